//! `GET /metrics`: Prometheus text exposition.
//!
//! - `gateway_charges_total`: every charge the fake provider has ever made in the store (the data
//!   directory, or the shared database: all instances); persisted, never decreases;
//! - `idempotency_requests_total{outcome}`: requests per outcome at the idempotency layer (labels in
//!   [`Outcome`]); counted since the process started;
//! - `idemlog_*`: the backend's own numbers ([`crate::idempotency::IdempotencyStore::gauges`]).

use std::fmt::Write;
use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderValue;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use tracing::warn;

use crate::idempotency::{Gauge, Outcome, OutcomeCounts, SharedStore};
use crate::payments::Gateway;

/// What the metrics endpoint reads.
#[derive(Clone)]
pub struct MetricsState {
    /// The layer's counters (all zero when the layer is off).
    pub counts: Arc<OutcomeCounts>,
    /// The provider, for the charge count.
    pub gateway: Gateway,
    /// The store, for its numbers.
    pub store: SharedStore,
}

/// Renders the exposition text. `charges_total` is `None` when the store could not be read (the
/// sample is then left out rather than reported as a number that went down).
pub fn render(counts: &OutcomeCounts, charges_total: Option<u64>, gauges: &[Gauge]) -> String {
    let mut out = String::with_capacity(2048);
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "# HELP gateway_charges_total Charges the payment provider has ever made (persisted).\n\
         # TYPE gateway_charges_total counter"
    );
    if let Some(total) = charges_total {
        let _ = writeln!(out, "gateway_charges_total {total}");
    }
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
    for gauge in gauges {
        let kind = if gauge.name.ends_with("_total") {
            "counter"
        } else {
            "gauge"
        };
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}",
            name = gauge.name,
            help = gauge.help,
            value = gauge.value,
        );
    }
    out
}

/// `GET /metrics`.
pub async fn metrics(State(state): State<MetricsState>) -> Response {
    let charges = match state.gateway.charges_total().await {
        Ok(total) => Some(total),
        Err(e) => {
            warn!(error = %e, "metrics: the charge counter could not be read");
            None
        }
    };
    let gauges = state.store.gauges().await;
    let body = render(&state.counts, charges, &gauges);
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
        let text = render(&counts, Some(7), &[]);
        assert!(text.contains("\ngateway_charges_total 7\n"));
        assert!(text.contains("idempotency_requests_total{outcome=\"replayed\"} 1\n"));
        for outcome in Outcome::ALL {
            assert!(text.contains(&format!("outcome=\"{}\"", outcome.label())));
        }
    }
}
