//! Replays the committed fuzz corpus of the server's targets (`fuzz/corpus/idempotency_key/` and
//! `fuzz/corpus/json_fingerprint/`) through the functions the fuzz targets call, so that every seed and
//! every input that once found a bug (`regress-*`) is checked by `cargo test`, without the fuzzer.

use std::path::{Path, PathBuf};

use idemlog_server::fuzzing;

/// Runs every file of a target's corpus; fails naming each file that panicked.
fn replay(target: &str, run: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .collect();
    files.sort();
    assert!(
        files.len() >= 5,
        "{} holds only {} inputs",
        dir.display(),
        files.len()
    );
    let failed: Vec<String> = files
        .iter()
        .filter(|path| {
            let bytes = std::fs::read(path).expect("read corpus file");
            std::panic::catch_unwind(|| run(&bytes)).is_err()
        })
        .map(|path| path.display().to_string())
        .collect();
    assert!(
        failed.is_empty(),
        "{target}: these inputs fail: {failed:#?}"
    );
}

#[test]
fn idempotency_key_corpus_parses_to_visible_ascii_keys_stable_under_quoting() {
    replay("idempotency_key", fuzzing::idempotency_key);
}

#[test]
fn json_fingerprint_corpus_canonicalises_idempotently_with_stable_fingerprints() {
    replay("json_fingerprint", fuzzing::json_fingerprint);
}
