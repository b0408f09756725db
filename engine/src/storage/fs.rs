//! The real file system.
//!
//! Reads go through a read-only memory map when one exists, so a replayed response is a slice of the
//! page cache with no copy and no system call: sealed files are mapped whole, and the segment being
//! appended to is mapped ahead of its end (see `map_for_reads`). Anything the map does not cover is
//! read with `pread`.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use memmap2::{Mmap, MmapOptions};

use super::{LockGuard, Storage, StorageFile};

/// Reads at least this long share the memory map instead of copying out of it.
const SHARE_FROM: usize = 64 << 10;

/// [`Storage`] on the operating system's file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct FsStorage;

struct FsFile {
    file: File,
    map: OnceLock<Arc<Mmap>>,
}

struct FsLock(#[allow(dead_code)] File);

impl LockGuard for FsLock {}

impl Storage for FsStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        fs::create_dir_all(dir)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            if entry.file_type()?.is_file()
                && let Some(name) = entry.file_name().to_str()
            {
                names.push(name.to_owned());
            }
        }
        Ok(names)
    }

    fn open(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        Ok(Arc::new(FsFile {
            file,
            map: OnceLock::new(),
        }))
    }

    fn create_new(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        Ok(Arc::new(FsFile {
            file,
            map: OnceLock::new(),
        }))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn try_lock(&self, path: &Path) -> io::Result<Option<Box<dyn LockGuard>>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        match file.try_lock() {
            Ok(()) => Ok(Some(Box::new(FsLock(file)))),
            Err(TryLockError::WouldBlock) => Ok(None),
            Err(TryLockError::Error(e)) => Err(e),
        }
    }
}

impl StorageFile for FsFile {
    fn size(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn read_at(&self, offset: u64, len: usize) -> io::Result<Bytes> {
        if let Some(map) = self.map.get() {
            let start = usize::try_from(offset).unwrap_or(usize::MAX);
            if let Some(end) = start.checked_add(len).filter(|&end| end <= map.len()) {
                // Small reads are copied out: sharing the map would put one reference count, bounced
                // between cores, on every replay. Large ones share it and skip the copy.
                if len < SHARE_FROM {
                    return Ok(Bytes::copy_from_slice(&map[start..end]));
                }
                return Ok(Bytes::from_owner(MapSlice {
                    map: Arc::clone(map),
                    start,
                    end,
                }));
            }
        }
        let mut buf = vec![0u8; len];
        self.file.read_exact_at(&mut buf, offset)?;
        Ok(Bytes::from(buf))
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.file.write_all_at(data, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn seal(&self) -> io::Result<()> {
        if self.map.get().is_none() && self.size()? > 0 {
            // SAFETY: the engine never writes to or truncates a sealed segment again; the directory lock
            // keeps other idemlog processes out, and compaction only unlinks sealed files, which leaves
            // existing mappings valid. A third party truncating our files under us is outside the
            // contract (as for every mmap-based store).
            let map = unsafe { Mmap::map(&self.file)? };
            let _ = self.map.set(Arc::new(map));
        }
        Ok(())
    }

    fn map_for_reads(&self, len: u64) -> io::Result<()> {
        let Ok(len) = usize::try_from(len) else {
            return Ok(());
        };
        if self.map.get().is_none() && len > 0 {
            // SAFETY: the mapping may extend past the end of the file, where touching a page would
            // raise SIGBUS; the engine only reads ranges it has already written (every read waits
            // until the writer's written position covers it) and never truncates this file while it
            // is open, so no access reaches past the end. Writes go through `pwrite` into the same
            // page cache the mapping shows. The other promises are those of `seal`.
            let map = unsafe { MmapOptions::new().len(len).map(&self.file)? };
            let _ = self.map.set(Arc::new(map));
        }
        Ok(())
    }
}

/// Keeps a mapping alive for as long as a `Bytes` slice of it exists.
struct MapSlice {
    map: Arc<Mmap>,
    start: usize,
    end: usize,
}

impl AsRef<[u8]> for MapSlice {
    fn as_ref(&self) -> &[u8] {
        &self.map[self.start..self.end]
    }
}
