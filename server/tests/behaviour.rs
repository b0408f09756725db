//! The server's behaviour, run on every store backend from one suite so the backends cannot drift:
//! each scenario below runs as `<scenario>::embedded` and `<scenario>::postgres`.
//!
//! The PostgreSQL variants need `DATABASE_URL` (`scripts/pg-test-cluster run -- cargo test`); where
//! it is missing they print a skip line, unless CI set PostgreSQL up, where they fail.

#[path = "behaviour/harness.rs"]
mod harness;

use std::time::Duration;

use axum::http::StatusCode;
use bytes::Bytes;
use harness::*;
use idemlog_server::idempotency::Outcome;
use idemlog_server::idempotency::store::{
    ClaimOutcome, Fingerprint, InsertOnce, RecordWrite, StoreError, StoredResponse, Takeover,
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
    let ClaimOutcome::Acquired(zombie) = store
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
        ClaimOutcome::InProgress { lease_left } => assert!(lease_left <= LEASE),
        other => panic!("expected in progress, got {other:?}"),
    }
    h.pass(LEASE + Duration::from_millis(200)).await;
    let ClaimOutcome::Acquired(winner) = store
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
        ClaimOutcome::Completed(stored) => assert_eq!(stored.body, Bytes::from("winner")),
        other => panic!("expected the winner's response, got {other:?}"),
    }
}

on_every_backend!(a_business_record_exists_exactly_when_its_key_completes);
async fn a_business_record_exists_exactly_when_its_key_completes(h: &Harness) {
    let store = &h.store;
    let ClaimOutcome::Acquired(released) = store
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
    let ClaimOutcome::Acquired(token) = store
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
        ClaimOutcome::Mismatch
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
