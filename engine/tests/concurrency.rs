//! Many threads on one store: exactly one acquire per key per lifetime, group commit, and side
//! writes to several keys (whose shards are locked together).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use common::{Fixture, TTL, TempDir, created, fp};
use idemlog::storage::FsStorage;
use idemlog::{ClaimOutcome, Durability, Options, SideWrite, Store};

const THREADS: usize = 8;
const KEYS: usize = 200;

fn key(i: usize) -> Vec<u8> {
    format!("key-{i}").into_bytes()
}

#[test]
fn concurrent_claims_of_the_same_keys_acquire_each_exactly_once() {
    let dir = TempDir::new("once");
    let store = Store::open(&dir.0, Options::default().storage(Arc::new(FsStorage))).unwrap();
    let acquired: Arc<Vec<AtomicUsize>> =
        Arc::new((0..KEYS).map(|_| AtomicUsize::new(0)).collect());
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let store = store.clone();
            let acquired = Arc::clone(&acquired);
            thread::spawn(move || {
                for n in 0..KEYS {
                    // Each thread walks the keys in a different order so that races happen everywhere.
                    let i = (n * 7 + t * 31) % KEYS;
                    match store.claim(b"acct", &key(i), &fp(1), TTL).unwrap() {
                        ClaimOutcome::Acquired(token) => {
                            acquired[i].fetch_add(1, Ordering::SeqCst);
                            store.complete(&token, &created("done"), &[]).unwrap();
                        }
                        ClaimOutcome::InProgress { .. } | ClaimOutcome::Completed(_) => {}
                        ClaimOutcome::Mismatch => panic!("same fingerprint cannot mismatch"),
                        ClaimOutcome::QuotaExceeded { .. } => panic!("no quota was set"),
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    for (i, count) in acquired.iter().enumerate() {
        assert_eq!(count.load(Ordering::SeqCst), 1, "key {i}");
    }
}

#[test]
fn released_keys_have_at_most_one_holder_at_any_time() {
    let f = Fixture::new();
    let store = f.open();
    let held: Arc<Vec<AtomicBool>> = Arc::new((0..8).map(|_| AtomicBool::new(false)).collect());
    let lifetimes = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let store = store.clone();
            let held = Arc::clone(&held);
            let lifetimes = Arc::clone(&lifetimes);
            thread::spawn(move || {
                for n in 0..400 {
                    let i = (n + t) % held.len();
                    if let ClaimOutcome::Acquired(token) =
                        store.claim(b"acct", &key(i), &fp(1), TTL).unwrap()
                    {
                        assert!(
                            !held[i].swap(true, Ordering::SeqCst),
                            "two holders of key {i}"
                        );
                        lifetimes.fetch_add(1, Ordering::SeqCst);
                        held[i].store(false, Ordering::SeqCst);
                        store.release(&token).unwrap();
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert!(
        lifetimes.load(Ordering::SeqCst) > 8,
        "keys were reacquired after release"
    );
}

#[test]
fn concurrent_sync_callers_share_fdatasyncs() {
    let dir = TempDir::new("group");
    let options = Options::default()
        .storage(Arc::new(FsStorage))
        .durability(Durability::Sync);
    let store = Store::open(&dir.0, options).unwrap();
    let per_thread = 100;
    let handles: Vec<_> = (0..16)
        .map(|t| {
            let store = store.clone();
            thread::spawn(move || {
                for n in 0..per_thread {
                    let k = format!("t{t}-{n}");
                    assert!(matches!(
                        store.claim(b"acct", k.as_bytes(), &fp(1), TTL).unwrap(),
                        ClaimOutcome::Acquired(_)
                    ));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let stats = store.stats();
    // One frame per claim, and the fence floor the first claim reserves.
    assert_eq!(stats.frames_appended, 16 * per_thread + 1);
    assert!(
        stats.syncs < stats.frames_appended / 2,
        "group commit should batch: {} syncs for {} frames",
        stats.syncs,
        stats.frames_appended
    );
}

#[test]
fn concurrent_sync_callers_survive_many_segment_rotations() {
    // Rotations wait for the leader, leaders gather appends, appenders rotate, on many threads: every
    // claim must complete and survive a reopen. A watchdog turns a hang into a failure.
    let dir = TempDir::new("rotate");
    let options = || {
        Options::default()
            .storage(Arc::new(FsStorage))
            .durability(Durability::Sync)
            .segment_size(4096)
            .compaction(None)
    };
    let store = Store::open(&dir.0, options()).unwrap();
    let threads = 16;
    let per_thread = 60;
    let (done, finished) = std::sync::mpsc::channel();
    for t in 0..threads {
        let store = store.clone();
        let done = done.clone();
        thread::spawn(move || {
            for n in 0..per_thread {
                let k = format!("t{t}-{n}");
                let ClaimOutcome::Acquired(token) =
                    store.claim(b"acct", k.as_bytes(), &fp(1), TTL).unwrap()
                else {
                    panic!("fresh key {k}");
                };
                store.complete(&token, &created(&k), &[]).unwrap();
            }
            done.send(()).unwrap();
        });
    }
    for _ in 0..threads {
        finished
            .recv_timeout(std::time::Duration::from_secs(120))
            .expect("a caller hung: a wake-up was lost");
    }
    assert!(store.stats().segments > 10, "{:?}", store.stats());
    drop(store);
    let store = Store::open(&dir.0, options()).unwrap();
    assert_eq!(store.stats().records, threads * per_thread);
}

fn side_store(name: &str) -> (TempDir, Store) {
    let dir = TempDir::new(name);
    let options = Options::default()
        .storage(Arc::new(FsStorage))
        .durability(Durability::None);
    let store = Store::open(&dir.0, options).unwrap();
    (dir, store)
}

#[test]
fn side_writes_naming_the_same_keys_in_opposite_orders_never_deadlock() {
    let (_dir, store) = side_store("side-order");
    // Sixteen keys over 64 shards: whatever the hash seed, most pairs are in different shards.
    let keys: Arc<Vec<String>> = Arc::new((0..16).map(|i| format!("k{i}")).collect());
    let (done, finished) = mpsc::channel();
    for t in 0..THREADS {
        let (store, keys, done) = (store.clone(), Arc::clone(&keys), done.clone());
        thread::spawn(move || {
            for round in 0..2_000 {
                let (a, b) = (&keys[round % 16], &keys[(round * 7 + 3) % 16]);
                let (first, second) = if t % 2 == 0 { (a, b) } else { (b, a) };
                store
                    .side_write(&[
                        SideWrite::put("ns", first.clone(), "v"),
                        SideWrite::put("ns", second.clone(), "v"),
                    ])
                    .unwrap();
            }
            done.send(()).unwrap();
        });
    }
    for _ in 0..THREADS {
        finished
            .recv_timeout(Duration::from_secs(120))
            .expect("a side writer is stuck: shard locks taken out of order");
    }
}

#[test]
fn a_side_write_to_two_keys_is_never_seen_half_applied() {
    let (_dir, store) = side_store("side-atomic");
    let writes = 20_000u64;
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (store, stop) = (store.clone(), Arc::clone(&stop));
            thread::spawn(move || {
                let read = |key: &[u8]| -> u64 {
                    store
                        .side_get(b"ns", key)
                        .unwrap()
                        .map_or(0, |v| std::str::from_utf8(&v).unwrap().parse().unwrap())
                };
                let mut checks = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // `b` comes first in every write: seeing its value i means the whole write i
                    // is applied, so `a`, read after it, holds i or later.
                    let b = read(b"b");
                    let a = read(b"a");
                    assert!(
                        a >= b,
                        "read b = {b}, then a = {a}: write {b} seen half applied"
                    );
                    checks += 1;
                }
                checks
            })
        })
        .collect();
    for i in 1..=writes {
        store
            .side_write(&[
                SideWrite::put("ns", "b", i.to_string()),
                SideWrite::put("ns", "a", i.to_string()),
            ])
            .unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        assert!(reader.join().unwrap() > 0, "every reader checked something");
    }
}
