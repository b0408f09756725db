//! The embedded store opened with `RecoveredClaims::HeldUntilLeaseEnd` (a reverse proxy, whose
//! upstream goes on when the process dies): a claim is on disk before `claim` returns, so a crash
//! while the handler's work runs keeps the key in progress after the restart instead of letting
//! the first retry run the work again. The default store lets the completion's fdatasync cover the
//! claim (its handlers die with the process).

use std::sync::Arc;
use std::time::Duration;

use idemlog::testkit::{CrashMode, FaultOp, FaultyStorage};
use idemlog::{ManualClock, Options, RecoveredClaims};
use idemlog_idempotency::backends::embedded::EmbeddedBackend;
use idemlog_idempotency::store::{Claim, Fingerprint, IdempotencyStore};

const TTL: Duration = Duration::from_secs(3600);
const LEASE: Duration = Duration::from_secs(30);

fn options(storage: &FaultyStorage, clock: &ManualClock) -> Options {
    Options::default()
        .storage(Arc::new(storage.clone()))
        .clock(Arc::new(clock.clone()))
        .lease(LEASE)
        .recovered_claims(RecoveredClaims::HeldUntilLeaseEnd)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_survives_a_power_loss_right_after_it_returns_when_claims_are_held() {
    let storage = FaultyStorage::new();
    let clock = ManualClock::new(1_700_000_000_000);
    let fp = Fingerprint([3; 32]);
    let store = EmbeddedBackend::open("/data", options(&storage, &clock)).expect("open");
    // The claim's fdatasync is slow: a claim that returned before it would not be on disk yet.
    storage.on_next(FaultOp::Sync, "", || {
        std::thread::sleep(Duration::from_millis(300));
    });
    match store.claim("acct", "k1", &fp, TTL).await {
        Ok(Claim::Acquired(_)) => {}
        other => panic!("expected a fresh claim, got {other:?}"),
    }
    // The machine loses power while the handler's work runs elsewhere.
    storage.crash(CrashMode::DropUnsynced);
    drop(store);
    let reopened = EmbeddedBackend::open("/data", options(&storage, &clock)).expect("reopen");
    match reopened.claim("acct", "k1", &fp, TTL).await {
        Ok(Claim::InProgress { lease_left }) => assert_eq!(lease_left, LEASE),
        other => panic!("the claim was lost in the crash: {other:?}"),
    }
}
