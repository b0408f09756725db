//! How the layer settles a claim from what the inner service answered: the configured release
//! statuses, the `ClaimDirective` response extension (a reverse proxy's "no effect" and "effect
//! unknown"), the stored-header allow-list, and an optional key. The store's clock is manual, so
//! a lease runs out exactly when a test says.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderName, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use idemlog::testkit::FaultyStorage;
use idemlog::{ManualClock, Options, RecordState, Store};
use idemlog_idempotency::backends::embedded::EmbeddedBackend;
use idemlog_idempotency::{
    ClaimDirective, IdempotencyConfig, IdempotencyLayer, Outcome, ReleaseStatuses, Scope,
};
use tokio::sync::{Notify, Semaphore};
use tower::ServiceExt;

const START_MS: u64 = 1_700_000_000_000;
const LEASE: Duration = Duration::from_secs(30);

#[derive(Clone)]
struct Handler {
    calls: Arc<AtomicU64>,
    entered: Arc<Notify>,
    gate: Arc<Semaphore>,
}

struct Fixture {
    router: Router,
    layer: IdempotencyLayer,
    store: Store,
    clock: ManualClock,
    handler: Handler,
}

async fn with_scope(mut request: Request, next: Next) -> Response {
    request.extensions_mut().insert(Scope::new("tenant"));
    next.run(request).await
}

/// The first call's effect is unknown (504 + directive); later calls succeed.
async fn unknown_once(State(h): State<Handler>) -> Response {
    let n = h.calls.fetch_add(1, Ordering::SeqCst) + 1;
    if n == 1 {
        let mut response = (StatusCode::GATEWAY_TIMEOUT, "timed out").into_response();
        response
            .extensions_mut()
            .insert(ClaimDirective::EffectUnknown);
        return response;
    }
    (StatusCode::CREATED, format!("call {n}")).into_response()
}

/// Waits at the gate, then says its effect is unknown.
async fn slow_unknown(State(h): State<Handler>) -> Response {
    h.calls.fetch_add(1, Ordering::SeqCst);
    h.entered.notify_one();
    let _permit = h.gate.acquire().await.expect("gate open");
    let mut response = (StatusCode::GATEWAY_TIMEOUT, "timed out").into_response();
    response
        .extensions_mut()
        .insert(ClaimDirective::EffectUnknown);
    response
}

/// A 400 that certainly had no effect.
async fn no_effect(State(h): State<Handler>) -> Response {
    h.calls.fetch_add(1, Ordering::SeqCst);
    let mut response = (StatusCode::BAD_REQUEST, "not sent").into_response();
    response.extensions_mut().insert(ClaimDirective::Release);
    response
}

async fn conflict(State(h): State<Handler>) -> Response {
    h.calls.fetch_add(1, Ordering::SeqCst);
    (StatusCode::CONFLICT, "busy").into_response()
}

async fn error(State(h): State<Handler>) -> Response {
    let n = h.calls.fetch_add(1, Ordering::SeqCst) + 1;
    (StatusCode::INTERNAL_SERVER_ERROR, format!("error {n}")).into_response()
}

async fn headers(State(h): State<Handler>) -> Response {
    h.calls.fetch_add(1, Ordering::SeqCst);
    (
        StatusCode::OK,
        [("set-cookie", "a=b"), ("etag", "\"v1\""), ("x-trace", "t")],
        "ok",
    )
        .into_response()
}

fn fixture(configure: impl FnOnce(&mut IdempotencyConfig)) -> Fixture {
    let clock = ManualClock::new(START_MS);
    let embedded = EmbeddedBackend::open(
        "/data",
        Options::default()
            .storage(Arc::new(FaultyStorage::new()))
            .clock(Arc::new(clock.clone()))
            .lease(LEASE),
    )
    .expect("store");
    let store = embedded.engine().expect("engine store");
    let mut config = IdempotencyConfig::new(Duration::from_secs(3600), LEASE);
    config.heartbeat = Some(Duration::from_millis(5));
    configure(&mut config);
    let layer = IdempotencyLayer::new(Arc::new(embedded), config);
    let handler = Handler {
        calls: Arc::new(AtomicU64::new(0)),
        entered: Arc::new(Notify::new()),
        gate: Arc::new(Semaphore::new(0)),
    };
    let router = Router::new()
        .route("/unknown-once", post(unknown_once))
        .route("/slow-unknown", post(slow_unknown))
        .route("/no-effect", post(no_effect))
        .route("/conflict", post(conflict))
        .route("/error", post(error))
        .route("/headers", post(headers))
        .route_layer(layer.clone())
        .with_state(handler.clone())
        .layer(middleware::from_fn(with_scope));
    Fixture {
        router,
        layer,
        store,
        clock,
        handler,
    }
}

async fn call(router: &Router, path: &str, key: Option<&str>) -> Response {
    let mut request = Request::post(path);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    router
        .clone()
        .oneshot(request.body(Body::empty()).expect("request"))
        .await
        .expect("infallible")
}

async fn text(response: Response) -> String {
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("body");
    String::from_utf8_lossy(&bytes).into_owned()
}

fn lease_until(store: &Store) -> u64 {
    match store.get(b"tenant", b"k").expect("get").map(|r| r.state) {
        Some(RecordState::InProgress { lease_until_ms }) => lease_until_ms,
        other => panic!("expected an in-progress record, found {other:?}"),
    }
}

#[tokio::test]
async fn an_unknown_effect_leaves_the_key_in_progress_until_its_lease_runs_out() {
    let f = fixture(|_| {});
    let first = call(&f.router, "/unknown-once", Some("k")).await;
    assert_eq!(first.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(lease_until(&f.store), START_MS + LEASE.as_millis() as u64);

    let retry = call(&f.router, "/unknown-once", Some("k")).await;
    assert_eq!(
        retry.status(),
        StatusCode::CONFLICT,
        "held while the effect is unknown"
    );
    assert!(retry.headers().contains_key("retry-after"));
    assert_eq!(f.handler.calls.load(Ordering::SeqCst), 1);

    f.clock.advance(LEASE + Duration::from_secs(1));
    let later = call(&f.router, "/unknown-once", Some("k")).await;
    assert_eq!(
        later.status(),
        StatusCode::CREATED,
        "taken over after the lease"
    );
    assert_eq!(text(later).await, "call 2");
    assert_eq!(f.layer.counts().get(Outcome::EffectUnknown), 1);
    assert_eq!(f.layer.counts().get(Outcome::Released), 0);
    assert_eq!(f.layer.counts().get(Outcome::TakenOver), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_of_an_unknown_effect_is_no_longer_renewed() {
    let f = fixture(|_| {});
    let first = tokio::spawn({
        let router = f.router.clone();
        async move { call(&router, "/slow-unknown", Some("k")).await }
    });
    f.handler.entered.notified().await;
    // While the handler runs, its lease is renewed.
    f.clock.advance(Duration::from_secs(25));
    let renewed = START_MS + 55_000;
    let deadline = Instant::now() + Duration::from_secs(10);
    while lease_until(&f.store) < renewed {
        assert!(Instant::now() < deadline, "the lease was never renewed");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    f.handler.gate.add_permits(1);
    let response = first.await.expect("task");
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    let settled = lease_until(&f.store);

    // Many heartbeats later by both clocks, the lease has not moved.
    f.clock.advance(Duration::from_secs(20));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(lease_until(&f.store), settled);
    f.clock.advance(LEASE);
    let after = call(&f.router, "/slow-unknown", Some("k")).await;
    assert_ne!(
        after.status(),
        StatusCode::CONFLICT,
        "the key was freed by its lease"
    );
}

#[tokio::test]
async fn a_release_directive_releases_whatever_the_status() {
    let f = fixture(|_| {});
    for _ in 0..2 {
        let response = call(&f.router, "/no-effect", Some("k")).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        assert!(!response.headers().contains_key("idempotent-replayed"));
    }
    assert_eq!(f.handler.calls.load(Ordering::SeqCst), 2);
    assert_eq!(f.layer.counts().get(Outcome::Released), 2);
}

#[tokio::test]
async fn configured_release_statuses_replace_the_default() {
    let f = fixture(|c| c.release_statuses = ReleaseStatuses::none().with_code(409));
    for _ in 0..2 {
        assert_eq!(
            call(&f.router, "/conflict", Some("c")).await.status(),
            StatusCode::CONFLICT
        );
    }
    assert_eq!(f.handler.calls.load(Ordering::SeqCst), 2, "409 released");

    let first = call(&f.router, "/error", Some("e")).await;
    assert_eq!(first.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let replay = call(&f.router, "/error", Some("e")).await;
    assert_eq!(
        replay.headers()["idempotent-replayed"],
        "true",
        "a 500 is now stored"
    );
    assert_eq!(text(replay).await, "error 3");
}

#[tokio::test]
async fn the_stored_header_allow_list_is_configurable() {
    let f = fixture(|c| {
        c.stored_headers = vec![
            HeaderName::from_static("set-cookie"),
            HeaderName::from_static("x-trace"),
        ]
    });
    call(&f.router, "/headers", Some("k")).await;
    let replay = call(&f.router, "/headers", Some("k")).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.headers()["set-cookie"], "a=b");
    assert_eq!(replay.headers()["x-trace"], "t");
    assert!(!replay.headers().contains_key("etag"));
}

#[tokio::test]
async fn an_optional_key_left_out_passes_through_untouched() {
    let f = fixture(|c| c.key_required = false);
    for _ in 0..2 {
        let response = call(&f.router, "/headers", None).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert!(!response.headers().contains_key("idempotent-replayed"));
    }
    assert_eq!(f.handler.calls.load(Ordering::SeqCst), 2);
    assert_eq!(f.layer.counts().get(Outcome::NoKey), 2);
    let malformed = call(&f.router, "/headers", Some("")).await;
    assert_eq!(
        malformed.status(),
        StatusCode::BAD_REQUEST,
        "a bad key is still refused"
    );
}

#[tokio::test]
async fn layers_made_with_config_share_counts_and_store() {
    let f = fixture(|_| {});
    let other = f
        .layer
        .with_config(IdempotencyConfig::new(Duration::from_secs(60), LEASE));
    let router = Router::new()
        .route("/error", post(error))
        .route_layer(other.clone())
        .with_state(f.handler.clone())
        .layer(middleware::from_fn(with_scope));
    call(&router, "/error", Some("x")).await;
    assert_eq!(f.layer.counts().get(Outcome::Released), 1);
    assert_eq!(other.config().key_ttl, Duration::from_secs(60));
}
