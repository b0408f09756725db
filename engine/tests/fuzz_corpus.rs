//! Replays the committed fuzz corpus (`fuzz/corpus/<target>/`) through the functions the engine's fuzz
//! targets call, so that every seed and every input that once found a bug (`regress-*`) is checked by
//! `cargo test`, without the fuzzer.
//!
//! `write_seed_corpus` (ignored) regenerates the `seed-*` files from logs the engine writes itself:
//! `cargo test -p idemlog --test fuzz_corpus -- --ignored`.

use std::path::{Path, PathBuf};

use idemlog::testkit::fuzzing;

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target)
}

fn replay(target: &str, run: fn(&[u8])) {
    fuzzing::replay_corpus(&corpus_dir(target), run);
}

#[test]
fn frame_decode_corpus_keeps_every_decoding_invariant() {
    replay("frame_decode", fuzzing::decode_frames);
}

#[test]
fn recovery_raw_corpus_opens_or_fails_as_corruption() {
    replay("recovery_raw", fuzzing::recover_files);
}

#[test]
fn recovery_damage_corpus_recovers_the_valid_prefix_or_reports_corruption() {
    replay("recovery_damage", fuzzing::recover_damaged);
}

#[test]
fn model_steps_corpus_matches_the_reference_model() {
    replay("model_steps", fuzzing::run_steps);
}

/// Recipes for [`fuzzing::build_log`]: (name, recipe).
fn recipes() -> Vec<(&'static str, Vec<u8>)> {
    // claim: 0 scope key fp ttl; complete: 2 token len side; release: 3 token; extend: 4 token;
    // advance: 5 n; side write: 6 key kind; compact or reopen: 7 even/odd.
    let claim_complete = vec![0, 0, 1, 0, 2, 2, 0, 3, 0];
    let mixed = vec![
        0, 0, 1, 0, 2, 0, 1, 2, 0, 1, 0, 0, 3, 0, 2, 1, 9, 0, 2, 0, 40, 1, 3, 1, 4, 1, 5, 20, 6, 1,
        2, 6, 2, 0, 7, 1, 0, 1, 3, 1, 2,
    ];
    // Enough large completions to rotate 4 KiB segments, then a compaction and more appends.
    let mut rotating = Vec::new();
    for i in 0..8u8 {
        rotating.extend_from_slice(&[0, i % 2, i, 0, 2, 2, i, 200, i % 2]);
    }
    rotating.extend_from_slice(&[5, 50, 7, 0, 0, 1, 7, 0, 2, 2, 8, 30, 0, 6, 3, 2]);
    // One rotation, then a compaction: a manifest, a compacted segment and a log segment.
    let compacted_small = vec![
        0, 0, 0, 0, 2, 2, 0, 200, 0, 0, 1, 1, 0, 2, 2, 1, 200, 1, 7, 0, 0, 0, 2, 0, 2, 2, 2, 10, 0,
    ];
    vec![
        ("empty", Vec::new()),
        ("compacted-small", compacted_small),
        ("claim-complete", claim_complete),
        ("mixed", mixed),
        ("rotating-compacted", rotating),
    ]
}

#[test]
#[ignore = "writes the seed-* files of fuzz/corpus; run by hand after a format change"]
fn write_seed_corpus() {
    let write = |target: &str, name: &str, bytes: &[u8]| {
        let dir = corpus_dir(target);
        std::fs::create_dir_all(&dir).expect("create corpus dir");
        std::fs::write(dir.join(format!("seed-{name}")), bytes).expect("write seed");
    };
    for (name, recipe) in recipes() {
        let files = fuzzing::log_files(&recipe);
        for (file, bytes) in &files {
            if file.ends_with("seg") && bytes.len() <= 4096 {
                write("frame_decode", &format!("{name}-{file}"), bytes);
            }
        }
        let (_, active) = files
            .iter()
            .filter(|(file, _)| file.ends_with(".seg"))
            .max_by(|a, b| a.0.cmp(&b.0))
            .expect("every log has an active segment");
        let mut single = vec![0];
        single.extend_from_slice(active);
        write("recovery_raw", &format!("{name}-active"), &single);
        if let Some(joined) = fuzzing::join_files(&files) {
            write("recovery_raw", &format!("{name}-dir"), &joined);
        }

        let with = |damage: &[u8]| {
            let mut input = vec![u8::try_from(recipe.len()).expect("short recipe")];
            input.extend_from_slice(&recipe);
            input.extend_from_slice(damage);
            input
        };
        write("recovery_damage", &format!("{name}-intact"), &with(&[]));
        let len = u16::try_from(active.len()).expect("small segment");
        let [lo, hi] = (len - 5).to_le_bytes();
        write(
            "recovery_damage",
            &format!("{name}-truncated"),
            &with(&[0xff, 0, lo, hi]),
        );
        let [lo, hi] = (len / 2).to_le_bytes();
        write(
            "recovery_damage",
            &format!("{name}-flipped"),
            &with(&[0xff, 1, lo, hi, 0x10]),
        );
        write(
            "recovery_damage",
            &format!("{name}-garbage"),
            &with(&[0xff, 2, 6, 1, 2, 3, 4, 5, 6, 3, 30]),
        );
        write(
            "recovery_damage",
            &format!("{name}-first-file-flipped"),
            &with(&[0, 1, 40, 0, 1]),
        );
    }

    // Operation sequences: the pseudo-random bytes `tests/model.rs` uses, and a few written out.
    for seed in 0u32..6 {
        let bytes: Vec<u8> = (0..300u32)
            .map(|i| {
                (i.wrapping_mul(2_654_435_761)
                    .wrapping_add(seed.wrapping_mul(40_503))
                    >> 13) as u8
            })
            .collect();
        write("model_steps", &format!("pseudo-random-{seed}"), &bytes);
    }
    let claim = [0u8, 0, 1, 0, 1];
    let complete = [5u8, 0, 1, 20, 0];
    let crash_torn = [14u8, 7];
    let steps: [(&str, Vec<u8>); 4] = [
        (
            "claim-complete-crash",
            [&claim[..], &complete, &crash_torn].concat(),
        ),
        ("claim-release-reopen", [&claim[..], &[8, 0, 13]].concat()),
        (
            "expire-and-reclaim",
            [&claim[..], &complete, &[11, 255, 11, 255, 17], &claim].concat(),
        ),
        (
            "failed-sync-then-crash",
            [&claim[..], &[15, 0], &complete, &[14, 1]].concat(),
        ),
    ];
    for (name, bytes) in steps {
        write("model_steps", name, &bytes);
    }
}
