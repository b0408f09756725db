//! The router: routes, which of them are idempotent and authenticated, and the state they share.
//!
//! Everything is passed in explicitly ([`App`]); nothing is global, so tests build the same router
//! on an in-memory store with a manual clock, or on PostgreSQL.
//!
//! | route | auth | idempotency layer |
//! |---|---|---|
//! | `POST /payments` | Bearer | yes (unless `--idempotency off`) |
//! | `GET /payments/{id}` | Bearer | no |
//! | `GET /idempotency-keys/{key}` | Bearer | no (reads a key's status; changes nothing) |
//! | `GET /healthz`, `GET /readyz`, `GET /metrics` | none | no |
//!
//! Every response carries `x-request-id` (the client's, or a fresh UUID), and every 5xx problem
//! body names it as `request_id`.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderName, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tracing::debug;

use crate::auth::{ApiKeys, require_account};
use crate::idempotency::status::{KeyStatusState, key_status};
use crate::idempotency::{
    FingerprintMode, Health, IdempotencyConfig, IdempotencyLayer, OutcomeCounts, SharedStore,
    persist_side_records,
};
use crate::metrics::{MetricsState, metrics};
use crate::payments::{Gateway, GatewayConfig, PaymentsState, create_payment, get_payment};
use crate::problem::{Problem, add_request_id, ensure_problem_json};

/// The request-id header: taken from the client when present, generated (a UUID) otherwise,
/// echoed on every response and named in every 5xx problem body, so a client's report can be matched
/// with the server's log.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Settings of the application (the binary fills them from its flags).
#[derive(Clone)]
pub struct AppConfig {
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

/// Everything the router needs, built once.
#[derive(Clone)]
pub struct App {
    /// The store (any backend).
    pub store: SharedStore,
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

impl App {
    /// Builds the provider and the layer on an open store.
    pub fn new(store: SharedStore, keys: ApiKeys, config: &AppConfig) -> Self {
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

/// `GET /healthz` and `GET /readyz`: 200 while the store serves, 503 problem+json (with
/// `Retry-After`) while it is poisoned, being reopened or unreachable. The reason goes to the log,
/// never to the client.
async fn health(State(store): State<SharedStore>) -> Response {
    match store.health() {
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

/// The application router.
pub fn app(app: &App) -> Router {
    let payments = PaymentsState {
        store: Arc::clone(&app.store),
        gateway: app.gateway.clone(),
    };
    let create = match &app.idempotency {
        Some(layer) => post(create_payment).route_layer(layer.clone()),
        None => post(create_payment).route_layer(middleware::from_fn_with_state(
            Arc::clone(&app.store),
            persist_side_records,
        )),
    };
    let counts = app.idempotency.as_ref().map_or_else(
        || Arc::new(OutcomeCounts::default()),
        IdempotencyLayer::counts,
    );
    let api = Router::new()
        .route("/payments", create)
        .route("/payments/{id}", get(get_payment))
        .with_state(payments)
        .route(
            "/idempotency-keys/{key}",
            get(key_status).with_state(KeyStatusState {
                store: Arc::clone(&app.store),
                retry_after: app.retry_after,
            }),
        )
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&app.keys),
            require_account,
        ))
        .layer(DefaultBodyLimit::max(app.max_body_bytes));
    Router::new()
        .route("/healthz", get(health).with_state(Arc::clone(&app.store)))
        .route("/readyz", get(health).with_state(Arc::clone(&app.store)))
        .route(
            "/metrics",
            get(metrics).with_state(MetricsState {
                counts,
                gateway: app.gateway.clone(),
                store: Arc::clone(&app.store),
            }),
        )
        .merge(api)
        .fallback(|| async {
            Problem::from_status(axum::http::StatusCode::NOT_FOUND, "no such route")
        })
        .layer(middleware::map_response(ensure_problem_json))
        .layer(middleware::from_fn(add_request_id))
        .layer(PropagateRequestIdLayer::new(REQUEST_ID))
        .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
}
