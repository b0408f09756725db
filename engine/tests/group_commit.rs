//! `GroupCommit::Gather`: the committer may hold a batch back for more waiters, but never makes a
//! task's wait end before an fdatasync covered its frames, never holds a lone caller back, and
//! never holds any caller longer than `max_wait`.

mod common;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

use common::{Fixture, TTL, fp};
use idemlog::testkit::CrashMode;
use idemlog::{ClaimOptions, ClaimOutcome, Deferred, GroupCommit, Options, Store};

/// Far longer than any test may take, so that a wait that ran it out shows as a failure.
const LONG_WAIT: Duration = Duration::from_secs(1);

struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs `future` on this thread (the engine has no async runtime of its own to test with).
fn block_on<F: Future>(future: F) -> F::Output {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}

fn gather(f: &Fixture, max_batch: usize, max_wait: Duration) -> Options {
    f.options().group_commit(GroupCommit::Gather {
        max_batch,
        max_wait,
    })
}

/// Claims `key` and awaits its durability the way the server does (deferred call, then `durable`).
fn claim_and_await(store: &Store, key: &str) {
    let deferred = store
        .claim_deferred(
            b"acct",
            key.as_bytes(),
            &fp(1),
            TTL,
            &ClaimOptions::default(),
        )
        .expect("claim");
    let Deferred::Ready(ClaimOutcome::Acquired(_), pending) = deferred else {
        panic!("{key}: not acquired");
    };
    block_on(store.durable(pending)).expect("durable");
}

/// `threads` callers at once, each claiming and awaiting keys `t{thread}-{0..per_thread}`.
fn claim_from_threads(store: &Arc<Store>, threads: usize, per_thread: usize) {
    let callers: Vec<_> = (0..threads)
        .map(|t| {
            let store = Arc::clone(store);
            std::thread::spawn(move || {
                for i in 0..per_thread {
                    claim_and_await(&store, &format!("t{t}-{i}"));
                }
            })
        })
        .collect();
    for caller in callers {
        caller.join().expect("caller thread");
    }
}

#[test]
fn gathering_group_commit_does_not_hold_a_lone_caller_back() {
    let f = Fixture::new();
    let store = Store::open(&f.dir, gather(&f, 32, LONG_WAIT)).expect("open");
    let started = Instant::now();
    for i in 0..5 {
        claim_and_await(&store, &format!("k{i}"));
    }
    assert!(
        started.elapsed() < LONG_WAIT / 2,
        "five sequential waits took {:?}: a lone caller waited for a batch",
        started.elapsed()
    );
}

#[test]
fn gathering_group_commit_ends_no_wait_before_an_fdatasync_covers_it() {
    let f = Fixture::new();
    let store =
        Arc::new(Store::open(&f.dir, gather(&f, 8, Duration::from_millis(5))).expect("open"));
    claim_from_threads(&store, 8, 25);
    // Every wait has ended: a power loss now must keep every one of the 200 claims.
    f.fs.crash(CrashMode::DropUnsynced);
    drop(store);
    let reopened = f.open();
    for t in 0..8 {
        for i in 0..25 {
            let key = format!("t{t}-{i}");
            assert!(
                reopened
                    .get(b"acct", key.as_bytes())
                    .expect("get")
                    .is_some(),
                "{key} was acknowledged as durable but lost in a power loss"
            );
        }
    }
}

#[test]
fn gathering_group_commit_holds_no_caller_past_max_wait() {
    let f = Fixture::new();
    let max_wait = Duration::from_millis(20);
    let store = Arc::new(Store::open(&f.dir, gather(&f, 32, max_wait)).expect("open"));
    // Callers that come together make the committer gather ...
    claim_from_threads(&store, 4, 10);
    // ... and then one alone is synced when `max_wait` runs out at the latest, not at the
    // committer's idle interval (100 ms).
    let started = Instant::now();
    claim_and_await(&store, "alone");
    let waited = started.elapsed();
    assert!(waited < max_wait * 4, "a lone waiter waited {waited:?}");
}
