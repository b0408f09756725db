//! The admin listener: `/metrics`, `/healthz`, `/readyz`, on their own address so that the proxy
//! never shadows a path of the upstream (the proxy listener forwards these paths like any other).
//!
//! - `/healthz`: 200 while the process serves;
//! - `/readyz`: 200 while the store serves, else 503 (a poisoned embedded store, an unreachable
//!   database): a load balancer stops sending traffic to this proxy;
//! - `/metrics`: Prometheus text: the layer's and the store's series
//!   (`idempotency_requests_total{outcome}`, `idemlog_*`) and the proxy's upstream series
//!   ([`crate::metrics`]).

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use idemlog_idempotency::metrics::Snapshot;
use idemlog_idempotency::{Health, OutcomeCounts, StoreHandle};
use prometheus_client::registry::Registry;
use tracing::warn;

use crate::metrics::UpstreamMetrics;

/// Content type of the exposition.
pub const CONTENT_TYPE_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What the admin routes read.
#[derive(Clone)]
pub struct AdminState {
    /// The store (health, gauges).
    pub store: StoreHandle,
    /// The layer's outcome counts (shared by every route).
    pub counts: Arc<OutcomeCounts>,
    /// The upstream series.
    pub upstream: UpstreamMetrics,
}

/// The admin router.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

async fn readyz(State(state): State<AdminState>) -> Response {
    match state.store.health() {
        Health::Ready => "ready\n".into_response(),
        Health::Unavailable(reason) => {
            warn!(%reason, "readiness check: store unavailable");
            (StatusCode::SERVICE_UNAVAILABLE, "store unavailable\n").into_response()
        }
    }
}

async fn metrics(State(state): State<AdminState>) -> Response {
    let mut registry = Registry::default();
    Snapshot::read(&state.counts, &*state.store)
        .await
        .register(&mut registry);
    state.upstream.register(&mut registry);
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, &registry) {
        Ok(()) => ([(CONTENT_TYPE, CONTENT_TYPE_TEXT)], text).into_response(),
        Err(e) => {
            warn!(error = %e, "could not encode the metrics");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}
