//! The operator CLI, run as a real process on a real directory.

mod common;

use std::process::{Command, Output};
use std::sync::Arc;

use common::{TTL, TempDir, acquire, created, fp};
use idemlog::storage::FsStorage;
use idemlog::{Options, Store};

fn ctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idemlogctl"))
        .args(args)
        .output()
        .expect("run idemlogctl")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn populated(name: &str) -> TempDir {
    let dir = TempDir::new(name);
    let store = Store::open(
        &dir.0,
        Options::default()
            .storage(Arc::new(FsStorage))
            .segment_size(4096),
    )
    .unwrap();
    for i in 0..40 {
        let token = acquire(&store, "acct", &format!("k{i}"), fp(1));
        if i % 2 == 0 {
            store
                .complete(&token, &created(&format!("body {i}")), &[])
                .unwrap();
        } else {
            store.release(&token).unwrap();
        }
    }
    acquire(&store, "acct", "running", fp(1));
    drop(store);
    dir
}

fn path(dir: &TempDir) -> &str {
    dir.0.to_str().unwrap()
}

#[test]
fn stats_reports_live_keys_and_garbage() {
    let dir = populated("cli-stats");
    let out = ctl(&["stats", path(&dir)]);
    assert!(out.status.success(), "{}", text(&out));
    let t = text(&out);
    assert!(t.contains("live keys:        21"), "{t}");
    assert!(t.contains("in progress:      1"), "{t}");
    assert!(t.contains("garbage ratio:"), "{t}");
}

#[test]
fn inspect_shows_a_completed_record() {
    let dir = populated("cli-inspect");
    let out = ctl(&["inspect", path(&dir), "acct", "k4"]);
    assert!(out.status.success(), "{}", text(&out));
    let t = text(&out);
    assert!(
        t.contains("state:        completed") && t.contains("body:         body 4"),
        "{t}"
    );
    let out = ctl(&["inspect", path(&dir), "acct", "k5"]);
    assert!(text(&out).contains("no live record"), "{}", text(&out));
}

#[test]
fn verify_passes_a_clean_log_and_names_file_and_offset_of_corruption() {
    let dir = populated("cli-verify");
    let out = ctl(&["verify", path(&dir)]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).starts_with("ok: "), "{}", text(&out));

    // Damage a frame in the first (sealed) segment.
    let seg = dir.0.join("00000000000000000001.seg");
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[100] ^= 0x5a;
    std::fs::write(&seg, &bytes).unwrap();
    let out = ctl(&["verify", path(&dir)]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let t = text(&out);
    assert!(
        t.contains("00000000000000000001.seg") && t.contains("at offset"),
        "{t}"
    );
}

#[test]
fn verify_reports_a_torn_tail_without_cutting_it() {
    let dir = populated("cli-torn");
    let last = std::fs::read_dir(&dir.0)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .max()
        .unwrap();
    let len = std::fs::metadata(&last).unwrap().len();
    let mut bytes = std::fs::read(&last).unwrap();
    bytes.extend_from_slice(&[7; 10]);
    std::fs::write(&last, &bytes).unwrap();
    let out = ctl(&["verify", path(&dir)]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("torn tail in {} at offset {len}", last.display())),
        "{}",
        text(&out)
    );
    assert_eq!(
        std::fs::metadata(&last).unwrap().len(),
        len + 10,
        "verify changes nothing"
    );
}

#[test]
fn compact_reclaims_space() {
    let dir = populated("cli-compact");
    let out = ctl(&["compact", path(&dir)]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("compacted"), "{}", text(&out));
    let store = Store::open(&dir.0, Options::default().storage(Arc::new(FsStorage))).unwrap();
    assert!(store.get(b"acct", b"k4").unwrap().is_some());
    assert!(store.claim(b"acct", b"k4", &fp(1), TTL).is_ok());
}

#[test]
fn every_command_refuses_a_directory_held_open() {
    let dir = populated("cli-locked");
    let _held = Store::open(&dir.0, Options::default().storage(Arc::new(FsStorage))).unwrap();
    for args in [
        vec!["stats", path(&dir)],
        vec!["verify", path(&dir)],
        vec!["compact", path(&dir)],
        vec!["inspect", path(&dir), "acct", "k4"],
    ] {
        let out = ctl(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(text(&out).contains("locked"), "{args:?}: {}", text(&out));
    }
}

#[test]
fn unknown_command_prints_usage() {
    let out = ctl(&["frobnicate"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("usage:"));
}

/// Every file under `dir` with its bytes, sorted by name.
fn snapshot(dir: &TempDir) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p.file_name().unwrap().to_string_lossy().into_owned(), bytes)
        })
        .collect();
    files.sort();
    files
}

#[test]
fn stats_and_inspect_change_no_byte_of_a_directory_with_a_torn_tail_and_leftovers() {
    let dir = populated("cli-read-only");
    let last = std::fs::read_dir(&dir.0)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .max()
        .unwrap();
    let mut bytes = std::fs::read(&last).unwrap();
    bytes.extend_from_slice(&[7; 10]);
    std::fs::write(&last, &bytes).unwrap();
    // Leftovers of an interrupted compaction: an unlisted output and a temporary manifest.
    std::fs::write(dir.0.join(format!("{:020}.cseg", 9999)), b"partial output").unwrap();
    std::fs::write(dir.0.join("MANIFEST.tmp"), b"partial manifest").unwrap();
    let before = snapshot(&dir);

    let out = ctl(&["stats", path(&dir)]);
    assert!(out.status.success(), "{}", text(&out));
    let t = text(&out);
    assert!(
        t.contains("live keys:        21") && t.contains("torn tail:"),
        "{t}"
    );
    let out = ctl(&["inspect", path(&dir), "acct", "k4"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("body:         body 4"),
        "{}",
        text(&out)
    );

    assert!(
        snapshot(&dir) == before,
        "stats or inspect changed the directory"
    );
}
