//! Failed writes and fsyncs poison the store; each durability mode keeps what it promises.

mod common;

use std::time::Duration;

use common::{Fixture, TTL, acquire, created, fp};
use idemlog::testkit::{CrashMode, FaultOp};
use idemlog::{ClaimOutcome, Durability, Error, SideWrite, Store};

#[test]
fn failed_fdatasync_poisons_the_store_until_reopen() {
    let f = Fixture::new();
    let store = f.open();
    f.fs.fail_sync_after(1);
    let err = store.claim(b"acct", b"k", &fp(1), TTL).unwrap_err();
    assert!(err.is_poisoned(), "{err}");
    assert!(err.to_string().contains("fdatasync"), "{err}");
    assert!(
        store
            .claim(b"acct", b"other", &fp(1), TTL)
            .unwrap_err()
            .is_poisoned()
    );
    assert!(store.get(b"acct", b"k").unwrap_err().is_poisoned());
    assert!(store.sync().unwrap_err().is_poisoned());
}

#[test]
fn failed_fdatasync_is_never_retried() {
    let f = Fixture::new();
    let store = f.open();
    f.fs.fail_sync_after(1);
    assert!(store.claim(b"acct", b"k", &fp(1), TTL).is_err());
    let syncs = f.fs.syncs();
    let _ = store.claim(b"acct", b"k2", &fp(1), TTL);
    let _ = store.sync();
    drop(store);
    assert_eq!(
        f.fs.syncs(),
        syncs,
        "no fdatasync after the failure, not even on drop"
    );
}

#[test]
fn unacknowledged_claim_after_failed_sync_is_gone_after_power_loss() {
    let f = Fixture::new();
    let store = f.open();
    let kept = acquire(&store, "acct", "kept", fp(1));
    store.complete(&kept, &created("kept"), &[]).unwrap();
    f.fs.fail_sync_after(1);
    assert!(store.claim(b"acct", b"lost", &fp(1), TTL).is_err());
    f.fs.crash(CrashMode::DropUnsynced);
    drop(store);
    let store = f.open();
    assert!(store.get(b"acct", b"kept").unwrap().is_some());
    assert_eq!(store.get(b"acct", b"lost").unwrap(), None);
}

#[test]
fn full_disk_on_write_is_a_typed_error_naming_the_segment() {
    let f = Fixture::new();
    let store = f.open();
    f.fs.fail_write_after(1);
    let err = store.claim(b"acct", b"k", &fp(1), TTL).unwrap_err();
    let Error::Poisoned(cause) = &err else {
        panic!("expected poisoned, got {err}");
    };
    let Error::Io { op, path, source } = &**cause else {
        panic!("expected io cause, got {cause}");
    };
    assert_eq!(*op, "write");
    assert_eq!(path, &f.segment_path(1));
    assert_eq!(source.kind(), std::io::ErrorKind::StorageFull);
}

#[test]
fn reopen_after_poisoning_works() {
    let f = Fixture::new();
    let store = f.open();
    f.fs.fail_sync_after(1);
    assert!(store.claim(b"acct", b"k", &fp(1), TTL).is_err());
    f.fs.crash(CrashMode::DropUnsynced);
    drop(store);
    let store = f.open();
    acquire(&store, "acct", "k", fp(1));
}

#[test]
fn periodic_mode_keeps_acknowledged_work_through_a_process_crash() {
    let f = Fixture::new();
    let options = f
        .options()
        .durability(Durability::Periodic(Duration::from_secs(3600)));
    let store = Store::open(&f.dir, options.clone()).unwrap();
    let token = acquire(&store, "acct", "k", fp(1));
    store.complete(&token, &created("x"), &[]).unwrap();
    f.fs.crash(CrashMode::ProcessOnly);
    drop(store);
    let store = Store::open(&f.dir, options).unwrap();
    assert!(matches!(
        store.claim(b"acct", b"k", &fp(1), TTL).unwrap(),
        ClaimOutcome::Completed(_)
    ));
}

#[test]
fn periodic_mode_syncs_in_the_background() {
    let f = Fixture::new();
    let options = f
        .options()
        .durability(Durability::Periodic(Duration::from_millis(5)));
    let store = Store::open(&f.dir, options.clone()).unwrap();
    // Open syncs once itself (the fence floor): count from after it.
    let opened = store.stats().syncs;
    acquire(&store, "acct", "k", fp(1));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while store.stats().syncs == opened {
        assert!(
            std::time::Instant::now() < deadline,
            "background sync never ran"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    f.fs.crash(CrashMode::DropUnsynced);
    drop(store);
    let store = Store::open(&f.dir, options).unwrap();
    assert!(store.get(b"acct", b"k").unwrap().is_some());
}

#[test]
fn none_mode_keeps_what_was_synced_explicitly() {
    let f = Fixture::new();
    let options = f.options().durability(Durability::None);
    let store = Store::open(&f.dir, options.clone()).unwrap();
    acquire(&store, "acct", "synced", fp(1));
    store.sync().unwrap();
    f.fs.crash(CrashMode::DropUnsynced);
    drop(store);
    let store = Store::open(&f.dir, options).unwrap();
    assert!(store.get(b"acct", b"synced").unwrap().is_some());
}

#[test]
fn none_mode_replays_a_completion_written_only_to_the_buffer() {
    let f = Fixture::new();
    let store = Store::open(&f.dir, f.options().durability(Durability::None)).unwrap();
    let token = acquire(&store, "acct", "k", fp(1));
    store.complete(&token, &created("buffered"), &[]).unwrap();
    assert_eq!(
        store.claim(b"acct", b"k", &fp(1), TTL).unwrap(),
        ClaimOutcome::Completed(created("buffered"))
    );
}

#[test]
fn torn_power_loss_in_none_mode_still_opens() {
    for seed in 0..20 {
        let f = Fixture::new();
        let options = f.options().durability(Durability::None);
        let store = Store::open(&f.dir, options.clone()).unwrap();
        for i in 0..50 {
            let token = acquire(&store, "acct", &format!("k{i}"), fp(1));
            store.complete(&token, &created("x"), &[]).unwrap();
            if i % 7 == 0 {
                let _ = store.clone().sync();
            }
        }
        let _ = store.clone().sync();
        for i in 50..80 {
            acquire(&store, "acct", &format!("k{i}"), fp(1));
        }
        // Push the buffered frames to the file without syncing them.
        let _ = store.get(b"acct", b"k79");
        f.fs.crash(CrashMode::TornTail { seed });
        drop(store);
        let store = Store::open(&f.dir, options).expect("a torn tail always opens");
        for i in 0..50 {
            assert!(
                store
                    .get(b"acct", format!("k{i}").as_bytes())
                    .unwrap()
                    .is_some()
            );
        }
    }
}

#[test]
fn frames_left_unsynced_by_a_dead_process_are_synced_at_open() {
    let f = Fixture::new();
    let store = f.open();
    f.fs.fail_sync_after(1);
    assert!(store.claim(b"acct", b"k", &fp(1), TTL).is_err());
    drop(store);
    // The failed claim's frame is in the "page cache": the next open sees it and may serve it, so it
    // must make it durable first.
    let store = f.open();
    assert!(store.get(b"acct", b"k").unwrap().is_some());
    drop(store);
    f.fs.crash(CrashMode::DropUnsynced);
    assert!(f.open().get(b"acct", b"k").unwrap().is_some());
}

/// Process 1 (`Durability::None`) crashes during a rotation after creating the next segment and before
/// its final fdatasync of the old one, with a frame appended during the rotation written to the old
/// segment but not synced. Process 2 must make that frame durable before serving it: it is in the
/// second-to-last segment, not the newest.
#[test]
fn a_frame_left_unsynced_in_the_old_segment_by_a_crash_during_rotation_is_synced_at_open() {
    let f = Fixture::new();
    let none = f.options().segment_size(4096).durability(Durability::None);
    let store = Store::open(&f.dir, none.clone()).unwrap();
    // When the rotation creates segment 2 (phase 1, writer unlocked), append one more frame: it goes
    // to segment 1, written in phase 2. Then let the crash come right before phase 2's fdatasync.
    let (hook_store, hook_fs) = (store.clone(), f.fs.clone());
    f.fs.on_next(FaultOp::Create, ".seg", move || {
        acquire(&hook_store, "acct", "raced", fp(1));
        // create, header write, header fdatasync, directory fsync, phase 2 write; not its fdatasync.
        hook_fs.crash_after(5);
    });
    let mut i = 0;
    while store.stats().segments < 2 {
        let _ = store.side_write(&[SideWrite::put("filler", format!("f{i}"), "x".repeat(100))]);
        i += 1;
        assert!(i < 1000, "no rotation");
    }
    assert!(store.sync().unwrap_err().is_poisoned());
    f.fs.crash(CrashMode::ProcessOnly);
    drop(store);

    // Process 2 sees the frame (it is in the page cache) and serves it, then appends to segment 2.
    let sync = f.options().segment_size(4096);
    let store = Store::open(&f.dir, sync.clone()).unwrap();
    assert!(store.get(b"acct", b"raced").unwrap().is_some());
    let token = acquire(&store, "acct", "after", fp(1));
    store.complete(&token, &created("after"), &[]).unwrap();
    f.fs.crash(CrashMode::DropUnsynced);
    drop(store);

    let store = Store::open(&f.dir, sync).expect("opens after the power loss");
    assert!(
        store.get(b"acct", b"raced").unwrap().is_some(),
        "served, then lost"
    );
    assert!(store.get(b"acct", b"after").unwrap().is_some());
}

/// Every crash point of a rotation with a frame appended during it, then a process crash, a reopen
/// that serves what it sees, and a power loss: what the second process served is still there.
#[test]
fn every_crash_point_of_a_rotation_keeps_what_the_next_process_served() {
    for crash_at in 0..8 {
        let f = Fixture::new();
        let none = f.options().segment_size(4096).durability(Durability::None);
        let store = Store::open(&f.dir, none).unwrap();
        let (hook_store, hook_fs) = (store.clone(), f.fs.clone());
        f.fs.on_next(FaultOp::Create, ".seg", move || {
            acquire(&hook_store, "acct", "raced", fp(1));
            hook_fs.crash_after(crash_at);
        });
        for i in 0..1000 {
            if store.stats().segments >= 2
                || store
                    .side_write(&[SideWrite::put("filler", format!("f{i}"), "x".repeat(100))])
                    .is_err()
            {
                break;
            }
        }
        let _ = store.sync();
        f.fs.crash(CrashMode::ProcessOnly);
        drop(store);

        let sync = f.options().segment_size(4096);
        let store = Store::open(&f.dir, sync.clone()).unwrap();
        let served = store.get(b"acct", b"raced").unwrap().is_some();
        let token = acquire(&store, "acct", "after", fp(1));
        store.complete(&token, &created("after"), &[]).unwrap();
        f.fs.crash(CrashMode::DropUnsynced);
        drop(store);

        let store = Store::open(&f.dir, sync)
            .unwrap_or_else(|e| panic!("crash point {crash_at}: open after power loss: {e}"));
        let kept = store.get(b"acct", b"raced").unwrap().is_some();
        assert!(!served || kept, "crash point {crash_at}: served, then lost");
        assert!(store.get(b"acct", b"after").unwrap().is_some());
    }
}

#[test]
fn a_store_poisoned_by_a_full_disk_is_closed_and_reopened_in_the_same_process() {
    for op in [FaultOp::Write, FaultOp::Sync] {
        let f = Fixture::new();
        let options = f
            .options()
            .compaction(Some(idemlog::CompactionPolicy::default()));
        let store = Store::open(&f.dir, options.clone()).unwrap();
        let token = acquire(&store, "acct", "acked", fp(1));
        let side = [SideWrite::put("payments", "pay_1", "100")];
        store.complete(&token, &created("acked"), &side).unwrap();
        // A request still in flight holds a handle of its own.
        let in_flight = store.clone();

        f.fs.fail_op(op, ".seg", 1, std::io::ErrorKind::StorageFull);
        let err = store.claim(b"acct", b"unacked", &fp(1), TTL).unwrap_err();
        assert!(err.store_unusable() && err.is_poisoned(), "{op:?}: {err}");
        assert!(store.is_poisoned());
        assert!(store.close().unwrap_err().is_poisoned(), "{op:?}");

        let store = Store::open(&f.dir, options).expect("the lock was released by close");
        assert!(matches!(
            store.claim(b"acct", b"acked", &fp(1), TTL).unwrap(),
            ClaimOutcome::Completed(_)
        ));
        assert_eq!(
            store.side_get(b"payments", b"pay_1").unwrap().as_deref(),
            Some(&b"100"[..])
        );
        acquire(&store, "acct", "new", fp(1));
        let err = in_flight.claim(b"acct", b"x", &fp(1), TTL).unwrap_err();
        assert!(
            err.store_unusable(),
            "{op:?}: the old handle stays dead: {err}"
        );
    }
}

#[test]
fn dropping_every_handle_of_a_poisoned_store_releases_the_directory() {
    let f = Fixture::new();
    let store = f.open();
    f.fs.fail_op(FaultOp::Write, ".seg", 1, std::io::ErrorKind::StorageFull);
    assert!(
        store
            .claim(b"acct", b"k", &fp(1), TTL)
            .unwrap_err()
            .is_poisoned()
    );
    drop(store);
    acquire(&f.open(), "acct", "k2", fp(1));
}

/// Under `Periodic` a caller waits only for its frames to be written, so an fdatasync of the
/// flusher (or of `Store::sync`, as here) that is taking long must not hold its write up.
#[test]
fn a_periodic_write_is_not_held_up_by_a_running_fdatasync() {
    use std::sync::mpsc;
    let f = Fixture::new();
    let options = f
        .options()
        .durability(Durability::Periodic(Duration::from_secs(3600)));
    let store = Store::open(&f.dir, options).unwrap();
    acquire(&store, "acct", "before", fp(1));
    let (entered_tx, entered) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    f.fs.on_next(FaultOp::Sync, ".seg", move || {
        entered_tx.send(()).unwrap();
        // Held until the test lets it go (bounded, so a failing test cannot hang).
        let _ = release_rx.recv_timeout(Duration::from_secs(30));
    });
    let syncing = std::thread::spawn({
        let store = store.clone();
        move || store.sync()
    });
    entered
        .recv_timeout(Duration::from_secs(10))
        .expect("the fdatasync started");
    let (done_tx, done) = mpsc::channel();
    let claimer = std::thread::spawn({
        let store = store.clone();
        move || {
            done_tx
                .send(store.claim(b"acct", b"during", &fp(1), TTL))
                .unwrap()
        }
    });
    let claimed = done.recv_timeout(Duration::from_secs(5));
    release.send(()).unwrap();
    syncing.join().unwrap().unwrap();
    claimer.join().unwrap();
    let outcome = claimed
        .expect("the claim waited for the running fdatasync")
        .unwrap();
    assert!(matches!(outcome, ClaimOutcome::Acquired(_)), "{outcome:?}");
}
