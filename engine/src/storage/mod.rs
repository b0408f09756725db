//! The one door through which the engine touches files.
//!
//! [`Storage`] and [`StorageFile`] are deliberately small: create, open, list, rename, remove, positional
//! read and write, fdatasync, directory sync, and an exclusive lock. [`FsStorage`] is the real
//! implementation; the `testkit` feature adds `testkit::FaultyStorage`, an in-memory file system that
//! keeps durable and unsynced data apart, so tests can crash at any step, tear the last append, drop
//! unsynced writes and fail fsyncs, deterministically and without sleeping.

mod fs;

use std::io;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

pub use fs::FsStorage;

/// A file system, as the engine needs it.
pub trait Storage: Send + Sync + 'static {
    /// Creates a directory and its parents if missing.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Names of the regular files directly inside `dir`.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Opens an existing file for reading and writing.
    fn open(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>>;
    /// Creates a new, empty file; fails if it exists.
    fn create_new(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>>;
    /// Removes a file.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Atomically renames `from` to `to`, replacing `to`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes the directory's entries (creations, renames, removals) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Takes an exclusive lock on `path` (creating it), or `None` if someone else holds it. The lock
    /// is held until the returned guard is dropped.
    fn try_lock(&self, path: &Path) -> io::Result<Option<Box<dyn LockGuard>>>;
}

/// An open file.
pub trait StorageFile: Send + Sync + 'static {
    /// Current length in bytes.
    fn size(&self) -> io::Result<u64>;
    /// Exactly `len` bytes at `offset`; an error if the file is shorter.
    fn read_at(&self, offset: u64, len: usize) -> io::Result<Bytes>;
    /// [`StorageFile::read_at`], except that the bytes may be a read-only memory map of the file rather
    /// than a copy. The caller must not shrink the file below `offset + len` while the returned bytes,
    /// or any slice of them, live (touching a mapped page past the end of a file is a fatal signal,
    /// not an error). For reading a whole segment at open.
    fn read_in_place(&self, offset: u64, len: usize) -> io::Result<Bytes> {
        self.read_at(offset, len)
    }
    /// The bytes `[offset, offset + len)` borrowed from a memory map of the file, or `None` if no map
    /// covers them (then use [`StorageFile::read_at`]). The same bytes `read_at` would copy out, with
    /// the same rules: only bytes the file already holds for good (a sealed file, or a prefix declared
    /// with [`StorageFile::written_prefix`]). For short reads that are decoded on the spot (a replay),
    /// which then skip the copy and its allocation.
    fn read_mapped(&self, offset: u64, len: usize) -> Option<&[u8]> {
        let _ = (offset, len);
        None
    }
    /// Writes all of `data` at `offset`.
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()>;
    /// fdatasync: makes written data durable.
    fn sync_data(&self) -> io::Result<()>;
    /// Truncates or extends the file.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// A hint that the file will not be written again, so reads may use a memory map.
    fn seal(&self) -> io::Result<()> {
        Ok(())
    }
    /// A hint that the first `len` bytes of the file are written and stay as they are, never
    /// rewritten nor truncated, for as long as this handle is open (the file is only appended to from
    /// here on), so reads inside them may use a memory map. The engine calls it on the segment being
    /// appended to, with a position its writer has already written, and only while it holds the
    /// directory lock (so no other process can cut the file).
    fn written_prefix(&self, len: u64) {
        let _ = len;
    }
}

/// Holds a directory lock until dropped.
pub trait LockGuard: Send + Sync {}

/// Creates `dir` (and missing parents) so that it survives a power loss: each directory created is
/// made durable by syncing its parent, which is what holds its entry. An existing directory is left
/// alone. Without this a new store could acknowledge writes into a directory that a power loss
/// removes, files and all.
pub(crate) fn create_dir_durable(storage: &dyn Storage, dir: &Path) -> io::Result<()> {
    match storage.list(dir) {
        Ok(_) => return Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    // A relative path's last component has the current directory as its parent.
    let parent = match dir.parent() {
        Some(p) if p.as_os_str().is_empty() => Some(Path::new(".")),
        other => other,
    };
    if let Some(parent) = parent {
        create_dir_durable(storage, parent)?;
    }
    storage.create_dir_all(dir)?;
    if let Some(parent) = parent {
        storage.sync_dir(parent)?;
    }
    Ok(())
}

/// Replaces `dir/name` atomically and durably with `contents`: write a temporary file, sync it, rename
/// it over the target, sync the directory. Every metadata file goes through here.
pub fn write_atomic(
    storage: &dyn Storage,
    dir: &Path,
    name: &str,
    contents: &[u8],
) -> io::Result<()> {
    replace_atomic(storage, dir, name, contents).map_err(|e| match e {
        AtomicWriteError::BeforeRename(e) | AtomicWriteError::Ambiguous(e) => e,
    })
}

/// How an atomic replacement failed, which decides what the caller may assume about the target.
#[derive(Debug)]
pub(crate) enum AtomicWriteError {
    /// Creating, writing or syncing the temporary file failed: the target was not touched, and only
    /// the temporary file (`{name}.tmp`) may be left behind.
    BeforeRename(io::Error),
    /// The rename, or the directory sync after it, failed: the rename may or may not have happened,
    /// and may or may not survive a power loss, so either version is what a restart may see.
    Ambiguous(io::Error),
}

/// The temporary file [`write_atomic`] writes `dir/name` through.
pub(crate) fn atomic_tmp_path(dir: &Path, name: &str) -> std::path::PathBuf {
    dir.join(format!("{name}.tmp"))
}

/// [`write_atomic`], telling a failure before the rename (nothing switched) from one at or after it.
pub(crate) fn replace_atomic(
    storage: &dyn Storage,
    dir: &Path,
    name: &str,
    contents: &[u8],
) -> Result<(), AtomicWriteError> {
    let tmp = atomic_tmp_path(dir, name);
    let prepare = || -> io::Result<()> {
        match storage.remove(&tmp) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let file = storage.create_new(&tmp)?;
        file.write_at(0, contents)?;
        file.sync_data()
    };
    prepare().map_err(AtomicWriteError::BeforeRename)?;
    storage
        .rename(&tmp, &dir.join(name))
        .and_then(|()| storage.sync_dir(dir))
        .map_err(AtomicWriteError::Ambiguous)
}
