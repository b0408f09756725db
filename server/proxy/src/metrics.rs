//! The proxy's own series, next to the layer's (`idemlog_idempotency::metrics`):
//! - `proxy_upstream_request_duration_seconds{status_class}`: time from sending a request to the
//!   upstream to its response head (protected routes: to the end of the stored body), for every
//!   request the upstream answered;
//! - `proxy_upstream_errors_total{kind}`: requests the upstream did not answer: `connect` (nothing
//!   sent, 502), `timeout` and `lost` (after sending, 504).

use std::time::Duration;

use axum::http::StatusCode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Buckets: 100 µs to 30 s.
const BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    10.0, 30.0,
];

/// Kinds of upstream failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamError {
    /// Could not connect: nothing was sent.
    Connect,
    /// No answer within the timeout.
    Timeout,
    /// The connection failed after the request was sent.
    Lost,
}

impl UpstreamError {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Timeout => "timeout",
            Self::Lost => "lost",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StatusLabels {
    status_class: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ErrorLabels {
    kind: &'static str,
}

type Durations = Family<StatusLabels, Histogram, fn() -> Histogram>;

fn histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// Upstream latency and errors; clones share the series.
#[derive(Clone)]
pub struct UpstreamMetrics {
    durations: Durations,
    errors: Family<ErrorLabels, Counter>,
}

impl Default for UpstreamMetrics {
    fn default() -> Self {
        let errors: Family<ErrorLabels, Counter> = Family::default();
        for kind in [
            UpstreamError::Connect,
            UpstreamError::Timeout,
            UpstreamError::Lost,
        ] {
            // Present from the start, at 0, so that rate() works before the first failure.
            let _ = errors.get_or_create(&ErrorLabels { kind: kind.label() });
        }
        Self {
            durations: Family::new_with_constructor(histogram),
            errors,
        }
    }
}

impl UpstreamMetrics {
    /// One answered request.
    pub fn observe(&self, elapsed: Duration, status: StatusCode) {
        let status_class = match status.as_u16() / 100 {
            1 => "1xx",
            2 => "2xx",
            3 => "3xx",
            4 => "4xx",
            _ => "5xx",
        };
        self.durations
            .get_or_create(&StatusLabels { status_class })
            .observe(elapsed.as_secs_f64());
    }

    /// One request the upstream did not answer.
    pub fn error(&self, kind: UpstreamError) {
        self.errors
            .get_or_create(&ErrorLabels { kind: kind.label() })
            .inc();
    }

    /// Registers both series.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "proxy_upstream_request_duration_seconds",
            "Time the upstream took to answer, by status class.",
            self.durations.clone(),
        );
        registry.register(
            "proxy_upstream_errors",
            "Requests the upstream did not answer, by kind (connect: nothing sent; timeout, lost: after sending).",
            self.errors.clone(),
        );
    }
}
