//! The issue's scenarios against the real binary on 127.0.0.1.

use std::io::Read;
use std::net::Shutdown;
use std::time::Duration;

use idemlog_e2e::*;

#[test]
fn healthz_and_metrics_are_served() {
    let dir = TempDir::new("health");
    let server = Server::start(dir.path(), &[]);
    assert_eq!(server.get(None, "/healthz").status, 200);
    let metrics = server.get(None, "/metrics");
    assert_eq!(metrics.status, 200);
    assert!(
        metrics
            .header("content-type")
            .is_some_and(|v| v.starts_with("text/plain"))
    );
    for outcome in [
        "executed",
        "replayed",
        "conflict",
        "mismatch",
        "rejected_key",
        "released",
        "taken_over",
    ] {
        assert_eq!(server.outcome(outcome), 0, "{outcome}");
    }
    assert_eq!(server.charges(), 0);
}

#[test]
fn replay_returns_the_stored_response_without_charging_again() {
    let dir = TempDir::new("replay");
    let server = Server::start(dir.path(), &["--gateway-latency", "0ms"]);
    let first = server.pay(KEY_A, "order-1", BODY);
    assert_eq!(first.status, 201, "{first:?}");
    let id = first.json()["id"].as_str().expect("id").to_owned();
    assert_eq!(
        first.header("location"),
        Some(format!("/payments/{id}").as_str())
    );
    let replay = server.pay(KEY_A, "\"order-1\"", r#"{"currency":"BRL","amount":100}"#);
    assert_eq!(replay.status, 201);
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(replay.body, first.body);
    assert_eq!(server.charges(), 1);
    assert_eq!(server.outcome("replayed"), 1);
}

#[test]
fn same_key_with_another_body_is_422() {
    let dir = TempDir::new("mismatch");
    let server = Server::start(dir.path(), &["--gateway-latency", "0ms"]);
    assert_eq!(server.pay(KEY_A, "order-1", BODY).status, 201);
    let other = server.pay(KEY_A, "order-1", r#"{"amount": 5.00, "currency": "BRL"}"#);
    assert_eq!(other.status, 422, "{other:?}");
    assert_eq!(
        other.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(server.charges(), 1);
    assert_eq!(server.outcome("mismatch"), 1);
}

#[test]
fn ten_concurrent_duplicates_charge_exactly_once() {
    let dir = TempDir::new("concurrent");
    let server = Server::start(dir.path(), &["--gateway-latency", "300ms"]);
    let replies: Vec<Reply> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..10)
            .map(|_| scope.spawn(|| server.pay(KEY_A, "order-1", BODY)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    let executed: Vec<&Reply> = replies
        .iter()
        .filter(|r| r.status == 201 && !r.replayed())
        .collect();
    assert_eq!(executed.len(), 1, "{replies:#?}");
    for reply in &replies {
        match reply.status {
            201 => assert_eq!(reply.body, executed[0].body),
            409 => assert!(reply.header("retry-after").is_some()),
            other => panic!("unexpected {other}: {reply:?}"),
        }
    }
    assert_eq!(server.charges(), 1);
}

#[test]
fn keys_are_scoped_per_account() {
    let dir = TempDir::new("scope");
    let server = Server::start(dir.path(), &["--gateway-latency", "0ms"]);
    let a = server.pay(KEY_A, "order-1", BODY);
    let b = server.pay(KEY_B, "order-1", BODY);
    assert_eq!((a.status, b.status), (201, 201));
    assert!(!b.replayed());
    assert_ne!(a.json()["id"], b.json()["id"]);
    assert_eq!(server.charges(), 2);
    let location = a.header("location").expect("Location");
    assert_eq!(server.get(Some(KEY_A), location).status, 200);
    assert_eq!(server.get(Some(KEY_B), location).status, 404);
    assert_eq!(server.get(None, location).status, 401);
}

#[test]
fn a_missing_key_is_rejected_before_any_charge() {
    let dir = TempDir::new("missing-key");
    let server = Server::start(dir.path(), &["--gateway-latency", "0ms"]);
    let auth = format!("Bearer {KEY_A}");
    let reply = server.request(
        "POST",
        "/payments",
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
        ],
        BODY.as_bytes(),
    );
    assert_eq!(reply.status, 400, "{reply:?}");
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(server.charges(), 0);
    assert_eq!(server.outcome("rejected_key"), 1);
}

#[test]
fn a_restart_on_the_same_data_dir_replays_completed_keys() {
    let dir = TempDir::new("restart");
    let server = Server::start(dir.path(), &["--gateway-latency", "0ms"]);
    let first = server.pay(KEY_A, "order-1", BODY);
    assert_eq!(first.status, 201);
    assert!(server.terminate().success());

    let server = Server::start(dir.path(), &["--gateway-latency", "0ms"]);
    let replay = server.pay(KEY_A, "order-1", BODY);
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(replay.body, first.body);
    assert_eq!(server.charges(), 1, "the charge count survives restarts");
    assert_eq!(
        server
            .get(Some(KEY_A), first.header("location").expect("Location"))
            .status,
        200
    );
}

#[test]
fn a_client_disconnect_still_records_the_payment() {
    let dir = TempDir::new("disconnect");
    let server = Server::start(dir.path(), &["--gateway-latency", "300ms"]);
    let auth = format!("Bearer {KEY_A}");
    let stream = server.send_only(
        "POST",
        "/payments",
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
            ("Idempotency-Key", "order-1"),
        ],
        BODY.as_bytes(),
    );
    wait_until(Duration::from_secs(10), "the charge", || {
        server.charges() == 1
    });
    // Hang up before the answer.
    let _ = stream.shutdown(Shutdown::Both);
    drop(stream);
    let mut replay = server.pay(KEY_A, "order-1", BODY);
    wait_until(Duration::from_secs(10), "the recorded result", || {
        replay = server.pay(KEY_A, "order-1", BODY);
        replay.status != 409
    });
    assert_eq!(replay.status, 201, "{replay:?}");
    assert!(
        replay.replayed(),
        "the abandoned request's result was recorded"
    );
    assert_eq!(server.charges(), 1);
    assert_eq!(server.outcome("executed"), 1);
}

#[test]
fn a_5xx_releases_the_key_and_the_retry_charges_nothing_new() {
    let dir = TempDir::new("release");
    let server = Server::start(
        dir.path(),
        &[
            "--gateway-latency",
            "0ms",
            "--gateway-fail-after-charge",
            "1",
        ],
    );
    let failed = server.pay(KEY_A, "order-1", BODY);
    assert_eq!(failed.status, 502, "{failed:?}");
    assert_eq!(
        failed.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(server.outcome("released"), 1);
    let retry = server.pay(KEY_A, "order-1", BODY);
    assert_eq!(retry.status, 201, "{retry:?}");
    assert!(!retry.replayed());
    assert_eq!(server.charges(), 1, "exactly one charge");
}

#[test]
fn a_claim_left_by_a_crash_is_taken_over_by_the_first_retry_with_one_charge() {
    let dir = TempDir::new("crash");
    let server = Server::start(dir.path(), &["--lease", "60s", "--gateway-latency", "60s"]);
    let auth = format!("Bearer {KEY_A}");
    let _abandoned = server.send_only(
        "POST",
        "/payments",
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
            ("Idempotency-Key", "order-1"),
        ],
        BODY.as_bytes(),
    );
    // The provider has charged; the response is still "on its way" when the process dies.
    wait_until(Duration::from_secs(10), "the charge", || {
        server.charges() == 1
    });
    server.kill();

    // A long lease: the claim recovered at open belongs to the dead process, so the first retry
    // takes it over at once instead of waiting the lease out.
    let server = Server::start(dir.path(), &["--lease", "60s", "--gateway-latency", "0ms"]);
    let reply = server.pay(KEY_A, "order-1", BODY);
    assert_eq!(reply.status, 201, "{reply:?}");
    assert!(!reply.replayed());
    assert_eq!(server.outcome("taken_over"), 1);
    assert_eq!(
        server.charges(),
        1,
        "the provider returned the original charge"
    );
    let replay = server.pay(KEY_A, "order-1", BODY);
    assert!(replay.replayed());
    assert_eq!(replay.body, reply.body);
}

#[test]
fn an_expired_key_can_be_reused() {
    let dir = TempDir::new("expiry");
    let server = Server::start(
        dir.path(),
        &["--key-ttl", "300ms", "--gateway-latency", "0ms"],
    );
    let first = server.pay(KEY_A, "order-1", BODY);
    assert_eq!(first.status, 201);
    std::thread::sleep(Duration::from_millis(400));
    let again = server.pay(KEY_A, "order-1", BODY);
    assert_eq!(again.status, 201, "{again:?}");
    assert!(!again.replayed(), "an expired key is a new operation");
    assert_ne!(again.json()["charge_id"], first.json()["charge_id"]);
    assert_eq!(server.charges(), 2);
}

#[test]
fn a_running_key_is_409_with_retry_after() {
    let dir = TempDir::new("conflict");
    let server = Server::start(dir.path(), &["--gateway-latency", "2s"]);
    let auth = format!("Bearer {KEY_A}");
    let mut first = server.send_only(
        "POST",
        "/payments",
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
            ("Idempotency-Key", "order-1"),
        ],
        BODY.as_bytes(),
    );
    wait_until(Duration::from_secs(10), "the charge", || {
        server.charges() == 1
    });
    let busy = server.pay(KEY_A, "order-1", BODY);
    assert_eq!(busy.status, 409, "{busy:?}");
    assert_eq!(
        busy.header("content-type"),
        Some("application/problem+json")
    );
    let seconds: u64 = busy
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .expect("seconds");
    assert!((1..=30).contains(&seconds));
    let mut raw = Vec::new();
    first.read_to_end(&mut raw).expect("first response");
    assert!(
        raw.starts_with(b"HTTP/1.1 201"),
        "{}",
        String::from_utf8_lossy(&raw)
    );
}

#[test]
fn a_body_over_the_limit_is_413_without_a_charge() {
    let dir = TempDir::new("too-large");
    let server = Server::start(
        dir.path(),
        &["--max-body-bytes", "64", "--gateway-latency", "0ms"],
    );
    let body = format!(
        r#"{{"amount": 1, "currency": "BRL", "pad": "{}"}}"#,
        "x".repeat(200)
    );
    let reply = server.pay(KEY_A, "order-1", &body);
    assert_eq!(reply.status, 413, "{reply:?}");
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(server.charges(), 0);
}

#[test]
fn sigterm_finishes_requests_in_flight_then_exits() {
    let dir = TempDir::new("sigterm");
    let server = Server::start(dir.path(), &["--gateway-latency", "700ms"]);
    let auth = format!("Bearer {KEY_A}");
    let mut stream = server.send_only(
        "POST",
        "/payments",
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
            ("Idempotency-Key", "order-1"),
        ],
        BODY.as_bytes(),
    );
    wait_until(Duration::from_secs(10), "the charge", || {
        server.charges() == 1
    });
    server.signal_terminate();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("response");
    assert!(
        raw.starts_with(b"HTTP/1.1 201"),
        "{}",
        String::from_utf8_lossy(&raw)
    );
    let mut server = server;
    assert!(server.wait_exit(Duration::from_secs(30)).success());
    assert!(server.logs().iter().any(|l| l.contains("store closed")));

    let restarted = Server::start(dir.path(), &["--gateway-latency", "0ms"]);
    assert!(restarted.pay(KEY_A, "order-1", BODY).replayed());
}

#[test]
fn without_configured_keys_the_demo_key_works_and_is_logged_loudly() {
    let dir = TempDir::new("demo");
    let server = Server::start_with(dir.path(), &["--gateway-latency", "0ms"], &[]);
    let reply = server.pay("demo-key", "order-1", BODY);
    assert_eq!(reply.status, 201, "{reply:?}");
    assert_eq!(server.pay(KEY_A, "order-2", BODY).status, 401);
    assert!(
        server
            .logs()
            .iter()
            .any(|l| l.contains("WARN") && l.contains("DEMO key")),
        "{:#?}",
        server.logs()
    );
}

#[test]
fn request_ids_histogram_and_openapi_are_served_by_the_binary() {
    let dir = TempDir::new("observability");
    let server = Server::start_with(
        dir.path(),
        &["--gateway-latency", "0ms"],
        &[
            (
                "IDEMLOG_API_KEYS",
                &format!("{KEY_A}={ACCOUNT_A},{KEY_B}={ACCOUNT_B}"),
            ),
            ("RUST_LOG", "info,tower_http=debug"),
        ],
    );
    let count = "http_server_request_duration_seconds_count{http_route=\"/payments\",http_request_method=\"POST\",http_response_status_code=\"201\"}";
    let reply = server.request(
        "POST",
        "/payments",
        &[
            ("authorization", &format!("Bearer {KEY_A}")),
            ("content-type", "application/json"),
            ("idempotency-key", "order-obs"),
            ("x-request-id", "e2e-request-7"),
        ],
        BODY.as_bytes(),
    );
    assert_eq!(reply.status, 201, "{reply:?}");
    assert_eq!(reply.header("x-request-id"), Some("e2e-request-7"));
    assert_eq!(server.metric(count), 1);
    assert_eq!(server.pay(KEY_A, "order-obs-2", BODY).status, 201);
    assert_eq!(server.metric(count), 2, "the histogram's count rises");
    assert_eq!(server.metric("idemlog_store_up"), 1);

    // The request's log lines name its id.
    wait_until(
        Duration::from_secs(10),
        "a log line with the request id",
        || {
            server
                .logs()
                .iter()
                .any(|line| line.contains("e2e-request-7") && line.contains("/payments"))
        },
    );

    let unauthorized = server.get(None, "/payments/pay_x");
    assert_eq!(unauthorized.status, 401);
    let id = unauthorized
        .header("x-request-id")
        .expect("generated id")
        .to_owned();
    assert_eq!(unauthorized.json()["request_id"], id.as_str());

    let doc = server.get(None, "/openapi.json");
    assert_eq!(doc.status, 200);
    let doc = doc.json();
    assert_eq!(doc["openapi"], "3.1.0");
    assert!(doc["paths"]["/payments"]["post"].is_object());
}
