//! `GET /metrics`: Prometheus text exposition (format 0.0.4), encoded by `prometheus-client`.
//!
//! - `gateway_charges_total`: every charge the fake provider has ever made in the store (the data
//!   directory, or the shared database: all instances); persisted, never decreases;
//! - the idempotency layer's and the store's series (`idempotency_requests_total{outcome}`,
//!   `idemlog_store_up`, `idemlog_*`), named and encoded by [`idemlog_idempotency::metrics`].
//!
//! A scrape reads atomics and the backends' running counts: it never walks the store's keys.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, Method};
use axum::response::{IntoResponse, Response};
use pin_project_lite::pin_project;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tower::{Layer, Service};
use tracing::warn;

use crate::payments::Gateway;
use crate::routes::{ROUTES, UNMATCHED_ROUTE};
use idemlog_idempotency::metrics::Snapshot;
use idemlog_idempotency::{OutcomeCounts, StoreHandle};

/// Content type of the exposition.
pub const CONTENT_TYPE_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Buckets of `http_server_request_duration_seconds`: 100 µs (a replay from memory) to 10 s (a
/// slow provider), about three per decade.
pub const HTTP_BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// Labels of `http_server_request_duration_seconds` (OpenTelemetry HTTP semantic conventions).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct HttpLabels {
    /// The route template (`/payments/{id}`), or [`UNMATCHED_ROUTE`].
    pub http_route: &'static str,
    /// The method; `_OTHER` for a non-standard one.
    pub http_request_method: &'static str,
    /// The response status.
    pub http_response_status_code: u16,
}

type HttpFamily = Family<HttpLabels, Histogram, fn() -> Histogram>;

fn http_histogram() -> Histogram {
    Histogram::new(HTTP_BUCKETS)
}

/// The HTTP server histogram, shared by every clone of the router's middleware.
#[derive(Clone)]
pub struct HttpMetrics {
    requests: HttpFamily,
    registry: Arc<Registry>,
}

impl Default for HttpMetrics {
    fn default() -> Self {
        let requests: HttpFamily = Family::new_with_constructor(http_histogram);
        let mut registry = Registry::default();
        registry.register(
            "http_server_request_duration_seconds",
            "Duration of HTTP server requests, from arrival at the router to the response head.",
            requests.clone(),
        );
        Self {
            requests,
            registry: Arc::new(registry),
        }
    }
}

impl HttpMetrics {
    /// Records one request.
    pub fn observe(&self, labels: &HttpLabels, seconds: f64) {
        self.requests.get_or_create(labels).observe(seconds);
    }
}

/// The label of a method: its name for the standard ones, `_OTHER` otherwise (bounded cardinality).
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        Method::TRACE => "TRACE",
        Method::CONNECT => "CONNECT",
        _ => "_OTHER",
    }
}

/// The `http_route` label: the matched route's template as listed in [`crate::routes::ROUTES`] (a
/// `&'static str`, so recording allocates nothing), or [`UNMATCHED_ROUTE`].
///
/// A route served by the router but missing from that list is a bug (it would be missing from the
/// OpenAPI document too): debug builds panic on its first request, so any test that reaches it
/// fails; release builds label it `unlisted`.
fn route_label(matched: Option<&MatchedPath>) -> &'static str {
    let Some(matched) = matched else {
        return UNMATCHED_ROUTE;
    };
    match ROUTES.iter().find(|r| r.path == matched.as_str()) {
        Some(route) => route.path,
        None => {
            debug_assert!(
                false,
                "route {} is served but not listed in routes::ROUTES",
                matched.as_str()
            );
            "unlisted"
        }
    }
}

/// Middleware (for `Router::layer`, so that it runs after routing and sees [`MatchedPath`]):
/// records `http_server_request_duration_seconds` when the response head is ready.
#[derive(Clone)]
pub struct RecordHttpLayer {
    metrics: HttpMetrics,
}

impl RecordHttpLayer {
    /// A layer recording into `metrics`.
    pub fn new(metrics: HttpMetrics) -> Self {
        Self { metrics }
    }
}

impl<S> Layer<S> for RecordHttpLayer {
    type Service = RecordHttp<S>;

    fn layer(&self, inner: S) -> RecordHttp<S> {
        RecordHttp {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// The service of [`RecordHttpLayer`]. A service of its own rather than
/// `axum::middleware::from_fn`, which clones the whole service below it and boxes two futures on
/// every request (benches/NOTEBOOK.md, issue 23's eleventh step).
#[derive(Clone)]
pub struct RecordHttp<S> {
    inner: S,
    metrics: HttpMetrics,
}

impl<S> Service<Request> for RecordHttp<S>
where
    S: Service<Request, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = RecordHttpFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let http_route = route_label(request.extensions().get::<MatchedPath>());
        let http_request_method = method_label(request.method());
        RecordHttpFuture {
            started: Instant::now(),
            inner: self.inner.call(request),
            metrics: self.metrics.clone(),
            http_route,
            http_request_method,
        }
    }
}

pin_project! {
    /// The future of [`RecordHttp`]: the response, observed when it is ready.
    pub struct RecordHttpFuture<F> {
        #[pin]
        inner: F,
        metrics: HttpMetrics,
        started: Instant,
        http_route: &'static str,
        http_request_method: &'static str,
    }
}

impl<F, E> Future for RecordHttpFuture<F>
where
    F: Future<Output = Result<Response, E>>,
{
    type Output = Result<Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = ready!(this.inner.poll(cx));
        if let Ok(response) = &result {
            let labels = HttpLabels {
                http_route: this.http_route,
                http_request_method: this.http_request_method,
                http_response_status_code: response.status().as_u16(),
            };
            this.metrics
                .observe(&labels, this.started.elapsed().as_secs_f64());
        }
        Poll::Ready(result)
    }
}

/// What the metrics endpoint reads.
#[derive(Clone)]
pub struct MetricsState {
    /// The layer's counters (all zero when the layer is off).
    pub counts: Arc<OutcomeCounts>,
    /// The provider, for the charge count.
    pub gateway: Gateway,
    /// The store, for its numbers.
    pub store: StoreHandle,
    /// The HTTP histogram.
    pub http: HttpMetrics,
}

/// The provider's charge counter, encoded as a `prometheus-client` collector.
#[derive(Debug)]
struct Charges(u64);

impl Collector for Charges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // Counter names are registered without `_total`: the encoder appends it.
        encoder
            .encode_descriptor(
                "gateway_charges",
                "Charges the payment provider has ever made (persisted).",
                None,
                MetricType::Counter,
            )?
            .encode_counter::<NoLabelSet, _, u64>(&self.0, None)
    }
}

/// Encodes one scrape: the charge count, the layer's and store's figures, then the HTTP histogram.
fn render(charges_total: Option<u64>, idempotency: Snapshot, http: &HttpMetrics) -> String {
    let mut registry = Registry::default();
    if let Some(total) = charges_total {
        registry.register_collector(Box::new(Charges(total)));
    }
    idempotency.register(&mut registry);
    let mut out = String::with_capacity(8192);
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry);
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &http.registry);
    out
}

/// `GET /metrics`.
pub async fn metrics(State(state): State<MetricsState>) -> Response {
    let charges_total = match state.gateway.charges_total().await {
        Ok(total) => Some(total),
        Err(e) => {
            warn!(error = %e, "metrics: the charge counter could not be read");
            None
        }
    };
    let idempotency = Snapshot::read(&state.counts, state.store.as_ref()).await;
    let mut response = render(charges_total, idempotency, &state.http).into_response();
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE_TEXT));
    response
}

#[cfg(test)]
mod tests {
    use idemlog_idempotency::Outcome;

    use super::*;

    #[test]
    fn exposition_has_the_charges_the_layer_and_the_http_histogram() {
        let counts = OutcomeCounts::default();
        counts.record(Outcome::Replayed);
        let http = HttpMetrics::default();
        http.observe(
            &HttpLabels {
                http_route: "/payments/{id}",
                http_request_method: "GET",
                http_response_status_code: 200,
            },
            0.0003,
        );
        let text = render(
            Some(7),
            Snapshot::new(&counts, true, Vec::new(), Vec::new()),
            &http,
        );
        assert!(text.contains("\ngateway_charges_total 7\n"), "{text}");
        assert!(text.contains("idempotency_requests_total{outcome=\"replayed\"} 1\n"));
        assert!(text.contains("\nidemlog_store_up 1\n"), "{text}");
        assert!(text.contains(
            "http_server_request_duration_seconds_bucket{http_route=\"/payments/{id}\",http_request_method=\"GET\",http_response_status_code=\"200\",le=\"0.0005\"} 1\n"
        ), "{text}");
    }
}
