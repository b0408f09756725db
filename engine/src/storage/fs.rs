//! The real file system.
//!
//! Reads of sealed (immutable) files go through a read-only memory map, with no system call; the
//! segment being appended to is read with `pread`. (Mapping the active segment too was tried: on this
//! kernel and ext4, fdatasync of a file with a shared mapping was 16 times slower, which group commit
//! cannot afford.)

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use memmap2::Mmap;

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
