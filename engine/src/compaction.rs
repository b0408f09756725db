//! Online compaction: rewrite the live records of the sealed segments into new segments, switch the
//! manifest, and drop the old files, while claims and completions go on.
//!
//! The inputs are every segment but the active one. Compaction runs in four phases:
//!
//! 1. **Collect** the locations of live records (unexpired, still pointed at by the index) that lie in
//!    the inputs, one shard lock at a time; then fdatasync the log, so that every newer version that
//!    made an input operation garbage is durable before that operation is dropped.
//! 2. **Copy** those operations verbatim (they are self-contained snapshots) into new `.cseg` files,
//!    fdatasync them and the directory. No lock is held; the writer keeps appending to the active
//!    segment, which is not an input.
//! 3. **Switch**: replace the manifest (base = the outputs, first tail = the active segment at the
//!    start, fence floor = the next fencing token). This is the commit point. Then move each index
//!    entry to its copy *only if it still points at the old location* (Bitcask's rule): an entry that
//!    changed during the copy points into the tail, whose operations replay after the base anyway, so
//!    nothing is lost or resurrected. Entries left pointing at inputs were expired and are dropped.
//! 4. **Delete** the inputs. Readers that took a handle before the switch keep reading it.
//!
//! A crash before the switch leaves the outputs as garbage; a crash after it leaves the inputs as
//! garbage; recovery deletes either (see `manifest.rs`). A failure before the switch (creating,
//! writing or syncing an output, the directory, or the temporary manifest) switched nothing: the
//! outputs and the temporary manifest are removed (best effort; leftovers are counted in the stats and
//! deleted by the next open) and the store keeps serving. Only a failure of the manifest rename or of
//! the directory sync after it poisons the store, since it is then unknown which manifest a restart
//! will see.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::index::{Entry, SideEntry};
use crate::log::frame::{self, TAG_OPS};
use crate::log::segment::{self, Kind, Loc};
use crate::log::segments::SegmentFile;
use crate::manifest::{Manifest, Switched};
use crate::options::CompactionPolicy;
use crate::store::{Core, Store};

/// Target payload size of a compacted frame.
const FRAME_TARGET: usize = 256 << 10;

/// What one compaction did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactionReport {
    /// Segments rewritten and deleted.
    pub input_segments: usize,
    /// Their bytes.
    pub input_bytes: u64,
    /// Compacted segments written.
    pub output_segments: usize,
    /// Their bytes.
    pub output_bytes: u64,
    /// Live records and side records copied.
    pub records_copied: usize,
    /// Wall time, in microseconds.
    pub micros: u64,
}

/// How the bytes on disk divide between live data and garbage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SpaceUse {
    /// Bytes of live operations in sealed segments.
    pub(crate) sealed_live: u64,
    /// Bytes of sealed segment files.
    pub(crate) sealed: u64,
    /// Bytes of live operations anywhere.
    pub(crate) live: u64,
}

impl SpaceUse {
    pub(crate) fn garbage(&self) -> u64 {
        self.sealed.saturating_sub(self.sealed_live)
    }

    pub(crate) fn wants_compaction(&self, policy: &CompactionPolicy) -> bool {
        let garbage = self.garbage();
        garbage > 0
            && garbage >= policy.min_garbage_bytes
            && garbage as f64 >= policy.garbage_ratio * self.sealed as f64
    }
}

/// Copied operations: `(old, new)` location pairs sorted by old location.
struct Outputs {
    files: Vec<SegmentFile>,
    moves: Vec<(Loc, Loc)>,
}

fn loc_key(loc: &Loc) -> (u32, u32) {
    (loc.segment, loc.offset)
}

impl Store {
    /// Compacts now: rewrites the live records of all sealed segments and deletes the old files.
    /// Claims and completions continue meanwhile. Returns what it did; with nothing sealed it does
    /// nothing.
    pub fn compact(&self) -> Result<CompactionReport> {
        self.core().compact()
    }
}

impl Core {
    /// Live and garbage bytes. Scans the index a chunk of slots at a time, so it never holds a lock
    /// for long; with writes going on, the figure is a close estimate rather than a snapshot.
    pub(crate) fn space(&self) -> SpaceUse {
        self.space_and_visit(|_| {}, |_| {})
    }

    /// [`Core::space`], also showing every entry (live or not) to the visitors on the same pass.
    pub(crate) fn space_and_visit(
        &self,
        mut record: impl FnMut(&Entry),
        mut side: impl FnMut(&SideEntry),
    ) -> SpaceUse {
        let active = self.writer.active_segment();
        let now = self.options.clock.now_ms();
        let mut space = SpaceUse::default();
        let mut count = |loc: Loc| {
            space.live += u64::from(loc.len);
            if loc.segment != active {
                space.sealed_live += u64::from(loc.len);
            }
        };
        self.records.for_each_chunked(|e| {
            record(e);
            if e.is_live(now) {
                count(e.loc);
            }
        });
        self.side.for_each_chunked(|e| {
            side(e);
            if e.is_live(now) {
                count(e.loc);
            }
        });
        space.sealed = self
            .segments
            .all()
            .iter()
            .filter(|s| s.id != active)
            .filter_map(|s| s.file.size().ok())
            .sum();
        space
    }

    pub(crate) fn compact(&self) -> Result<CompactionReport> {
        let _one_at_a_time = self.compaction.lock();
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        self.writer.check_poisoned()?;
        let started = Instant::now();
        let active = self.writer.active_segment();
        let inputs: Vec<Arc<SegmentFile>> = self
            .segments
            .all()
            .into_iter()
            .filter(|s| s.kind == Kind::Compacted || s.id < active)
            .collect();
        if inputs.is_empty() {
            return Ok(CompactionReport::default());
        }
        let mut input_ids: Vec<u32> = inputs.iter().map(|s| s.id).collect();
        input_ids.sort_unstable();
        let mut report = CompactionReport {
            input_segments: inputs.len(),
            input_bytes: inputs.iter().filter_map(|s| s.file.size().ok()).sum(),
            ..CompactionReport::default()
        };

        let locs = self.collect_live(&input_ids);
        // An input operation that the index no longer points at was superseded by a newer version
        // in the tail, so it is not copied; the switch then deletes it. That is only safe once the
        // newer version is durable, and it need not be yet: its caller may still be waiting for the
        // fdatasync, or may not wait at all (a deferred write). Without this sync a crash after the
        // switch would lose both versions of the record. Versions appended after the collect step
        // are harmless: the operations they supersede were live then, so they are copied.
        self.writer.sync_all()?;
        // Read before the copy: every fence handed out later lands in the tail. The reserved
        // limit, not just the next fence: the fence-floor operation that reserved it may sit in an
        // input, which this compaction drops, while fences below the limit are handed out before
        // their claims are durable.
        let fence_floor = self
            .next_fence
            .load(Ordering::SeqCst)
            .max(self.fence_limit.load(Ordering::SeqCst));
        let outputs = match self.write_outputs(&locs) {
            Ok(outputs) => outputs,
            Err((e, written)) => {
                self.abandon(&written);
                return Err(e);
            }
        };

        let manifest = Manifest {
            first_tail: active,
            fence_floor,
            base: outputs.files.iter().map(|s| s.id).collect(),
        };
        if let Err(failed) = manifest.store(&*self.options.storage, &self.dir) {
            return Err(match failed.switched {
                // The old manifest is in force and still names the inputs, which are untouched: drop
                // the outputs and the temporary manifest, and keep serving.
                Switched::No => {
                    self.abandon(&outputs.files);
                    self.remove_leftover(&Manifest::tmp_path(&self.dir));
                    failed.error
                }
                // Which manifest a restart reads is unknown, so which files are garbage is too:
                // nothing more may be written or deleted until a reopen decides.
                Switched::Unknown => self.writer.poison_with(failed.error),
            });
        }
        for file in &outputs.files {
            self.segments.insert(file.clone());
        }
        self.relocate(&input_ids, &outputs.moves);
        for input in &inputs {
            self.segments.remove(input.id);
        }
        self.compactions.fetch_add(1, Ordering::Relaxed);
        report.output_segments = outputs.files.len();
        report.output_bytes = outputs
            .files
            .iter()
            .filter_map(|s| s.file.size().ok())
            .sum();
        report.records_copied = outputs.moves.len();
        self.compaction_reclaimed.fetch_add(
            report.input_bytes.saturating_sub(report.output_bytes),
            Ordering::Relaxed,
        );

        // The switch is durable; the inputs are garbage from here, and a failure to delete them is
        // finished by the next open.
        let storage = &*self.options.storage;
        for input in &inputs {
            storage
                .remove(&input.path)
                .map_err(|e| Error::io("remove", &input.path, e))?;
        }
        storage
            .sync_dir(&self.dir)
            .map_err(|e| Error::io("sync directory", &self.dir, e))?;
        report.micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        Ok(report)
    }

    /// Locations of live records and side records inside the inputs, sorted.
    ///
    /// Scanned a chunk of slots at a time, with writes going on. Nothing is missed: the inputs are
    /// sealed, so no entry starts pointing into them during the scan, and an entry keeps its slot
    /// until it is removed.
    fn collect_live(&self, inputs: &[u32]) -> Vec<Loc> {
        let now = self.options.clock.now_ms();
        let in_inputs = |loc: &Loc| inputs.binary_search(&loc.segment).is_ok();
        let mut locs = Vec::new();
        self.records.for_each_chunked(|e| {
            if e.is_live(now) && in_inputs(&e.loc) {
                locs.push(e.loc);
            }
        });
        self.side.for_each_chunked(|e| {
            if e.is_live(now) && in_inputs(&e.loc) {
                locs.push(e.loc);
            }
        });
        locs.sort_unstable_by_key(loc_key);
        locs
    }

    /// Copies the operations at `locs` into new compacted segments, synced. On failure, returns the
    /// files created so far so they can be removed.
    fn write_outputs(&self, locs: &[Loc]) -> Result<Outputs, (Error, Vec<SegmentFile>)> {
        let mut out = OutputWriter {
            core: self,
            files: Vec::new(),
            moves: Vec::with_capacity(locs.len()),
            len: 0,
            payload: Vec::with_capacity(FRAME_TARGET + 4096),
            pending: Vec::new(),
        };
        let result = (|| -> Result<()> {
            let mut source: Option<Arc<SegmentFile>> = None;
            for &loc in locs {
                if source.as_ref().is_none_or(|s| s.id != loc.segment) {
                    source = Some(self.segments.get(loc.segment));
                }
                let bytes = source.as_ref().expect("set above").read(loc)?;
                if !out.payload.is_empty() && out.payload.len() + bytes.len() > FRAME_TARGET {
                    out.flush_frame()?;
                }
                out.pending.push((loc, out.payload.len()));
                out.payload.extend_from_slice(&bytes);
            }
            out.flush_frame()?;
            out.finish_file()?;
            let storage = &*self.options.storage;
            storage
                .sync_dir(&self.dir)
                .map_err(|e| Error::io("sync directory", &self.dir, e))
        })();
        match result {
            Ok(()) => Ok(Outputs {
                files: out.files,
                moves: out.moves,
            }),
            Err(e) => Err((e, out.files)),
        }
    }

    /// Removes the outputs of a compaction that did not reach its switch (best effort: recovery
    /// deletes whatever is left).
    fn abandon(&self, files: &[SegmentFile]) {
        for file in files {
            self.remove_leftover(&file.path);
        }
    }

    /// Removes a file of a failed compaction, best effort: a file that cannot be removed is counted
    /// in [`crate::Stats::compaction_leftovers`] and deleted by the next open, which treats every
    /// file the manifest does not name as garbage.
    fn remove_leftover(&self, path: &std::path::Path) {
        match self.options.storage.remove(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                self.compaction_leftovers.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    /// Points index entries at their copies, if they still point at the originals; drops entries left
    /// in the inputs (they expired before the copy).
    fn relocate(&self, inputs: &[u32], moves: &[(Loc, Loc)]) {
        let moved = |loc: Loc| -> Option<Loc> {
            moves
                .binary_search_by_key(&loc_key(&loc), |(old, _)| loc_key(old))
                .ok()
                .map(|i| moves[i].1)
        };
        let update = |loc: &mut Loc| -> bool {
            if inputs.binary_search(&loc.segment).is_err() {
                return true;
            }
            match moved(*loc) {
                Some(new) => {
                    *loc = new;
                    true
                }
                None => false,
            }
        };
        // Each entry is checked and moved under its shard's lock, which is all Bitcask's rule needs;
        // a chunk at a time keeps claims from waiting on the whole shard.
        self.records.retain_chunked(|e| update(&mut e.loc));
        self.side
            .retain_chunked(|e: &mut SideEntry| update(&mut e.loc));
    }
}

/// Appends copied operations to a sequence of compacted segment files.
struct OutputWriter<'a> {
    core: &'a Core,
    files: Vec<SegmentFile>,
    moves: Vec<(Loc, Loc)>,
    /// Bytes written to the last file.
    len: u32,
    payload: Vec<u8>,
    /// Operations in `payload`: original location and offset inside the payload.
    pending: Vec<(Loc, usize)>,
}

impl OutputWriter<'_> {
    fn flush_frame(&mut self) -> Result<()> {
        if self.payload.is_empty() {
            return Ok(());
        }
        let frame_len = frame::HEADER_LEN + self.payload.len();
        let segment_size = self.core.options.segment_size as usize;
        if self.files.is_empty()
            || (self.len as usize + frame_len > segment_size
                && self.len as usize > segment::HEADER_LEN)
        {
            self.finish_file()?;
            self.start_file()?;
        }
        let file = self.files.last().expect("a file was started").clone();
        let mut buf = Vec::with_capacity(frame_len);
        // Compacted segments are synced as a whole before anyone relies on them: mark 0.
        frame::encode(&mut buf, TAG_OPS, 0, |b| b.extend_from_slice(&self.payload));
        file.file
            .write_at(u64::from(self.len), &buf)
            .map_err(|e| Error::io("write", &file.path, e))?;
        let payload_at = self.len as usize + frame::HEADER_LEN;
        for (i, &(old, at)) in self.pending.iter().enumerate() {
            let end = self.pending.get(i + 1).map_or(self.payload.len(), |p| p.1);
            self.moves.push((
                old,
                Loc {
                    segment: file.id,
                    offset: (payload_at + at) as u32,
                    len: (end - at) as u32,
                },
            ));
        }
        self.len += frame_len as u32;
        self.payload.clear();
        self.pending.clear();
        Ok(())
    }

    fn start_file(&mut self) -> Result<()> {
        let id = self.core.segments.allocate_id();
        let path = self.core.segments.path(id, Kind::Compacted);
        let file = self
            .core
            .options
            .storage
            .create_new(&path)
            .map_err(|e| Error::io("create", &path, e))?;
        let segment = SegmentFile {
            id,
            kind: Kind::Compacted,
            path,
            file,
        };
        self.files.push(segment.clone());
        segment
            .file
            .write_at(0, &segment::encode_header(id))
            .map_err(|e| Error::io("write", &segment.path, e))?;
        self.len = segment::HEADER_LEN as u32;
        Ok(())
    }

    /// Syncs and seals the last file, if any.
    fn finish_file(&mut self) -> Result<()> {
        if let Some(file) = self.files.last() {
            file.file
                .sync_data()
                .map_err(|e| Error::io("fdatasync", &file.path, e))?;
            file.file
                .seal()
                .map_err(|e| Error::io("map", &file.path, e))?;
        }
        Ok(())
    }
}
