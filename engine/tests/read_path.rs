//! The read path on the real file system: replays served from memory maps of the segment being
//! appended to (its written prefix) and of sealed segments, while the log grows, rotates and is
//! compacted, and recovery scanning segments in place and cutting a torn tail.

mod common;

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;

use common::{TTL, TempDir, acquire, created, fp};
use idemlog::storage::FsStorage;
use idemlog::{ClaimOutcome, Durability, Options, Store};

/// A body of about 1 KiB that names its key, so a replay of the wrong bytes is caught.
fn body(n: u64) -> String {
    format!("{n:08}-{}", "x".repeat(1000))
}

fn key(n: u64) -> String {
    format!("key-{n}")
}

fn replay(store: &Store, n: u64) {
    match store
        .claim(b"acct", key(n).as_bytes(), &fp(1), TTL)
        .unwrap()
    {
        ClaimOutcome::Completed(r) => {
            assert_eq!(r.status, 201);
            assert_eq!(r.body, body(n), "replay of {}", key(n));
            assert_eq!(r.header("Location").unwrap().as_ref(), b"/payments/1");
        }
        other => panic!("expected a replay of {}, got {other:?}", key(n)),
    }
}

#[test]
fn replays_stay_right_while_the_log_grows_rotates_and_is_compacted() {
    let dir = TempDir::new("read-path");
    let options = || {
        Options::default()
            .storage(Arc::new(FsStorage))
            .durability(Durability::None)
            .segment_size(256 << 10)
            .compaction(None)
    };
    let store = Store::open(&dir.0, options()).unwrap();
    // Completed keys are 0..done; readers replay any of them, mostly the newest (in the active
    // segment, read through its growing prefix map), while the writer appends and rotates and a
    // compactor rewrites and deletes the sealed segments under them.
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let total = 3000;
    let writer = {
        let (store, done) = (store.clone(), Arc::clone(&done));
        thread::spawn(move || {
            for n in 0..total {
                let token = acquire(&store, "acct", &key(n), fp(1));
                store.complete(&token, &created(&body(n)), &[]).unwrap();
                done.store(n + 1, Ordering::Release);
            }
        })
    };
    let readers: Vec<_> = (0..2u64)
        .map(|r| {
            let (store, done, stop) = (store.clone(), Arc::clone(&done), Arc::clone(&stop));
            thread::spawn(move || {
                let mut x = 0x9E37_79B9_7F4A_7C15_u64 ^ r;
                let mut replays = 0;
                while !stop.load(Ordering::Acquire) {
                    let done = done.load(Ordering::Acquire);
                    if done == 0 {
                        continue;
                    }
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let back = if x.is_multiple_of(4) {
                        x >> 8
                    } else {
                        (x >> 8) % 64
                    };
                    replay(&store, done - 1 - back % done);
                    replays += 1;
                }
                replays
            })
        })
        .collect();
    let compactor = {
        let (store, stop) = (store.clone(), Arc::clone(&stop));
        thread::spawn(move || {
            let mut compactions = 0;
            while !stop.load(Ordering::Acquire) {
                if store.compact().unwrap().input_segments > 0 {
                    compactions += 1;
                }
                thread::sleep(std::time::Duration::from_millis(2));
            }
            compactions
        })
    };
    writer.join().unwrap();
    stop.store(true, Ordering::Release);
    let replays: u64 = readers.into_iter().map(|h| h.join().unwrap()).sum();
    let compactions = compactor.join().unwrap();
    assert!(replays > 100, "only {replays} replays ran");
    assert!(compactions > 0, "no compaction ran");
    for n in 0..total {
        replay(&store, n);
    }
    store.close().unwrap();

    let store = Store::open(&dir.0, options()).unwrap();
    for n in 0..total {
        replay(&store, n);
    }
}

#[test]
fn a_torn_tail_of_a_large_active_segment_is_cut_and_appends_go_on() {
    let dir = TempDir::new("read-torn");
    let options = || {
        Options::default()
            .storage(Arc::new(FsStorage))
            .durability(Durability::Sync)
            .compaction(None)
    };
    let store = Store::open(&dir.0, options()).unwrap();
    // Well past one 64 KiB step of the prefix map, all in one segment.
    for n in 0..300 {
        let token = acquire(&store, "acct", &key(n), fp(1));
        store.complete(&token, &created(&body(n)), &[]).unwrap();
    }
    for n in 0..300 {
        replay(&store, n);
    }
    store.close().unwrap();
    drop(store);

    // A crash mid-append: half a frame header at the end of the active segment.
    let segment = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "seg"))
        .unwrap();
    let intact = std::fs::metadata(&segment).unwrap().len();
    std::fs::OpenOptions::new()
        .append(true)
        .open(&segment)
        .unwrap()
        .write_all(&[0xAB; 13])
        .unwrap();

    let store = Store::open(&dir.0, options()).unwrap();
    let torn = store
        .recovery_report()
        .torn_tail
        .clone()
        .expect("torn tail");
    assert_eq!(torn.offset, intact);
    assert_eq!(torn.discarded, 13);
    for n in 0..300 {
        replay(&store, n);
    }
    for n in 300..400 {
        let token = acquire(&store, "acct", &key(n), fp(1));
        store.complete(&token, &created(&body(n)), &[]).unwrap();
    }
    for n in 0..400 {
        replay(&store, n);
    }
    store.close().unwrap();
    drop(store);
    let store = Store::open(&dir.0, options()).unwrap();
    assert!(store.recovery_report().torn_tail.is_none());
    for n in 0..400 {
        replay(&store, n);
    }
}
