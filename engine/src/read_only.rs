//! A read-only view of a data directory, for operator tools (`idemlogctl stats` and `inspect`).
//!
//! Invariant: opening and using a [`ReadOnlyStore`] changes nothing in the directory. It replays the
//! log into an index exactly as recovery does, but never writes, truncates, syncs, deletes or creates
//! a file: a torn tail is reported and left in place (replay stops before it, as recovery's cut
//! would), leftovers of interrupted compactions are reported and left, and no segment is created. It
//! takes the directory lock only when `LOCK` already exists (so it refuses a directory a store holds
//! open, like [`crate::verify`]), and never creates it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::clock::Clock;
use crate::dir_lock::{self, LOCK_FILE};
use crate::error::{Error, Result};
use crate::index::{self, Entry, Sharded, SideEntry};
use crate::limits;
use crate::log::segment::Kind;
use crate::log::segments::Segments;
use crate::options::Options;
use crate::record::Record;
use crate::recovery::{Layout, RecoveredLeases, Replay, open_tail_from, scan_segment};
use crate::storage::LockGuard;
use crate::store::{Stats, record_at};

/// The records of a data directory as the next open would see them, without changing a byte.
pub struct ReadOnlyStore {
    segments: Segments,
    records: Sharded<Entry>,
    side: Sharded<SideEntry>,
    /// The segment the next open would append to (its bytes are not garbage).
    active: Option<u32>,
    torn_tail: Option<(PathBuf, u64)>,
    garbage: Vec<PathBuf>,
    clock: Arc<dyn Clock>,
    _lock: Option<Box<dyn LockGuard>>,
}

impl ReadOnlyStore {
    /// Replays the log under `dir` with `options.storage`, judging expiry by `options.clock`.
    /// Fails with [`Error::Locked`] if a store has the directory open, and with [`Error::Corrupt`]
    /// where the next open would.
    pub fn open(dir: impl AsRef<Path>, options: &Options) -> Result<ReadOnlyStore> {
        let dir = dir.as_ref();
        let storage = &*options.storage;
        let names = storage.list(dir).map_err(|e| Error::io("list", dir, e))?;
        let lock = if names.iter().any(|n| n == LOCK_FILE) {
            Some(dir_lock::lock(storage, dir)?)
        } else {
            None
        };
        let layout = Layout::read(storage, dir)?;
        let segments = Segments::new(dir);
        let records = Sharded::new(16);
        let side = Sharded::new(1);
        let mut replay = Replay {
            records: &records,
            side: &side,
            next_fence: 1,
            // Nothing is claimed through a read-only view: leases do not matter here.
            leases: RecoveredLeases::Over,
        };
        let open_tail = open_tail_from(storage, &layout, &segments)?;
        let mut torn_tail = None;
        for opened in layout.open_in_replay_order(storage, &segments, open_tail) {
            let (segment, in_open_tail) = opened?;
            let scanned = scan_segment(&segment, in_open_tail, |op, loc| replay.apply(op, loc))?;
            if let Some(offset) = scanned.end.torn_at() {
                torn_tail = Some((segment.path.clone(), offset));
            }
            segments.insert(segment);
        }
        Ok(ReadOnlyStore {
            segments,
            records,
            side,
            active: layout.tail.last().copied(),
            torn_tail,
            garbage: layout.garbage,
            clock: Arc::clone(&options.clock),
            _lock: lock,
        })
    }

    /// A torn tail the next open will cut: the file and the offset where intact frames end.
    pub fn torn_tail(&self) -> Option<&(PathBuf, u64)> {
        self.torn_tail.as_ref()
    }

    /// Leftovers of interrupted compactions and atomic writes, which the next open will delete.
    pub fn garbage(&self) -> &[PathBuf] {
        &self.garbage
    }

    /// The live record for `(scope, key)`, if any.
    pub fn get(&self, scope: &[u8], key: &[u8]) -> Result<Option<Record>> {
        limits::check_record_key(scope, key)?;
        let now = self.clock.now_ms();
        let id = index::record_key(scope, key);
        let hash = self.records.hash(id.as_bytes());
        let entry = self
            .records
            .shard(hash)
            .lock()
            .get(hash, id.as_bytes())
            .filter(|e| e.is_live(now))
            .copied();
        match entry {
            Some(entry) => record_at(&self.segments.get(entry.loc.segment), &entry).map(Some),
            None => Ok(None),
        }
    }

    /// Counts as [`crate::Store::stats`] would report them right after an open (the counters of work
    /// done since open are zero).
    pub fn stats(&self) -> Stats {
        let now = self.clock.now_ms();
        let active = self.active;
        let mut stats = Stats::default();
        let (mut live, mut sealed_live) = (0u64, 0u64);
        let mut count = |loc: crate::log::segment::Loc| {
            live += u64::from(loc.len);
            if Some(loc.segment) != active {
                sealed_live += u64::from(loc.len);
            }
        };
        self.records.for_each_chunked(|e| {
            stats.index_entries += 1;
            if e.is_live(now) {
                stats.records += 1;
                stats.in_progress += usize::from(e.lease_until.is_some());
                count(e.loc);
            }
        });
        self.side.for_each_chunked(|e| {
            stats.index_entries += 1;
            if e.is_live(now) {
                stats.side_records += 1;
                count(e.loc);
            }
        });
        let all = self.segments.all();
        stats.segments = all.len();
        stats.disk_bytes = all.iter().filter_map(|s| s.file.size().ok()).sum();
        let sealed: u64 = all
            .iter()
            .filter(|s| !(s.kind == Kind::Log && Some(s.id) == active))
            .filter_map(|s| s.file.size().ok())
            .sum();
        stats.live_bytes = live;
        stats.garbage_bytes = sealed.saturating_sub(sealed_live);
        stats
    }
}
