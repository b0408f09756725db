//! `GET /metrics`: Prometheus text exposition.
//!
//! - `gateway_charges_total`: every charge the fake provider has ever made in this data directory
//!   (persisted, survives restarts, never decreases);
//! - `idempotency_requests_total{outcome}`: requests per outcome at the idempotency layer (labels in
//!   [`Outcome`]); counted since the process started;
//! - `idemlog_*`: store gauges and counters from `Store::stats`.

use std::fmt::Write;
use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderValue;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use idemlog::{Stats, Store};

use crate::idempotency::{Outcome, OutcomeCounts};
use crate::payments::Gateway;

/// What the metrics endpoint reads.
#[derive(Clone)]
pub struct MetricsState {
    /// The layer's counters (all zero when the layer is off).
    pub counts: Arc<OutcomeCounts>,
    /// The provider, for the charge count.
    pub gateway: Gateway,
    /// The store, for its stats.
    pub store: Store,
}

/// Renders the exposition text.
pub fn render(counts: &OutcomeCounts, charges_total: u64, stats: &Stats) -> String {
    let mut out = String::with_capacity(2048);
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "# HELP gateway_charges_total Charges the payment provider has ever made (persisted).\n\
         # TYPE gateway_charges_total counter\n\
         gateway_charges_total {charges_total}"
    );
    let _ = writeln!(
        out,
        "# HELP idempotency_requests_total Requests at the idempotency layer, by outcome.\n\
         # TYPE idempotency_requests_total counter"
    );
    for outcome in Outcome::ALL {
        let _ = writeln!(
            out,
            "idempotency_requests_total{{outcome=\"{}\"}} {}",
            outcome.label(),
            counts.get(outcome)
        );
    }
    let gauges: [(&str, &str, u64); 4] = [
        (
            "idemlog_records",
            "Live idempotency records.",
            stats.records as u64,
        ),
        (
            "idemlog_records_in_progress",
            "Claims still in progress.",
            stats.in_progress as u64,
        ),
        (
            "idemlog_side_records",
            "Live side records.",
            stats.side_records as u64,
        ),
        (
            "idemlog_disk_bytes",
            "Bytes of all log segments.",
            stats.disk_bytes,
        ),
    ];
    for (name, help, value) in gauges {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
        );
    }
    let counters: [(&str, &str, u64); 2] = [
        (
            "idemlog_frames_appended_total",
            "Log frames appended since start.",
            stats.frames_appended,
        ),
        (
            "idemlog_syncs_total",
            "fdatasync calls since start.",
            stats.syncs,
        ),
    ];
    for (name, help, value) in counters {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
        );
    }
    out
}

/// `GET /metrics`.
pub async fn metrics(State(state): State<MetricsState>) -> Response {
    let store = state.store.clone();
    // `stats` walks every shard; keep it off the async workers.
    let stats = tokio::task::spawn_blocking(move || store.stats())
        .await
        .unwrap_or_default();
    let body = render(&state.counts, state.gateway.charges_total(), &stats);
    let mut response = body.into_response();
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_lists_charges_and_every_outcome() {
        let counts = OutcomeCounts::default();
        counts.record(Outcome::Replayed);
        let text = render(&counts, 7, &Stats::default());
        assert!(text.contains("\ngateway_charges_total 7\n"));
        assert!(text.contains("idempotency_requests_total{outcome=\"replayed\"} 1\n"));
        for outcome in Outcome::ALL {
            assert!(text.contains(&format!("outcome=\"{}\"", outcome.label())));
        }
    }
}
