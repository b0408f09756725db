//! The server's behaviour, run on every store backend from one suite so the backends cannot drift:
//! each scenario below runs as `<scenario>::embedded` and `<scenario>::postgres`.
//!
//! The PostgreSQL variants need `DATABASE_URL` (`scripts/pg-test-cluster run -- cargo test`); where
//! it is missing they print a skip line, unless CI set PostgreSQL up, where they fail.

mod common;
#[path = "behaviour/harness.rs"]
mod harness;

use std::time::Duration;

use axum::http::StatusCode;
use bytes::Bytes;
use harness::*;
use idemlog_idempotency::Outcome;
use idemlog_idempotency::store::{
    Claim, Fingerprint, InsertOnce, RecordWrite, StoreError, StoredResponse, Takeover,
};

/// Runs `scenario` on both backends, each in its own test.
macro_rules! on_every_backend {
    ($scenario:ident) => {
        on_every_backend!($scenario, Settings::default());
    };
    ($scenario:ident, $settings:expr) => {
        mod $scenario {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn embedded() {
                let h = Harness::start(Backend::Embedded, $settings)
                    .await
                    .expect("embedded");
                super::$scenario(&h).await;
                h.finish().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                let Some(h) = Harness::start(Backend::Postgres, $settings).await else {
                    return;
                };
                super::$scenario(&h).await;
                h.finish().await;
            }
        }
    };
}

on_every_backend!(a_new_key_runs_once_and_replays_byte_for_byte);
async fn a_new_key_runs_once_and_replays_byte_for_byte(h: &Harness) {
    let first = h.pay(KEY_A, "order-1", BODY).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    let again = h
        .pay(KEY_A, "order-1", r#"{"currency":"BRL","amount":100}"#)
        .await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(again.header("location"), first.header("location"));
    assert_eq!(h.charges().await, 1);
    assert_eq!(h.outcome(Outcome::Replayed), 1);
}

on_every_backend!(concurrent_duplicates_charge_once);
async fn concurrent_duplicates_charge_once(h: &Harness) {
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let router = h.router.clone();
        tasks.push(tokio::spawn(async move {
            send(&router, payment(KEY_A, Some("order-1"), BODY)).await
        }));
    }
    let mut created = Vec::new();
    for task in tasks {
        let reply = task.await.expect("task");
        match reply.status {
            StatusCode::CREATED => created.push(reply.body),
            StatusCode::CONFLICT => assert!(reply.header("retry-after").is_some()),
            other => panic!("unexpected {other}: {reply:?}"),
        }
    }
    assert!(!created.is_empty());
    assert!(
        created.iter().all(|b| *b == created[0]),
        "one response for all"
    );
    assert_eq!(h.charges().await, 1);
}

on_every_backend!(the_same_key_with_another_body_is_422);
async fn the_same_key_with_another_body_is_422(h: &Harness) {
    assert_eq!(
        h.pay(KEY_A, "order-1", BODY).await.status,
        StatusCode::CREATED
    );
    let other = h
        .pay(KEY_A, "order-1", r#"{"amount": 250.00, "currency": "BRL"}"#)
        .await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        other.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(h.charges().await, 1);
}

on_every_backend!(a_missing_key_is_400_and_charges_nothing);
async fn a_missing_key_is_400_and_charges_nothing(h: &Harness) {
    let reply = h.send(payment(KEY_A, None, BODY)).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(h.charges().await, 0);
}

on_every_backend!(keys_of_different_accounts_never_meet);
async fn keys_of_different_accounts_never_meet(h: &Harness) {
    let a = h.pay(KEY_A, "order-1", BODY).await;
    let b = h.pay(KEY_B, "order-1", BODY).await;
    assert_eq!(b.status, StatusCode::CREATED);
    assert!(!b.replayed());
    assert_ne!(a.json()["id"], b.json()["id"]);
    assert_eq!(h.charges().await, 2);
    // A payment is readable by its owner only.
    let location = a.header("location").expect("location").to_owned();
    assert_eq!(h.get(KEY_A, &location).await.status, StatusCode::OK);
    assert_eq!(h.get(KEY_B, &location).await.status, StatusCode::NOT_FOUND);
}

on_every_backend!(
    a_running_key_is_409_with_retry_after,
    Settings {
        latency: Duration::from_millis(600),
        ..Settings::default()
    }
);
async fn a_running_key_is_409_with_retry_after(h: &Harness) {
    let router = h.router.clone();
    let first =
        tokio::spawn(async move { send(&router, payment(KEY_A, Some("order-1"), BODY)).await });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while h.charges().await == 0 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let busy = h.pay(KEY_A, "order-1", BODY).await;
    assert_eq!(busy.status, StatusCode::CONFLICT, "{busy:?}");
    assert_eq!(busy.header("retry-after"), Some("1"));
    assert_eq!(first.await.expect("task").status, StatusCode::CREATED);
    assert_eq!(
        h.pay(KEY_A, "order-1", BODY).await.status,
        StatusCode::CREATED
    );
    assert_eq!(h.charges().await, 1);
}

on_every_backend!(
    a_5xx_releases_the_key_and_the_retry_gets_the_original_charge,
    Settings {
        fail_after_charge: 1,
        ..Settings::default()
    }
);
async fn a_5xx_releases_the_key_and_the_retry_gets_the_original_charge(h: &Harness) {
    let failed = h.pay(KEY_A, "order-1", BODY).await;
    assert_eq!(failed.status, StatusCode::BAD_GATEWAY, "{failed:?}");
    assert_eq!(h.outcome(Outcome::Released), 1);
    let retry = h.pay(KEY_A, "order-1", BODY).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert!(!retry.replayed(), "the handler ran again");
    assert_eq!(h.charges().await, 1, "the provider deduplicated the charge");
}

on_every_backend!(an_expired_key_is_a_new_operation);
async fn an_expired_key_is_a_new_operation(h: &Harness) {
    let first = h.pay(KEY_A, "order-1", BODY).await;
    assert_eq!(first.status, StatusCode::CREATED);
    h.pass(TTL + Duration::from_millis(200)).await;
    let second = h.pay(KEY_A, "order-1", BODY).await;
    assert_eq!(second.status, StatusCode::CREATED);
    assert!(!second.replayed());
    assert_ne!(first.json()["id"], second.json()["id"]);
    assert_eq!(h.charges().await, 2);
}

fn fp(n: u8) -> Fingerprint {
    Fingerprint([n; 32])
}

on_every_backend!(a_stuck_claim_is_taken_over_and_its_holder_fenced);
async fn a_stuck_claim_is_taken_over_and_its_holder_fenced(h: &Harness) {
    let store = &h.store;
    let Claim::Acquired(zombie) = store
        .claim("acct_a", "k", &fp(1), TTL)
        .await
        .expect("claim")
    else {
        panic!("a new key is acquired");
    };
    match store
        .claim("acct_a", "k", &fp(1), TTL)
        .await
        .expect("claim")
    {
        Claim::InProgress { lease_left } => assert!(lease_left <= LEASE),
        other => panic!("expected in progress, got {other:?}"),
    }
    h.pass(LEASE + Duration::from_millis(200)).await;
    let Claim::Acquired(winner) = store
        .claim("acct_a", "k", &fp(1), TTL)
        .await
        .expect("claim")
    else {
        panic!("a claim whose lease ran out is taken over");
    };
    assert_eq!(winner.takeover, Some(Takeover::LeaseExpired));
    assert!(winner.fence > zombie.fence);
    // The zombie wakes up: it can neither complete (with its business record) nor release nor extend.
    let record = RecordWrite::put("payments", "pay_zombie", "{}");
    let refused = store
        .complete(&zombie, &StoredResponse::new(201, "zombie"), &[record])
        .await;
    assert!(
        matches!(refused, Err(StoreError::LeaseLost { .. })),
        "{refused:?}"
    );
    assert!(
        store
            .record("payments", "pay_zombie")
            .await
            .expect("read")
            .is_none()
    );
    assert!(matches!(
        store.release(&zombie).await,
        Err(StoreError::LeaseLost { .. })
    ));
    assert!(matches!(
        store.extend(&zombie).await,
        Err(StoreError::LeaseLost { .. })
    ));
    store
        .complete(&winner, &StoredResponse::new(201, "winner"), &[])
        .await
        .expect("the winner completes");
    match store
        .claim("acct_a", "k", &fp(1), TTL)
        .await
        .expect("claim")
    {
        Claim::Completed(stored) => assert_eq!(stored.body, Bytes::from("winner")),
        other => panic!("expected the winner's response, got {other:?}"),
    }
}

on_every_backend!(a_business_record_exists_exactly_when_its_key_completes);
async fn a_business_record_exists_exactly_when_its_key_completes(h: &Harness) {
    let store = &h.store;
    let Claim::Acquired(released) = store
        .claim("acct_a", "k1", &fp(1), TTL)
        .await
        .expect("claim")
    else {
        panic!("acquired");
    };
    store.release(&released).await.expect("release");
    assert!(
        store
            .record("payments", "pay_1")
            .await
            .expect("read")
            .is_none()
    );
    let Claim::Acquired(token) = store
        .claim("acct_a", "k1", &fp(1), TTL)
        .await
        .expect("claim")
    else {
        panic!("a released key is acquired again");
    };
    assert!(token.fence > released.fence);
    let record = RecordWrite::put("payments", "pay_1", r#"{"amount":1}"#);
    store
        .complete(&token, &StoredResponse::new(201, "ok"), &[record])
        .await
        .expect("complete");
    assert_eq!(
        store.record("payments", "pay_1").await.expect("read"),
        Some(Bytes::from(r#"{"amount":1}"#))
    );
    assert!(matches!(
        store
            .claim("acct_a", "k1", &fp(2), TTL)
            .await
            .expect("claim"),
        Claim::Mismatch { .. }
    ));
}

on_every_backend!(the_provider_dedups_and_counts_each_charge_once);
async fn the_provider_dedups_and_counts_each_charge_once(h: &Harness) {
    let store = &h.store;
    let write = RecordWrite::put("gateway.charges", "charge:1:a:k", "first");
    assert_eq!(
        store
            .insert_once(&write, "charges_total")
            .await
            .expect("insert"),
        InsertOnce::Inserted
    );
    let again = RecordWrite::put("gateway.charges", "charge:1:a:k", "second");
    assert_eq!(
        store
            .insert_once(&again, "charges_total")
            .await
            .expect("insert"),
        InsertOnce::Existing(Bytes::from("first"))
    );
    assert_eq!(store.counter("charges_total").await.expect("counter"), 1);
}

// ---- Issue 13: key status, differing fields, per-account quota ----

fn status_path(key: &str) -> String {
    format!("/idempotency-keys/{key}")
}

on_every_backend!(the_status_of_a_completed_key_is_its_response_and_reading_it_changes_nothing);
async fn the_status_of_a_completed_key_is_its_response_and_reading_it_changes_nothing(h: &Harness) {
    let first = h.pay(KEY_A, "order-1", BODY).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let status = h.get(KEY_A, &status_path("order-1")).await;
    assert_eq!(status.status, StatusCode::OK, "{status:?}");
    assert_eq!(status.header("content-type"), Some("application/json"));
    let body = status.json();
    assert_eq!(body["key"], "order-1");
    assert_eq!(body["state"], "completed");
    assert_eq!(body["response_status"], 201);
    assert_eq!(body["location"].as_str(), first.header("location"));
    assert!(body.get("retry_after").is_none());
    for field in ["created_at", "expires_at"] {
        let at = body[field].as_str().expect(field);
        assert!(
            at.len() == 24 && at.ends_with('Z') && at.as_bytes()[10] == b'T',
            "{at}"
        );
    }
    assert!(body["created_at"].as_str() < body["expires_at"].as_str());
    // Reading changed nothing: the replay is the stored response, nothing charged again.
    let again = h.pay(KEY_A, "order-1", BODY).await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(h.charges().await, 1);
    // Another account, an unknown key: the same 404; no credentials: 401.
    for (api_key, key) in [(KEY_B, "order-1"), (KEY_A, "never-used")] {
        let missing = h.get(api_key, &status_path(key)).await;
        assert_eq!(missing.status, StatusCode::NOT_FOUND, "{missing:?}");
        assert_eq!(
            missing.header("content-type"),
            Some("application/problem+json")
        );
    }
    let anonymous = h
        .send(
            axum::http::Request::get(status_path("order-1"))
                .body(axum::body::Body::empty())
                .expect("request"),
        )
        .await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    // An expired key is a 404 too.
    h.pass(TTL + Duration::from_millis(200)).await;
    assert_eq!(
        h.get(KEY_A, &status_path("order-1")).await.status,
        StatusCode::NOT_FOUND
    );
}

on_every_backend!(the_status_path_names_the_key_as_stored_for_quoted_and_bare_headers);
async fn the_status_path_names_the_key_as_stored_for_quoted_and_bare_headers(h: &Harness) {
    assert_eq!(
        h.pay(KEY_A, "\"quoted-1\"", BODY).await.status,
        StatusCode::CREATED
    );
    assert_eq!(
        h.pay(KEY_A, "a/b?c", BODY).await.status,
        StatusCode::CREATED
    );
    let quoted = h.get(KEY_A, &status_path("quoted-1")).await;
    assert_eq!(quoted.status, StatusCode::OK, "{quoted:?}");
    assert_eq!(quoted.json()["key"], "quoted-1");
    let encoded = h.get(KEY_A, &status_path("a%2Fb%3Fc")).await;
    assert_eq!(encoded.status, StatusCode::OK, "{encoded:?}");
    assert_eq!(encoded.json()["key"], "a/b?c");
}

on_every_backend!(the_status_of_a_running_key_never_extends_its_lease);
async fn the_status_of_a_running_key_never_extends_its_lease(h: &Harness) {
    let store = &h.store;
    let Claim::Acquired(first) = store
        .claim("acct_a", "running", &fp(1), TTL)
        .await
        .expect("claim")
    else {
        panic!("acquired");
    };
    for _ in 0..3 {
        let status = h.get(KEY_A, &status_path("running")).await;
        assert_eq!(status.status, StatusCode::OK, "{status:?}");
        let body = status.json();
        assert_eq!(body["state"], "in_progress");
        assert_eq!(body["retry_after"], 1);
        assert!(body.get("response_status").is_none());
        h.pass(LEASE / 4).await;
    }
    h.pass(LEASE / 4 + Duration::from_millis(200)).await;
    // The lease ran out on schedule: the reads did not renew it.
    let Claim::Acquired(winner) = store
        .claim("acct_a", "running", &fp(1), TTL)
        .await
        .expect("claim")
    else {
        panic!("the lease was not extended by the status reads");
    };
    assert_eq!(winner.takeover, Some(Takeover::LeaseExpired));
    assert!(winner.fence > first.fence);
}

on_every_backend!(a_reused_key_422_names_the_differing_fields_and_no_values);
async fn a_reused_key_422_names_the_differing_fields_and_no_values(h: &Harness) {
    assert_eq!(
        h.pay(KEY_A, "order-1", BODY).await.status,
        StatusCode::CREATED
    );
    let cases: [(&str, &[&str]); 3] = [
        (r#"{"amount": 250.00, "currency": "BRL"}"#, &["/amount"]),
        (
            r#"{"amount": 7, "currency": "USD"}"#,
            &["/amount", "/currency"],
        ),
        (
            r#"{"amount": 100, "currency": "BRL", "note": "x"}"#,
            &["/note"],
        ),
    ];
    for (body, expected) in cases {
        let reply = h.pay(KEY_A, "order-1", body).await;
        assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY, "{reply:?}");
        assert_eq!(
            reply.header("content-type"),
            Some("application/problem+json")
        );
        let json = reply.json();
        assert_eq!(
            json["differing_fields"],
            serde_json::json!(expected),
            "{body}"
        );
        // No value of either request anywhere in the answer. The request id is random (a UUID
        // may well contain "250"), so it is left out of the search.
        let mut without_id = json.clone();
        if let Some(fields) = without_id.as_object_mut() {
            fields.remove("request_id");
        }
        let text = without_id.to_string();
        assert!(!text.contains("250") && !text.contains("USD"), "{text}");
    }
    // A member that disappeared is named from the stored side.
    let reply = h.pay(KEY_A, "order-1", r#"{"amount": 100}"#).await;
    assert_eq!(
        reply.json()["differing_fields"],
        serde_json::json!(["/currency"])
    );
    // Query and content type; a body that is no longer JSON is compared whole ("").
    let request = axum::http::Request::post("/payments?x=1")
        .header("authorization", format!("Bearer {KEY_A}"))
        .header("content-type", "text/plain")
        .header("idempotency-key", "order-1")
        .body(axum::body::Body::from(BODY))
        .expect("request");
    let reply = h.send(request).await;
    assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        reply.json()["differing_fields"],
        serde_json::json!(["", "content-type", "query"])
    );
    assert_eq!(h.charges().await, 1);
    assert_eq!(h.outcome(Outcome::Mismatch), 5);
}

on_every_backend!(
    a_new_key_over_the_account_quota_is_429_and_the_quota_frees_itself,
    Settings {
        max_live_keys: 2,
        ..Settings::default()
    }
);
async fn a_new_key_over_the_account_quota_is_429_and_the_quota_frees_itself(h: &Harness) {
    for key in ["k1", "k2"] {
        assert_eq!(h.pay(KEY_A, key, BODY).await.status, StatusCode::CREATED);
    }
    let refused = h.pay(KEY_A, "k3", BODY).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{refused:?}");
    assert_eq!(
        refused.header("content-type"),
        Some("application/problem+json")
    );
    let wait: u64 = refused
        .header("retry-after")
        .expect("retry-after")
        .parse()
        .expect("seconds");
    assert!((1..=2).contains(&wait), "{wait}");
    assert_eq!(h.charges().await, 2, "nothing charged");
    assert_eq!(h.outcome(Outcome::QuotaExceeded), 1);
    assert_eq!(
        h.get(KEY_A, &status_path("k3")).await.status,
        StatusCode::NOT_FOUND,
        "nothing claimed"
    );
    // Existing keys still replay and report; other accounts are unaffected.
    assert!(h.pay(KEY_A, "k1", BODY).await.replayed());
    assert_eq!(
        h.get(KEY_A, &status_path("k2")).await.status,
        StatusCode::OK
    );
    assert_eq!(h.pay(KEY_B, "k3", BODY).await.status, StatusCode::CREATED);
    // The account's keys expire: the quota frees itself.
    h.pass(TTL + Duration::from_millis(1100)).await;
    assert_eq!(h.pay(KEY_A, "k3", BODY).await.status, StatusCode::CREATED);
}

on_every_backend!(
    concurrent_new_keys_at_the_quota_admit_exactly_the_quota,
    Settings {
        max_live_keys: 5,
        ..Settings::default()
    }
);
async fn concurrent_new_keys_at_the_quota_admit_exactly_the_quota(h: &Harness) {
    let mut tasks = Vec::new();
    for i in 0..16 {
        let router = h.router.clone();
        tasks.push(tokio::spawn(async move {
            send(&router, payment(KEY_A, Some(&format!("c{i}")), BODY)).await
        }));
    }
    let (mut created, mut refused) = (0, 0);
    for task in tasks {
        let reply = task.await.expect("task");
        match reply.status {
            StatusCode::CREATED => created += 1,
            StatusCode::TOO_MANY_REQUESTS => refused += 1,
            other => panic!("unexpected {other}: {reply:?}"),
        }
    }
    assert_eq!((created, refused), (5, 11));
    assert_eq!(h.charges().await, 5);
}
