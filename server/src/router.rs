//! The router: routes, which of them are idempotent and authenticated, and the state they share.
//!
//! Everything is passed in explicitly ([`Services`]); nothing is global, so tests build the same router
//! on an in-memory store with a manual clock, or on PostgreSQL.
//!
//! | route | auth | idempotency layer |
//! |---|---|---|
//! | `POST /payments` | Bearer | yes (unless `--idempotency off`) |
//! | `GET /payments/{id}` | Bearer | no |
//! | `GET /idempotency-keys/{key}` | Bearer | no (reads a key's status; changes nothing) |
//! | `GET /healthz`, `GET /readyz`, `GET /metrics`, `GET /openapi.json` | none | no |
//!
//! Every response carries `x-request-id` (the client's when sane, or a fresh UUID), every log line
//! of a request names it, and every problem body has it as `request_id` ([`crate::request_id`]).
//! Every route is listed in [`crate::routes::ROUTES`], which the OpenAPI document is checked against.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tower::ServiceBuilder;
use tower_http::trace::{DefaultOnFailure, DefaultOnResponse, TraceLayer};
use tracing::debug;

use crate::auth::{ApiKeys, RequireAccountLayer};
use crate::metrics::{HttpMetrics, MetricsState, RecordHttpLayer, metrics};
use crate::payments::{Gateway, GatewayConfig, PaymentsState, create_payment, get_payment};
use crate::telemetry::make_span;
use idemlog_idempotency::problem::{Problem, ProblemJsonLayer};
use idemlog_idempotency::request_id::RequestContextLayer;
use idemlog_idempotency::status::{KeyStatusState, key_status};
use idemlog_idempotency::{
    FingerprintMode, Health, IdempotencyConfig, IdempotencyLayer, OutcomeCounts, StoreHandle,
    persist_side_records,
};

/// Settings of the router (the binary fills them from its flags).
#[derive(Clone)]
pub struct RouterConfig {
    /// Idempotency key lifetime (and the provider's key lifetime).
    pub key_ttl: Duration,
    /// The store's lease (sets the layer's renewal period).
    pub lease: Duration,
    /// `Retry-After` hint of a 409 (capped by the lease left).
    pub retry_after: Duration,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Largest response body stored (at most what the store accepts).
    pub max_response_bytes: usize,
    /// Fingerprint mode.
    pub fingerprint: FingerprintMode,
    /// Provider latency.
    pub gateway_latency: Duration,
    /// Provider lost-response fault count.
    pub gateway_fail_after_charge: u64,
    /// Whether `POST /payments` goes through the idempotency layer (off only for benchmarks).
    pub idempotency: bool,
    /// Most live idempotency keys per account (0: no limit).
    pub max_live_keys_per_account: u64,
}

/// Everything the router needs, built once: the store and what is built on it.
#[derive(Clone)]
pub struct Services {
    /// The store (any backend).
    pub store: StoreHandle,
    /// The fake provider.
    pub gateway: Gateway,
    /// API keys.
    pub keys: Arc<ApiKeys>,
    /// The idempotency layer, when on.
    pub idempotency: Option<IdempotencyLayer>,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// The `Retry-After` hint of a 409 (repeated by the key status route).
    pub retry_after: Duration,
}

impl Services {
    /// Builds the provider and the layer on an open store.
    pub fn new(store: StoreHandle, keys: ApiKeys, config: &RouterConfig) -> Self {
        let gateway = Gateway::new(
            Arc::clone(&store),
            GatewayConfig {
                key_ttl: config.key_ttl,
                latency: config.gateway_latency,
                fail_after_charge: config.gateway_fail_after_charge,
            },
        );
        let idempotency = config.idempotency.then(|| {
            let mut layer_config = IdempotencyConfig::new(config.key_ttl, config.lease);
            layer_config.max_body_bytes = config.max_body_bytes;
            layer_config.max_response_bytes = config.max_response_bytes;
            layer_config.fingerprint = config.fingerprint;
            layer_config.retry_after = config.retry_after;
            layer_config.max_live_keys =
                (config.max_live_keys_per_account > 0).then_some(config.max_live_keys_per_account);
            IdempotencyLayer::new(Arc::clone(&store), layer_config)
        });
        Self {
            store,
            gateway,
            keys: Arc::new(keys),
            idempotency,
            max_body_bytes: config.max_body_bytes,
            retry_after: config.retry_after,
        }
    }
}

/// `GET /readyz`: 200 while the store serves, 503 problem+json (with `Retry-After`) while it is
/// poisoned, being reopened or unreachable (for PostgreSQL: checked actively, so an idle instance
/// turns 503 within seconds of an outage). The reason goes to the log, never to the client.
async fn readiness(State(store): State<StoreHandle>) -> Response {
    health_response(&store, store.health())
}

/// `GET /healthz`: liveness. 200 while the process works: for the embedded store (whose disk is
/// part of the process) the same as `/readyz`; for PostgreSQL 200 even while the shared database
/// is down, so that its outage does not get every instance restarted at once.
async fn liveness(State(store): State<StoreHandle>) -> Response {
    health_response(&store, store.liveness())
}

fn health_response(store: &StoreHandle, health: Health) -> Response {
    match health {
        Health::Ready => "ok".into_response(),
        Health::Unavailable(reason) => {
            debug!(
                backend = store.kind(),
                reason, "health check: store unavailable"
            );
            Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "Idempotency store unavailable",
                "the store is unavailable; the server is recovering by itself",
            )
            .retry_after(1)
            .into_response()
        }
    }
}

/// The router of every route in [`crate::routes::ROUTES`].
pub fn router(services: &Services) -> Router {
    let payments = PaymentsState {
        store: Arc::clone(&services.store),
        gateway: services.gateway.clone(),
    };
    let create = match &services.idempotency {
        Some(layer) => post(create_payment).route_layer(layer.clone()),
        None => post(create_payment).route_layer(middleware::from_fn_with_state(
            Arc::clone(&services.store),
            persist_side_records,
        )),
    };
    let counts = services.idempotency.as_ref().map_or_else(
        || Arc::new(OutcomeCounts::default()),
        IdempotencyLayer::counts,
    );
    let http = HttpMetrics::default();
    let api = Router::new()
        .route("/payments", create)
        .route("/payments/{id}", get(get_payment))
        .with_state(payments)
        .route(
            "/idempotency-keys/{key}",
            get(key_status).with_state(KeyStatusState {
                store: Arc::clone(&services.store),
                retry_after: services.retry_after,
            }),
        )
        // One `route_layer` call for both: axum boxes each route once per call, and a request clones
        // every box between it and the handler (benches/NOTEBOOK.md, "Fewer boxed layers").
        .route_layer(
            ServiceBuilder::new()
                .layer(DefaultBodyLimit::max(services.max_body_bytes))
                .layer(RequireAccountLayer::new(Arc::clone(&services.keys))),
        );
    Router::new()
        .route(
            "/healthz",
            get(liveness).with_state(Arc::clone(&services.store)),
        )
        .route(
            "/readyz",
            get(readiness).with_state(Arc::clone(&services.store)),
        )
        .route(
            "/metrics",
            get(metrics).with_state(MetricsState {
                counts,
                gateway: services.gateway.clone(),
                store: Arc::clone(&services.store),
                http: http.clone(),
            }),
        )
        .route("/openapi.json", get(crate::openapi::serve))
        .merge(api)
        .fallback(|| async {
            Problem::from_status(axum::http::StatusCode::NOT_FOUND, "no such route")
        })
        // `Router::layer` wraps each route after routing, so these see `MatchedPath`. One call with
        // the whole stack (outermost first) instead of one per layer: axum boxes the route at each
        // call, and every request clones each box below the one it enters, several times over.
        .layer(
            ServiceBuilder::new()
                .layer(RequestContextLayer)
                .layer(
                    TraceLayer::new_for_http()
                        .make_span_with(make_span)
                        .on_response(DefaultOnResponse::new().level(tracing::Level::DEBUG))
                        .on_failure(DefaultOnFailure::new().level(tracing::Level::DEBUG)),
                )
                .layer(RecordHttpLayer::new(http))
                .layer(ProblemJsonLayer),
        )
}
