//! Opening a log: replay, torn tails, corruption, unknown tags, locking.

mod common;

use std::sync::Arc;

use common::{Fixture, TTL, TempDir, acquire, created, fp, raw_frame};
use idemlog::storage::FsStorage;
use idemlog::testkit::CrashMode;
use idemlog::{ClaimOutcome, Corruption, Error, Options, SideWrite, Store};

#[test]
fn reopen_replays_completed_and_in_progress_keys() {
    let f = Fixture::new();
    let store = f.open();
    let done = acquire(&store, "acct", "done", fp(1));
    store
        .complete(
            &done,
            &created("{}"),
            &[SideWrite::put("payments", "p1", "v1")],
        )
        .unwrap();
    let running = acquire(&store, "acct", "running", fp(2));
    drop(store);

    let store = f.open();
    assert_eq!(
        store.claim(b"acct", b"done", &fp(1), TTL).unwrap(),
        ClaimOutcome::Completed(created("{}"))
    );
    assert!(matches!(
        store.get(b"acct", b"running").unwrap().unwrap().state,
        idemlog::RecordState::InProgress { .. }
    ));
    assert_eq!(store.side_get(b"payments", b"p1").unwrap().unwrap(), "v1");
    let after = acquire(&store, "acct", "new", fp(3));
    assert!(
        after.fence() > running.fence(),
        "fences keep growing across restarts"
    );
}

#[test]
fn released_key_stays_released_after_reopen() {
    let f = Fixture::new();
    let store = f.open();
    let token = acquire(&store, "acct", "k", fp(1));
    store.release(&token).unwrap();
    drop(store);
    let store = f.open();
    assert_eq!(store.get(b"acct", b"k").unwrap(), None);
}

#[test]
fn torn_tail_is_truncated_on_open() {
    let f = Fixture::new();
    let store = f.open();
    let token = acquire(&store, "acct", "k", fp(1));
    store.complete(&token, &created("{}"), &[]).unwrap();
    drop(store);
    let path = f.segment_path(1);
    let mut bytes = f.fs.read_file(&path).unwrap();
    let valid_len = bytes.len() as u64;
    let frame = raw_frame(1, valid_len, b"\x06\x01\x00\x00\x00\x00\x00\x00\x00");
    bytes.extend_from_slice(&frame[..frame.len() - 3]);
    f.fs.write_file(&path, &bytes);

    let store = f.open();
    let torn = store
        .recovery_report()
        .torn_tail
        .clone()
        .expect("torn tail reported");
    assert_eq!(torn.offset, valid_len);
    assert_eq!(torn.discarded, frame.len() as u64 - 3);
    // Cut back to the valid prefix, then the open appended its fence floor (a 24-byte header and a
    // 9-byte operation) there, and zeros ahead of it (the writer's preallocation).
    let reopened = f.fs.read_file(&path).unwrap();
    let floor_end = valid_len as usize + 33;
    assert!(reopened.len() >= floor_end);
    assert_eq!(reopened[..valid_len as usize], bytes[..valid_len as usize]);
    assert_ne!(reopened[valid_len as usize..floor_end], [0u8; 33]);
    assert!(reopened[floor_end..].iter().all(|&b| b == 0));
    assert!(matches!(
        store.claim(b"acct", b"k", &fp(1), TTL).unwrap(),
        ClaimOutcome::Completed(_)
    ));
    // Appends continue after the cut and survive another reopen.
    acquire(&store, "acct", "k2", fp(1));
    drop(store);
    let store = f.open();
    assert_eq!(store.recovery_report().torn_tail, None);
    assert!(store.get(b"acct", b"k2").unwrap().is_some());
}

#[test]
fn zeroed_tail_after_a_crash_is_cut_without_a_torn_tail_report() {
    // Zeros after the last frame are what the writer's preallocation (or a filesystem that
    // persisted a size but not the data) leaves: nothing was written there, so nothing is torn.
    let f = Fixture::new();
    let store = f.open();
    acquire(&store, "acct", "k", fp(1));
    drop(store);
    let path = f.segment_path(1);
    let mut bytes = f.fs.read_file(&path).unwrap();
    let valid_len = bytes.len();
    bytes.extend_from_slice(&[0u8; 4096]);
    f.fs.write_file(&path, &bytes);
    let store = f.open();
    assert_eq!(store.recovery_report().torn_tail, None);
    assert!(store.get(b"acct", b"k").unwrap().is_some());
    // Appends go on where the frames ended, and survive another reopen.
    acquire(&store, "acct", "k2", fp(1));
    drop(store);
    let reopened = f.fs.read_file(&path).unwrap();
    assert_eq!(reopened[..valid_len], bytes[..valid_len]);
    let store = f.open();
    assert!(store.get(b"acct", b"k2").unwrap().is_some());
}

#[test]
fn a_torn_frame_before_zeros_is_still_a_torn_tail() {
    let f = Fixture::new();
    let store = f.open();
    acquire(&store, "acct", "k", fp(1));
    drop(store);
    let path = f.segment_path(1);
    let mut bytes = f.fs.read_file(&path).unwrap();
    let valid_len = bytes.len() as u64;
    let frame = raw_frame(1, valid_len, b"\x06\x01\x00\x00\x00\x00\x00\x00\x00");
    // Cut inside the header's checksum: the zeros after it cannot complete the frame.
    bytes.extend_from_slice(&frame[..22]);
    bytes.extend_from_slice(&[0u8; 4096]);
    f.fs.write_file(&path, &bytes);
    let store = f.open();
    let torn = store
        .recovery_report()
        .torn_tail
        .clone()
        .expect("torn tail reported");
    assert_eq!(torn.offset, valid_len);
    assert!(store.get(b"acct", b"k").unwrap().is_some());
}

#[test]
fn checksum_failure_before_the_tail_names_file_and_offset() {
    let f = Fixture::new();
    let store = f.open();
    acquire(&store, "acct", "k1", fp(1));
    acquire(&store, "acct", "k2", fp(1));
    drop(store);
    let path = f.segment_path(1);
    let mut bytes = f.fs.read_file(&path).unwrap();
    // After the segment header (32 bytes) and the fence floor the open wrote (33 bytes).
    let first_frame = 32 + 33;
    bytes[first_frame + 40] ^= 0xff; // inside the first claim's payload
    f.fs.write_file(&path, &bytes);
    match Store::open(&f.dir, f.options()) {
        Err(Error::Corrupt {
            path: p,
            offset,
            reason,
        }) => {
            assert_eq!(p, path);
            assert_eq!(offset, first_frame as u64);
            assert_eq!(reason, Corruption::DamagedDurableData);
        }
        other => panic!("expected corruption, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn damage_in_a_sealed_segment_is_corruption() {
    let f = Fixture::new();
    let store = Store::open(&f.dir, f.options().segment_size(4096)).unwrap();
    for i in 0..100 {
        acquire(&store, "acct", &format!("key-{i}"), fp(1));
    }
    assert!(store.stats().segments > 2);
    drop(store);
    let path = f.segment_path(1);
    let mut bytes = f.fs.read_file(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1; // the last frame of a sealed segment
    f.fs.write_file(&path, &bytes);
    let err = Store::open(&f.dir, f.options().segment_size(4096))
        .err()
        .unwrap();
    assert!(
        matches!(&err, Error::Corrupt { path: p, reason: Corruption::PayloadChecksum, .. } if *p == path),
        "{err}"
    );
}

#[test]
fn unknown_frame_tag_is_rejected_not_skipped() {
    let f = Fixture::new();
    drop(f.open());
    let path = f.segment_path(1);
    let mut bytes = f.fs.read_file(&path).unwrap();
    let durable = bytes.len() as u64;
    bytes.extend_from_slice(&raw_frame(0x42, durable, b"future"));
    f.fs.write_file(&path, &bytes);
    let err = Store::open(&f.dir, f.options()).err().unwrap();
    assert!(
        matches!(
            err,
            Error::Corrupt {
                offset,
                reason: Corruption::UnknownFrameTag(0x42),
                ..
            } if offset == durable
        ),
        "{err}"
    );
}

#[test]
fn unknown_operation_tag_is_rejected_not_skipped() {
    let f = Fixture::new();
    drop(f.open());
    let path = f.segment_path(1);
    let mut bytes = f.fs.read_file(&path).unwrap();
    bytes.extend_from_slice(&raw_frame(1, 32, &[0x99, 1, 2, 3]));
    f.fs.write_file(&path, &bytes);
    let err = Store::open(&f.dir, f.options()).err().unwrap();
    assert!(
        matches!(
            err,
            Error::Corrupt {
                reason: Corruption::UnknownOpTag(0x99),
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn torn_segment_header_from_a_crash_during_rotation_is_reinitialized() {
    let f = Fixture::new();
    let store = f.open();
    acquire(&store, "acct", "k", fp(1));
    drop(store);
    let next = f.segment_path(2);
    f.fs.write_file(&next, b"IDEMLO");
    let store = f.open();
    assert_eq!(
        store.recovery_report().torn_tail.as_ref().unwrap().path,
        next
    );
    assert!(store.get(b"acct", b"k").unwrap().is_some());
    acquire(&store, "acct", "k2", fp(1));
    drop(store);
    assert!(f.open().get(b"acct", b"k2").unwrap().is_some());
}

#[test]
fn second_open_of_a_directory_is_refused_until_the_first_closes() {
    let f = Fixture::new();
    let first = f.open();
    let err = Store::open(&f.dir, f.options()).err().unwrap();
    assert!(matches!(err, Error::Locked { .. }), "{err}");
    drop(first);
    f.open();
}

#[test]
fn second_open_on_the_real_file_system_is_refused() {
    let dir = TempDir::new("lock");
    let options = || Options::default().storage(Arc::new(FsStorage));
    let first = Store::open(&dir.0, options()).unwrap();
    let err = Store::open(&dir.0, options()).err().unwrap();
    assert!(matches!(err, Error::Locked { .. }), "{err}");
    drop(first);
    Store::open(&dir.0, options()).unwrap();
}

#[test]
fn real_file_system_round_trip_through_sealed_mapped_segments() {
    let dir = TempDir::new("mmap");
    let options = || {
        Options::default()
            .storage(Arc::new(FsStorage))
            .segment_size(4096)
    };
    let store = Store::open(&dir.0, options()).unwrap();
    for i in 0..50 {
        let key = format!("key-{i}");
        let token = acquire(&store, "acct", &key, fp(1));
        store.complete(&token, &created(&key), &[]).unwrap();
    }
    assert!(store.stats().segments > 2);
    drop(store);
    let store = Store::open(&dir.0, options()).unwrap();
    for i in 0..50 {
        let key = format!("key-{i}");
        let ClaimOutcome::Completed(r) = store.claim(b"acct", key.as_bytes(), &fp(1), TTL).unwrap()
        else {
            panic!("expected replay of {key}");
        };
        assert_eq!(r.body, key);
    }
}

#[test]
fn records_past_their_ttl_are_not_loaded() {
    let f = Fixture::new();
    let store = f.open();
    acquire(&store, "acct", "k", fp(1));
    drop(store);
    f.clock.advance(TTL);
    let store = f.open();
    assert_eq!(store.stats().records, 0);
}

#[test]
fn process_crash_keeps_every_acknowledged_operation_in_sync_mode() {
    let f = Fixture::new();
    let store = f.open();
    let token = acquire(&store, "acct", "k", fp(1));
    store.complete(&token, &created("x"), &[]).unwrap();
    f.fs.crash(CrashMode::DropUnsynced);
    drop(store);
    let store = f.open();
    assert!(matches!(
        store.claim(b"acct", b"k", &fp(1), TTL).unwrap(),
        ClaimOutcome::Completed(_)
    ));
}

#[test]
fn torn_tail_before_an_empty_successor_segment_is_truncated() {
    // A rotation creates the next segment (empty) before the last frames appended to the old one
    // are synced; a crash in between leaves the old segment with a torn tail and an empty successor.
    let f = Fixture::new();
    let store = Store::open(&f.dir, f.options().segment_size(4096)).unwrap();
    let mut keys = Vec::new();
    while store.stats().segments < 2 {
        let key = format!("k{}", keys.len());
        acquire(&store, "acct", &key, fp(1));
        keys.push(key);
    }
    drop(store);
    let (old, next) = (f.segment_path(1), f.segment_path(2));
    let next_bytes = f.fs.read_file(&next).unwrap();
    f.fs.write_file(&next, &next_bytes[..32]);
    let mut old_bytes = f.fs.read_file(&old).unwrap();
    let valid = old_bytes.len() as u64;
    old_bytes.extend_from_slice(&raw_frame(1, valid, b"torn")[..10]);
    f.fs.write_file(&old, &old_bytes);

    let store = Store::open(&f.dir, f.options().segment_size(4096)).expect("opens");
    let torn = store
        .recovery_report()
        .torn_tail
        .clone()
        .expect("torn tail reported");
    assert_eq!((torn.path, torn.offset), (old, valid));
    let in_old = keys.len() - 1; // the last key went to the successor, whose frames we removed
    for key in &keys[..in_old] {
        assert!(
            store.get(b"acct", key.as_bytes()).unwrap().is_some(),
            "{key}"
        );
    }
    acquire(&store, "acct", "after", fp(1));
    drop(store);
    assert!(f.open().get(b"acct", b"after").unwrap().is_some());
}

#[test]
fn damage_in_a_segment_followed_by_one_with_frames_is_still_corruption() {
    let f = Fixture::new();
    let store = Store::open(&f.dir, f.options().segment_size(4096)).unwrap();
    while store.stats().segments < 2 {
        acquire(
            &store,
            "acct",
            &format!("k{}", store.stats().frames_appended),
            fp(1),
        );
    }
    drop(store);
    let old = f.segment_path(1);
    let mut bytes = f.fs.read_file(&old).unwrap();
    bytes.extend_from_slice(b"garbage after a sealed segment");
    f.fs.write_file(&old, &bytes);
    let err = Store::open(&f.dir, f.options().segment_size(4096))
        .err()
        .unwrap();
    assert!(
        matches!(err, Error::Corrupt { ref path, .. } if *path == old),
        "{err}"
    );
}

#[test]
fn a_data_directory_created_by_open_survives_a_power_loss() {
    let f = Fixture::new();
    let dir = std::path::PathBuf::from("/srv/idem/data");
    let store = Store::open(&dir, f.options()).unwrap();
    let token = acquire(&store, "acct", "k", fp(1));
    store.complete(&token, &created("x"), &[]).unwrap();
    f.fs.crash(CrashMode::DropUnsynced);
    drop(store);
    let store = Store::open(&dir, f.options()).unwrap();
    assert!(
        store.get(b"acct", b"k").unwrap().is_some(),
        "the directory entries of /srv, /srv/idem and /srv/idem/data were never made durable"
    );
}
