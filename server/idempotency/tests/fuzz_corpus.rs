//! Replays the committed fuzz corpus of the server's targets (`fuzz/corpus/idempotency_key/` and
//! `fuzz/corpus/json_fingerprint/`) through the functions the fuzz targets call, so that every seed and
//! every input that once found a bug (`regress-*`) is checked by `cargo test`, without the fuzzer.

use std::path::Path;

use idemlog_idempotency::testkit::fuzzing;

fn replay(target: &str, run: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    idemlog::testkit::fuzzing::replay_corpus(&dir, run);
}

#[test]
fn idempotency_key_corpus_parses_to_visible_ascii_keys_stable_under_quoting() {
    replay("idempotency_key", fuzzing::idempotency_key);
}

#[test]
fn json_fingerprint_corpus_canonicalises_idempotently_with_stable_fingerprints() {
    replay("json_fingerprint", fuzzing::json_fingerprint);
}
