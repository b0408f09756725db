//! The claim / complete / release / extend contract, one scenario per test.

mod common;

use std::time::Duration;

use common::{Fixture, LEASE, TTL, acquire, created, fp};
use idemlog::{
    ClaimOutcome, Error, RecordState, RecoveredClaims, SideWrite, StoredResponse, Takeover,
};

#[test]
fn fresh_key_is_acquired_without_takeover() {
    let f = Fixture::new();
    let store = f.open();
    let token = acquire(&store, "acct", "k1", fp(1));
    assert_eq!(token.takeover(), None);
    assert_eq!(token.scope(), b"acct");
    assert_eq!(token.key(), b"k1");
}

#[test]
fn completed_key_replays_the_stored_response() {
    let f = Fixture::new();
    let store = f.open();
    let token = acquire(&store, "acct", "k1", fp(1));
    let response = created(r#"{"id":"pay_1"}"#).with_header("ETag", vec![0xff, 0x00]);
    store.complete(&token, &response, &[]).unwrap();
    let again = store.claim(b"acct", b"k1", &fp(1), TTL).unwrap();
    assert_eq!(again, ClaimOutcome::Completed(response));
}

#[test]
fn same_key_with_other_fingerprint_is_a_mismatch_while_running_and_after() {
    let f = Fixture::new();
    let store = f.open();
    let token = acquire(&store, "acct", "k1", fp(1));
    assert_eq!(
        store.claim(b"acct", b"k1", &fp(2), TTL).unwrap(),
        ClaimOutcome::Mismatch
    );
    store.complete(&token, &created("{}"), &[]).unwrap();
    assert_eq!(
        store.claim(b"acct", b"k1", &fp(2), TTL).unwrap(),
        ClaimOutcome::Mismatch
    );
}

#[test]
fn retry_while_running_reports_time_left_on_the_lease() {
    let f = Fixture::new();
    let store = f.open();
    acquire(&store, "acct", "k1", fp(1));
    f.clock.advance(Duration::from_secs(10));
    assert_eq!(
        store.claim(b"acct", b"k1", &fp(1), TTL).unwrap(),
        ClaimOutcome::InProgress {
            retry_after: LEASE - Duration::from_secs(10)
        }
    );
}

#[test]
fn scopes_do_not_share_keys() {
    let f = Fixture::new();
    let store = f.open();
    let a = acquire(&store, "acct_a", "same", fp(1));
    store.complete(&a, &created("a"), &[]).unwrap();
    let b = acquire(&store, "acct_b", "same", fp(1));
    store.complete(&b, &created("b"), &[]).unwrap();
    let ClaimOutcome::Completed(replay) = store.claim(b"acct_b", b"same", &fp(1), TTL).unwrap()
    else {
        panic!("expected replay");
    };
    assert_eq!(replay.body, "b");
}

#[test]
fn released_key_can_be_claimed_again_with_a_larger_fence() {
    let f = Fixture::new();
    let store = f.open();
    let first = acquire(&store, "acct", "k1", fp(1));
    store.release(&first).unwrap();
    assert_eq!(store.get(b"acct", b"k1").unwrap(), None);
    let second = acquire(&store, "acct", "k1", fp(2));
    assert!(second.fence() > first.fence());
    assert_eq!(second.takeover(), None);
}

#[test]
fn expired_lease_is_taken_over_and_the_zombie_cannot_complete() {
    let f = Fixture::new();
    let store = f.open();
    let zombie = acquire(&store, "acct", "k1", fp(1));
    f.clock.advance(LEASE + Duration::from_millis(1));
    let winner = acquire(&store, "acct", "k1", fp(1));
    assert_eq!(winner.takeover(), Some(Takeover::LeaseExpired));
    assert!(winner.fence() > zombie.fence());

    let err = store
        .complete(&zombie, &created("zombie"), &[])
        .unwrap_err();
    assert!(matches!(err, Error::LeaseLost { .. }), "{err}");
    assert!(matches!(
        store.release(&zombie),
        Err(Error::LeaseLost { .. })
    ));
    assert!(matches!(
        store.extend(&zombie),
        Err(Error::LeaseLost { .. })
    ));

    store.complete(&winner, &created("winner"), &[]).unwrap();
    let ClaimOutcome::Completed(replay) = store.claim(b"acct", b"k1", &fp(1), TTL).unwrap() else {
        panic!("expected replay");
    };
    assert_eq!(replay.body, "winner");
}

#[test]
fn zombie_completion_writes_nothing() {
    let f = Fixture::new();
    let store = f.open();
    let zombie = acquire(&store, "acct", "k1", fp(1));
    f.clock.advance(LEASE * 2);
    acquire(&store, "acct", "k1", fp(1));
    let before = store.stats().bytes_appended;
    let side = [SideWrite::put("payments", "p1", "zombie payment")];
    assert!(store.complete(&zombie, &created("z"), &side).is_err());
    assert_eq!(store.stats().bytes_appended, before);
    assert_eq!(store.side_get(b"payments", b"p1").unwrap(), None);
}

#[test]
fn lease_expiry_without_a_competitor_still_lets_the_holder_complete() {
    let f = Fixture::new();
    let store = f.open();
    let slow = acquire(&store, "acct", "k1", fp(1));
    f.clock.advance(LEASE * 2);
    store.complete(&slow, &created("slow"), &[]).unwrap();
}

#[test]
fn extend_pushes_the_lease_out() {
    let f = Fixture::new();
    let store = f.open();
    let token = acquire(&store, "acct", "k1", fp(1));
    f.clock.advance(LEASE - Duration::from_secs(1));
    assert_eq!(store.extend(&token).unwrap(), LEASE);
    f.clock.advance(Duration::from_secs(5));
    assert_eq!(
        store.claim(b"acct", b"k1", &fp(1), TTL).unwrap(),
        ClaimOutcome::InProgress {
            retry_after: LEASE - Duration::from_secs(5)
        }
    );
}

#[test]
fn record_past_its_ttl_is_replaced_by_a_new_claim() {
    let f = Fixture::new();
    let store = f.open();
    let token = acquire(&store, "acct", "k1", fp(1));
    store.complete(&token, &created("old"), &[]).unwrap();
    f.clock.advance(TTL);
    assert_eq!(store.get(b"acct", b"k1").unwrap(), None);
    let token = acquire(&store, "acct", "k1", fp(2));
    assert_eq!(token.takeover(), Some(Takeover::Expired));
}

#[test]
fn holder_cannot_complete_after_the_ttl() {
    let f = Fixture::new();
    let store = f.open();
    let token = acquire(&store, "acct", "k1", fp(1));
    f.clock.advance(TTL);
    assert!(matches!(
        store.complete(&token, &created("late"), &[]),
        Err(Error::LeaseLost { .. })
    ));
}

#[test]
fn completion_and_side_records_land_together() {
    let f = Fixture::new();
    let store = f.open();
    let token = acquire(&store, "acct", "k1", fp(1));
    let side = [
        SideWrite::put("payments", "pay_1", "{\"amount\":100}"),
        SideWrite::put_with_ttl("charges", "charge:acct:k1", "ch_1", TTL),
    ];
    store.complete(&token, &created("{}"), &side).unwrap();
    assert_eq!(
        store.side_get(b"payments", b"pay_1").unwrap().unwrap(),
        "{\"amount\":100}"
    );
    assert_eq!(
        store
            .side_get(b"charges", b"charge:acct:k1")
            .unwrap()
            .unwrap(),
        "ch_1"
    );
    assert_eq!(
        store.stats().frames_appended,
        3,
        "the open's fence floor, the claim, and one completion frame"
    );
}

#[test]
fn side_record_with_ttl_expires() {
    let f = Fixture::new();
    let store = f.open();
    store
        .side_write(&[SideWrite::put_with_ttl(
            "ns",
            "k",
            "v",
            Duration::from_secs(5),
        )])
        .unwrap();
    assert!(store.side_get(b"ns", b"k").unwrap().is_some());
    f.clock.advance(Duration::from_secs(5));
    assert_eq!(store.side_get(b"ns", b"k").unwrap(), None);
}

#[test]
fn side_records_can_be_removed() {
    let f = Fixture::new();
    let store = f.open();
    store.side_write(&[SideWrite::put("ns", "k", "v")]).unwrap();
    store.side_write(&[SideWrite::remove("ns", "k")]).unwrap();
    assert_eq!(store.side_get(b"ns", b"k").unwrap(), None);
}

#[test]
fn get_shows_state_and_times() {
    let f = Fixture::new();
    let store = f.open();
    let start = 1_700_000_000_000;
    let token = acquire(&store, "acct", "k1", fp(1));
    let record = store.get(b"acct", b"k1").unwrap().unwrap();
    assert_eq!(record.created_at_ms, start);
    assert_eq!(record.expires_at_ms, start + TTL.as_millis() as u64);
    assert_eq!(
        record.state,
        RecordState::InProgress {
            lease_until_ms: start + LEASE.as_millis() as u64
        }
    );
    store.complete(&token, &created("x"), &[]).unwrap();
    let record = store.get(b"acct", b"k1").unwrap().unwrap();
    assert_eq!(record.state, RecordState::Completed(created("x")));
    assert_eq!(record.fingerprint, fp(1));
}

#[test]
fn oversized_and_empty_inputs_are_typed_errors() {
    let f = Fixture::new();
    let store = f.open();
    let long = vec![b'k'; 256];
    assert!(matches!(
        store.claim(b"acct", &long, &fp(1), TTL),
        Err(Error::TooLarge { max: 255, .. })
    ));
    assert!(matches!(
        store.claim(b"acct", b"", &fp(1), TTL),
        Err(Error::Empty(_))
    ));
    assert!(matches!(
        store.claim(b"", b"k", &fp(1), TTL),
        Err(Error::Empty(_))
    ));
    assert!(matches!(
        store.claim(b"acct", b"k", &fp(1), Duration::ZERO),
        Err(Error::InvalidArgument(_))
    ));
    let token = acquire(&store, "acct", "k", fp(1));
    let huge = StoredResponse::new(200, vec![0u8; (4 << 20) + 1]);
    assert!(matches!(
        store.complete(&token, &huge, &[]),
        Err(Error::TooLarge { .. })
    ));
    // The claim is still held and usable after a refused completion.
    store.complete(&token, &created("ok"), &[]).unwrap();
}

#[test]
fn closed_store_refuses_work() {
    let f = Fixture::new();
    let store = f.open();
    let clone = store.clone();
    store.close().unwrap();
    assert!(matches!(
        clone.claim(b"a", b"k", &fp(1), TTL),
        Err(Error::Closed)
    ));
}

#[test]
fn a_wall_clock_step_past_the_lease_leaves_a_live_claim_in_progress() {
    let f = Fixture::new();
    let store = f.open();
    let running = acquire(&store, "acct", "k1", fp(1));
    // NTP steps the wall clock forward by ten leases; no time passes for the running handler.
    f.clock.step_wall_forward(LEASE * 10);
    assert_eq!(
        store.claim(b"acct", b"k1", &fp(1), TTL).unwrap(),
        ClaimOutcome::InProgress { retry_after: LEASE }
    );
    store.complete(&running, &created("done"), &[]).unwrap();
}

#[test]
fn a_wall_clock_step_back_does_not_stretch_a_lease() {
    let f = Fixture::new();
    let store = f.open();
    let dead = acquire(&store, "acct", "k1", fp(1));
    f.clock.step_wall_back(Duration::from_secs(3600));
    f.clock.advance_monotonic(LEASE + Duration::from_millis(1));
    let retry = acquire(&store, "acct", "k1", fp(1));
    assert_eq!(retry.takeover(), Some(Takeover::LeaseExpired));
    assert!(retry.fence() > dead.fence());
}

#[test]
fn an_in_progress_claim_recovered_at_open_is_taken_over_by_the_first_retry() {
    let f = Fixture::new();
    let store = f.open();
    let dead = acquire(&store, "acct", "k1", fp(1));
    drop(store);
    // No time passes: the lease written to the log still runs on the wall clock, but its holder
    // was the previous process.
    let store = f.open();
    let retry = acquire(&store, "acct", "k1", fp(1));
    assert_eq!(retry.takeover(), Some(Takeover::LeaseExpired));
    assert!(retry.fence() > dead.fence());
    assert!(matches!(
        store.complete(&dead, &created("dead"), &[]),
        Err(Error::LeaseLost { .. })
    ));
    store.complete(&retry, &created("retry"), &[]).unwrap();
}

/// A store whose claims guard work outside the process (a reverse proxy) reopened with
/// [`RecoveredClaims::HeldUntilLeaseEnd`].
fn open_holding_recovered_claims(f: &Fixture) -> idemlog::Store {
    idemlog::Store::open(
        &f.dir,
        f.options()
            .recovered_claims(RecoveredClaims::HeldUntilLeaseEnd),
    )
    .unwrap()
}

#[test]
fn a_claim_recovered_under_held_leases_answers_in_progress_until_its_lease_ends() {
    let f = Fixture::new();
    let store = f.open();
    let dead = acquire(&store, "acct", "k1", fp(1));
    drop(store);
    f.clock.advance(Duration::from_secs(10));
    let store = open_holding_recovered_claims(&f);
    // 30 s lease written at t0, reopened at t0 + 10 s: 20 s left.
    match store.claim(b"acct", b"k1", &fp(1), TTL).unwrap() {
        ClaimOutcome::InProgress {
            retry_after: lease_left,
        } => {
            assert_eq!(lease_left, LEASE - Duration::from_secs(10))
        }
        other => panic!("expected in progress, got {other:?}"),
    }
    f.clock.advance(Duration::from_secs(19));
    assert!(matches!(
        store.claim(b"acct", b"k1", &fp(1), TTL).unwrap(),
        ClaimOutcome::InProgress { .. }
    ));
    f.clock.advance(Duration::from_secs(1));
    let retry = acquire(&store, "acct", "k1", fp(1));
    assert_eq!(retry.takeover(), Some(Takeover::LeaseExpired));
    assert!(retry.fence() > dead.fence());
}

#[test]
fn a_held_recovered_claim_keeps_the_lease_of_its_last_renewal() {
    let f = Fixture::new();
    let store = f.open();
    let token = acquire(&store, "acct", "k1", fp(1));
    f.clock.advance(Duration::from_secs(25));
    store.extend(&token).unwrap();
    drop(store);
    let store = open_holding_recovered_claims(&f);
    match store.claim(b"acct", b"k1", &fp(1), TTL).unwrap() {
        ClaimOutcome::InProgress {
            retry_after: lease_left,
        } => assert_eq!(lease_left, LEASE),
        other => panic!("expected in progress, got {other:?}"),
    }
}

#[test]
fn a_held_recovered_claim_whose_lease_already_ended_is_taken_over_at_once() {
    let f = Fixture::new();
    let store = f.open();
    acquire(&store, "acct", "k1", fp(1));
    drop(store);
    f.clock.advance(LEASE);
    let store = open_holding_recovered_claims(&f);
    let retry = acquire(&store, "acct", "k1", fp(1));
    assert_eq!(retry.takeover(), Some(Takeover::LeaseExpired));
}

#[test]
fn a_wall_clock_stepped_back_cannot_stretch_a_held_recovered_lease() {
    let f = Fixture::new();
    let store = f.open();
    acquire(&store, "acct", "k1", fp(1));
    drop(store);
    // The log says the lease ends 30 s after t0; the wall clock now reads an hour earlier.
    f.clock.step_wall_back(Duration::from_secs(3600));
    let store = open_holding_recovered_claims(&f);
    match store.claim(b"acct", b"k1", &fp(1), TTL).unwrap() {
        ClaimOutcome::InProgress {
            retry_after: lease_left,
        } => assert_eq!(lease_left, LEASE),
        other => panic!("expected in progress, got {other:?}"),
    }
    f.clock.advance_monotonic(LEASE);
    let retry = acquire(&store, "acct", "k1", fp(1));
    assert_eq!(retry.takeover(), Some(Takeover::LeaseExpired));
}
