//! The zeros the writer puts ahead of its frames (`log::writer::PREALLOCATE`): present while a
//! segment is written to, gone from every sealed segment and from a cleanly closed or dropped store,
//! and cut without a torn-tail report when a crash leaves them.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::{TempDir, acquire, created, fp};
use idemlog::storage::FsStorage;
use idemlog::{Options, Store, verify};

fn open(dir: &Path, segment_size: u32) -> Store {
    Store::open(
        dir,
        Options::default()
            .storage(Arc::new(FsStorage))
            .segment_size(segment_size),
    )
    .unwrap()
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut all: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    all.sort();
    all
}

fn ends_in_zeros(path: &Path) -> bool {
    let bytes = std::fs::read(path).unwrap();
    bytes.len() >= 8 && bytes[bytes.len() - 8..].iter().all(|&b| b == 0)
}

#[test]
fn the_segment_being_written_is_filled_with_zeros_ahead_of_its_frames() {
    let dir = TempDir::new("prealloc-ahead");
    let store = open(&dir.0, 8 << 20);
    acquire(&store, "acct", "k", fp(1));
    let active = segments(&dir.0).pop().unwrap();
    let len = std::fs::metadata(&active).unwrap().len();
    assert_eq!(len, 1 << 20, "filled to the next MiB");
    assert!(ends_in_zeros(&active));
    store.close().unwrap();
}

#[test]
fn a_closed_store_leaves_no_zeros_after_its_last_frame() {
    let dir = TempDir::new("prealloc-close");
    let store = open(&dir.0, 8 << 20);
    acquire(&store, "acct", "k", fp(1));
    store.close().unwrap();
    let active = segments(&dir.0).pop().unwrap();
    assert!(std::fs::metadata(&active).unwrap().len() < 4096);
    assert!(!ends_in_zeros(&active));
}

#[test]
fn a_dropped_store_leaves_no_zeros_after_its_last_frame() {
    let dir = TempDir::new("prealloc-drop");
    let store = open(&dir.0, 8 << 20);
    acquire(&store, "acct", "k", fp(1));
    drop(store);
    let active = segments(&dir.0).pop().unwrap();
    assert!(!ends_in_zeros(&active));
}

#[test]
fn sealed_segments_end_with_their_last_frame() {
    let dir = TempDir::new("prealloc-sealed");
    let store = open(&dir.0, 16 << 10);
    for i in 0..300 {
        let token = acquire(&store, "acct", &format!("k{i}"), fp(1));
        store
            .complete(&token, &created(&"x".repeat(200)), &[])
            .unwrap();
    }
    let all = segments(&dir.0);
    assert!(all.len() >= 3, "rotated: {all:?}");
    for sealed in &all[..all.len() - 1] {
        assert!(!ends_in_zeros(sealed), "{}", sealed.display());
    }
    // Closing touches only the last segment; verification treats any damage (zeros included)
    // outside it as corruption.
    store.close().unwrap();
    let report = verify(&dir.0, Arc::new(FsStorage)).unwrap();
    assert_eq!(report.torn_tail, None);
}

#[test]
fn zeros_a_crash_left_are_cut_and_every_record_stays() {
    let dir = TempDir::new("prealloc-crash");
    let store = open(&dir.0, 8 << 20);
    for i in 0..20 {
        let token = acquire(&store, "acct", &format!("k{i}"), fp(1));
        store.complete(&token, &created("{}"), &[]).unwrap();
    }
    let active = segments(&dir.0).pop().unwrap();
    // What a crash leaves: the file as it is now, zeros ahead and all. Copy it aside before the
    // store's drop cuts them, and put it back afterwards.
    let crashed = std::fs::read(&active).unwrap();
    assert!(ends_in_zeros(&active));
    drop(store);
    std::fs::write(&active, &crashed).unwrap();

    let store = open(&dir.0, 8 << 20);
    assert_eq!(store.recovery_report().torn_tail, None);
    for i in 0..20 {
        assert!(
            store
                .get(b"acct", format!("k{i}").as_bytes())
                .unwrap()
                .is_some()
        );
    }
}

#[test]
fn durability_none_writes_no_zeros_ahead() {
    let dir = TempDir::new("prealloc-none");
    let store = Store::open(
        &dir.0,
        Options::default()
            .storage(Arc::new(FsStorage))
            .durability(idemlog::Durability::None),
    )
    .unwrap();
    acquire(&store, "acct", "k", fp(1));
    store.sync().unwrap();
    let active = segments(&dir.0).pop().unwrap();
    assert!(std::fs::metadata(&active).unwrap().len() < 4096);
    store.close().unwrap();
}

#[test]
fn a_write_the_disk_has_no_room_to_prepare_for_leaves_no_frame_behind() {
    // The zeros ahead are written before the frames: when the disk cannot take them, the round
    // fails with none of its frames in the file, so the unacknowledged claim is not there after a
    // reopen either. (Frames first, the claim that crosses the preallocated end would fit in the
    // 2 000 bytes left, land in the file, and be found after the reopen.)
    let f = common::Fixture::new();
    let store = f.open();
    // Most of the first preallocated MiB, in big frames.
    let big = "x".repeat(60 << 10);
    for i in 0..16 {
        let token = acquire(&store, "acct", &format!("big{i}"), fp(1));
        store.complete(&token, &created(&big), &[]).unwrap();
    }
    f.fs.set_capacity(Some(f.fs.used_bytes() + 2_000));
    let mut failed = None;
    for i in 0..20_000 {
        let key = format!("k{i}");
        match store.claim(b"acct", key.as_bytes(), &fp(1), common::TTL) {
            Ok(idemlog::ClaimOutcome::Acquired(_)) => {}
            Ok(other) => panic!("{other:?}"),
            Err(_) => {
                failed = Some(key);
                break;
            }
        }
    }
    let failed = failed.expect("the disk never filled up");
    assert!(store.is_poisoned());
    drop(store);
    f.fs.set_capacity(None);
    let store = f.open();
    assert_eq!(
        store.get(b"acct", failed.as_bytes()).unwrap(),
        None,
        "the failed claim of {failed} is not in the log"
    );
    assert!(store.get(b"acct", b"big0").unwrap().is_some());
}

#[test]
fn a_frame_bigger_than_the_zeros_ahead_is_written_whole() {
    // The zeros run from the file's end to the next MiB past the frames: for one frame of several
    // MiB that is several MiB of zeros, written in pieces. (A 4 MiB probe record once panicked
    // here, slicing more zeros than there are.)
    let dir = TempDir::new("prealloc-big-frame");
    let store = open(&dir.0, 64 << 20);
    let big = vec![7u8; 3 << 20];
    store
        .side_write(&[idemlog::SideWrite::put("ns", "big", big.clone())])
        .unwrap();
    store.close().unwrap();
    let store = open(&dir.0, 64 << 20);
    assert_eq!(store.side_get(b"ns", b"big").unwrap().unwrap(), big);
}
