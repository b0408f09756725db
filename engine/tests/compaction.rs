//! Compaction: reclaims expired, released and superseded records, survives a crash at every step,
//! and never loses or resurrects a record that changes while it runs.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{Fixture, TTL, TempDir, acquire, created, fp};
use idemlog::storage::FsStorage;
use idemlog::testkit::{CrashMode, FaultyStorage};
use idemlog::{ClaimOutcome, CompactionPolicy, Durability, Options, Record, SideWrite, Store};

const KEYS: usize = 60;

fn key(i: usize) -> String {
    format!("key-{i:03}")
}

/// Everything observable about the keys and side records a test wrote.
fn dump(store: &Store) -> BTreeMap<String, Option<Record>> {
    let mut out = BTreeMap::new();
    for i in 0..KEYS {
        out.insert(key(i), store.get(b"acct", key(i).as_bytes()).unwrap());
        let side = store.side_get(b"payments", key(i).as_bytes()).unwrap();
        out.insert(
            format!("side/{}", key(i)),
            side.map(|v| Record {
                fingerprint: idemlog::Fingerprint([0; 32]),
                created_at_ms: 0,
                expires_at_ms: 0,
                fence: 0,
                state: idemlog::RecordState::Completed(idemlog::StoredResponse::new(0, v)),
                request_digest: None,
            }),
        );
    }
    out
}

/// A store spread over many small segments holding completed, in-progress, released, superseded and
/// expired records, and side records with and without a TTL.
fn populate(f: &Fixture) -> Store {
    let store = Store::open(&f.dir, f.options().segment_size(4096)).unwrap();
    for i in 0..KEYS {
        let ttl = if i % 5 == 0 {
            Duration::from_secs(10)
        } else {
            TTL
        };
        let ClaimOutcome::Acquired(token) = store
            .claim(b"acct", key(i).as_bytes(), &fp(1), ttl)
            .unwrap()
        else {
            panic!("fresh key");
        };
        match i % 4 {
            0 => store.release(&token).unwrap(),
            1 => continue, // stays in progress
            _ => {
                let side = if i % 3 == 0 {
                    vec![SideWrite::put_with_ttl(
                        "payments",
                        key(i),
                        "expiring",
                        Duration::from_secs(10),
                    )]
                } else {
                    vec![SideWrite::put("payments", key(i), format!("payment {i}"))]
                };
                store.complete(&token, &created(&key(i)), &side).unwrap();
            }
        }
    }
    // Supersede some records: release and claim again, so older versions become garbage.
    for i in (0..KEYS).filter(|i| i % 4 == 0).take(6) {
        acquire(&store, "acct", &key(i), fp(2));
    }
    f.clock.advance(Duration::from_secs(11));
    store
}

#[test]
fn compaction_reclaims_dead_bytes_and_keeps_every_live_record() {
    let f = Fixture::new();
    let store = populate(&f);
    let before = dump(&store);
    let stats = store.stats();
    assert!(stats.segments > 3 && stats.garbage_bytes > 0, "{stats:?}");

    let report = store.compact().unwrap();
    assert!(report.input_segments >= 3, "{report:?}");
    let after = store.stats();
    assert!(
        after.disk_bytes < stats.disk_bytes,
        "{stats:?} -> {after:?}"
    );
    // What remains is framing: segment and frame headers around the copied operations.
    assert!(after.garbage_bytes * 10 < after.live_bytes, "{after:?}");
    assert_eq!(dump(&store), before);

    drop(store);
    let store = Store::open(&f.dir, f.options().segment_size(4096)).unwrap();
    assert_eq!(dump(&store), before, "the same after a restart");
    let names: Vec<_> = f.fs.describe().into_iter().map(|(p, ..)| p).collect();
    assert!(
        names
            .iter()
            .any(|p| p.extension().is_some_and(|e| e == "cseg")),
        "{names:?}"
    );
}

#[test]
fn claims_and_completions_continue_after_compaction() {
    let f = Fixture::new();
    let store = populate(&f);
    store.compact().unwrap();
    let token = acquire(&store, "acct", "after", fp(1));
    store.complete(&token, &created("after"), &[]).unwrap();
    let fence = token.fence();
    drop(store);
    let store = Store::open(&f.dir, f.options()).unwrap();
    assert!(acquire(&store, "acct", "later", fp(1)).fence() > fence);
}

#[test]
fn fences_keep_growing_when_compaction_dropped_every_record() {
    let f = Fixture::new();
    let store = Store::open(&f.dir, f.options().segment_size(4096)).unwrap();
    let mut last = 0;
    for i in 0..KEYS {
        let token = acquire(&store, "acct", &key(i), fp(1));
        last = token.fence();
        store.release(&token).unwrap();
    }
    store.compact().unwrap();
    drop(store);
    let store = Store::open(&f.dir, f.options()).unwrap();
    assert!(acquire(&store, "acct", "next", fp(1)).fence() > last);
}

#[test]
fn crash_at_every_step_of_compaction_keeps_exactly_the_logical_content() {
    let f = Fixture::new();
    let store = populate(&f);
    let expected = dump(&store);
    store.close().unwrap();
    drop(store);
    let base = f.fs.clone();
    let options = |fs: &FaultyStorage| f.options().segment_size(4096).storage(Arc::new(fs.clone()));

    // How many mutating calls (writes, syncs, creates, renames, removes) one compaction makes.
    let probe = base.fork();
    let store = Store::open(&f.dir, options(&probe)).unwrap();
    let start = probe.mutations();
    store.compact().unwrap();
    let steps = probe.mutations() - start;
    drop(store);
    assert!(
        steps > 10,
        "a compaction should take many steps, took {steps}"
    );

    for crash_at in 0..=steps {
        for mode in [
            CrashMode::DropUnsynced,
            CrashMode::TornTail { seed: crash_at },
            CrashMode::ProcessOnly,
        ] {
            let fs = base.fork();
            let store = Store::open(&f.dir, options(&fs)).unwrap();
            fs.crash_after(crash_at);
            let result = store.compact();
            assert_eq!(
                result.is_ok(),
                crash_at == steps,
                "step {crash_at}: {result:?}"
            );
            fs.crash(mode);
            drop(store);
            let store = Store::open(&f.dir, options(&fs))
                .unwrap_or_else(|e| panic!("open after crash at step {crash_at} ({mode:?}): {e}"));
            assert_eq!(
                dump(&store),
                expected,
                "crash at step {crash_at} ({mode:?})"
            );
            // And the store still works, including another compaction.
            acquire(&store, "acct", "after-crash", fp(1));
            store.compact().unwrap();
            assert_eq!(
                dump(&store),
                expected,
                "compaction after the crash at step {crash_at}"
            );
        }
    }
}

#[test]
fn records_changing_during_compaction_are_neither_lost_nor_resurrected() {
    let dir = TempDir::new("online");
    let options = || {
        Options::default()
            .storage(Arc::new(FsStorage))
            .durability(Durability::None)
            .segment_size(16 << 10)
            .compaction(None)
    };
    let store = Store::open(&dir.0, options()).unwrap();
    let writers = 3;
    let keys_per_writer = 40;
    let rounds = 30;
    let compactor = {
        let store = store.clone();
        thread::spawn(move || {
            let mut runs = 0;
            let deadline = Instant::now() + Duration::from_secs(60);
            while runs < 40 && Instant::now() < deadline {
                store.compact().unwrap();
                runs += 1;
            }
            runs
        })
    };
    // Each writer owns its keys, so it knows their final state: it cycles each key through claim,
    // then complete or release, and records the last outcome.
    let handles: Vec<_> = (0..writers)
        .map(|w| {
            let store = store.clone();
            thread::spawn(move || {
                let mut expected = BTreeMap::new();
                let mut generation = vec![0u32; keys_per_writer];
                for round in 0..rounds {
                    for (k, generation) in generation.iter_mut().enumerate() {
                        let name = format!("w{w}-k{k}-g{generation}");
                        let body = format!("{name} round {round}");
                        let ClaimOutcome::Acquired(token) =
                            store.claim(b"acct", name.as_bytes(), &fp(1), TTL).unwrap()
                        else {
                            panic!("{name} is released or new, so it must be acquired");
                        };
                        if (round + k) % 3 == 0 {
                            store.release(&token).unwrap();
                            expected.insert(name.clone(), None);
                        } else {
                            let side = [SideWrite::put("payments", name.clone(), body.clone())];
                            store.complete(&token, &created(&body), &side).unwrap();
                            expected.insert(name.clone(), Some(body.clone()));
                            *generation += 1;
                        }
                        // Reads race with the compactor deleting the segments they point into.
                        if (round + k) % 3 != 0 {
                            let got = store.side_get(b"payments", name.as_bytes()).unwrap();
                            assert_eq!(got.as_deref(), Some(body.as_bytes()), "{name}");
                        }
                    }
                }
                expected
            })
        })
        .collect();
    let mut expected = BTreeMap::new();
    for h in handles {
        expected.extend(h.join().unwrap());
    }
    let runs = compactor.join().unwrap();
    assert!(runs > 1, "compaction ran concurrently {runs} times");
    store.compact().unwrap();

    let check = |store: &Store, when: &str| {
        for (name, body) in &expected {
            let record = store.get(b"acct", name.as_bytes()).unwrap();
            match body {
                None => assert_eq!(record, None, "{when}: released {name} resurrected"),
                Some(body) => {
                    let Some(Record {
                        state: idemlog::RecordState::Completed(r),
                        ..
                    }) = record
                    else {
                        panic!("{when}: completed {name} lost: {record:?}");
                    };
                    assert_eq!(
                        r.body,
                        body.as_bytes(),
                        "{when}: {name} has a stale version"
                    );
                }
            }
        }
    };
    check(&store, "live");
    store.close().unwrap();
    drop(store);
    let store = Store::open(&dir.0, options()).unwrap();
    check(&store, "after restart");
}

#[test]
fn compaction_triggers_by_itself_on_the_garbage_ratio() {
    let f = Fixture::new();
    let policy = CompactionPolicy {
        interval: Duration::from_millis(10),
        garbage_ratio: 0.5,
        min_garbage_bytes: 0,
    };
    let store = Store::open(
        &f.dir,
        f.options().segment_size(4096).compaction(Some(policy)),
    )
    .unwrap();
    for i in 0..200 {
        let token = acquire(&store, "acct", &format!("k{i}"), fp(1));
        store.release(&token).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while store.stats().compactions == 0 {
        assert!(
            Instant::now() < deadline,
            "no automatic compaction: {:?}",
            store.stats()
        );
        thread::sleep(Duration::from_millis(10));
    }
    assert!(store.stats().segments <= 3, "{:?}", store.stats());
}

#[test]
fn sweep_drops_expired_records_from_memory() {
    let f = Fixture::new();
    let store = f.open();
    for i in 0..10 {
        acquire(&store, "acct", &format!("k{i}"), fp(1));
    }
    store
        .side_write(&[SideWrite::put_with_ttl(
            "ns",
            "k",
            "v",
            Duration::from_secs(1),
        )])
        .unwrap();
    assert_eq!(store.stats().index_entries, 11);
    f.clock.advance(TTL);
    assert_eq!(store.sweep(), 11);
    assert_eq!(store.stats().index_entries, 0);
}

#[test]
fn leftovers_of_an_unfinished_compaction_are_deleted_at_open() {
    let f = Fixture::new();
    let store = populate(&f);
    store.close().unwrap();
    drop(store);
    let stray = f.dir.join("00000000000000009999.cseg");
    f.fs.write_file(&stray, b"half-written compaction output");
    f.fs.write_file(&f.dir.join("MANIFEST.tmp"), b"half-written manifest");
    let store = Store::open(&f.dir, f.options()).unwrap();
    assert!(f.fs.read_file(&stray).is_none());
    assert!(f.fs.read_file(&f.dir.join("MANIFEST.tmp")).is_none());
    assert!(store.stats().records > 0);
}

/// Names of the files in the fixture's directory with a given extension.
fn files_ending(f: &Fixture, suffix: &str) -> Vec<std::path::PathBuf> {
    f.fs.describe()
        .into_iter()
        .map(|(p, ..)| p)
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect()
}

#[test]
fn compaction_failing_before_its_manifest_rename_leaves_the_store_serving() {
    use idemlog::testkit::FaultOp;
    let steps = [
        (FaultOp::Create, ".cseg", 1),
        (FaultOp::Write, ".cseg", 2),
        (FaultOp::Sync, ".cseg", 1),
        (FaultOp::SyncDir, "", 1),
        (FaultOp::Create, "MANIFEST.tmp", 1),
        (FaultOp::Write, "MANIFEST.tmp", 1),
        (FaultOp::Sync, "MANIFEST.tmp", 1),
    ];
    for (op, suffix, nth) in steps {
        let f = Fixture::new();
        let store = populate(&f);
        let before = dump(&store);
        f.fs.fail_op(op, suffix, nth, std::io::ErrorKind::StorageFull);
        let err = store.compact().unwrap_err();
        assert!(!err.is_poisoned(), "{op:?} {suffix}: {err}");
        assert!(!store.is_poisoned(), "{op:?} {suffix}");
        assert!(
            files_ending(&f, ".cseg").is_empty(),
            "{op:?} {suffix}: outputs left"
        );
        assert!(
            files_ending(&f, ".tmp").is_empty(),
            "{op:?} {suffix}: temp left"
        );
        assert_eq!(dump(&store), before, "{op:?} {suffix}");

        let token = acquire(&store, "acct", "after", fp(1));
        store.complete(&token, &created("after"), &[]).unwrap();
        store.compact().expect("the next compaction works");
        let after = dump(&store);
        drop(store);
        let store = Store::open(&f.dir, f.options().segment_size(4096)).unwrap();
        assert_eq!(dump(&store), after, "{op:?} {suffix}: after reopen");
        assert!(store.get(b"acct", b"after").unwrap().is_some());
    }
}

#[test]
fn compaction_failing_at_its_manifest_rename_or_the_directory_sync_after_it_poisons_the_store() {
    use idemlog::testkit::FaultOp;
    for (op, suffix, nth) in [
        (FaultOp::Rename, "MANIFEST.tmp", 1),
        (FaultOp::SyncDir, "", 2),
    ] {
        let f = Fixture::new();
        let store = populate(&f);
        let before = dump(&store);
        f.fs.fail_op(op, suffix, nth, std::io::ErrorKind::Other);
        assert!(store.compact().unwrap_err().is_poisoned(), "{op:?}");
        assert!(store.is_poisoned());
        assert!(
            store
                .claim(b"acct", b"x", &fp(1), TTL)
                .unwrap_err()
                .is_poisoned()
        );
        drop(store);
        let store = Store::open(&f.dir, f.options().segment_size(4096)).unwrap();
        assert_eq!(dump(&store), before, "{op:?}: after reopen");
    }
}
