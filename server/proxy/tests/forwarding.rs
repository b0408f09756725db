//! The proxy's request path in process, against a small axum upstream: what the upstream sees
//! (fencing token, forwarded headers, hop-by-hop headers removed) and how the two upstream failures
//! settle a key (connect refused → 502 and released; timeout → 504 and held until the lease ends),
//! and an upstream answer the store cannot record (sent to the client, the key held).
//! The end-to-end tests of the binary against an upstream in another language are in `tests/`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::routing::post;
use clap::Parser;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idemlog::testkit::{FaultOp, FaultyStorage};
use idemlog::{ManualClock, Options, RecoveredClaims};
use idemlog_idempotency::backends::embedded::EmbeddedBackend;
use idemlog_idempotency::store::{Health, IdempotencyStore};
use idemlog_proxy::app::App;
use idemlog_proxy::cli::Cli;
use idemlog_proxy::config::{RouteSettings, parse_rules};
use idemlog_proxy::forward::Upstream;
use idemlog_proxy::metrics::UpstreamMetrics;
use idemlog_proxy::scope::ScopeSource;
use idemlog_proxy::serve::{Limits, connection_permits, serve};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// The upstream: `/echo` answers with the headers it got, `/slow` takes 2 s; both count calls.
async fn upstream() -> (SocketAddr, Arc<AtomicU64>) {
    let calls = Arc::new(AtomicU64::new(0));
    async fn echo(State(calls): State<Arc<AtomicU64>>, headers: HeaderMap) -> String {
        calls.fetch_add(1, Ordering::SeqCst);
        let mut lines: Vec<String> = headers
            .iter()
            .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap_or("?")))
            .collect();
        lines.sort();
        lines.join("\n")
    }
    async fn slow(State(calls): State<Arc<AtomicU64>>) -> &'static str {
        calls.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(2)).await;
        "late"
    }
    let app = Router::new()
        .route("/echo", post(echo).get(echo).put(echo))
        .route("/slow", post(slow))
        .with_state(Arc::clone(&calls));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, calls)
}

struct Proxy {
    addr: SocketAddr,
    _stop: oneshot::Sender<()>,
}

async fn proxy(upstream: &str) -> Proxy {
    proxy_with_rules(upstream, "").await
}

/// The store the proxy's flags open, on the engine's in-memory storage and a manual clock.
fn store_on(fs: &FaultyStorage) -> EmbeddedBackend {
    EmbeddedBackend::open(
        "/data",
        Options::default()
            .storage(Arc::new(fs.clone()))
            .clock(Arc::new(ManualClock::new(1_700_000_000_000)))
            .lease(LEASE)
            .recovered_claims(RecoveredClaims::HeldUntilLeaseEnd),
    )
    .expect("store")
}

const LEASE: Duration = Duration::from_secs(30);

async fn proxy_with_rules(upstream: &str, rules: &str) -> Proxy {
    proxy_on(upstream, rules, store_on(&FaultyStorage::new())).await
}

async fn proxy_on(upstream: &str, rules: &str, store: EmbeddedBackend) -> Proxy {
    let lease = format!("{}s", LEASE.as_secs());
    let cli = Cli::try_parse_from([
        "idemlog-proxy",
        "--upstream",
        upstream,
        "--static-scope",
        "shop",
        "--upstream-timeout",
        "300ms",
        "--lease",
        &lease,
    ])
    .expect("flags");
    let upstream = Upstream::new(
        &cli.upstream,
        cli.upstream_timeout,
        UpstreamMetrics::default(),
    )
    .expect("upstream");
    let scope = ScopeSource::from_cli(&cli).expect("scope");
    let defaults = RouteSettings::defaults(&cli);
    let rules = parse_rules(rules, "rules.toml", &defaults).expect("rules");
    let app = App::new(Arc::new(store), Arc::new(upstream), scope, &defaults, rules);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let limits = Limits {
        grace: Duration::from_secs(1),
        body_read_timeout: Duration::from_secs(5),
    };
    tokio::spawn(serve(
        listener,
        app,
        async move {
            let _ = stopped.await;
        },
        limits,
        connection_permits(16),
    ));
    Proxy { addr, _stop: stop }
}

async fn send(
    proxy: &Proxy,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, HeaderMap, String) {
    let client: Client<HttpConnector, Body> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let mut request = Request::builder()
        .method(method)
        .uri(format!("http://{}{path}", proxy.addr));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = client
        .request(request.body(Body::from("{}")).expect("request"))
        .await
        .expect("response");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

#[tokio::test]
async fn the_upstream_gets_the_claims_fencing_token_and_forwarded_headers_only() {
    let (up, calls) = upstream().await;
    let p = proxy(&format!("http://{up}")).await;
    let (status, _, seen) = send(
        &p,
        "POST",
        "/echo",
        &[
            ("idempotency-key", "k1"),
            ("idempotency-fencing-token", "999999"),
            ("connection", "x-hop"),
            ("x-hop", "secret"),
            ("content-type", "application/json"),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{seen}");
    assert!(seen.contains("idempotency-key: k1"), "{seen}");
    assert!(
        !seen.contains("999999"),
        "a client's token never reaches the upstream: {seen}"
    );
    let token = seen
        .lines()
        .find_map(|l| l.strip_prefix("idempotency-fencing-token: "))
        .expect("a fencing token");
    assert!(token.parse::<u64>().is_ok(), "{token}");
    assert!(
        !seen.contains("x-hop"),
        "headers named by Connection are removed: {seen}"
    );
    assert!(seen.contains("x-forwarded-for: 127.0.0.1"), "{seen}");
    assert!(seen.contains("x-forwarded-proto: http"), "{seen}");
    assert!(
        seen.contains("forwarded: for=127.0.0.1;proto=http"),
        "{seen}"
    );
    assert!(seen.contains(&format!("host: {up}")), "{seen}");

    // The replay is the stored response, byte for byte, and the upstream ran once.
    let (status, headers, replay) = send(
        &p,
        "POST",
        "/echo",
        &[
            ("idempotency-key", "k1"),
            ("content-type", "application/json"),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(replay, seen);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_pass_through_request_loses_a_clients_fencing_token_and_gets_none() {
    let (up, _) = upstream().await;
    let p = proxy(&format!("http://{up}")).await;
    let (status, headers, seen) =
        send(&p, "GET", "/echo", &[("idempotency-fencing-token", "7")]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!headers.contains_key("idempotent-replayed"));
    assert!(!seen.contains("idempotency-fencing-token"), "{seen}");
}

#[tokio::test]
async fn an_unreachable_upstream_is_a_502_and_releases_the_key() {
    // A port that was free a moment ago: nothing listens there.
    let closed = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = closed.local_addr().expect("addr");
    drop(closed);
    let p = proxy(&format!("http://{addr}")).await;
    for _ in 0..2 {
        let (status, headers, body) = send(&p, "POST", "/x", &[("idempotency-key", "k")]).await;
        assert_eq!(
            status,
            StatusCode::BAD_GATEWAY,
            "released, so never a 409: {body}"
        );
        assert_eq!(headers["content-type"], "application/problem+json");
    }
}

#[tokio::test]
async fn an_upstream_timeout_is_a_504_and_the_key_stays_in_progress() {
    let (up, calls) = upstream().await;
    let p = proxy(&format!("http://{up}")).await;
    let (status, _, body) = send(&p, "POST", "/slow", &[("idempotency-key", "s")]).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
    assert!(body.contains("upstream-timeout"), "{body}");
    let (status, headers, _) = send(&p, "POST", "/slow", &[("idempotency-key", "s")]).await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "the effect is unknown: the key is held"
    );
    assert!(headers.contains_key("retry-after"));
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the upstream ran once");
}

#[tokio::test]
async fn route_rules_choose_which_requests_need_a_key_and_what_releases() {
    let (up, calls) = upstream().await;
    let rules = r#"
        [[route]]
        methods = ["POST", "PUT"]
        path = "/echo"
        key = "required"
        release_statuses = ["2xx"]
    "#;
    let p = proxy_with_rules(&format!("http://{up}"), rules).await;
    let (status, _, body) = send(&p, "POST", "/echo", &[]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("idempotency-key-missing"), "{body}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    // PUT is protected by the rule; a 2xx releases, so the same key runs again.
    for _ in 0..2 {
        let (status, headers, _) = send(&p, "PUT", "/echo", &[("idempotency-key", "p")]).await;
        assert_eq!(status, StatusCode::OK);
        assert!(!headers.contains_key("idempotent-replayed"));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    // Unmatched POST: the defaults (key optional, so a keyless one passes through).
    let (status, _, _) = send(&p, "POST", "/slow-not-matched", &[]).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_path_spelled_another_way_cannot_evade_a_route_rule() {
    let (up, calls) = upstream().await;
    let rules = r#"
        [[route]]
        methods = ["POST"]
        path = "/echo"
        key = "required"
    "#;
    let p = proxy_with_rules(&format!("http://{up}"), rules).await;
    // Not in normal form: refused, whatever the upstream would have made of it.
    for path in [
        "/%65cho",
        "/x/../echo",
        "/./echo",
        "/x/..;/echo",
        "//echo",
        "/x%2F..%2Fecho",
    ] {
        let (status, headers, body) = send(&p, "POST", path, &[]).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
        assert!(body.contains("path-not-normal"), "{path}: {body}");
        assert_eq!(
            headers.get("content-type").map(|v| v.as_bytes()),
            Some(&b"application/problem+json"[..]),
            "{path}"
        );
    }
    // Other readings of the same route match the rule: the key is required there too.
    for path in ["/ECHO", "/echo/", "/echo;jsessionid=1"] {
        let (status, _, body) = send(&p, "POST", path, &[]).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
        assert!(body.contains("idempotency-key-missing"), "{path}: {body}");
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "nothing reached the upstream"
    );
    // A method no rule names does not depend on the path: passed through as it is.
    let (status, _, _) = send(&p, "GET", "/x/../echo", &[]).await;
    assert_ne!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn an_upstream_answer_the_store_cannot_record_reaches_the_client_and_holds_the_key() {
    // The upstream charges, and while it does the proxy's disk fills up: the completion that
    // follows fails. The charge has happened, so the client must get it and no retry may charge
    // again.
    let fs = FaultyStorage::new();
    let calls = Arc::new(AtomicU64::new(0));
    async fn charge(
        State((calls, fs)): State<(Arc<AtomicU64>, FaultyStorage)>,
    ) -> (StatusCode, String) {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        fs.fail_op(FaultOp::Write, ".seg", 1, std::io::ErrorKind::StorageFull);
        (StatusCode::CREATED, format!("charged {n}"))
    }
    let app = Router::new()
        .route("/charge", post(charge))
        .with_state((Arc::clone(&calls), fs.clone()));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let up = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    let store = store_on(&fs);
    let p = proxy_on(&format!("http://{up}"), "", store.clone()).await;

    let (status, headers, body) = send(&p, "POST", "/charge", &[("idempotency-key", "c")]).await;
    assert_eq!(status, StatusCode::CREATED, "the upstream's answer: {body}");
    assert_eq!(body, "charged 1");
    assert!(!headers.contains_key("idempotent-replayed"));

    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while store.health() != Health::Ready {
        assert!(
            std::time::Instant::now() < deadline,
            "the store did not heal"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, headers, body) = send(&p, "POST", "/charge", &[("idempotency-key", "c")]).await;
    assert_eq!(status, StatusCode::CONFLICT, "held, not run again: {body}");
    assert!(headers.contains_key("retry-after"));
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the upstream charged once");
}
