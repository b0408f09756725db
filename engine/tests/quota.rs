//! Per-scope quota of live records and request digests: counts under expiry, release, sweep,
//! compaction and recovery; exactness under concurrency; digests through every snapshot.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use idemlog::{ClaimOptions, ClaimOutcome, RecordState, RequestDigest, Store};

fn limited(max: u64) -> ClaimOptions<'static> {
    ClaimOptions {
        max_live_per_scope: Some(max),
        ..ClaimOptions::default()
    }
}

fn claim(store: &Store, scope: &str, key: &str, ttl: Duration, max: u64) -> ClaimOutcome {
    store
        .claim_with(scope.as_bytes(), key.as_bytes(), &fp(1), ttl, &limited(max))
        .expect("claim")
}

#[test]
fn a_full_scope_refuses_new_keys_but_not_replays_or_other_scopes() {
    let f = Fixture::new();
    let store = f.open();
    for i in 0..3 {
        let ClaimOutcome::Acquired(t) = claim(&store, "a", &format!("k{i}"), TTL, 3) else {
            panic!("under the quota");
        };
        store.complete(&t, &created("ok"), &[]).expect("complete");
    }
    let ClaimOutcome::QuotaExceeded { retry_after } = claim(&store, "a", "k3", TTL, 3) else {
        panic!("the fourth new key is refused");
    };
    assert!(
        retry_after <= TTL + Duration::from_secs(1) && retry_after >= TTL - Duration::from_secs(1)
    );
    assert!(
        store.get(b"a", b"k3").expect("get").is_none(),
        "nothing written"
    );
    assert!(matches!(
        claim(&store, "a", "k0", TTL, 3),
        ClaimOutcome::Completed(_)
    ));
    assert!(matches!(
        claim(&store, "b", "k3", TTL, 3),
        ClaimOutcome::Acquired(_)
    ));
    assert_eq!(store.live_records(b"a"), 3);
}

#[test]
fn expiry_release_sweep_and_recovery_keep_the_count_exact() {
    let f = Fixture::new();
    let store = f.open();
    let short = Duration::from_secs(10);
    let t0 = match claim(&store, "a", "short", short, 3) {
        ClaimOutcome::Acquired(t) => t,
        other => panic!("{other:?}"),
    };
    store.complete(&t0, &created("ok"), &[]).expect("complete");
    let released = match claim(&store, "a", "released", TTL, 3) {
        ClaimOutcome::Acquired(t) => t,
        other => panic!("{other:?}"),
    };
    assert!(matches!(
        claim(&store, "a", "long", TTL, 3),
        ClaimOutcome::Acquired(_)
    ));
    assert_eq!(store.live_records(b"a"), 3);
    store.release(&released).expect("release");
    assert_eq!(
        store.live_records(b"a"),
        2,
        "a released record stops counting"
    );
    assert!(matches!(
        claim(&store, "a", "again", TTL, 3),
        ClaimOutcome::Acquired(_)
    ));
    let ClaimOutcome::QuotaExceeded { retry_after } = claim(&store, "a", "full", TTL, 3) else {
        panic!("full");
    };
    assert_eq!(retry_after, short, "until the short record expires");
    // The short record expires: its place frees itself, with or without a sweep.
    f.clock.advance(short);
    assert_eq!(store.live_records(b"a"), 2);
    store.sweep();
    assert_eq!(store.live_records(b"a"), 2);
    // Recovery recounts from the log: in-progress and completed records count, released ones not.
    store.close().expect("close");
    let store = f.open();
    assert_eq!(store.live_records(b"a"), 2);
    assert!(matches!(
        claim(&store, "a", "k4", TTL, 3),
        ClaimOutcome::Acquired(_)
    ));
    assert!(matches!(
        claim(&store, "a", "k5", TTL, 3),
        ClaimOutcome::QuotaExceeded { .. }
    ));
    // Compaction changes nothing.
    store.compact().expect("compact");
    assert_eq!(store.live_records(b"a"), 3);
    store.close().expect("close");
    let store = f.open();
    assert_eq!(store.live_records(b"a"), 3);
    // Everything expires: the scope is empty again.
    f.clock.advance(TTL + Duration::from_secs(1));
    assert_eq!(store.live_records(b"a"), 0);
    assert!(matches!(
        claim(&store, "a", "k5", TTL, 3),
        ClaimOutcome::Acquired(_)
    ));
}

#[test]
fn a_takeover_of_an_expired_key_is_a_new_key_and_of_a_stuck_claim_is_not() {
    let f = Fixture::new();
    let store = f.open();
    let short = Duration::from_secs(60);
    assert!(matches!(
        claim(&store, "a", "stuck", short, 2),
        ClaimOutcome::Acquired(_)
    ));
    assert!(matches!(
        claim(&store, "a", "other", TTL, 2),
        ClaimOutcome::Acquired(_)
    ));
    // The stuck claim's lease runs out: taking it over is allowed at the limit.
    f.clock.advance(LEASE + Duration::from_secs(1));
    assert!(matches!(
        claim(&store, "a", "stuck", short, 2),
        ClaimOutcome::Acquired(_)
    ));
    assert_eq!(store.live_records(b"a"), 2);
    // Once it expired, claiming it again is a new key: admitted, since it no longer counts.
    f.clock.advance(short + Duration::from_secs(1));
    assert_eq!(store.live_records(b"a"), 1);
    assert!(matches!(
        claim(&store, "a", "stuck", TTL, 2),
        ClaimOutcome::Acquired(_)
    ));
    assert!(matches!(
        claim(&store, "a", "third", TTL, 2),
        ClaimOutcome::QuotaExceeded { .. }
    ));
}

#[test]
fn concurrent_new_keys_at_the_limit_admit_exactly_the_quota() {
    let f = Fixture::new();
    let store = f.open();
    let acquired = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (store, acquired, refused) =
                (store.clone(), Arc::clone(&acquired), Arc::clone(&refused));
            thread::spawn(move || {
                for i in 0..25 {
                    match claim(&store, "a", &format!("t{t}-{i}"), TTL, 50) {
                        ClaimOutcome::Acquired(_) => acquired.fetch_add(1, Ordering::SeqCst),
                        ClaimOutcome::QuotaExceeded { .. } => {
                            refused.fetch_add(1, Ordering::SeqCst)
                        }
                        other => panic!("{other:?}"),
                    };
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    assert_eq!(acquired.load(Ordering::SeqCst), 50);
    assert_eq!(refused.load(Ordering::SeqCst), 150);
    assert_eq!(store.live_records(b"a"), 50);
}

#[test]
fn a_request_digest_survives_completion_renewal_compaction_and_reopen() {
    let f = Fixture::new();
    let store = f.open();
    let digest = b"\x01some-digest".as_slice();
    let options = ClaimOptions {
        request_digest: RequestDigest::Given(digest),
        ..ClaimOptions::default()
    };
    let ClaimOutcome::Acquired(token) = store
        .claim_with(b"a", b"k", &fp(1), TTL, &options)
        .expect("claim")
    else {
        panic!("acquired");
    };
    let seen = |store: &Store| store.get(b"a", b"k").expect("get").expect("record");
    assert_eq!(
        seen(&store).request_digest,
        Some(Bytes::from_static(digest))
    );
    store.extend(&token).expect("extend");
    assert_eq!(
        seen(&store).request_digest,
        Some(Bytes::from_static(digest))
    );
    store
        .complete(&token, &created("ok"), &[])
        .expect("complete");
    let record = seen(&store);
    assert!(matches!(record.state, RecordState::Completed(_)));
    assert_eq!(record.request_digest, Some(Bytes::from_static(digest)));
    store.compact().expect("compact");
    store.close().expect("close");
    let store = f.open();
    assert_eq!(
        seen(&store).request_digest,
        Some(Bytes::from_static(digest))
    );
    // A record claimed without a digest has none, and an oversized digest is refused.
    acquire(&store, "a", "plain", fp(1));
    assert_eq!(
        store
            .get(b"a", b"plain")
            .expect("get")
            .expect("record")
            .request_digest,
        None
    );
    let big = vec![1u8; 8 * 1024 + 1];
    assert!(claim_with_digest(&store, "big", 1, RequestDigest::Given(&big)).is_err());
}

/// A claim in scope `a` storing `digest`.
fn claim_with_digest(
    store: &Store,
    key: &str,
    fingerprint: u8,
    digest: RequestDigest<'_>,
) -> idemlog::Result<ClaimOutcome> {
    let options = ClaimOptions {
        request_digest: digest,
        ..ClaimOptions::default()
    };
    store.claim_with(b"a", key.as_bytes(), &fp(fingerprint), TTL, &options)
}

/// A claim with a digest computed on demand, counting the computations.
fn lazy_claim(store: &Store, key: &str, fingerprint: u8, calls: &AtomicUsize) -> ClaimOutcome {
    let compute = || {
        calls.fetch_add(1, Ordering::SeqCst);
        Bytes::from_static(b"\x01lazy-digest")
    };
    claim_with_digest(store, key, fingerprint, RequestDigest::Lazy(&compute)).expect("claim")
}

#[test]
fn a_lazy_digest_is_computed_only_by_a_claim_that_writes_and_is_stored() {
    let f = Fixture::new();
    let store = f.open();
    let calls = AtomicUsize::new(0);
    let ClaimOutcome::Acquired(token) = lazy_claim(&store, "k", 1, &calls) else {
        panic!("a new key is acquired");
    };
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "computed once for the write"
    );
    assert!(matches!(
        lazy_claim(&store, "k", 1, &calls),
        ClaimOutcome::InProgress { .. }
    ));
    assert!(matches!(
        lazy_claim(&store, "k", 2, &calls),
        ClaimOutcome::Mismatch
    ));
    store
        .complete(&token, &created("ok"), &[])
        .expect("complete");
    assert!(matches!(
        lazy_claim(&store, "k", 1, &calls),
        ClaimOutcome::Completed(_)
    ));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "neither the 409, the mismatch nor the replay computed it"
    );
    let stored = store.get(b"a", b"k").expect("get").expect("record");
    assert_eq!(
        stored.request_digest,
        Some(Bytes::from_static(b"\x01lazy-digest"))
    );
    store.close().expect("close");
    let store = f.open();
    let stored = store.get(b"a", b"k").expect("get").expect("record");
    assert_eq!(
        stored.request_digest,
        Some(Bytes::from_static(b"\x01lazy-digest")),
        "and it is in the log"
    );
}

#[test]
fn a_lazy_digest_over_8_kib_refuses_the_claim_and_writes_nothing() {
    let f = Fixture::new();
    let store = f.open();
    let compute = || Bytes::from(vec![1u8; 8 * 1024 + 1]);
    assert!(claim_with_digest(&store, "big", 1, RequestDigest::Lazy(&compute)).is_err());
    assert!(store.get(b"a", b"big").expect("get").is_none());
    assert_eq!(store.live_records(b"a"), 0);
}
