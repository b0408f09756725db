//! The router: routes, which of them are idempotent and authenticated, and the state they share.
//!
//! Everything is passed in explicitly ([`App`]); nothing is global, so tests build the same router
//! on an in-memory store with a manual clock.
//!
//! | route | auth | idempotency layer |
//! |---|---|---|
//! | `POST /payments` | Bearer | yes (unless `--idempotency off`) |
//! | `GET /payments/{id}` | Bearer | no |
//! | `GET /healthz`, `GET /metrics` | none | no |

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{get, post};
use idemlog::{Clock, Store};

use crate::auth::{ApiKeys, require_account};
use crate::idempotency::{
    FingerprintMode, IdempotencyConfig, IdempotencyLayer, OutcomeCounts, persist_side_records,
};
use crate::metrics::{MetricsState, metrics};
use crate::payments::{
    Gateway, GatewayConfig, GatewayError, PaymentsState, create_payment, get_payment,
};
use crate::problem::{Problem, ensure_problem_json};

/// Settings of the application (the binary fills them from its flags).
#[derive(Clone)]
pub struct AppConfig {
    /// Idempotency key lifetime (and the provider's key lifetime).
    pub key_ttl: Duration,
    /// The store's lease (sets the layer's renewal period).
    pub lease: Duration,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Largest response body stored (at most the store's `max_value_bytes`).
    pub max_response_bytes: usize,
    /// Fingerprint mode.
    pub fingerprint: FingerprintMode,
    /// Provider latency.
    pub gateway_latency: Duration,
    /// Provider lost-response fault count.
    pub gateway_fail_after_charge: u64,
    /// Whether `POST /payments` goes through the idempotency layer (off only for benchmarks).
    pub idempotency: bool,
    /// The store's clock.
    pub clock: Arc<dyn Clock>,
}

/// Everything the router needs, built once.
#[derive(Clone)]
pub struct App {
    /// The store.
    pub store: Store,
    /// The fake provider.
    pub gateway: Gateway,
    /// API keys.
    pub keys: Arc<ApiKeys>,
    /// The idempotency layer, when on.
    pub idempotency: Option<IdempotencyLayer>,
    /// Largest request body.
    pub max_body_bytes: usize,
}

impl App {
    /// Builds the provider and the layer on an open store.
    pub fn new(store: Store, keys: ApiKeys, config: &AppConfig) -> Result<Self, GatewayError> {
        let gateway = Gateway::open(
            store.clone(),
            GatewayConfig {
                key_ttl: config.key_ttl,
                latency: config.gateway_latency,
                fail_after_charge: config.gateway_fail_after_charge,
                clock: Arc::clone(&config.clock),
            },
        )?;
        let idempotency = config.idempotency.then(|| {
            let mut layer_config = IdempotencyConfig::new(config.key_ttl, config.lease);
            layer_config.max_body_bytes = config.max_body_bytes;
            layer_config.max_response_bytes = config.max_response_bytes;
            layer_config.fingerprint = config.fingerprint;
            IdempotencyLayer::new(store.clone(), layer_config)
        });
        Ok(Self {
            store,
            gateway,
            keys: Arc::new(keys),
            idempotency,
            max_body_bytes: config.max_body_bytes,
        })
    }
}

/// The application router.
pub fn app(app: &App) -> Router {
    let payments = PaymentsState {
        store: app.store.clone(),
        gateway: app.gateway.clone(),
    };
    let create = match &app.idempotency {
        Some(layer) => post(create_payment).route_layer(layer.clone()),
        None => post(create_payment).route_layer(middleware::from_fn_with_state(
            app.store.clone(),
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
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&app.keys),
            require_account,
        ))
        .layer(DefaultBodyLimit::max(app.max_body_bytes));
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/metrics",
            get(metrics).with_state(MetricsState {
                counts,
                gateway: app.gateway.clone(),
                store: app.store.clone(),
            }),
        )
        .merge(api)
        .fallback(|| async {
            Problem::from_status(axum::http::StatusCode::NOT_FOUND, "no such route")
        })
        .layer(middleware::map_response(ensure_problem_json))
}
