//! The payments server's own behaviour on every store backend: each scenario below runs as
//! `<scenario>::embedded` and `<scenario>::postgres`. These need the payments app (charges, the
//! provider's deduplication, a payment read by its owner); what every store must do whatever the
//! app is the layer crate's conformance suite (`idemlog_idempotency::testkit::conformance`), which
//! `server/idempotency/tests/conformance.rs` runs against both backends.
//!
//! The PostgreSQL variants need `DATABASE_URL` (`scripts/pg-test-cluster run -- cargo test`); where
//! it is missing they print a skip line, unless CI set PostgreSQL up, where they fail.

mod common;
#[path = "behaviour/harness.rs"]
mod harness;

use axum::http::StatusCode;
use harness::*;
use idemlog_idempotency::Outcome;

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
