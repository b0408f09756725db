//! What the layer does when the handler ran but its response could not be recorded
//! (`IdempotencyConfig::unrecorded_response`): the store's disk fills up under the completion, the
//! store refuses the value, or the response body fails while it is read.
//!
//! The store is the embedded engine on the in-memory `FaultyStorage`, opened as a reverse proxy
//! opens it (`RecoveredClaims::HeldUntilLeaseEnd`), with a manual clock so a lease runs out exactly
//! when a test says. A write failure poisons the engine, which then heals by itself (closes and
//! reopens the directory, about 100 ms later): meanwhile requests get 503.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use idemlog::testkit::{FaultOp, FaultyStorage};
use idemlog::{ManualClock, Options, RecordState, RecoveredClaims};
use idemlog_idempotency::backends::embedded::EmbeddedBackend;
use idemlog_idempotency::store::{Health, IdempotencyStore};
use idemlog_idempotency::{
    IdempotencyConfig, IdempotencyLayer, Outcome, Scope, UnrecordedResponse,
};
use tower::ServiceExt;

const START_MS: u64 = 1_700_000_000_000;
const LEASE: Duration = Duration::from_secs(30);
/// The store's largest value: smaller than the layer's `max_response_bytes` (4 MiB by default), as
/// when the layer is configured above its store's limit.
const STORE_MAX_VALUE: usize = 1024;

#[derive(Clone)]
struct Handler {
    calls: Arc<AtomicU64>,
    fs: FaultyStorage,
}

struct Fixture {
    router: Router,
    layer: IdempotencyLayer,
    backend: EmbeddedBackend,
    clock: ManualClock,
    handler: Handler,
}

async fn with_scope(mut request: Request, next: Next) -> Response {
    request.extensions_mut().insert(Scope::new("tenant"));
    next.run(request).await
}

/// Its first call fills the disk under the completion that follows it (the next log write fails
/// with `StorageFull`); every call answers 201 naming itself.
async fn charge(State(h): State<Handler>) -> Response {
    let n = h.calls.fetch_add(1, Ordering::SeqCst) + 1;
    if n == 1 {
        h.fs.fail_op(FaultOp::Write, ".seg", 1, std::io::ErrorKind::StorageFull);
    }
    (
        StatusCode::CREATED,
        [("location", format!("/charges/{n}"))],
        format!("charged {n}"),
    )
        .into_response()
}

/// A body larger than the store's largest value, within the layer's limit.
async fn big(State(h): State<Handler>) -> Response {
    let n = h.calls.fetch_add(1, Ordering::SeqCst) + 1;
    (
        StatusCode::CREATED,
        [("location", format!("/reports/{n}"))],
        "x".repeat(2 * STORE_MAX_VALUE),
    )
        .into_response()
}

/// A stored header longer than the store takes (8 KiB), so the response is refused with or
/// without its body.
async fn huge_header(State(h): State<Handler>) -> Response {
    h.calls.fetch_add(1, Ordering::SeqCst);
    let location = format!("/made/{}", "y".repeat(9 * 1024));
    (StatusCode::CREATED, [("location", location)], "made").into_response()
}

/// A body whose stream fails, as a connection lost mid-body would.
struct Broken;

impl HttpBody for Broken {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        Poll::Ready(Some(Err(std::io::Error::other("connection lost mid-body"))))
    }
}

async fn broken(State(h): State<Handler>) -> Response {
    h.calls.fetch_add(1, Ordering::SeqCst);
    (StatusCode::CREATED, Body::new(Broken)).into_response()
}

fn fixture(unrecorded: UnrecordedResponse) -> Fixture {
    let clock = ManualClock::new(START_MS);
    let fs = FaultyStorage::new();
    let backend = EmbeddedBackend::open(
        "/data",
        Options::default()
            .storage(Arc::new(fs.clone()))
            .clock(Arc::new(clock.clone()))
            .lease(LEASE)
            .max_value_bytes(STORE_MAX_VALUE)
            .recovered_claims(RecoveredClaims::HeldUntilLeaseEnd),
    )
    .expect("store");
    let mut config = IdempotencyConfig::new(Duration::from_secs(3600), LEASE);
    config.unrecorded_response = unrecorded;
    let layer = IdempotencyLayer::new(Arc::new(backend.clone()), config);
    let handler = Handler {
        calls: Arc::new(AtomicU64::new(0)),
        fs,
    };
    let router = Router::new()
        .route("/charge", post(charge))
        .route("/big", post(big))
        .route("/huge-header", post(huge_header))
        .route("/broken", post(broken))
        .route_layer(layer.clone())
        .with_state(handler.clone())
        .layer(middleware::from_fn(with_scope));
    Fixture {
        router,
        layer,
        backend,
        clock,
        handler,
    }
}

impl Fixture {
    async fn call(&self, path: &str) -> Response {
        let request = Request::post(path)
            .header("idempotency-key", "k")
            .body(Body::empty())
            .expect("request");
        match self.router.clone().oneshot(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        }
    }

    fn calls(&self) -> u64 {
        self.handler.calls.load(Ordering::SeqCst)
    }

    fn count(&self, outcome: Outcome) -> u64 {
        self.layer.counts().get(outcome)
    }

    /// Waits until the store has reopened after a failure.
    async fn healed(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.backend.health() != Health::Ready {
            assert!(Instant::now() < deadline, "the store did not heal");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The key's record, read from the engine.
    fn state(&self) -> Option<RecordState> {
        let engine = self.backend.engine().expect("store open");
        engine
            .get(b"tenant", b"k")
            .expect("get")
            .map(|record| record.state)
    }
}

async fn text(response: Response) -> String {
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("body");
    String::from_utf8_lossy(&bytes).into_owned()
}

fn assert_held(f: &Fixture) {
    match f.state() {
        Some(RecordState::InProgress { lease_until_ms }) => {
            assert_eq!(lease_until_ms, START_MS + LEASE.as_millis() as u64);
        }
        other => panic!("expected the key held in progress, found {other:?}"),
    }
}

#[tokio::test]
async fn by_default_a_completion_on_a_full_disk_is_a_503_and_a_later_retry_runs_again() {
    let f = fixture(UnrecordedResponse::default());
    let first = f.call("/charge").await;
    assert_eq!(first.status(), StatusCode::SERVICE_UNAVAILABLE);
    let problem = text(first).await;
    assert!(
        problem.contains("retry with the same Idempotency-Key"),
        "{problem}"
    );
    assert_eq!(f.count(Outcome::StoreError), 1);
    assert_eq!(f.count(Outcome::Unrecorded), 0);

    f.healed().await;
    assert_held(&f);
    // The retry the 503 asked for runs the handler again once the lease is over: safe only when
    // the handler's effect is deduplicated downstream.
    f.clock.advance(LEASE + Duration::from_secs(1));
    let retry = f.call("/charge").await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(text(retry).await, "charged 2");
    assert_eq!(f.calls(), 2);
}

#[tokio::test]
async fn sent_and_held_a_completion_on_a_full_disk_sends_the_handlers_response_and_holds_the_key() {
    let f = fixture(UnrecordedResponse::SendAndHold);
    let first = f.call("/charge").await;
    assert_eq!(
        first.status(),
        StatusCode::CREATED,
        "the handler's own status"
    );
    assert_eq!(first.headers()["location"], "/charges/1");
    assert!(!first.headers().contains_key("idempotent-replayed"));
    assert_eq!(text(first).await, "charged 1", "the handler's own body");
    assert_eq!(f.calls(), 1);
    assert_eq!(f.count(Outcome::Unrecorded), 1);
    assert_eq!(f.count(Outcome::StoreError), 0);
    assert_eq!(f.count(Outcome::Executed), 0);

    // While the store reopens, a retry is refused (503); once it has, the key is found held.
    let during = f.call("/charge").await.status();
    assert!(
        during == StatusCode::SERVICE_UNAVAILABLE || during == StatusCode::CONFLICT,
        "{during}"
    );
    f.healed().await;
    assert_held(&f);
    let retry = f.call("/charge").await;
    assert_eq!(retry.status(), StatusCode::CONFLICT);
    assert!(retry.headers().contains_key("retry-after"));
    // Until the last moment of the lease, nothing runs the handler a second time.
    f.clock.advance(LEASE - Duration::from_secs(1));
    assert_eq!(f.call("/charge").await.status(), StatusCode::CONFLICT);
    assert_eq!(f.calls(), 1, "the handler ran once");
}

#[tokio::test]
async fn sent_and_held_a_key_runs_again_once_its_lease_has_run_out() {
    // The risk this setting leaves, documented on `UnrecordedResponse::SendAndHold`.
    let f = fixture(UnrecordedResponse::SendAndHold);
    assert_eq!(f.call("/charge").await.status(), StatusCode::CREATED);
    f.healed().await;
    f.clock.advance(LEASE + Duration::from_secs(1));
    let later = f.call("/charge").await;
    assert_eq!(later.status(), StatusCode::CREATED);
    assert_eq!(text(later).await, "charged 2");
    assert_eq!(f.count(Outcome::TakenOver), 1);
}

#[tokio::test]
async fn sent_and_held_a_body_the_store_refuses_completes_the_key_without_it() {
    let f = fixture(UnrecordedResponse::SendAndHold);
    let first = f.call("/big").await;
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(text(first).await.len(), 2 * STORE_MAX_VALUE, "sent whole");

    let replay = f.call("/big").await;
    assert_eq!(replay.status(), StatusCode::CREATED, "the original status");
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.headers()["location"], "/reports/1");
    assert_eq!(replay.headers()["content-type"], "application/problem+json");
    let body = text(replay).await;
    assert!(
        body.contains("urn:idemlog:problem:response-body-not-kept"),
        "{body}"
    );
    assert!(body.contains("completed with status 201"), "{body}");
    assert_eq!(f.calls(), 1);
    assert_eq!(f.count(Outcome::Executed), 1);
    assert_eq!(f.count(Outcome::Unrecorded), 0);
    assert_eq!(f.count(Outcome::Released), 0);
}

#[tokio::test]
async fn by_default_a_body_the_store_refuses_releases_the_key_with_a_500() {
    let f = fixture(UnrecordedResponse::Retry);
    for _ in 0..2 {
        let response = f.call("/big").await;
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
    assert_eq!(f.calls(), 2, "released: the retry ran again at once");
    assert_eq!(f.count(Outcome::Released), 2);
    assert_eq!(f.state(), None, "nothing left of the key");
}

#[tokio::test]
async fn sent_and_held_a_response_refused_even_without_its_body_is_sent_unrecorded() {
    let f = fixture(UnrecordedResponse::SendAndHold);
    let first = f.call("/huge-header").await;
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(text(first).await, "made");
    assert_eq!(f.count(Outcome::Unrecorded), 1);
    // A refusal does not take the store out of service: the retry finds the key held at once.
    assert_held(&f);
    assert_eq!(f.call("/huge-header").await.status(), StatusCode::CONFLICT);
    assert_eq!(f.calls(), 1);
}

#[tokio::test]
async fn sent_and_held_a_body_that_fails_while_read_holds_the_key() {
    let f = fixture(UnrecordedResponse::SendAndHold);
    let first = f.call("/broken").await;
    assert_eq!(first.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let problem = text(first).await;
    assert!(
        problem.contains("urn:idemlog:problem:response-unreadable"),
        "{problem}"
    );
    assert_eq!(f.count(Outcome::Unrecorded), 1);
    assert_held(&f);
    assert_eq!(f.call("/broken").await.status(), StatusCode::CONFLICT);
    assert_eq!(f.calls(), 1);
}

#[tokio::test]
async fn by_default_a_body_that_fails_while_read_releases_the_key() {
    let f = fixture(UnrecordedResponse::Retry);
    for _ in 0..2 {
        assert_eq!(
            f.call("/broken").await.status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }
    assert_eq!(f.calls(), 2);
    assert_eq!(f.count(Outcome::Released), 2);
}

#[test]
fn the_default_setting_lets_a_retry_run_again() {
    let config = IdempotencyConfig::new(Duration::from_secs(60), LEASE);
    assert_eq!(config.unrecorded_response, UnrecordedResponse::Retry);
}
