//! The application the scenarios drive: the layer on a small orders route over the store under
//! test, with the key status route beside it, called in process (no socket).
//!
//! `POST /orders` counts its runs, may wait ([`Settings::latency`]) or fail with a 502 the first
//! few times ([`Settings::fail_first`]), and answers 201 with a `Location` and the order as a
//! business record (`orders/{id}`) that the layer writes with the completion. The scope is the
//! `X-Tenant` header (the scenarios' stand-in for authentication); without it the layer answers 401.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::header::LOCATION;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use idemlog::ManualClock;
use tower::ServiceExt;

use super::{Fixture, LEASE, TTL};
use crate::status::{KeyStatusState, key_status};
use crate::store::RecordWrite;
use crate::{IdempotencyConfig, IdempotencyLayer, Outcome, Scope, SideRecords, StoreHandle};

/// How the app around the store behaves in one scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// How long the handler takes.
    pub latency: Duration,
    /// The first this many runs of the handler answer 502.
    pub fail_first: u64,
    /// The per-scope quota of live keys, if any.
    pub max_live_keys: Option<u64>,
}

impl Settings {
    /// A handler that answers at once, never fails, and no quota.
    pub const DEFAULT: Settings = Settings {
        latency: Duration::ZERO,
        fail_first: 0,
        max_live_keys: None,
    };
}

impl Default for Settings {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The namespace of the business records the handler writes.
pub const ORDERS: &str = "orders";
/// The `Retry-After` hint the layer gives (in whole seconds).
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The orders app on the store under test.
pub struct App {
    /// The store under test.
    pub store: StoreHandle,
    /// The app: `POST /orders` behind the layer, `GET /idempotency-keys/{key}`.
    pub router: Router,
    layer: IdempotencyLayer,
    runs: Arc<AtomicU64>,
    clock: Option<ManualClock>,
}

#[derive(Clone)]
struct Handler {
    runs: Arc<AtomicU64>,
    settings: Settings,
}

impl App {
    /// The app on `fixture`'s store.
    pub fn new(fixture: Fixture, settings: Settings) -> Self {
        let mut config = IdempotencyConfig::new(TTL, LEASE);
        config.retry_after = RETRY_AFTER;
        config.max_live_keys = settings.max_live_keys;
        let layer = IdempotencyLayer::new(Arc::clone(&fixture.store), config);
        let runs = Arc::new(AtomicU64::new(0));
        let handler = Handler {
            runs: Arc::clone(&runs),
            settings,
        };
        let router = Router::new()
            .route(
                "/orders",
                post(create_order)
                    .with_state(handler)
                    .route_layer(layer.clone()),
            )
            .route(
                "/idempotency-keys/{key}",
                get(key_status).with_state(KeyStatusState {
                    store: Arc::clone(&fixture.store),
                    retry_after: RETRY_AFTER,
                }),
            )
            .layer(middleware::from_fn(tenant));
        Self {
            store: fixture.store,
            router,
            layer,
            runs,
            clock: fixture.clock,
        }
    }

    /// Lets `d` pass for the store: moves its manual clock, or sleeps.
    pub async fn pass(&self, d: Duration) {
        match &self.clock {
            Some(clock) => clock.advance(d),
            None => tokio::time::sleep(d).await,
        }
    }

    /// How many times the handler ran.
    pub fn runs(&self) -> u64 {
        self.runs.load(Ordering::SeqCst)
    }

    /// How many requests the layer answered with `outcome`.
    pub fn outcome(&self, outcome: Outcome) -> u64 {
        self.layer.counts().get(outcome)
    }

    /// Sends `request` to the app.
    pub async fn send(&self, request: Request<Body>) -> Reply {
        send(&self.router, request).await
    }

    /// `POST /orders` as `tenant` with `Idempotency-Key: key` (none when `None`) and a JSON body.
    pub async fn order(&self, tenant: &str, key: Option<&str>, body: &str) -> Reply {
        self.send(order(tenant, key, body)).await
    }

    /// `GET path` as `tenant`.
    pub async fn get(&self, tenant: &str, path: &str) -> Reply {
        let request = Request::get(path)
            .header("x-tenant", tenant)
            .body(Body::empty())
            .expect("a valid request");
        self.send(request).await
    }

    /// Waits for the layer's work that outlived its requests, closes the store and hands it back.
    pub(super) async fn finish(self) -> StoreHandle {
        let idle = self.layer.in_flight();
        let _ = tokio::time::timeout(Duration::from_secs(10), idle.wait_idle()).await;
        let _ = self.store.close().await;
        self.store
    }
}

/// `POST /orders` as `tenant`, with `Idempotency-Key: key` when given and a JSON `body`.
pub fn order(tenant: &str, key: Option<&str>, body: &str) -> Request<Body> {
    let mut builder = Request::post("/orders")
        .header("x-tenant", tenant)
        .header("content-type", "application/json");
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    builder
        .body(Body::from(body.to_owned()))
        .expect("a valid request")
}

/// Sends `request` to `router` and reads the whole answer.
pub async fn send(router: &Router, request: Request<Body>) -> Reply {
    let response = match router.clone().oneshot(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    };
    let status = response.status();
    let headers = response.headers().clone();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("the app's body reads")
        .to_vec();
    Reply {
        status,
        headers,
        body,
    }
}

/// An answer of the app.
pub struct Reply {
    /// Its status.
    pub status: StatusCode,
    /// Its headers.
    pub headers: HeaderMap,
    /// Its whole body.
    pub body: Vec<u8>,
}

impl Reply {
    /// The body as JSON (panics if it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }

    /// A header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Whether the layer replayed a stored response.
    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }
}

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {:?} {}",
            self.status,
            self.headers,
            String::from_utf8_lossy(&self.body)
        )
    }
}

/// The scenarios' authentication: the `X-Tenant` header is the scope.
async fn tenant(mut request: Request, next: Next) -> Response {
    let tenant = request
        .headers()
        .get("x-tenant")
        .and_then(|v| v.to_str().ok())
        .filter(|t| !t.is_empty())
        .map(|t| Scope::new(t.to_owned()));
    if let Some(scope) = tenant {
        request.extensions_mut().insert(scope);
    }
    next.run(request).await
}

async fn create_order(State(handler): State<Handler>, body: Bytes) -> Response {
    let run = handler.runs.fetch_add(1, Ordering::SeqCst) + 1;
    if !handler.settings.latency.is_zero() {
        tokio::time::sleep(handler.settings.latency).await;
    }
    if run <= handler.settings.fail_first {
        return (StatusCode::BAD_GATEWAY, "upstream failed").into_response();
    }
    let id = format!("ord_{run}");
    let created = serde_json::json!({
        "id": id,
        "order": serde_json::from_slice::<serde_json::Value>(&body).unwrap_or_default(),
    });
    let mut response = (StatusCode::CREATED, axum::Json(created)).into_response();
    if let Ok(location) = HeaderValue::try_from(format!("/orders/{id}")) {
        response.headers_mut().insert(LOCATION, location);
    }
    response
        .extensions_mut()
        .insert(SideRecords(vec![RecordWrite::put(ORDERS, id, body)]));
    response
}
