//! Opening: scan every segment, verify every checksum, rebuild the index, cut a torn tail.
//!
//! Rules (the argument for them is in `FORMAT.md`):
//! - The manifest names the compacted base segments; they are replayed first, then the log segments
//!   from `first_tail` on in id order; frames in file order, the operations of a frame together.
//!   Every other segment file is the garbage of an interrupted compaction and is deleted.
//! - Damage (a short or checksum-failing frame) in a segment is corruption, except in the *open tail*:
//!   the last log segment holding frames and any empty ones after it. A log segment is fully synced
//!   before its successor receives a frame, so only the open tail can hold unsynced bytes.
//! - Damage in the open tail is a torn tail, cut off, unless a later intact frame carries a sync mark
//!   beyond the damage: that proves the damaged bytes had been made durable, so it is corruption.
//! - Zeros from the first damaged offset of the open tail to the end of the file are the space the
//!   writer fills ahead of its frames (`log::writer::PREALLOCATE`), not damage: they are cut
//!   without a torn-tail report, as a file that simply ended there would need none. (A frame can
//!   never be all zeros: its header checksum would fail.)
//! - Every log segment of the open tail (and the one before it) and the directory are synced before
//!   the store serves anything: a crashed process may have left frames in the page cache that were
//!   never synced, and they are about to become visible. That is not only the newest segment: a crash
//!   during a rotation leaves the next segment created while the old one still has unsynced frames.
//! - A frame whose checksums hold but whose tag or operations this build does not understand is an
//!   error, never skipped: it is data someone wrote.
//!
//! Nothing here trusts a length it has not bounded, so arbitrary bytes produce an error, not a panic.

use std::path::{Path, PathBuf};

use crate::error::{Corruption, Error, Result};
use crate::index::{self, Entry, Sharded, SideEntry};
use crate::log::frame::{self, FrameDamage, TAG_OPS};
use crate::log::op::{self, Op, OpError};
use crate::log::segment::{self, Kind, Loc};
use crate::log::segments::{SegmentFile, Segments};
use crate::log::writer::create_segment;
use crate::manifest::Manifest;
use crate::options::{Options, RecoveredClaims};
use crate::storage::Storage;

/// What opening found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Segment files replayed.
    pub segments: usize,
    /// Frames replayed.
    pub frames: u64,
    /// Operations replayed.
    pub operations: u64,
    /// Bytes of log scanned.
    pub bytes: u64,
    /// A torn tail that was cut off, if any.
    pub torn_tail: Option<TornTail>,
}

/// An incomplete tail removed from the last segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornTail {
    /// The segment file.
    pub path: PathBuf,
    /// Where the file now ends.
    pub offset: u64,
    /// Bytes discarded.
    pub discarded: u64,
}

/// The log's state after replay.
pub(crate) struct Recovered {
    pub(crate) active: SegmentFile,
    pub(crate) active_len: u32,
    pub(crate) next_fence: u64,
    pub(crate) report: RecoveryReport,
}

/// Where replayed operations go.
pub(crate) struct Replay<'a> {
    pub(crate) records: &'a Sharded<Entry>,
    pub(crate) side: &'a Sharded<SideEntry>,
    pub(crate) next_fence: u64,
    /// The lease an in-progress claim keeps.
    pub(crate) leases: RecoveredLeases,
}

/// The in-memory lease deadline a claim found in progress gets at open.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RecoveredLeases {
    /// Over at once ([`index::LEASE_RECOVERED`]): its holder died with the previous process.
    Over,
    /// Until the wall-clock lease end the log holds, measured from the open on the monotonic
    /// clock, and at most one lease.
    Held {
        /// Wall-clock reading at open, in ms.
        wall_ms: u64,
        /// Monotonic reading at open, at least 1.
        monotonic_ms: u64,
        /// The store's lease, in ms.
        lease_ms: u64,
    },
}

impl RecoveredLeases {
    /// The policy of `options`, read off its clock now.
    pub(crate) fn from_options(options: &Options) -> Self {
        match options.recovered_claims {
            RecoveredClaims::Abandoned => Self::Over,
            RecoveredClaims::HeldUntilLeaseEnd => Self::Held {
                wall_ms: options.clock.now_ms(),
                monotonic_ms: options.clock.monotonic_ms().max(1),
                lease_ms: u64::try_from(options.lease.as_millis()).unwrap_or(u64::MAX),
            },
        }
    }

    /// The in-memory deadline of a claim whose log record says its lease ends at `lease_until_ms`
    /// (wall clock).
    pub(crate) fn deadline(self, lease_until_ms: u64) -> u64 {
        match self {
            Self::Over => index::LEASE_RECOVERED,
            Self::Held {
                wall_ms,
                monotonic_ms,
                lease_ms,
            } => {
                let left = lease_until_ms.saturating_sub(wall_ms).min(lease_ms);
                if left == 0 {
                    index::LEASE_RECOVERED
                } else {
                    monotonic_ms.saturating_add(left)
                }
            }
        }
    }
}

impl Replay<'_> {
    pub(crate) fn apply(&mut self, op: &Op<'_>, loc: Loc) {
        match op {
            Op::InProgress { head, .. } | Op::Completed { head, .. } => {
                self.next_fence = self.next_fence.max(head.fence.saturating_add(1));
            }
            Op::FenceFloor { next_fence } => self.next_fence = self.next_fence.max(*next_fence),
            _ => {}
        }
        match op {
            Op::InProgress { head, .. } | Op::Completed { head, .. } => {
                self.apply_record(&index::record_key(head.scope, head.key), op, loc);
            }
            Op::Released { scope, key, .. } => {
                self.apply_record(&index::record_key(scope, key), op, loc);
            }
            Op::SidePut { namespace, key, .. } | Op::SideRemove { namespace, key } => {
                let id = index::side_key(namespace, key);
                let id = id.as_bytes();
                let hash = self.side.hash(id);
                index::apply_side(&mut self.side.shard(hash).lock(), hash, id, op, loc);
            }
            Op::FenceFloor { .. } => {}
        }
    }

    fn apply_record(&self, id: &index::RecordKey, op: &Op<'_>, loc: Loc) {
        let id = id.as_bytes();
        let hash = self.records.hash(id);
        // Whoever held a claim found in the log was a process that is gone. Whether its work went
        // with it is the store's option (`RecoveredClaims`): by default its lease is over, so the
        // first retry takes the claim over instead of waiting out a lease nobody renews.
        let deadline = match op {
            Op::InProgress { lease_until, .. } => self.leases.deadline(*lease_until),
            _ => index::LEASE_RECOVERED,
        };
        index::apply_record(
            &mut self.records.shard(hash).lock(),
            hash,
            id,
            op,
            loc,
            deadline,
        );
    }
}

/// Which files of a data directory are replayed, in what order, and which are garbage.
pub(crate) struct Layout {
    pub(crate) manifest: Manifest,
    /// Compacted segments, in replay order.
    pub(crate) base: Vec<u32>,
    /// Log segments at or after `first_tail`, ascending; the last one is the active segment.
    pub(crate) tail: Vec<u32>,
    /// Leftovers of interrupted compactions and atomic writes.
    pub(crate) garbage: Vec<PathBuf>,
    /// The largest segment id present, live or not.
    pub(crate) max_id: u32,
}

impl Layout {
    /// Reads the manifest and classifies every file in `dir`; changes nothing.
    pub(crate) fn read(storage: &dyn Storage, dir: &Path) -> Result<Self> {
        let manifest = Manifest::load(storage, dir)?;
        let mut layout = Layout {
            base: manifest.base.clone(),
            manifest,
            tail: Vec::new(),
            garbage: Vec::new(),
            max_id: 0,
        };
        let mut compacted = Vec::new();
        for name in storage.list(dir).map_err(|e| Error::io("list", dir, e))? {
            if name.ends_with(".tmp") {
                layout.garbage.push(dir.join(name));
                continue;
            }
            let Some((id, kind)) = segment::parse_file_name(&name) else {
                continue;
            };
            layout.max_id = layout.max_id.max(id);
            match kind {
                Kind::Compacted if layout.base.contains(&id) => compacted.push(id),
                Kind::Log if id >= layout.manifest.first_tail => layout.tail.push(id),
                _ => layout.garbage.push(dir.join(name)),
            }
        }
        if let Some(missing) = layout.base.iter().find(|id| !compacted.contains(id)) {
            return Err(Error::corrupt(
                dir.join(segment::file_name(*missing, Kind::Compacted)),
                0,
                Corruption::MissingSegment,
            ));
        }
        layout.tail.sort_unstable();
        Ok(layout)
    }

    /// Every live segment in replay order.
    pub(crate) fn replay_order(&self) -> impl Iterator<Item = (u32, Kind)> + '_ {
        let base = self.base.iter().map(|&id| (id, Kind::Compacted));
        base.chain(self.tail.iter().map(|&id| (id, Kind::Log)))
    }

    /// Every live segment in replay order, opened, with whether it belongs to the open tail that
    /// starts at `open_tail` ([`open_tail_from`]): only there may a scan meet a torn tail.
    pub(crate) fn open_in_replay_order<'a>(
        &'a self,
        storage: &'a dyn Storage,
        segments: &'a Segments,
        open_tail: Option<u32>,
    ) -> impl Iterator<Item = Result<(SegmentFile, bool)>> + 'a {
        self.replay_order().map(move |(id, kind)| {
            let path = segments.path(id, kind);
            let file = storage
                .open(&path)
                .map_err(|e| Error::io("open", &path, e))?;
            let in_open_tail = kind == Kind::Log && open_tail.is_some_and(|first| id >= first);
            let segment = SegmentFile {
                id,
                kind,
                path,
                file,
            };
            Ok((segment, in_open_tail))
        })
    }
}

/// Replays every live segment in `dir` into `replay`, registers them in `segments`, and deletes the
/// garbage of interrupted compactions.
pub(crate) fn recover(
    storage: &dyn Storage,
    dir: &Path,
    segments: &Segments,
    replay: &mut Replay<'_>,
) -> Result<Recovered> {
    let layout = Layout::read(storage, dir)?;
    segments.reserve_above(layout.max_id);
    replay.next_fence = replay.next_fence.max(layout.manifest.fence_floor);
    collect_garbage(storage, dir, &layout.garbage)?;
    let mut report = RecoveryReport::default();
    let active_id = layout.tail.last().copied();
    let open_tail = open_tail_from(storage, &layout, segments)?;
    let must_sync = sync_from(&layout, open_tail);
    let mut active_len = 0;
    for opened in layout.open_in_replay_order(storage, segments, open_tail) {
        let (segment, in_open_tail) = opened?;
        let (id, kind) = (segment.id, segment.kind);
        if !in_open_tail {
            // Never written again nor cut (only the open tail can be): map it now, so that the scan
            // reads the page cache in place instead of copying the segment into a buffer.
            seal(&segment)?;
        }
        let len = replay_segment(&segment, in_open_tail, replay, &mut report)?;
        if kind == Kind::Log && must_sync.is_some_and(|first| id >= first) {
            // What we just replayed may still be only in the page cache, left by a process that
            // crashed before its fdatasync, and not only in the newest segment: a crash during a
            // rotation leaves the next segment created while the old one's last frames are unsynced.
            // Records served from now on must be durable, and so must every segment before the one
            // that is about to receive frames (FORMAT.md, rule 4), so sync them all now.
            segment
                .file
                .sync_data()
                .map_err(|e| Error::io("fdatasync", &segment.path, e))?;
        }
        let is_active = Some(id) == active_id && kind == Kind::Log;
        if is_active {
            active_len = len;
        } else {
            seal(&segment)?;
        }
        segments.insert(segment);
        report.segments += 1;
    }
    // A crashed process may have created the active segment without making its directory entry
    // durable (the crash came before `create_segment` synced the directory); appends are about to be
    // acknowledged in it, so the entry must survive a power loss.
    storage
        .sync_dir(dir)
        .map_err(|e| Error::io("sync directory", dir, e))?;
    let (active, active_len) = match active_id {
        Some(id) => (SegmentFile::clone(&segments.get(id)), active_len),
        None => {
            let id = segments.allocate_id();
            let active = create_segment(storage, segments, dir, id)?;
            (active, segment::HEADER_LEN as u32)
        }
    };
    Ok(Recovered {
        active,
        active_len,
        next_fence: replay.next_fence,
        report,
    })
}

fn seal(segment: &SegmentFile) -> Result<()> {
    segment
        .file
        .seal()
        .map_err(|e| Error::io("map", &segment.path, e))
}

/// The first log segment that may end in a torn tail: the last one holding frames (later ones can
/// only be empty, created by a rotation that had not yet switched to them when the crash came).
/// Every log segment before it was fully synced before the next one received a frame.
pub(crate) fn open_tail_from(
    storage: &dyn Storage,
    layout: &Layout,
    segments: &Segments,
) -> Result<Option<u32>> {
    for &id in layout.tail.iter().rev() {
        let path = segments.path(id, Kind::Log);
        let file = storage
            .open(&path)
            .map_err(|e| Error::io("open", &path, e))?;
        let len = file.size().map_err(|e| Error::io("stat", &path, e))?;
        if len > segment::HEADER_LEN as u64 {
            return Ok(Some(id));
        }
    }
    Ok(layout.tail.first().copied())
}

/// The first log segment recovery fdatasyncs: the open tail and the segment before it.
///
/// Only the open tail can hold frames that were never synced: every log segment before the last one
/// holding frames was synced before that one received its first frame, and every open syncs the open
/// tail before appending. The segment before the open tail is synced as well, at the cost of one
/// fdatasync of a normally clean file, so that the argument does not rest on that one step alone.
fn sync_from(layout: &Layout, open_tail: Option<u32>) -> Option<u32> {
    let first = open_tail?;
    let at = layout.tail.iter().position(|&id| id == first)?;
    Some(layout.tail[at.saturating_sub(1)])
}

fn collect_garbage(storage: &dyn Storage, dir: &Path, garbage: &[PathBuf]) -> Result<()> {
    if garbage.is_empty() {
        return Ok(());
    }
    for path in garbage {
        match storage.remove(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::io("remove", path, e));
            }
            _ => {}
        }
    }
    storage
        .sync_dir(dir)
        .map_err(|e| Error::io("sync directory", dir, e))
}

/// How a scanned segment ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SegmentEnd {
    /// Every byte belongs to an intact frame.
    Clean,
    /// The active segment holds intact frames up to this offset and a torn tail after it.
    TornTail(u64),
    /// The active segment's header is torn: the crash came while it was being created.
    TornHeader,
    /// The active segment holds intact frames up to this offset and only zeros after it: space
    /// the writer filled ahead of its frames, cut without being a torn tail.
    ZeroTail(u64),
}

impl SegmentEnd {
    /// Where intact frames end, if the segment ends in a torn tail (0 for a torn header).
    pub(crate) fn torn_at(self) -> Option<u64> {
        match self {
            SegmentEnd::Clean | SegmentEnd::ZeroTail(_) => None,
            SegmentEnd::TornTail(offset) => Some(offset),
            SegmentEnd::TornHeader => Some(0),
        }
    }
}

/// What a scan of one segment found.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scanned {
    pub(crate) end: SegmentEnd,
    pub(crate) file_len: u64,
    pub(crate) frames: u64,
    pub(crate) operations: u64,
}

/// Reads one segment, checks every checksum, and calls `apply` with the operations of each intact
/// frame, a whole frame at a time. Changes nothing on disk. The segment is read into memory, so this
/// is safe even if another process cuts the file meanwhile (tools may scan a directory they could not
/// lock).
pub(crate) fn scan_segment(
    segment: &SegmentFile,
    in_open_tail: bool,
    apply: impl FnMut(&Op<'_>, Loc),
) -> Result<Scanned> {
    scan(segment, in_open_tail, false, apply)
}

/// [`scan_segment`] reading the segment in place, through a memory map, rather than copying it: for
/// the store's own recovery, which holds the directory lock and cuts a torn tail only after the scan
/// (and its map) is over.
fn scan_segment_in_place(
    segment: &SegmentFile,
    in_open_tail: bool,
    apply: impl FnMut(&Op<'_>, Loc),
) -> Result<Scanned> {
    scan(segment, in_open_tail, true, apply)
}

fn scan(
    segment: &SegmentFile,
    in_open_tail: bool,
    in_place: bool,
    mut apply: impl FnMut(&Op<'_>, Loc),
) -> Result<Scanned> {
    let path = &segment.path;
    let file_len = segment
        .file
        .size()
        .map_err(|e| Error::io("stat", path, e))?;
    let len = usize::try_from(file_len)
        .ok()
        .filter(|&l| l <= u32::MAX as usize)
        .ok_or_else(|| {
            Error::corrupt(path, 0, Corruption::Malformed("segment larger than 4 GiB"))
        })?;
    let data = if in_place {
        segment.file.read_in_place(0, len)
    } else {
        segment.file.read_at(0, len)
    }
    .map_err(|e| Error::io("read", path, e))?;
    let mut scanned = Scanned {
        end: SegmentEnd::Clean,
        file_len,
        frames: 0,
        operations: 0,
    };

    if let Err(reason) = segment::check_header(&data, segment.id) {
        // The header is synced before any frame is written, so in the last segment a bad header with
        // no intact frame after it is a crash during segment creation: nothing here was acknowledged.
        if in_open_tail && !later_frame_proves_durable(&data, 0) {
            scanned.end = SegmentEnd::TornHeader;
            return Ok(scanned);
        }
        return Err(Error::corrupt(path, 0, reason));
    }

    let mut offset = segment::HEADER_LEN;
    // One allocation for the whole segment, not one per frame.
    let mut ops = Vec::new();
    while offset < data.len() {
        let frame = match frame::decode(&data[offset..]) {
            Ok(frame) => frame,
            Err(damage) => {
                let reason = damage_reason(damage);
                if !in_open_tail {
                    return Err(Error::corrupt(path, offset as u64, reason));
                }
                if data[offset..].iter().all(|&b| b == 0) {
                    scanned.end = SegmentEnd::ZeroTail(offset as u64);
                    return Ok(scanned);
                }
                if later_frame_proves_durable(&data, offset) {
                    return Err(Error::corrupt(
                        path,
                        offset as u64,
                        Corruption::DamagedDurableData,
                    ));
                }
                scanned.end = SegmentEnd::TornTail(offset as u64);
                return Ok(scanned);
            }
        };
        if frame.tag != TAG_OPS {
            return Err(Error::corrupt(
                path,
                offset as u64,
                Corruption::UnknownFrameTag(frame.tag),
            ));
        }
        op::decode_all_into(frame.payload, &mut ops).map_err(|e| {
            let reason = match e {
                OpError::UnknownTag(tag) => Corruption::UnknownOpTag(tag),
                OpError::Malformed(what) => Corruption::Malformed(what),
            };
            Error::corrupt(path, offset as u64, reason)
        })?;
        let payload_at = offset + frame::HEADER_LEN;
        for (op_offset, op_len, op) in &ops {
            let loc = Loc {
                segment: segment.id,
                offset: (payload_at + op_offset) as u32,
                len: *op_len as u32,
            };
            apply(op, loc);
        }
        scanned.frames += 1;
        scanned.operations += ops.len() as u64;
        offset += frame.encoded_len();
    }
    Ok(scanned)
}

/// Replays one segment; returns its valid length (after cutting a torn tail).
fn replay_segment(
    segment: &SegmentFile,
    in_open_tail: bool,
    replay: &mut Replay<'_>,
    report: &mut RecoveryReport,
) -> Result<u32> {
    // The scan's bytes (possibly a map of the file) are gone before a torn tail is cut below.
    let scanned = scan_segment_in_place(segment, in_open_tail, |op, loc| replay.apply(op, loc))?;
    report.bytes += scanned.file_len;
    report.frames += scanned.frames;
    report.operations += scanned.operations;
    match scanned.end {
        SegmentEnd::Clean => Ok(scanned.file_len as u32),
        SegmentEnd::TornHeader => reinitialize(segment, report, scanned.file_len),
        SegmentEnd::ZeroTail(offset) => {
            truncate(segment, offset)?;
            Ok(offset as u32)
        }
        SegmentEnd::TornTail(offset) => {
            truncate(segment, offset)?;
            report.torn_tail = Some(TornTail {
                path: segment.path.clone(),
                offset,
                discarded: scanned.file_len - offset,
            });
            Ok(offset as u32)
        }
    }
}

fn reinitialize(segment: &SegmentFile, report: &mut RecoveryReport, file_len: u64) -> Result<u32> {
    let path = &segment.path;
    segment
        .file
        .set_len(0)
        .and_then(|()| {
            segment
                .file
                .write_at(0, &segment::encode_header(segment.id))
        })
        .and_then(|()| segment.file.sync_data())
        .map_err(|e| Error::io("reinitialize", path, e))?;
    report.torn_tail = Some(TornTail {
        path: path.clone(),
        offset: 0,
        discarded: file_len,
    });
    Ok(segment::HEADER_LEN as u32)
}

fn truncate(segment: &SegmentFile, offset: u64) -> Result<()> {
    segment
        .file
        .set_len(offset)
        .and_then(|()| segment.file.sync_data())
        .map_err(|e| Error::io("truncate", &segment.path, e))
}

fn damage_reason(damage: FrameDamage) -> Corruption {
    match damage {
        FrameDamage::Truncated => Corruption::TruncatedFrame,
        FrameDamage::HeaderChecksum => Corruption::HeaderChecksum,
        FrameDamage::Length(len) => Corruption::FrameLength(len),
        FrameDamage::PayloadChecksum => Corruption::PayloadChecksum,
    }
}

/// Looks past damage at `damaged` for an intact frame whose sync mark says the log was durable beyond
/// `damaged` when that frame was written. Such a frame proves the damage hit acknowledged data.
///
/// Every candidate offset whose header checksum holds costs a checksum of its payload. In a real log
/// that happens about once per frame, but crafted bytes can hold such headers at every offset with
/// overlapping payloads, which made this search quadratic (half a minute for 8 MiB). Past a budget of
/// four times the data plus 1 MiB of payload checksums the search stops and answers `true`: refusing
/// to open is safe, cutting what may be durable data is not.
fn later_frame_proves_durable(data: &[u8], damaged: usize) -> bool {
    let mut budget = data.len().saturating_mul(4).saturating_add(1 << 20);
    let mut at = damaged + 1;
    while at + frame::HEADER_LEN <= data.len() {
        let decoded = frame::decode(&data[at..]);
        if let Ok(_) | Err(FrameDamage::PayloadChecksum) = decoded {
            let payload_len =
                u32::from_le_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]]);
            match budget.checked_sub(payload_len as usize) {
                Some(left) => budget = left,
                None => return true,
            }
        }
        match decoded {
            Ok(frame) if frame.sync_mark > damaged as u64 => return true,
            Ok(frame) => at += frame.encoded_len(),
            Err(_) => at += 1,
        }
    }
    false
}
