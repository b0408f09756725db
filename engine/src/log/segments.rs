//! The set of segment files the store currently reads from, by id, and the segment id allocator.
//!
//! The writer adds a segment when it rotates; compaction swaps sealed ones out. Readers take an `Arc`
//! of the file while they hold the index shard lock that gave them the location, so a segment removed
//! afterwards stays readable for them (its handle, mapping and, on Unix, its data live on). Ids come
//! from one allocator shared by the writer and compaction, so no two files ever share an id.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use bytes::Bytes;
use parking_lot::{MappedRwLockReadGuard, RwLock, RwLockReadGuard};

use super::segment::{Kind, Loc, file_name};
use crate::error::{Error, Result};
use crate::storage::StorageFile;

/// An open segment file and its path.
#[derive(Clone)]
pub(crate) struct SegmentFile {
    pub(crate) id: u32,
    pub(crate) kind: Kind,
    pub(crate) path: PathBuf,
    pub(crate) file: Arc<dyn StorageFile>,
}

impl SegmentFile {
    /// Reads the bytes of one operation.
    pub(crate) fn read(&self, loc: Loc) -> Result<Bytes> {
        debug_assert_eq!(loc.segment, self.id);
        self.file
            .read_at(u64::from(loc.offset), loc.len as usize)
            .map_err(|e| Error::io("read", &self.path, e))
    }

    /// Calls `f` on the bytes of one operation: borrowed from the file's memory map when one covers
    /// them ([`StorageFile::read_mapped`]), else read into a buffer as [`SegmentFile::read`] does.
    /// Only once the bytes are final (after [`SegmentFile::written_up_to`] for the active segment).
    pub(crate) fn with_bytes<R>(&self, loc: Loc, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        debug_assert_eq!(loc.segment, self.id);
        match self
            .file
            .read_mapped(u64::from(loc.offset), loc.len as usize)
        {
            Some(bytes) => Ok(f(bytes)),
            None => self.read(loc).map(|bytes| f(&bytes)),
        }
    }

    /// Tells the file that its bytes up to the end of `loc` are written and final
    /// ([`StorageFile::written_prefix`]), which lets it serve reads of the segment being appended to
    /// from a memory map. Only for a store's own segments, once `LogWriter::wait_visible` has returned
    /// for `loc`: the writer has written those bytes, and nothing rewrites or cuts them while the
    /// store holds the directory lock.
    pub(crate) fn written_up_to(&self, loc: Loc) {
        debug_assert_eq!(loc.segment, self.id);
        self.file
            .written_prefix(u64::from(loc.offset) + u64::from(loc.len));
    }
}

/// Open segments by id.
pub(crate) struct Segments {
    dir: PathBuf,
    /// Behind `Arc`s, so that a reader's handle costs a reference count, not a copy of the path.
    files: RwLock<BTreeMap<u32, Arc<SegmentFile>>>,
    next_id: AtomicU32,
}

impl Segments {
    pub(crate) fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_owned(),
            files: RwLock::new(BTreeMap::new()),
            next_id: AtomicU32::new(1),
        }
    }

    pub(crate) fn path(&self, id: u32, kind: Kind) -> PathBuf {
        self.dir.join(file_name(id, kind))
    }

    /// A fresh segment id, larger than every id in the directory.
    pub(crate) fn allocate_id(&self) -> u32 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Makes sure future ids are above `id` (called for every file found at open).
    pub(crate) fn reserve_above(&self, id: u32) {
        self.next_id
            .fetch_max(id.saturating_add(1), Ordering::Relaxed);
    }

    pub(crate) fn insert(&self, segment: SegmentFile) {
        self.files.write().insert(segment.id, Arc::new(segment));
    }

    pub(crate) fn remove(&self, id: u32) {
        self.files.write().remove(&id);
    }

    /// The segment holding `loc`. A location the index hands out always names an open segment.
    pub(crate) fn get(&self, id: u32) -> Arc<SegmentFile> {
        self.files
            .read()
            .get(&id)
            .cloned()
            .expect("index locations always name an open segment")
    }

    /// The segment `id`, borrowed under the read lock of the segment list rather than behind a
    /// reference count of its own: a replay's lookup then costs no atomic increment and decrement
    /// of a count that every caller shares. `None` if no open segment has that id (an index location
    /// always names one). Like [`Segments::get`], take it while holding the index shard lock that
    /// gave the location, so compaction cannot remove the segment in between.
    ///
    /// Hold the guard only for non-blocking work (reading and decoding the bytes): a rotation
    /// (`Segments::insert`, under the log writer's mutex) waits for it, and a new reader waits
    /// behind that rotation. Never wait for the writer, take an index shard lock, or read the
    /// segment list again while holding it.
    pub(crate) fn read(&self, id: u32) -> Option<MappedRwLockReadGuard<'_, SegmentFile>> {
        RwLockReadGuard::try_map(self.files.read(), |files| files.get(&id).map(|f| &**f)).ok()
    }

    /// All open segments in id order.
    pub(crate) fn all(&self) -> Vec<Arc<SegmentFile>> {
        self.files.read().values().cloned().collect()
    }
}
