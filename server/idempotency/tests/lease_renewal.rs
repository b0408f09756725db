//! Lease renewal: a handler that runs longer than the lease keeps its key while it is alive.
//!
//! The store's clock is manual (leases are judged by it); the renewal timer runs on tokio's clock
//! every few milliseconds, and the tests wait for its effect on the stored lease rather than for a
//! fixed time.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use idemlog::testkit::FaultyStorage;
use idemlog::{ManualClock, Options, RecordState, Store};
use idemlog_idempotency::backends::embedded::EmbeddedBackend;
use idemlog_idempotency::{IdempotencyConfig, IdempotencyLayer, Scope};
use tokio::sync::{Notify, Semaphore};
use tower::ServiceExt;

const START_MS: u64 = 1_700_000_000_000;
const LEASE: Duration = Duration::from_secs(30);

struct Fixture {
    router: Router,
    store: Store,
    clock: ManualClock,
    /// Handler runs so far.
    calls: Arc<AtomicU64>,
    /// Signalled when a handler starts.
    entered: Arc<Notify>,
    /// Handlers wait here for a permit (and give it back).
    gate: Arc<Semaphore>,
}

#[derive(Clone)]
struct Slow {
    calls: Arc<AtomicU64>,
    entered: Arc<Notify>,
    gate: Arc<Semaphore>,
}

async fn slow(State(slow): State<Slow>) -> Response {
    let n = slow.calls.fetch_add(1, Ordering::SeqCst) + 1;
    slow.entered.notify_one();
    let _permit = slow.gate.acquire().await.expect("gate open");
    (StatusCode::CREATED, format!("call {n}")).into_response()
}

async fn with_scope(mut request: Request, next: Next) -> Response {
    request.extensions_mut().insert(Scope::new("tenant"));
    next.run(request).await
}

fn fixture(heartbeat: Option<Duration>) -> Fixture {
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
    config.heartbeat = heartbeat;
    let state = Slow {
        calls: Arc::new(AtomicU64::new(0)),
        entered: Arc::new(Notify::new()),
        gate: Arc::new(Semaphore::new(0)),
    };
    let router = Router::new()
        .route("/slow", post(slow))
        .route_layer(IdempotencyLayer::new(Arc::new(embedded), config))
        .with_state(state.clone())
        .layer(middleware::from_fn(with_scope));
    Fixture {
        router,
        store,
        clock,
        calls: state.calls,
        entered: state.entered,
        gate: state.gate,
    }
}

async fn call(router: Router) -> Response {
    let request = Request::post("/slow")
        .header("idempotency-key", "k")
        .body(Body::empty())
        .expect("request");
    router.oneshot(request).await.expect("infallible")
}

fn lease_until(store: &Store) -> u64 {
    match store.get(b"tenant", b"k").expect("get").map(|r| r.state) {
        Some(RecordState::InProgress { lease_until_ms }) => lease_until_ms,
        other => panic!("expected an in-progress record, found {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_handler_keeps_its_key_past_the_first_lease() {
    let f = fixture(Some(Duration::from_millis(5)));
    let first = tokio::spawn(call(f.router.clone()));
    f.entered.notified().await;
    assert_eq!(lease_until(&f.store), START_MS + LEASE.as_millis() as u64);

    // 25 s later by the store's clock, a renewal moves the lease to 25 s + 30 s.
    f.clock.advance(Duration::from_secs(25));
    let renewed = START_MS + 55_000;
    let deadline = Instant::now() + Duration::from_secs(10);
    while lease_until(&f.store) < renewed {
        assert!(Instant::now() < deadline, "the lease was never renewed");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }

    // 35 s after the claim, past its first lease: a retry still finds the key held.
    f.clock.advance(Duration::from_secs(10));
    let retry = call(f.router.clone()).await;
    assert_eq!(retry.status(), StatusCode::CONFLICT);
    assert_eq!(f.calls.load(Ordering::SeqCst), 1);

    f.gate.add_permits(1);
    let first = first.await.expect("first request");
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(f.calls.load(Ordering::SeqCst), 1, "the handler ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_renewal_a_retry_takes_the_key_over_after_the_lease() {
    let f = fixture(None);
    let first = tokio::spawn(call(f.router.clone()));
    f.entered.notified().await;

    f.clock.advance(Duration::from_secs(35));
    let retry = tokio::spawn(call(f.router.clone()));
    f.entered.notified().await;
    assert_eq!(f.calls.load(Ordering::SeqCst), 2, "the retry took over");

    f.gate.add_permits(1);
    assert_eq!(
        retry.await.expect("retry").status(),
        StatusCode::CREATED,
        "the new holder completes"
    );
    let first = first.await.expect("first request");
    assert_ne!(
        first.status(),
        StatusCode::INTERNAL_SERVER_ERROR,
        "the overtaken holder gets the winner's response or a 409, never a failure"
    );
}
