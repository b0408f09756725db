//! The running counts behind `Store::metrics` (records, in progress, side records, bytes) stay
//! equal to a full walk of the index while many threads claim, take over, complete, release and
//! write side records with short TTLs, and sweeps, compactions and a reopen run meanwhile.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use common::{TempDir, created, fp};
use idemlog::storage::FsStorage;
use idemlog::{ClaimOutcome, Durability, Options, SideWrite, Store};

const THREADS: u64 = 4;
const STEPS: u64 = 3000;

fn options() -> Options {
    Options::default()
        .storage(Arc::new(FsStorage))
        .durability(Durability::None)
        .lease(Duration::from_millis(5))
        .segment_size(8 << 10)
        .compaction(None)
}

fn work(store: &Store, t: u64) {
    let mut x = t.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for _ in 0..STEPS {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let key = format!("k{}", x % 1024);
        let ttl = Duration::from_millis(1 + x % 40);
        match store.claim(b"acct", key.as_bytes(), &fp((x % 2) as u8), ttl) {
            Ok(ClaimOutcome::Acquired(token)) => match (x >> 8) % 4 {
                // Leave it in progress: its lease runs out and a later claim takes it over.
                0 => {}
                1 => {
                    let _ = store.release(&token);
                }
                _ => {
                    let side = [SideWrite::put_with_ttl(
                        "payments",
                        format!("p{}", x % 32),
                        "{}",
                        ttl,
                    )];
                    let _ = store.complete(&token, &created("done"), &side);
                }
            },
            Ok(_) => {}
            Err(e) => panic!("claim: {e}"),
        }
        if x.is_multiple_of(97) {
            store
                .side_write(&[SideWrite::remove("payments", format!("p{}", x % 32))])
                .expect("side remove");
        }
    }
}

#[test]
fn running_counts_equal_a_walk_under_concurrency_expiry_compaction_and_recovery() {
    let dir = TempDir::new("running-counts");
    let store = Store::open(&dir.0, options()).expect("open");
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let store = store.clone();
            thread::spawn(move || work(&store, t))
        })
        .collect();
    let done = Arc::new(AtomicBool::new(false));
    let maintainer = {
        let store = store.clone();
        let done = Arc::clone(&done);
        thread::spawn(move || {
            while !done.load(Ordering::Acquire) {
                store.sweep();
                store.compact().expect("compact");
                thread::sleep(Duration::from_millis(2));
            }
        })
    };
    for w in workers {
        w.join().expect("worker");
    }
    done.store(true, Ordering::Release);
    maintainer.join().expect("maintainer");
    store.check_running_counts().expect("after the run");
    store.sweep();
    store.compact().expect("compact");
    store
        .check_running_counts()
        .expect("after a sweep and a compaction");
    let metrics = store.metrics();
    assert!(metrics.compactions > 0, "{metrics:?}");
    assert!(metrics.compaction_reclaimed_bytes > 0, "{metrics:?}");
    store.close().expect("close");

    // Recovery rebuilds the index through the same functions: the counts follow.
    let store = Store::open(&dir.0, options()).expect("reopen");
    store.check_running_counts().expect("after recovery");
    thread::sleep(Duration::from_millis(50));
    store.sweep();
    store
        .check_running_counts()
        .expect("after everything expired");
    let metrics = store.metrics();
    assert_eq!(
        (metrics.records, metrics.in_progress),
        (0, 0),
        "every record expired"
    );
    store.close().expect("close");
}

#[test]
fn fdatasync_and_group_commit_histograms_count_synced_operations() {
    let dir = TempDir::new("histograms");
    let store = Store::open(
        &dir.0,
        Options::default()
            .storage(Arc::new(FsStorage))
            .durability(Durability::Sync),
    )
    .expect("open");
    for i in 0..10 {
        let key = format!("k{i}");
        let ClaimOutcome::Acquired(token) = store
            .claim(b"acct", key.as_bytes(), &fp(1), Duration::from_secs(60))
            .expect("claim")
        else {
            panic!("fresh key");
        };
        store
            .complete(
                &token,
                &created("done"),
                &[SideWrite::put("payments", key, "{}")],
            )
            .expect("complete");
    }
    let m = store.metrics();
    assert_eq!(m.fdatasync_seconds.count, m.syncs);
    assert!(m.fdatasync_seconds.sum > 0.0);
    // The fence floor written at open, then 10 claims (1 operation each) and 10 completions (2
    // each), one caller: 21 syncs, 31 operations.
    assert_eq!(m.commit_batch_operations.count, 21);
    let ops: f64 = m.commit_batch_operations.sum;
    assert_eq!(ops, 31.0);
    assert_eq!(m.records, 10);
    assert_eq!(m.side_records, 10);
    store.close().expect("close");
}
