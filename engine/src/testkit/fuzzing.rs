//! Entry points for fuzz targets (cargo-fuzz in this repository's `fuzz/`) and for the tests that
//! replay a committed corpus. Not part of the stable API.
//!
//! Each function takes arbitrary bytes, feeds them to a part of the engine that reads bytes from disk,
//! and panics when an invariant fails; the fuzzer reports the panic as a crash. An `Err` from the
//! engine is never a failure unless a function says so. Hangs and unbounded allocations are caught by
//! the fuzzer's timeout and memory limit.
//!
//! - [`decode_frames`]: frame and operation decoding at every offset of the input.
//! - [`recover_files`]: opening a data directory whose files hold arbitrary bytes.
//! - [`recover_damaged`]: opening a valid log after truncation, flipped bytes or appended garbage.
//! - [`run_steps`]: operation sequences against the reference model in [`crate::testkit::model`].
//!
//! [`replay_corpus`] runs a committed corpus through one of these (the engine's and the server's
//! corpus tests share it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::claim::{ClaimOutcome, Fingerprint};
use crate::clock::ManualClock;
use crate::error::Error;
use crate::index::{Entry, SideEntry, split_record_key};
use crate::log::frame::{self, FrameDamage, HEADER_LEN, MAX_PAYLOAD, TAG_OPS};
use crate::log::op::{self, Op, Response};
use crate::log::segment::{self, Kind};
use crate::options::{Durability, Options};
use crate::recovery::{Layout, RecoveryReport};
use crate::response::StoredResponse;
use crate::side::SideWrite;
use crate::storage::Storage;
use crate::store::Store;
use crate::testkit::FaultyStorage;
use crate::testkit::model::{Simulation, Step};

/// Runs every file of `dir` (a target's corpus, at least 5 inputs) through `run`; fails naming each
/// file that panicked.
pub fn replay_corpus(dir: &Path, run: fn(&[u8])) {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
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
        "{}: these inputs fail: {failed:#?}",
        dir.display()
    );
}

/// The data directory every target uses, on a [`FaultyStorage`].
const DIR: &str = "/fuzz";
/// The clock of every store opened here, so that expiry does not depend on when a target runs.
const NOW_MS: u64 = 1_700_000_000_000;

// ---------------------------------------------------------------------------------------------------
// Frame decoding

/// Decodes `bytes` as a frame at every offset, and as one frame payload.
///
/// Panics if the decoder accepts a frame whose checksums do not hold or rejects one whose do (or
/// reports the wrong reason), or if an operation it accepts does not re-encode to exactly its bytes,
/// breaks a limit of `FORMAT.md`, or holds a response that does not read back.
pub fn decode_frames(bytes: &[u8]) {
    check_ops(bytes);
    for at in 0..bytes.len() {
        let rest = &bytes[at..];
        let decoded = frame::decode(rest).map(|f| {
            assert_eq!(f.encoded_len(), HEADER_LEN + f.payload.len());
            (f.tag, f.sync_mark, f.payload)
        });
        let expected = frame_by_hand(rest);
        assert_eq!(decoded, expected, "frame at offset {at}");
        if let Ok((TAG_OPS, _, payload)) = decoded {
            assert!(
                std::ptr::eq(payload, &rest[HEADER_LEN..HEADER_LEN + payload.len()]),
                "the payload is the bytes after the header"
            );
            check_ops(payload);
        }
    }
}

/// The frame at the start of `b`, read field by field from `FORMAT.md` with the checksums recomputed.
fn frame_by_hand(b: &[u8]) -> Result<(u8, u64, &[u8]), FrameDamage> {
    if b.len() < HEADER_LEN {
        return Err(FrameDamage::Truncated);
    }
    let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    if crc32fast::hash(&b[..20]) != u32_at(20) {
        return Err(FrameDamage::HeaderChecksum);
    }
    let len = u32_at(0) as usize;
    if len > MAX_PAYLOAD {
        return Err(FrameDamage::Length(len as u64));
    }
    let payload = b
        .get(HEADER_LEN..HEADER_LEN + len)
        .ok_or(FrameDamage::Truncated)?;
    if crc32fast::hash(payload) != u32_at(4) {
        return Err(FrameDamage::PayloadChecksum);
    }
    let sync_mark = u64::from(u32_at(8)) | (u64::from(u32_at(12)) << 32);
    Ok((b[16], sync_mark, payload))
}

/// Checks every operation `op::decode_all` accepts in `payload`.
fn check_ops(payload: &[u8]) {
    let Ok(ops) = op::decode_all(payload) else {
        return;
    };
    let mut next = 0;
    for &(offset, len, op) in &ops {
        assert_eq!(offset, next, "operations are back to back");
        let raw = &payload[offset..offset + len];
        assert_eq!(op.encoded_len(), len, "encoded_len of {op:?}");
        let mut again = Vec::new();
        op.encode(&mut again);
        assert_eq!(again, raw, "{op:?} re-encodes to the bytes it came from");
        check_limits(&op);
        // Reading one operation back from its location, as the store does.
        let owner = Bytes::copy_from_slice(raw);
        let at = op::decode_at(&owner).expect("an accepted operation decodes at its location");
        if let Op::Completed {
            response: Response::Encoded(encoded),
            ..
        } = at
        {
            let response =
                op::response_from(&owner, encoded).expect("an accepted response reads back");
            let mut again = Vec::new();
            Op::Completed {
                head: head_of(&at),
                response: Response::Value(&response),
            }
            .encode(&mut again);
            assert_eq!(again, raw, "the response re-encodes to its bytes");
        }
        next = offset + len;
    }
    assert_eq!(next, payload.len(), "the payload is consumed exactly");
}

fn head_of<'a>(op: &Op<'a>) -> op::Head<'a> {
    match op {
        Op::InProgress { head, .. } | Op::Completed { head, .. } => *head,
        _ => unreachable!("only record snapshots have a head"),
    }
}

/// The lengths `FORMAT.md` promises for a decoded operation.
fn check_limits(op: &Op<'_>) {
    let record = |scope: &[u8], key: &[u8]| {
        assert!((1..=255).contains(&scope.len()), "scope length in {op:?}");
        assert!((1..=255).contains(&key.len()), "key length in {op:?}");
    };
    match op {
        Op::InProgress { head, .. } | Op::Completed { head, .. } => record(head.scope, head.key),
        Op::Released { scope, key, .. } => record(scope, key),
        Op::SidePut { namespace, key, .. } | Op::SideRemove { namespace, key } => {
            assert!(!namespace.is_empty(), "namespace length in {op:?}");
            assert!((1..=1024).contains(&key.len()), "side key length in {op:?}");
        }
        Op::FenceFloor { .. } => {}
    }
}

// ---------------------------------------------------------------------------------------------------
// Recovery from arbitrary files

/// The name of file `index` in [`split_files`]: log segments 1–6, compacted segments 1–4, the
/// manifest and a leftover temporary manifest.
pub fn file_name(index: u8) -> String {
    match index % 12 {
        i @ 0..=5 => segment::file_name(u32::from(i) + 1, Kind::Log),
        i @ 6..=9 => segment::file_name(u32::from(i) - 5, Kind::Compacted),
        10 => "MANIFEST".to_owned(),
        _ => "MANIFEST.tmp".to_owned(),
    }
}

/// Splits fuzz input into data-directory files.
///
/// If the first byte is below 0x80 the rest is the one segment [`file_name`]`(0)`. Otherwise the rest
/// is a sequence of `[name index u8][length u16 LE][bytes]` entries (a short last entry takes what is
/// left; a later entry for a name replaces an earlier one).
pub fn split_files(bytes: &[u8]) -> Vec<(String, &[u8])> {
    let Some((&mode, mut rest)) = bytes.split_first() else {
        return Vec::new();
    };
    if mode < 0x80 {
        return vec![(file_name(0), rest)];
    }
    let mut files = Vec::new();
    while let [index, lo, hi, tail @ ..] = rest {
        let len = usize::from(u16::from_le_bytes([*lo, *hi])).min(tail.len());
        files.push((file_name(*index), &tail[..len]));
        rest = &tail[len..];
    }
    files
}

/// The inverse of [`split_files`] for several files (used to write seeds); `None` if a name has no
/// index or a file is too long.
pub fn join_files(files: &[(String, Vec<u8>)]) -> Option<Vec<u8>> {
    let mut out = vec![0x80];
    for (name, contents) in files {
        let index = (0..12).find(|&i| file_name(i) == *name)?;
        out.push(index);
        out.extend_from_slice(&u16::try_from(contents.len()).ok()?.to_le_bytes());
        out.extend_from_slice(contents);
    }
    Some(out)
}

/// Opens a data directory holding the files of [`split_files`]`(bytes)`.
///
/// Panics if [`crate::verify`] changes a byte or disagrees with opening (on success or failure, the
/// frames, operations and torn tail found); if opening fails with anything but a corruption error; or
/// if it succeeds and then: an indexed record or side record does not read back, a second open does
/// not find exactly the same index with no torn tail (recovery left a clean log), or a write after
/// recovery is lost by the next open.
pub fn recover_files(bytes: &[u8]) {
    let fs = FaultyStorage::new();
    fs.create_dir_all(Path::new(DIR))
        .expect("in-memory directory");
    for (name, contents) in split_files(bytes) {
        fs.write_file(&Path::new(DIR).join(name), contents);
    }
    check_open(&fs);
}

/// What recovery rebuilt: every index entry, and the next fencing token.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    records: BTreeMap<Vec<u8>, Entry>,
    side: BTreeMap<Vec<u8>, SideEntry>,
    next_fence: u64,
}

impl Snapshot {
    fn of(store: &Store) -> Self {
        let core = store.core();
        let mut records = BTreeMap::new();
        for shard in core.records.shards() {
            records.extend(shard.lock().iter().map(|(k, e)| (k.to_vec(), *e)));
        }
        let mut side = BTreeMap::new();
        for shard in core.side.shards() {
            side.extend(shard.lock().iter().map(|(k, e)| (k.to_vec(), *e)));
        }
        Snapshot {
            records,
            side,
            next_fence: core.next_fence.load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// Reads every indexed record and side record through the public API.
    fn read_back(&self, store: &Store) {
        for (id, entry) in &self.records {
            let (scope, key) = split_record_key(id);
            let record = store
                .get(scope, key)
                .unwrap_or_else(|e| panic!("get {id:?} after recovery: {e}"))
                .unwrap_or_else(|| panic!("indexed record {id:?} is missing"));
            assert_eq!(record.fence, entry.fence);
            assert_eq!(
                crate::index::fp_prefix(&record.fingerprint.0),
                entry.fp_prefix
            );
        }
        for id in self.side.keys() {
            let (namespace, key) = split_record_key(id);
            store
                .side_get(namespace, key)
                .unwrap_or_else(|e| panic!("side_get {id:?} after recovery: {e}"))
                .unwrap_or_else(|| panic!("indexed side record {id:?} is missing"));
        }
    }
}

fn options(fs: &FaultyStorage) -> Options {
    Options::default()
        .storage(Arc::new(fs.clone()))
        .clock(Arc::new(ManualClock::new(NOW_MS)))
        .durability(Durability::Sync)
        .segment_size(4096)
        .compaction(None)
}

/// Every file of `fs` with its bytes.
fn files_of(fs: &FaultyStorage) -> Vec<(PathBuf, Option<Vec<u8>>)> {
    fs.describe()
        .into_iter()
        .map(|(path, _, _)| {
            let bytes = fs.read_file(&path);
            (path, bytes)
        })
        .collect()
}

/// Verifies, then opens `fs`, and checks what [`recover_files`] promises; returns what the open found.
fn check_open(fs: &FaultyStorage) -> Option<(Snapshot, RecoveryReport)> {
    let before = files_of(fs);
    let verified = crate::verify(DIR, Arc::new(fs.clone()));
    assert_eq!(files_of(fs), before, "verify changed the directory");
    let store = match Store::open(DIR, options(fs)) {
        Ok(store) => store,
        Err(e @ Error::Corrupt { .. }) => {
            assert!(
                verified.is_err(),
                "verify passed {verified:?}; open failed: {e}"
            );
            return None;
        }
        Err(e) => panic!("open failed with an error that is not corruption: {e}"),
    };
    let report = store.recovery_report().clone();
    let verified = verified.unwrap_or_else(|e| panic!("verify failed ({e}); open passed"));
    assert_eq!(
        (verified.frames, verified.operations, verified.segments),
        (report.frames, report.operations, report.segments),
        "verify and open disagree on what the log holds"
    );
    assert_eq!(
        verified.torn_tail,
        report
            .torn_tail
            .as_ref()
            .map(|t| (t.path.clone(), t.offset)),
        "verify and open disagree on the torn tail"
    );
    let first = Snapshot::of(&store);
    first.read_back(&store);
    store.close().expect("close after recovery");
    drop(store);

    let store = Store::open(DIR, options(fs)).expect("a log that opened once opens again");
    assert_eq!(
        store.recovery_report().torn_tail,
        None,
        "the first open left a torn tail"
    );
    let second = Snapshot::of(&store);
    assert_eq!(
        (&second.records, &second.side),
        (&first.records, &first.side),
        "a second open rebuilt another index"
    );
    // Each open reserves a block of fences with a durable floor, which the next open replays.
    assert!(
        second.next_fence > first.next_fence,
        "fences went back: {} after {}",
        second.next_fence,
        first.next_fence
    );

    // Recovery must leave the log ending on a frame boundary: an append now survives a reopen.
    let marker = SideWrite::put(&b"fuzz"[..], &b"after-recovery"[..], &b"1"[..]);
    store.side_write(&[marker]).expect("append after recovery");
    store.close().expect("close after an append");
    drop(store);
    let store = Store::open(DIR, options(fs)).expect("open after an append");
    assert_eq!(
        store
            .side_get(b"fuzz", b"after-recovery")
            .expect("side_get"),
        Some(Bytes::from_static(b"1")),
        "an append after recovery was lost"
    );
    Some((first, report))
}

// ---------------------------------------------------------------------------------------------------
// Recovery from a damaged valid log

/// Builds a valid log from a recipe (see [`build_log`]), damages one of its segment files, and opens
/// it.
///
/// Input: `[recipe length u8][recipe][damage]`. Damage: `[file index u8]` (modulo the number of
/// segment files, in name order), then a sequence of edits, each a tag byte (modulo 4) and its
/// arguments: 0 truncate to `u16 LE` (modulo length + 1); 1 XOR the byte at `u16 LE` (modulo length)
/// with a non-zero mask `u8`; 2 append `n u8` bytes taken from the input; 3 append `n u8` zeros.
///
/// The *valid prefix* is the original log with the damaged file cut at the last frame boundary before
/// the first changed byte. Panics if: the undamaged log does not open; damage that a crash can leave
/// (the active segment cut short and/or followed by zeros) does not open; opening fails with anything
/// but a corruption error; the open finds fewer frames than the valid prefix, or the same number but
/// another index; damage that must be reported is cut off silently (any damage to a sealed or
/// compacted segment but a cut at a frame boundary, and damage to the active segment followed by an
/// intact frame whose sync mark covers it); or any check of [`recover_files`] fails.
pub fn recover_damaged(bytes: &[u8]) {
    let (recipe, damage) = match bytes.split_first() {
        Some((&len, rest)) => rest.split_at(usize::from(len).min(rest.len())),
        None => (&[][..], &[][..]),
    };
    let original = build_log(recipe);
    let dir = Path::new(DIR);
    let layout = Layout::read(&original, dir).expect("a freshly built log has a valid layout");
    let mut names: Vec<(u32, Kind)> = layout.replay_order().collect();
    names.sort_by_key(|&(id, kind)| segment::file_name(id, kind));
    let (file_index, edits) = damage.split_first().unwrap_or((&0, &[]));
    let (id, kind) = names[usize::from(*file_index) % names.len()];
    let path = dir.join(segment::file_name(id, kind));
    let is_active = kind == Kind::Log && layout.tail.last() == Some(&id);
    let before = original.read_file(&path).expect("segment exists");
    let after = apply_damage(&before, edits);

    let first_diff = before
        .iter()
        .zip(&after)
        .position(|(a, b)| a != b)
        .or_else(|| (before.len() != after.len()).then(|| before.len().min(after.len())));
    let damaged = original.fork();
    damaged.write_file(&path, &after);
    let got = check_open(&damaged);

    let Some(first_diff) = first_diff else {
        assert!(got.is_some(), "the undamaged log failed to open");
        return;
    };
    let crash_like = is_active && after[first_diff..].iter().all(|&b| b == 0);
    let boundary = frame_boundary_before(&before, first_diff);
    let must_fail = if is_active {
        durable_beyond(&before, &after, boundary)
    } else {
        after != before[..boundary]
    };
    let Some((got, got_report)) = got else {
        assert!(
            !crash_like,
            "a torn tail of the active segment (cut at {first_diff}) failed to open"
        );
        return;
    };
    let prefix = original.fork();
    prefix.write_file(&path, &before[..boundary]);
    let (want, want_report) = check_open(&prefix).unwrap_or_else(|| {
        panic!("a segment damaged at {first_diff} opened, but its valid prefix does not")
    });
    assert!(
        got_report.frames >= want_report.frames,
        "damage at {first_diff} lost intact frames: {got_report:?} vs the valid prefix {want_report:?}"
    );
    if got_report.frames == want_report.frames {
        assert!(
            !must_fail,
            "damage at {first_diff} of {} was cut off silently instead of reported",
            path.display()
        );
        assert_eq!(
            got, want,
            "damage at {first_diff}: index differs from the valid prefix's"
        );
    }
    // More frames than the prefix: the damage itself holds checksummed frames (the fuzzer can write
    // them), which recovery rightly replays; the checks in `check_open` still held.
}

/// Whether a frame of `before` after `boundary` is unchanged in `after` and carries a sync mark
/// beyond `boundary`: proof that the damaged bytes had been made durable (`FORMAT.md`).
fn durable_beyond(before: &[u8], after: &[u8], boundary: usize) -> bool {
    let mut at = segment::HEADER_LEN;
    while let Ok(f) = frame::decode(before.get(at..).unwrap_or_default()) {
        let end = at + f.encoded_len();
        if at > boundary
            && f.sync_mark > boundary as u64
            && after.get(at..end) == Some(&before[at..end])
        {
            return true;
        }
        at = end;
    }
    false
}

/// The largest frame boundary of the valid segment `bytes` at or before `at`: 0 inside the header.
fn frame_boundary_before(bytes: &[u8], at: usize) -> usize {
    if at < segment::HEADER_LEN {
        return 0;
    }
    let mut boundary = segment::HEADER_LEN;
    while let Ok(f) = frame::decode(&bytes[boundary..]) {
        if boundary + f.encoded_len() > at {
            break;
        }
        boundary += f.encoded_len();
    }
    boundary
}

fn apply_damage(original: &[u8], edits: &[u8]) -> Vec<u8> {
    let mut out = original.to_vec();
    let mut it = edits.iter().copied();
    while let Some(tag) = it.next() {
        let mut next = || it.next().unwrap_or(0);
        match tag % 4 {
            0 => {
                let len = usize::from(u16::from_le_bytes([next(), next()]));
                out.truncate(len % (out.len() + 1));
            }
            1 => {
                let at = usize::from(u16::from_le_bytes([next(), next()]));
                let mask = next().max(1);
                if !out.is_empty() {
                    let at = at % out.len();
                    out[at] ^= mask;
                }
            }
            2 => {
                let n = next();
                for _ in 0..n {
                    out.push(next());
                }
            }
            _ => {
                let n = next();
                out.resize(out.len() + usize::from(n), 0);
            }
        }
    }
    out
}

/// Builds a cleanly closed log on a fresh [`FaultyStorage`] by running a recipe against a store with
/// 4 KiB segments. Each recipe byte (modulo 8) is an operation, taking its arguments from the bytes
/// after it: 0–1 claim, 2 complete (with a body of up to 4 KiB and maybe a side record), 3 release,
/// 4 extend, 5 advance the clock, 6 side write, 7 compact or reopen. Refused operations are skipped.
pub fn build_log(recipe: &[u8]) -> FaultyStorage {
    let fs = FaultyStorage::new();
    let clock = ManualClock::new(NOW_MS - 3_600_000);
    let open =
        || Store::open(DIR, options(&fs).clock(Arc::new(clock.clone()))).expect("open a new log");
    let mut store = open();
    let mut tokens = Vec::new();
    let mut it = recipe.iter().copied();
    while let Some(tag) = it.next() {
        let mut next = || it.next().unwrap_or(0);
        let pick =
            |tokens: &Vec<_>, n: u8| tokens.get(usize::from(n) % tokens.len().max(1)).cloned();
        match tag % 8 {
            0 | 1 => {
                let (scope, key, fp, ttl) = (next() % 2, next() % 8, next() % 2, next() % 3);
                let ttl = [1, 600, 7200][usize::from(ttl)];
                if let Ok(ClaimOutcome::Acquired(token)) = store.claim(
                    format!("acct_{scope}").as_bytes(),
                    format!("key-{key}").as_bytes(),
                    &Fingerprint([fp; 32]),
                    Duration::from_secs(ttl),
                ) {
                    tokens.push(token);
                }
            }
            2 => {
                let (n, len, side) = (next(), next(), next());
                if let Some(token) = pick(&tokens, n) {
                    let response = StoredResponse::new(201, vec![b'x'; usize::from(len) * 16])
                        .with_header("Location", format!("/invoices/{len}"));
                    let side: Vec<SideWrite> = (side % 2 == 0)
                        .then(|| SideWrite::put("invoices", format!("inv-{len}"), "{}"))
                        .into_iter()
                        .collect();
                    let _ = store.complete(&token, &response, &side);
                }
            }
            3 => {
                if let Some(token) = pick(&tokens, next()) {
                    let _ = store.release(&token);
                }
            }
            4 => {
                if let Some(token) = pick(&tokens, next()) {
                    let _ = store.extend(&token);
                }
            }
            5 => clock.advance(Duration::from_millis(u64::from(next()) * 100)),
            6 => {
                let key = format!("inv-{}", next() % 4);
                let write = match next() % 3 {
                    0 => SideWrite::remove("invoices", key),
                    1 => SideWrite::put_with_ttl("invoices", key, "{}", Duration::from_secs(1)),
                    _ => SideWrite::put("invoices", key, "{}"),
                };
                let _ = store.side_write(&[write]);
            }
            _ => {
                if next() % 2 == 0 {
                    let _ = store.compact();
                } else {
                    store.close().expect("close");
                    drop(store);
                    store = open();
                }
            }
        }
    }
    store.close().expect("close");
    fs
}

/// The files of the log [`build_log`] makes from `recipe`, by name (used to write seeds).
pub fn log_files(recipe: &[u8]) -> Vec<(String, Vec<u8>)> {
    let fs = build_log(recipe);
    fs.describe()
        .into_iter()
        .filter_map(|(path, _, _)| {
            let bytes = fs.read_file(&path)?;
            Some((path.file_name()?.to_str()?.to_owned(), bytes))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------------
// Operation sequences against the reference model

/// Steps beyond this are ignored, so that one input stays a fraction of a second.
pub const MAX_STEPS: usize = 400;

/// Decodes `bytes` into [`Step`]s ([`Step::decode_all`]) and runs them against the store and the
/// model; then checks a simulated power loss and a final crash. Panics at the first divergence.
pub fn run_steps(bytes: &[u8]) {
    let mut sim = Simulation::default();
    for (i, step) in Step::decode_all(bytes).iter().take(MAX_STEPS).enumerate() {
        if let Err(e) = sim.run(step) {
            panic!("step {i} {step:?}: {e}");
        }
    }
    if let Err(e) = sim.probe_power_loss() {
        panic!("power loss after the last step: {e}");
    }
    if let Err(e) = sim.run(&Step::Crash { mode: 1 }) {
        panic!("final power loss: {e}");
    }
}
