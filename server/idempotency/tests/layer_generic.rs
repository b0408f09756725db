//! The layer on its own, around plain handlers: what any axum app that opts in gets.

mod memory_store;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use idemlog::Durability;
use idemlog_idempotency::{IdempotencyConfig, IdempotencyLayer, Outcome, Scope};
use tower::ServiceExt;

struct Fixture {
    router: Router,
    layer: IdempotencyLayer,
    calls: Arc<AtomicU64>,
}

async fn with_scope(mut request: Request, next: Next) -> Response {
    request.extensions_mut().insert(Scope::new("tenant"));
    next.run(request).await
}

fn fixture() -> Fixture {
    fixture_with(Durability::Sync)
}

/// `Durability::None` makes the layer call the store inline instead of on the blocking pool.
fn fixture_with(durability: Durability) -> Fixture {
    let store = memory_store::open(durability);
    let mut config = IdempotencyConfig::new(Duration::from_secs(3600), Duration::from_secs(30));
    config.max_response_bytes = 1024;
    let layer = IdempotencyLayer::new(Arc::new(store), config);
    let calls = Arc::new(AtomicU64::new(0));
    let idempotent = Router::new()
        .route("/ok", post(ok))
        .route("/fail", post(fail))
        .route("/panic", post(panics))
        .route("/cookie", post(cookie))
        .route("/huge", post(huge))
        .route_layer(layer.clone());
    let router = Router::new()
        .merge(idempotent)
        .route("/plain", post(ok))
        .with_state(Arc::clone(&calls))
        .layer(middleware::from_fn(with_scope))
        .route(
            "/unscoped",
            post(|| async { "unreachable" }).route_layer(layer.clone()),
        );
    Fixture {
        router,
        layer,
        calls,
    }
}

async fn ok(State(calls): State<Arc<AtomicU64>>) -> Response {
    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
    (StatusCode::CREATED, format!("call {n}")).into_response()
}

async fn fail(State(calls): State<Arc<AtomicU64>>) -> Response {
    calls.fetch_add(1, Ordering::SeqCst);
    (StatusCode::INTERNAL_SERVER_ERROR, "boom").into_response()
}

async fn panics(State(calls): State<Arc<AtomicU64>>) -> Response {
    calls.fetch_add(1, Ordering::SeqCst);
    panic!("handler bug");
}

async fn cookie() -> Response {
    (
        StatusCode::OK,
        [
            ("set-cookie", "session=first-caller-only"),
            ("etag", "\"v1\""),
        ],
        "with cookie",
    )
        .into_response()
}

async fn huge() -> Response {
    (StatusCode::OK, "x".repeat(2048)).into_response()
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

#[tokio::test]
async fn a_completed_key_runs_the_handler_once() {
    completed_key_runs_once(fixture()).await;
}

#[tokio::test]
async fn a_completed_key_runs_the_handler_once_with_inline_store_calls() {
    completed_key_runs_once(fixture_with(Durability::None)).await;
}

async fn completed_key_runs_once(f: Fixture) {
    assert_eq!(
        text(call(&f.router, "/ok", Some("k")).await).await,
        "call 1"
    );
    let replay = call(&f.router, "/ok", Some("k")).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(text(replay).await, "call 1");
    assert_eq!(f.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_server_error_is_not_stored_and_releases_the_key() {
    let f = fixture();
    let first = call(&f.router, "/fail", Some("k")).await;
    assert_eq!(first.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let second = call(&f.router, "/fail", Some("k")).await;
    assert_eq!(second.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(second.headers().get("idempotent-replayed").is_none());
    assert_eq!(f.calls.load(Ordering::SeqCst), 2, "the retry ran again");
    assert_eq!(f.layer.counts().get(Outcome::Released), 2);
}

#[tokio::test]
async fn a_panicking_handler_releases_the_key_and_answers_500() {
    panicking_handler(fixture()).await;
}

#[tokio::test]
async fn a_panicking_handler_releases_the_key_and_answers_500_with_inline_store_calls() {
    panicking_handler(fixture_with(Durability::None)).await;
}

async fn panicking_handler(f: Fixture) {
    let first = call(&f.router, "/panic", Some("k")).await;
    assert_eq!(first.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(first.headers()["content-type"], "application/problem+json");
    let second = call(&f.router, "/panic", Some("k")).await;
    assert_eq!(second.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(f.calls.load(Ordering::SeqCst), 2, "the key was free again");
}

#[tokio::test]
async fn set_cookie_is_never_replayed_but_etag_is() {
    let f = fixture();
    let first = call(&f.router, "/cookie", Some("k")).await;
    assert!(
        first.headers().get("set-cookie").is_some(),
        "the first caller gets it"
    );
    let replay = call(&f.router, "/cookie", Some("k")).await;
    assert!(replay.headers().get("set-cookie").is_none());
    assert_eq!(replay.headers()["etag"], "\"v1\"");
}

#[tokio::test]
async fn a_response_too_large_to_store_is_sent_whole_and_never_run_twice() {
    let f = fixture();
    let first = call(&f.router, "/huge", Some("k")).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(
        text(first).await,
        "x".repeat(2048),
        "the first caller gets every byte"
    );
    let second = call(&f.router, "/huge", Some("k")).await;
    assert_eq!(
        second.status(),
        StatusCode::OK,
        "the replay keeps the status"
    );
    assert_eq!(second.headers()["idempotent-replayed"], "true");
    assert_eq!(second.headers()["content-type"], "application/problem+json");
    let body = text(second).await;
    assert!(body.contains("response-body-not-kept"), "{body}");
    assert!(body.contains("completed with status 200"), "{body}");
    assert_eq!(
        f.calls.load(Ordering::SeqCst),
        0,
        "the /huge handler counts nothing"
    );
    assert_eq!(f.layer.counts().get(Outcome::Executed), 1);
    assert_eq!(f.layer.counts().get(Outcome::Replayed), 1);
    assert_eq!(f.layer.counts().get(Outcome::Released), 0);
}

#[tokio::test]
async fn routes_without_the_layer_need_no_key() {
    let f = fixture();
    let plain = call(&f.router, "/plain", None).await;
    assert_eq!(plain.status(), StatusCode::CREATED);
    let guarded = call(&f.router, "/ok", None).await;
    assert_eq!(guarded.status(), StatusCode::BAD_REQUEST);
    assert_eq!(f.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_request_without_a_scope_is_401() {
    let f = fixture();
    let response = call(&f.router, "/unscoped", Some("k")).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(f.layer.counts().get(Outcome::Unauthenticated), 1);
}

#[tokio::test]
async fn a_layer_under_nest_fingerprints_the_full_path() {
    let f = fixture();
    // One layer (one store) serving the same inner route under two prefixes: `nest` strips the
    // prefix from the URI the layer sees, so without the original URI both fingerprinted as `/ok`
    // and the second call was served the first one's response.
    let inner = Router::new()
        .route("/ok", post(ok))
        .route_layer(f.layer.clone())
        .with_state(Arc::clone(&f.calls));
    let router = Router::new()
        .nest("/v1", inner.clone())
        .nest("/v2", inner)
        .layer(middleware::from_fn(with_scope));
    assert_eq!(
        call(&router, "/v1/ok", Some("k")).await.status(),
        StatusCode::CREATED
    );
    let other_path = call(&router, "/v2/ok", Some("k")).await;
    assert_eq!(other_path.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(f.calls.load(Ordering::SeqCst), 1);
}
