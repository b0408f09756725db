//! The issue's scenarios, in process: the real router on an in-memory store with a manual clock.

mod common;

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::*;
use idemlog::Durability;
use idemlog_idempotency::{FingerprintMode, Outcome};

#[tokio::test]
async fn replay_returns_the_stored_response_without_charging_again() {
    let t = TestApp::new();
    let first = t.pay(KEY_A, "order-1", BODY).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert!(!first.replayed());
    let id = first.json()["id"].as_str().expect("id").to_owned();
    assert_eq!(
        first.header("location"),
        Some(format!("/payments/{id}").as_str())
    );
    assert_eq!(first.json()["status"], "succeeded");
    assert_eq!(first.json()["currency"], "BRL");
    assert_eq!(first.json()["amount"].as_f64(), Some(100.0));

    let retry = t.pay(KEY_A, "order-1", BODY).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(retry.body, first.body, "replay is byte for byte");
    assert_eq!(retry.header("location"), first.header("location"));
    assert_eq!(retry.header("content-type"), Some("application/json"));
    assert_eq!(t.charges().await, 1);
    assert_eq!(t.outcome(Outcome::Executed), 1);
    assert_eq!(t.outcome(Outcome::Replayed), 1);
}

#[tokio::test]
async fn same_key_with_another_body_is_422_and_charges_nothing_more() {
    let t = TestApp::new();
    assert_eq!(
        t.pay(KEY_A, "order-1", BODY).await.status,
        StatusCode::CREATED
    );
    let other = t
        .pay(KEY_A, "order-1", r#"{"amount": 250.00, "currency": "BRL"}"#)
        .await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY, "{other:?}");
    assert_eq!(
        other.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(other.json()["status"], 422);
    assert_eq!(t.charges().await, 1);
    assert_eq!(t.outcome(Outcome::Mismatch), 1);
}

#[tokio::test]
async fn reserialised_json_is_the_same_request() {
    let t = TestApp::new();
    let first = t
        .pay(KEY_A, "order-1", r#"{"amount":100.00,"currency":"BRL"}"#)
        .await;
    let again = t
        .pay(
            KEY_A,
            "order-1",
            "{\n  \"currency\": \"BRL\",\n  \"amount\": 100\n}",
        )
        .await;
    assert!(again.replayed(), "{again:?}");
    assert_eq!(again.body, first.body);
    assert_eq!(t.charges().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_concurrent_duplicates_charge_exactly_once() {
    ten_concurrent_duplicates(Durability::Sync).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_concurrent_duplicates_charge_exactly_once_with_inline_store_calls() {
    ten_concurrent_duplicates(Durability::None).await;
}

async fn ten_concurrent_duplicates(durability: Durability) {
    let t = TestApp::with(Settings {
        latency: Duration::from_millis(100),
        durability,
        ..Settings::default()
    });
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let router = t.router.clone();
        tasks.push(tokio::spawn(async move {
            send(&router, payment(KEY_A, Some("order-1"), BODY)).await
        }));
    }
    let mut executed = Vec::new();
    let mut replays = Vec::new();
    let mut conflicts = 0;
    for task in tasks {
        let reply = task.await.expect("task");
        match reply.status {
            StatusCode::CREATED if reply.replayed() => replays.push(reply),
            StatusCode::CREATED => executed.push(reply),
            StatusCode::CONFLICT => {
                assert!(reply.header("retry-after").is_some(), "{reply:?}");
                conflicts += 1;
            }
            other => panic!("unexpected {other}: {reply:?}"),
        }
    }
    assert_eq!(executed.len(), 1, "exactly one request runs the handler");
    for replay in &replays {
        assert_eq!(replay.body, executed[0].body);
    }
    assert_eq!(replays.len() + conflicts, 9);
    assert_eq!(t.charges().await, 1);
}

#[tokio::test]
async fn keys_are_scoped_per_account() {
    let t = TestApp::new();
    let a = t.pay(KEY_A, "order-1", BODY).await;
    let b = t.pay(KEY_B, "order-1", BODY).await;
    assert_eq!(a.status, StatusCode::CREATED);
    assert_eq!(b.status, StatusCode::CREATED);
    assert!(
        !b.replayed(),
        "account B must not receive account A's response"
    );
    assert_ne!(a.json()["id"], b.json()["id"]);
    assert_eq!(t.charges().await, 2);
}

#[tokio::test]
async fn a_client_account_header_does_not_change_the_scope() {
    let t = TestApp::new();
    let a = t.pay(KEY_A, "order-1", BODY).await;
    let mut request = payment(KEY_B, Some("order-1"), BODY);
    request
        .headers_mut()
        .insert("x-account-id", ACCOUNT_A.parse().expect("value"));
    let b = t.send(request).await;
    assert_eq!(b.status, StatusCode::CREATED);
    assert!(!b.replayed(), "X-Account-Id must be ignored");
    assert_ne!(a.json()["id"], b.json()["id"]);
}

#[tokio::test]
async fn a_missing_key_is_rejected_before_any_charge() {
    let t = TestApp::new();
    let reply = t.send(payment(KEY_A, None, BODY)).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{reply:?}");
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(t.charges().await, 0);
    assert_eq!(t.outcome(Outcome::RejectedKey), 1);
}

#[tokio::test]
async fn empty_long_and_non_ascii_keys_are_rejected_before_any_charge() {
    let t = TestApp::new();
    let long = "k".repeat(256);
    for key in ["", "\"\"", long.as_str(), "has space", "\"unterminated"] {
        let reply = t.pay(KEY_A, key, BODY).await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "key {key:?}: {reply:?}"
        );
    }
    let mut request = payment(KEY_A, None, BODY);
    request.headers_mut().insert(
        "idempotency-key",
        axum::http::HeaderValue::from_bytes("caf\u{e9}".as_bytes()).expect("value"),
    );
    assert_eq!(t.send(request).await.status, StatusCode::BAD_REQUEST);
    assert_eq!(t.charges().await, 0);
}

#[tokio::test]
async fn quoted_and_bare_forms_are_the_same_key() {
    let t = TestApp::new();
    let first = t.pay(KEY_A, "\"order-1\"", BODY).await;
    let bare = t.pay(KEY_A, "order-1", BODY).await;
    assert!(bare.replayed(), "{bare:?}");
    assert_eq!(bare.body, first.body);
    assert_eq!(t.charges().await, 1);
}

#[tokio::test]
async fn requests_without_valid_credentials_are_401_and_charge_nothing() {
    let t = TestApp::new();
    let no_auth = Request::post("/payments")
        .header("idempotency-key", "order-1")
        .header("content-type", "application/json")
        .body(Body::from(BODY))
        .expect("request");
    let reply = t.send(no_auth).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(
        t.pay("wrong", "order-1", BODY).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(t.charges().await, 0);
}

#[tokio::test]
async fn a_restart_on_the_same_data_dir_replays_completed_keys() {
    let mut t = TestApp::new();
    let first = t.pay(KEY_A, "order-1", BODY).await;
    assert_eq!(first.status, StatusCode::CREATED);
    t.restart();
    let retry = t.pay(KEY_A, "order-1", BODY).await;
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(retry.body, first.body);
    assert_eq!(
        t.charges().await,
        1,
        "the charge count survives the restart"
    );
    let id = first.json()["id"].as_str().expect("id").to_owned();
    assert_eq!(
        t.get(KEY_A, &format!("/payments/{id}")).await.status,
        StatusCode::OK
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_disconnect_still_records_the_payment() {
    client_disconnect(Durability::Sync).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_disconnect_still_records_the_payment_with_inline_store_calls() {
    client_disconnect(Durability::None).await;
}

async fn client_disconnect(durability: Durability) {
    let t = TestApp::with(Settings {
        latency: Duration::from_millis(300),
        durability,
        ..Settings::default()
    });
    // The client gives up (its request future is dropped) while the provider call is running.
    let gave_up = tokio::time::timeout(
        Duration::from_millis(50),
        send(&t.router, payment(KEY_A, Some("order-1"), BODY)),
    )
    .await;
    assert!(gave_up.is_err(), "the request should still be running");
    t.idle().await;
    assert_eq!(
        t.outcome(Outcome::Executed),
        1,
        "the handler ran to the end"
    );
    let retry = t.pay(KEY_A, "order-1", BODY).await;
    assert!(retry.replayed(), "the result was recorded: {retry:?}");
    assert_eq!(t.charges().await, 1);
    let id = retry.json()["id"].as_str().expect("id").to_owned();
    assert_eq!(
        t.get(KEY_A, &format!("/payments/{id}")).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_5xx_releases_the_key_and_the_retry_gets_the_original_charge() {
    release_on_5xx(Durability::Sync).await;
}

#[tokio::test]
async fn a_5xx_releases_the_key_and_the_retry_gets_the_original_charge_with_inline_store_calls() {
    release_on_5xx(Durability::None).await;
}

async fn release_on_5xx(durability: Durability) {
    let t = TestApp::with(Settings {
        fail_after_charge: 1,
        durability,
        ..Settings::default()
    });
    let failed = t.pay(KEY_A, "order-1", BODY).await;
    assert_eq!(failed.status, StatusCode::BAD_GATEWAY, "{failed:?}");
    assert_eq!(
        failed.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(t.outcome(Outcome::Released), 1);
    assert_eq!(
        t.charges().await,
        1,
        "the provider made the charge before the response was lost"
    );

    let retry = t.pay(KEY_A, "order-1", BODY).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert!(!retry.replayed(), "a released key runs again");
    assert_eq!(
        t.charges().await,
        1,
        "the provider dedups the retry onto the first charge"
    );
    assert_eq!(t.outcome(Outcome::Executed), 1);
}

/// Polls `done` every 5 ms until it holds; fails with `what` after 5 s.
async fn eventually<F, Fut>(what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !done().await {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_left_by_a_crash_is_taken_over_by_the_first_retry_with_one_charge() {
    let mut t = TestApp::with(Settings {
        latency: Duration::from_secs(5),
        ..Settings::default()
    });
    // The first process charges and then dies before it can record the response.
    let router = t.router.clone();
    let doomed =
        tokio::spawn(async move { send(&router, payment(KEY_A, Some("order-1"), BODY)).await });
    eventually("the charge was never made", || async {
        t.charges().await > 0
    })
    .await;
    t.settings.latency = Duration::ZERO;
    t.crash_and_restart();
    doomed.abort();

    // The claim recovered at open belongs to the dead process: the first retry takes it over at
    // once, without waiting out the lease.
    let recovered = t.pay(KEY_A, "order-1", BODY).await;
    assert_eq!(recovered.status, StatusCode::CREATED, "{recovered:?}");
    assert_eq!(t.outcome(Outcome::TakenOver), 1);
    assert_eq!(
        t.charges().await,
        1,
        "the provider returned the original charge"
    );

    let replay = t.pay(KEY_A, "order-1", BODY).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, recovered.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_cut_short_by_a_crash_before_its_completion_leaves_nothing_behind() {
    // The claim and the provider's charge record are not waited for on their own (the
    // completion's fdatasync covers them). A crash before the completion therefore loses both
    // together: the retry runs as a new request and is charged exactly once.
    let mut t = TestApp::with(Settings {
        latency: Duration::from_secs(5),
        ..Settings::default()
    });
    let router = t.router.clone();
    let doomed =
        tokio::spawn(async move { send(&router, payment(KEY_A, Some("order-1"), BODY)).await });
    // Watch the engine's in-memory counts, which (unlike the charge counter) show writes that are
    // not durable yet: the charge record and its counter stripe.
    let engine = t.store.engine().expect("store open");
    // Opening synced once (the fence floor); the request itself must not sync.
    let opened_syncs = engine.metrics().syncs;
    eventually("the charge was never made", || {
        let charged = engine.metrics().side_records >= 2;
        async move { charged }
    })
    .await;
    assert_eq!(engine.metrics().records, 1, "the claim is held in memory");
    assert_eq!(
        engine.metrics().syncs,
        opened_syncs,
        "nothing waited for the disk yet"
    );
    t.settings.latency = Duration::ZERO;
    t.crash_and_restart();
    doomed.abort();

    assert_eq!(t.charges().await, 0, "the charge died with its request");
    let retry = t.pay(KEY_A, "order-1", BODY).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert!(!retry.replayed());
    assert_eq!(t.outcome(Outcome::Executed), 1);
    assert_eq!(t.outcome(Outcome::TakenOver), 0, "no claim survived");
    assert_eq!(t.charges().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_key_is_409_with_a_short_retry_after_hint() {
    let t = TestApp::with(Settings {
        latency: Duration::from_millis(300),
        ..Settings::default()
    });
    let router = t.router.clone();
    let first =
        tokio::spawn(async move { send(&router, payment(KEY_A, Some("order-1"), BODY)).await });
    while t.charges().await == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let busy = t.pay(KEY_A, "order-1", BODY).await;
    assert_eq!(busy.status, StatusCode::CONFLICT, "{busy:?}");
    assert_eq!(
        busy.header("content-type"),
        Some("application/problem+json")
    );
    // The 30 s lease is nearly all left, but the handler takes milliseconds: the hint is 1 s.
    assert_eq!(busy.header("retry-after"), Some("1"));
    assert_eq!(first.await.expect("task").status, StatusCode::CREATED);
    assert_eq!(t.outcome(Outcome::Conflict), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_after_hint_never_exceeds_the_lease_left() {
    let t = TestApp::with(Settings {
        latency: Duration::from_millis(300),
        retry_after: Duration::from_secs(20),
        ..Settings::default()
    });
    let router = t.router.clone();
    let first =
        tokio::spawn(async move { send(&router, payment(KEY_A, Some("order-1"), BODY)).await });
    while t.charges().await == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    t.clock.advance(Duration::from_millis(27_500));
    let busy = t.pay(KEY_A, "order-1", BODY).await;
    assert_eq!(busy.status, StatusCode::CONFLICT, "{busy:?}");
    // 30 s lease, 27.5 s gone: 2.5 s left, rounded up, below the 20 s hint.
    assert_eq!(busy.header("retry-after"), Some("3"));
    assert_eq!(first.await.expect("task").status, StatusCode::CREATED);
}

#[tokio::test]
async fn an_expired_key_can_be_reused_as_a_new_operation() {
    let t = TestApp::new();
    let first = t.pay(KEY_A, "order-1", BODY).await;
    t.clock.advance(TTL + Duration::from_millis(1));
    let reused = t
        .pay(KEY_A, "order-1", r#"{"amount": 7.50, "currency": "BRL"}"#)
        .await;
    assert_eq!(reused.status, StatusCode::CREATED, "{reused:?}");
    assert!(!reused.replayed());
    assert_ne!(reused.json()["id"], first.json()["id"]);
    assert_ne!(
        reused.json()["charge_id"],
        first.json()["charge_id"],
        "downstream, too, it is new"
    );
    assert_eq!(t.charges().await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overtaken_holder_gets_the_winners_response_not_a_second_payment() {
    let t = TestApp::with(Settings {
        latency: Duration::from_millis(400),
        ..Settings::default()
    });
    let router = t.router.clone();
    let slow =
        tokio::spawn(async move { send(&router, payment(KEY_A, Some("order-1"), BODY)).await });
    while t.charges().await == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The slow holder looks dead: its lease runs out and a retry takes the key over.
    t.clock.advance(LEASE + Duration::from_millis(1));
    let winner = t.pay(KEY_A, "order-1", BODY).await;
    assert_eq!(winner.status, StatusCode::CREATED, "{winner:?}");
    let loser = slow.await.expect("task");
    assert_eq!(loser.status, StatusCode::CREATED, "{loser:?}");
    assert!(
        loser.replayed(),
        "the overtaken holder serves the winner's stored response"
    );
    assert_eq!(loser.body, winner.body);
    assert_eq!(t.charges().await, 1);
    assert_eq!(t.outcome(Outcome::TakenOver), 1);
    assert_eq!(t.outcome(Outcome::Fenced), 1);
    let id = winner.json()["id"].as_str().expect("id").to_owned();
    assert_eq!(
        t.get(KEY_A, &format!("/payments/{id}")).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_body_over_the_limit_is_413_and_charges_nothing() {
    let t = TestApp::with(Settings {
        max_body_bytes: 64,
        ..Settings::default()
    });
    let padded = format!(
        r#"{{"amount": 1, "currency": "BRL", "pad": "{}"}}"#,
        "x".repeat(100)
    );
    let reply = t.pay(KEY_A, "order-1", &padded).await;
    assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE, "{reply:?}");
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(t.charges().await, 0);
    assert_eq!(t.outcome(Outcome::BodyTooLarge), 1);
}

#[tokio::test]
async fn invalid_payments_are_4xx_problems_and_charge_nothing() {
    let t = TestApp::new();
    let cases = [
        (
            r#"{"amount": 0, "currency": "BRL"}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            r#"{"amount": -5.00, "currency": "BRL"}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            r#"{"amount": 1.001, "currency": "BRL"}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            r#"{"amount": "100.00", "currency": "BRL"}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            r#"{"amount": 100.00, "currency": "brl"}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (r#"{"amount": 100.00}"#, StatusCode::UNPROCESSABLE_ENTITY),
        (
            r#"{"amount": 100.00, "currency": "BRL""#,
            StatusCode::BAD_REQUEST,
        ),
        ("not json", StatusCode::BAD_REQUEST),
    ];
    for (i, (body, status)) in cases.iter().enumerate() {
        let reply = t.pay(KEY_A, &format!("bad-{i}"), body).await;
        assert_eq!(reply.status, *status, "{body}: {reply:?}");
        assert_eq!(
            reply.header("content-type"),
            Some("application/problem+json")
        );
        let problem = reply.json();
        for member in ["type", "title", "status", "detail"] {
            assert!(problem.get(member).is_some(), "{member} missing: {problem}");
        }
    }
    assert_eq!(t.charges().await, 0);
}

#[tokio::test]
async fn a_4xx_result_is_stored_and_replayed() {
    let t = TestApp::new();
    let body = r#"{"amount": 0, "currency": "BRL"}"#;
    let first = t.pay(KEY_A, "order-1", body).await;
    assert_eq!(first.status, StatusCode::UNPROCESSABLE_ENTITY);
    let again = t.pay(KEY_A, "order-1", body).await;
    assert_eq!(again.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
}

#[tokio::test]
async fn a_store_failure_is_503_without_internals_and_nothing_is_charged() {
    let t = TestApp::new();
    t.fs.fail_write_after(1);
    let reply = t.pay(KEY_A, "order-1", BODY).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    assert!(reply.header("retry-after").is_some());
    let text = String::from_utf8_lossy(&reply.body).to_string();
    // The audit found the data directory's path and the OS error text in this body.
    for leak in ["/data", "injected", "os error", "write", "seg"] {
        assert!(!text.contains(leak), "503 body leaks {leak:?}: {text}");
    }
    let problem = reply.json();
    let request_id = reply.header("x-request-id").expect("x-request-id");
    assert_eq!(problem["request_id"], request_id, "{problem}");
    assert_eq!(t.outcome(Outcome::StoreError), 1);
}

#[tokio::test]
async fn a_failed_store_reports_unready_then_heals_without_a_restart() {
    let t = TestApp::new();
    assert_eq!(
        t.pay(KEY_A, "order-0", BODY).await.status,
        StatusCode::CREATED
    );
    // Every mutation fails from now on, as on a full disk: the store is poisoned and cannot reopen.
    t.fs.crash_after(0);
    let failed = t.pay(KEY_A, "order-1", BODY).await;
    assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE, "{failed:?}");
    for path in ["/healthz", "/readyz"] {
        let probe = t.get(KEY_A, path).await;
        assert_eq!(
            probe.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{path}: {probe:?}"
        );
        assert_eq!(
            probe.header("content-type"),
            Some("application/problem+json")
        );
    }
    let refused = t.pay(KEY_A, "order-1", BODY).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(refused.header("retry-after").is_some());
    // The cause goes away (space freed): the store reopens by itself.
    t.fs.crash(idemlog::testkit::CrashMode::ProcessOnly);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while t.get(KEY_A, "/readyz").await.status != StatusCode::OK {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the store did not heal"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(t.get(KEY_A, "/healthz").await.status, StatusCode::OK);
    // The acknowledged payment survived; the failed one runs now, once.
    let replay = t.pay(KEY_A, "order-0", BODY).await;
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(
        t.pay(KEY_A, "order-1", BODY).await.status,
        StatusCode::CREATED
    );
    assert_eq!(t.charges().await, 2);
}

#[tokio::test]
async fn tenants_whose_account_and_key_join_alike_get_separate_charges() {
    // The audit's collision: account "acct_a" with key "b:k", account "acct_a:b" with key "k".
    let t = TestApp::with_keys(&[(KEY_A, "acct_a"), (KEY_B, "acct_a:b")]);
    let first = t.pay(KEY_A, "b:k", BODY).await;
    let second = t.pay(KEY_B, "k", BODY).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert_eq!(second.status, StatusCode::CREATED, "{second:?}");
    assert!(!second.replayed());
    assert_ne!(first.json()["charge_id"], second.json()["charge_id"]);
    assert_eq!(t.charges().await, 2);
}

#[tokio::test]
async fn an_amount_that_floats_mangle_is_charged_and_echoed_exactly() {
    let t = TestApp::new();
    let reply = t
        .pay(
            KEY_A,
            "order-1",
            r#"{"amount": 550137998.06, "currency": "BRL"}"#,
        )
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    let text = String::from_utf8_lossy(&reply.body).to_string();
    assert!(text.contains(r#""amount":550137998.06,"#), "{text}");
}

#[tokio::test]
async fn an_amount_with_sub_cent_precision_is_422_naming_the_field_and_not_charged() {
    let t = TestApp::new();
    let reply = t
        .pay(
            KEY_A,
            "order-1",
            r#"{"amount": 1.000000001, "currency": "BRL"}"#,
        )
        .await;
    assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY, "{reply:?}");
    let detail = reply.json()["detail"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(detail.contains("amount"), "{detail}");
    assert_eq!(t.charges().await, 0);
}

#[tokio::test]
async fn a_body_with_a_repeated_member_is_400_and_claims_nothing() {
    let t = TestApp::new();
    let dup = t
        .pay(
            KEY_A,
            "order-1",
            r#"{"amount": 1, "amount": 100.00, "currency": "BRL"}"#,
        )
        .await;
    assert_eq!(dup.status, StatusCode::BAD_REQUEST, "{dup:?}");
    assert_eq!(dup.header("content-type"), Some("application/problem+json"));
    assert_eq!(t.outcome(Outcome::RejectedBody), 1);
    // The corrected retry with the same key runs normally: nothing was claimed or stored.
    let clean = t.pay(KEY_A, "order-1", BODY).await;
    assert_eq!(clean.status, StatusCode::CREATED, "{clean:?}");
    assert!(!clean.replayed());
    assert_eq!(t.charges().await, 1);
}

#[tokio::test]
async fn the_same_body_under_another_content_type_is_422() {
    let t = TestApp::with(Settings {
        fingerprint: FingerprintMode::ExactBytes,
        ..Settings::default()
    });
    assert_eq!(
        t.pay(KEY_A, "order-1", BODY).await.status,
        StatusCode::CREATED
    );
    let request = Request::post("/payments")
        .header("authorization", format!("Bearer {KEY_A}"))
        .header("content-type", "text/plain")
        .header("idempotency-key", "order-1")
        .body(Body::from(BODY))
        .expect("request");
    assert_eq!(
        t.send(request).await.status,
        StatusCode::UNPROCESSABLE_ENTITY
    );
}

#[tokio::test]
async fn a_payment_is_visible_only_to_its_owner() {
    let t = TestApp::new();
    let created = t.pay(KEY_A, "order-1", BODY).await;
    let location = created.header("location").expect("Location").to_owned();
    let mine = t.get(KEY_A, &location).await;
    assert_eq!(mine.status, StatusCode::OK);
    assert_eq!(mine.body, created.body);
    let theirs = t.get(KEY_B, &location).await;
    assert_eq!(theirs.status, StatusCode::NOT_FOUND);
    assert_eq!(
        theirs.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(
        t.get(KEY_A, "/payments/pay_nope").await.status,
        StatusCode::NOT_FOUND
    );
    let anonymous = Request::get(&location)
        .body(Body::empty())
        .expect("request");
    assert_eq!(t.send(anonymous).await.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_client_sent_replayed_header_changes_nothing() {
    let t = TestApp::new();
    let mut request = payment(KEY_A, Some("order-1"), BODY);
    request
        .headers_mut()
        .insert("idempotent-replayed", "true".parse().expect("value"));
    let reply = t.send(request).await;
    assert_eq!(reply.status, StatusCode::CREATED);
    assert!(!reply.replayed());
    assert_eq!(t.outcome(Outcome::Executed), 1);
}

#[tokio::test]
async fn a_released_key_leaves_no_payment_record() {
    let t = TestApp::with(Settings {
        fail_after_charge: 1,
        ..Settings::default()
    });
    assert_eq!(
        t.pay(KEY_A, "order-1", BODY).await.status,
        StatusCode::BAD_GATEWAY
    );
    let stats = t.store.engine().expect("store open").stats();
    // Side records: the provider's charge and its counter only; no payment.
    assert_eq!(stats.side_records, 2, "{stats:?}");
}

#[tokio::test]
async fn metrics_report_charges_and_outcomes() {
    let t = TestApp::new();
    t.pay(KEY_A, "order-1", BODY).await;
    t.pay(KEY_A, "order-1", BODY).await;
    let request = Request::get("/metrics")
        .body(Body::empty())
        .expect("request");
    let reply = t.send(request).await;
    assert_eq!(reply.status, StatusCode::OK);
    let text = String::from_utf8(reply.body).expect("utf8");
    assert!(text.contains("\ngateway_charges_total 1\n"), "{text}");
    assert!(text.contains("idempotency_requests_total{outcome=\"executed\"} 1\n"));
    assert!(text.contains("idempotency_requests_total{outcome=\"replayed\"} 1\n"));
    let health = t
        .send(
            Request::get("/healthz")
                .body(Body::empty())
                .expect("request"),
        )
        .await;
    assert_eq!(health.status, StatusCode::OK);
}

#[tokio::test]
async fn with_the_layer_off_payments_are_still_served_and_recorded() {
    let t = TestApp::with(Settings {
        idempotency: false,
        ..Settings::default()
    });
    let created = t.send(payment(KEY_A, None, BODY)).await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    let location = created.header("location").expect("Location").to_owned();
    assert_eq!(t.get(KEY_A, &location).await.status, StatusCode::OK);
    assert_eq!(t.charges().await, 1);
}

#[tokio::test]
async fn a_store_poisoned_behind_the_servers_back_is_reported_and_healed() {
    let t = TestApp::new();
    // A write that no request made (as the flusher or a compaction would) fails and poisons the
    // engine: no failing request is there to notice it.
    t.fs.fail_write_after(1);
    let engine = t.store.engine().expect("store open");
    let write = idemlog::SideWrite::put("test", "k", "v");
    assert!(engine.side_write(&[write]).is_err());
    assert!(engine.is_poisoned());
    drop(engine);
    let probe = t.get(KEY_A, "/readyz").await;
    assert_eq!(probe.status, StatusCode::SERVICE_UNAVAILABLE, "{probe:?}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while t.get(KEY_A, "/readyz").await.status != StatusCode::OK {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the store did not heal"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        t.pay(KEY_A, "order-1", BODY).await.status,
        StatusCode::CREATED
    );
}

#[tokio::test]
async fn a_store_reopened_onto_a_still_full_disk_is_not_ready_until_it_can_write() {
    let t = TestApp::new();
    // The next six log writes fail, as on a disk that stays full for a while: opening needs no
    // space, so only a write tells whether the cause has gone.
    for _ in 0..6 {
        t.fs.fail_op(
            idemlog::testkit::FaultOp::Write,
            ".seg",
            1,
            std::io::ErrorKind::StorageFull,
        );
    }
    assert_eq!(
        t.pay(KEY_A, "order-1", BODY).await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while t.get(KEY_A, "/readyz").await.status != StatusCode::OK {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the store did not heal"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Ready means ready: the first request after it is served, not refused by the same full disk.
    let after = t.pay(KEY_A, "order-1", BODY).await;
    assert_eq!(after.status, StatusCode::CREATED, "{after:?}");
}

#[tokio::test]
async fn a_disk_with_room_for_less_than_a_full_record_keeps_the_store_unready() {
    let t = TestApp::new();
    assert_eq!(
        t.pay(KEY_A, "order-0", BODY).await.status,
        StatusCode::CREATED
    );
    // 256 bytes left: less than one payment writes, more than a token write needs. A healer that
    // proved itself with a small write would call this store ready, fail the next payment, and
    // alternate between serving and 503 for as long as the disk stays full. The log's newest
    // segment already holds up to 1 MiB of zeros ahead of its records (the engine's
    // preallocation), so payments go on into that space until the log needs more.
    t.fs.set_capacity(Some(t.fs.used_bytes() + 256));
    let mut failed_order = None;
    for i in 1..=5_000 {
        let order = format!("order-{i}");
        let reply = t.pay(KEY_A, &order, BODY).await;
        if reply.status == StatusCode::SERVICE_UNAVAILABLE {
            failed_order = Some(order);
            break;
        }
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    }
    let failed_order = failed_order.expect("the disk never filled up");
    // Several reopen attempts (100, 200, 400, 800 ms apart): none may declare the store ready.
    let watch_until = tokio::time::Instant::now() + Duration::from_millis(1600);
    while tokio::time::Instant::now() < watch_until {
        let ready = t.get(KEY_A, "/readyz").await;
        assert_eq!(
            ready.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "ready on a disk with {} bytes free",
            256
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // Space is freed: the store heals by itself and the payment goes through.
    t.fs.set_capacity(None);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while t.get(KEY_A, "/readyz").await.status != StatusCode::OK {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the store did not heal"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let after = t.pay(KEY_A, &failed_order, BODY).await;
    assert_eq!(after.status, StatusCode::CREATED, "{after:?}");
}
