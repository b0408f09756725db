//! Issue 23's in-process request benchmark: one `POST /payments` through the server's real router
//! (request context, trace span, HTTP metrics, problem mapping, body limit, authentication, the
//! idempotency layer, the payment handler and its provider) on the embedded store, without a socket.
//!
//! It isolates the user-space CPU a request costs us from the kernel's TCP work and from the load
//! generator competing for the same two cores, which makes wrk's per-request figures swing by ±15 %
//! between runs on this machine; a change to the request path shows here at the 1–2 % level first,
//! and then in the wrk pairs of benches/NOTEBOOK.md. The store runs with `Durability::None` (no fdatasync
//! wait: that part is the engine's own benchmark, `store`), one caller, one current-thread runtime.
//!
//! Groups (one iteration = one request, answered and its body read):
//! - `request/new_key/{log}`: a new `Idempotency-Key` each time (claim, charge, complete);
//! - `request/replay/{log}`: the same key again (a stored response replayed);
//!
//! with `log` = `info` (the server's subscriber and default filter, lines written to a sink through
//! the same batching writer) or `off` (no subscriber: what logging costs is the difference).
//!
//! Run with `cargo bench -p idemlog-benches --bench router`. Times on this machine's shared cores
//! swing by ±10 % between runs; instruction counts do not. With `IDEMLOG_ROUTER_REQUESTS=n` set
//! (and `IDEMLOG_ROUTER_KIND=new_key`, `replay` or `no_layer` (new keys with `--idempotency off`:
//! what the layer costs is the difference), `IDEMLOG_ROUTER_LOG=info` or `off`) the bench
//! sends n requests of that kind and exits without criterion, for
//! `valgrind --tool=callgrind`: the difference between two such runs' instruction totals
//! divided by the difference of their n is the instructions one request costs.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group};
use idemlog::{Durability, Options};
use idemlog_benches::ScratchDir;
use idemlog_idempotency::FingerprintMode;
use idemlog_idempotency::backends::embedded::EmbeddedBackend;
use idemlog_server::auth::ApiKeys;
use idemlog_server::config::LogFormat;
use idemlog_server::log_buffer::log_buffer;
use idemlog_server::router::{RouterConfig, Services, router};
use idemlog_server::telemetry::log_subscriber;
use tower::ServiceExt;
use tracing_subscriber::EnvFilter;

/// The server binary's allocator, so that allocation costs what it costs there.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const API_KEY: &str = "sk_bench";
const ACCOUNT: &str = "acct_bench";
const BODY: &str = r#"{"amount": 100.00, "currency": "BRL"}"#;

/// The server's defaults where they matter to a request (`--key-ttl`, `--lease`, body limits),
/// with the idempotency layer on or off (`--idempotency off`).
fn config(idempotency: bool) -> RouterConfig {
    RouterConfig {
        key_ttl: Duration::from_secs(24 * 3600),
        lease: Duration::from_secs(30),
        retry_after: Duration::from_secs(1),
        max_body_bytes: 64 * 1024,
        max_response_bytes: 64 * 1024,
        fingerprint: FingerprintMode::default(),
        gateway_latency: Duration::ZERO,
        gateway_fail_after_charge: 0,
        idempotency,
        max_live_keys_per_account: 0,
    }
}

fn payment(key: &str) -> Request<Body> {
    Request::post("/payments")
        .header("authorization", format!("Bearer {API_KEY}"))
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(Body::from(BODY))
        .expect("a valid request")
}

async fn send(app: &Router, request: Request<Body>) -> usize {
    let response = app.clone().oneshot(request).await.expect("infallible");
    assert_eq!(response.status(), StatusCode::CREATED, "the payment failed");
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("a full body");
    body.len()
}

/// The router on a fresh embedded store, with the replayed key already completed.
fn app(rt: &tokio::runtime::Runtime, dir: &ScratchDir, idempotency: bool) -> (Services, Router) {
    let options = Options::default().durability(Durability::None);
    let store = EmbeddedBackend::open(dir.path(), options).expect("open the store");
    let keys = ApiKeys::new(&[(API_KEY.to_owned(), ACCOUNT.to_owned())]).expect("keys");
    let services = Services::new(Arc::new(store.clone()), keys, &config(idempotency));
    let app = router(&services);
    rt.block_on(send(&app, payment("replayed")));
    (services, app)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// `IDEMLOG_ROUTER_REQUESTS=n`: n requests of one kind, no timing (see the module docs).
fn count_run(n: u64) {
    let kind = std::env::var("IDEMLOG_ROUTER_KIND").unwrap_or_else(|_| "new_key".to_owned());
    let log = std::env::var("IDEMLOG_ROUTER_LOG").unwrap_or_else(|_| "info".to_owned());
    let rt = runtime();
    let dir = ScratchDir::new("router-count");
    let (writer, _guard) = log_buffer(std::io::sink()).expect("log writer thread");
    let subscriber = log_subscriber(EnvFilter::new(&log), LogFormat::Text, writer, false);
    tracing::subscriber::with_default(subscriber, || {
        let (services, app) = app(&rt, &dir, kind != "no_layer");
        for i in 0..n {
            let key = match kind.as_str() {
                "replay" => "replayed".to_owned(),
                _ => format!("k-{i}"),
            };
            black_box(rt.block_on(send(&app, payment(&key))));
        }
        rt.block_on(async { services.store.close().await })
            .expect("close the store");
    });
}

fn bench_requests(c: &mut Criterion) {
    let rt = runtime();
    let dir = ScratchDir::new("router-bench");
    let (services, app) = app(&rt, &dir, true);
    let next = AtomicU64::new(0);

    let mut group = c.benchmark_group("request");
    group.throughput(Throughput::Elements(1));
    for log in ["info", "off"] {
        let (writer, _guard) = log_buffer(std::io::sink()).expect("log writer thread");
        let subscriber = log_subscriber(EnvFilter::new(log), LogFormat::Text, writer, false);
        let dispatch = tracing::Dispatch::new(subscriber);
        tracing::dispatcher::with_default(&dispatch, || {
            group.bench_function(BenchmarkId::new("new_key", log), |b| {
                b.iter_batched(
                    || payment(&format!("k-{}", next.fetch_add(1, Ordering::Relaxed))),
                    |request| black_box(rt.block_on(send(&app, request))),
                    BatchSize::SmallInput,
                )
            });
            group.bench_function(BenchmarkId::new("replay", log), |b| {
                b.iter_batched(
                    || payment("replayed"),
                    |request| black_box(rt.block_on(send(&app, request))),
                    BatchSize::SmallInput,
                )
            });
        });
    }
    group.finish();
    rt.block_on(async { services.store.close().await })
        .expect("close the store");
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(5));
    targets = bench_requests
}
fn main() {
    if let Some(n) = std::env::var("IDEMLOG_ROUTER_REQUESTS")
        .ok()
        .and_then(|n| n.parse().ok())
    {
        count_run(n);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
