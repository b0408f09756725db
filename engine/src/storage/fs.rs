//! The real file system.
//!
//! Reads of sealed (immutable) files go through a read-only memory map, with no system call. The
//! segment being appended to is read through a [`PrefixMap`]: a read-only mapping of only the part the
//! engine has said is written ([`StorageFile::written_prefix`]), grown a step at a time inside an
//! address range reserved up front, so readers never touch a page past the end of the file and never
//! wait for the mapping to grow. What it does not cover yet (the last, partial step) is read with
//! `pread`. Recovery reads whole segments with [`StorageFile::read_in_place`], a temporary map
//! instead of a copy.
//!
//! History: mapping the whole active segment ahead of its end (at open, past the end of the file)
//! was measured in December 2026 to make fdatasync 16 times slower on that kernel build, so for a
//! while the active segment was read with `pread` only. The prefix map differs: it is created on the
//! first read, not at open, and never covers bytes past the end of the file. On kernel 6.18 (build
//! fc-v1098) a probe appending 300-byte records with one fdatasync each showed no difference with
//! such a mapping present and read from (p50 145–165 µs either way), nor did single-caller `Sync`
//! claims with replays in between; if a kernel changes, compare the `fdatasync_seconds` histogram.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use memmap2::{Mmap, MmapOptions};
use parking_lot::Mutex;

use super::{LockGuard, Storage, StorageFile};

/// Reads at least this long share the memory map instead of copying out of it.
const SHARE_FROM: usize = 64 << 10;

/// The prefix map grows in steps of this many bytes (a multiple of every page size Linux uses on
/// common hardware, so every step starts on a page boundary): one `mmap` per 64 KiB written and read.
const PREFIX_STEP: usize = 64 << 10;

/// Address space reserved for a prefix map: past every segment size the options allow (1 GiB) plus a
/// frame that may overrun it. Reads beyond it use `pread`. Address space only: the reservation is
/// `PROT_NONE` and not backed by memory, and sealing gives back the part past the file's end.
const PREFIX_RESERVE: usize = 2 << 30;

/// [`Storage`] on the operating system's file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct FsStorage;

struct FsFile {
    file: File,
    map: OnceLock<Arc<Mmap>>,
    /// Set on the first [`StorageFile::written_prefix`] of a file that is not sealed; `None` if the
    /// reservation failed (reads then use `pread`).
    prefix: OnceLock<Option<PrefixMap>>,
}

impl FsFile {
    fn new(file: File) -> Self {
        Self {
            file,
            map: OnceLock::new(),
            prefix: OnceLock::new(),
        }
    }
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
        Ok(Arc::new(FsFile::new(file)))
    }

    fn create_new(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        Ok(Arc::new(FsFile::new(file)))
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
        // Large reads from the whole-file map share it and skip the copy. Small ones are copied out:
        // sharing the map would put one reference count, bounced between cores, on every replay.
        if len >= SHARE_FROM
            && let Some(map) = self.map.get()
        {
            let start = usize::try_from(offset).unwrap_or(usize::MAX);
            if let Some(end) = start.checked_add(len).filter(|&end| end <= map.len()) {
                return Ok(Bytes::from_owner(MapSlice {
                    map: Arc::clone(map),
                    start,
                    end,
                }));
            }
        }
        if let Some(bytes) = self.read_mapped(offset, len) {
            return Ok(Bytes::copy_from_slice(bytes));
        }
        let mut buf = vec![0u8; len];
        self.file.read_exact_at(&mut buf, offset)?;
        Ok(Bytes::from(buf))
    }

    fn read_mapped(&self, offset: u64, len: usize) -> Option<&[u8]> {
        if let Some(map) = self.map.get() {
            let start = usize::try_from(offset).unwrap_or(usize::MAX);
            if let Some(bytes) = start.checked_add(len).and_then(|end| map.get(start..end)) {
                return Some(bytes);
            }
        }
        match self.prefix.get() {
            Some(Some(prefix)) => prefix.get(offset, len),
            _ => None,
        }
    }

    fn read_in_place(&self, offset: u64, len: usize) -> io::Result<Bytes> {
        if len < SHARE_FROM || self.map.get().is_some() {
            return self.read_at(offset, len);
        }
        let size = self.size()?;
        if offset.checked_add(len as u64).is_none_or(|end| end > size) {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read past the end of the file",
            ));
        }
        // SAFETY: every mapped byte is inside the file (checked just above), and the caller promises
        // not to shrink the file while the returned bytes live (see the trait). Nothing writes through
        // the map; bytes appended meanwhile lie past it.
        let map = unsafe { MmapOptions::new().offset(offset).len(len).map(&self.file)? };
        Ok(Bytes::from_owner(MapSlice {
            map: Arc::new(map),
            start: 0,
            end: len,
        }))
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
            if let Some(Some(prefix)) = self.prefix.get() {
                prefix.seal(map_len(self.size()?));
            }
        }
        Ok(())
    }

    fn written_prefix(&self, len: u64) {
        if self.map.get().is_some() {
            return;
        }
        let len = map_len(len);
        if len < PREFIX_STEP {
            return;
        }
        if let Some(prefix) = self.prefix.get_or_init(PrefixMap::reserve) {
            prefix.grow_to(&self.file, len);
        }
    }
}

/// `len` as a mapping length: `usize::MAX` (so never covered) if it does not fit.
fn map_len(len: u64) -> usize {
    usize::try_from(len).unwrap_or(usize::MAX)
}

/// A read-only shared mapping of a growing prefix of a file, at an address that never changes.
///
/// On creation it reserves [`PREFIX_RESERVE`] bytes of address space (`PROT_NONE`, no memory). Growing
/// maps the file's next whole steps over the start of what is still reserved, with `MAP_FIXED` at the
/// file offset equal to the offset in the range, and only then publishes the new length (`Release`),
/// so a reader that sees a length (`Acquire`) finds those pages mapped. Pages are only ever added while
/// the map lives; the whole range is unmapped when it is dropped, which needs `&mut self`, so no reader
/// is left. Invariants, under `grow`:
/// - `mapped <= limit <= PREFIX_RESERVE`; `[0, mapped)` maps the file, `[mapped, limit)` is still our
///   reservation, and nothing past `limit` is ours any more (given back, or lost to a failed `mmap`).
/// - Every mapped byte is a byte the engine declared written ([`StorageFile::written_prefix`]): in the
///   file, never rewritten and never truncated while the file is open, so no access raises `SIGBUS`.
struct PrefixMap {
    base: *mut u8,
    /// Bytes of the file mapped at `base` (a multiple of [`PREFIX_STEP`]).
    mapped: AtomicUsize,
    /// Serialises growth and sealing; holds `limit`.
    grow: Mutex<usize>,
}

// SAFETY: the pointer is only dereferenced for reads of `[0, mapped)`, which never changes once
// published; growth is serialised by the mutex.
unsafe impl Send for PrefixMap {}
// SAFETY: as for `Send`: shared access only reads published, immutable bytes.
unsafe impl Sync for PrefixMap {}

impl PrefixMap {
    /// Reserves the address range, or `None` if the system refuses (reads then use `pread`).
    fn reserve() -> Option<PrefixMap> {
        // SAFETY: a fresh anonymous mapping at an address the kernel chooses touches no existing
        // memory. `PROT_NONE` with `MAP_NORESERVE` commits no memory.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PREFIX_RESERVE,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return None;
        }
        Some(PrefixMap {
            base: base.cast(),
            mapped: AtomicUsize::new(0),
            grow: Mutex::new(PREFIX_RESERVE),
        })
    }

    /// The bytes `[offset, offset + len)` if they are mapped.
    fn get(&self, offset: u64, len: usize) -> Option<&[u8]> {
        let mapped = self.mapped.load(Ordering::Acquire);
        let start = usize::try_from(offset).ok()?;
        let end = start.checked_add(len).filter(|&end| end <= mapped)?;
        // SAFETY: `[start, end)` lies inside `[0, mapped)`, which maps bytes of the file that exist and
        // are never rewritten or truncated while the file is open (see the type's invariants), and
        // stays mapped until `self` is dropped, which the borrow prevents.
        Some(unsafe { std::slice::from_raw_parts(self.base.add(start), end - start) })
    }

    /// Maps whole steps of the file up to `written`, the length the engine declared written, if that
    /// is at least a step past what is mapped. A failure leaves the map as it was (reads use `pread`).
    fn grow_to(&self, file: &File, written: usize) {
        let target = written / PREFIX_STEP * PREFIX_STEP;
        if target < self.mapped.load(Ordering::Relaxed) + PREFIX_STEP {
            return;
        }
        let mut limit = self.grow.lock();
        let mapped = self.mapped.load(Ordering::Relaxed);
        let target = target.min(*limit);
        if target <= mapped {
            return;
        }
        let Ok(offset) = libc::off_t::try_from(mapped) else {
            return;
        };
        // SAFETY: `[mapped, target)` is inside our own reservation (`target <= limit`), so
        // `MAP_FIXED` replaces nothing but it. The file's bytes `[mapped, target)` were declared
        // written, so every page lies inside the file. `PROT_READ`: nothing is written through it.
        let at = unsafe {
            libc::mmap(
                self.base.add(mapped).cast(),
                target - mapped,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_FIXED,
                file.as_raw_fd(),
                offset,
            )
        };
        if at == libc::MAP_FAILED {
            // A failed `MAP_FIXED` may have unmapped part of the range, which someone else may now
            // be given: never map or unmap past `mapped` again.
            *limit = mapped;
            return;
        }
        self.mapped.store(target, Ordering::Release);
    }

    /// The file is sealed at `len` bytes: give back the reservation past its last page. Readers never
    /// look past `mapped`, which is at most `len`.
    fn seal(&self, len: usize) {
        let mut limit = self.grow.lock();
        let keep = len
            .checked_next_multiple_of(PREFIX_STEP)
            .unwrap_or(usize::MAX)
            .max(self.mapped.load(Ordering::Relaxed));
        if keep >= *limit {
            return;
        }
        // SAFETY: `[keep, limit)` is our own reservation, past every mapped byte; no reader looks
        // there, and `limit` drops so that nothing maps or unmaps it again.
        if unsafe { libc::munmap(self.base.add(keep).cast(), *limit - keep) } == 0 {
            *limit = keep;
        }
    }
}

impl Drop for PrefixMap {
    fn drop(&mut self) {
        let limit = *self.grow.get_mut();
        if limit > 0 {
            // SAFETY: `[0, limit)` is ours (mapped file pages and reservation), and `&mut self` means
            // no reader holds a slice of it.
            unsafe { libc::munmap(self.base.cast(), limit) };
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the system's temporary directory, removed on drop.
    struct TempDir(std::path::PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("idemlog-fs-{name}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    fn create(path: &Path) -> FsFile {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .unwrap();
        FsFile::new(file)
    }

    fn mapped(file: &FsFile) -> usize {
        match file.prefix.get() {
            Some(Some(prefix)) => prefix.mapped.load(Ordering::Acquire),
            _ => 0,
        }
    }

    #[test]
    fn the_prefix_map_serves_only_declared_written_steps_and_grows_with_them() {
        let dir = TempDir::new("prefix");
        let file = create(&dir.0.join("a.seg"));
        let data = pattern(5 * PREFIX_STEP);
        let first = 2 * PREFIX_STEP + 100;
        file.write_at(0, &data[..first]).unwrap();

        file.written_prefix(PREFIX_STEP as u64 - 1);
        assert_eq!(mapped(&file), 0, "less than a step written: nothing mapped");
        file.written_prefix(first as u64);
        assert_eq!(mapped(&file), 2 * PREFIX_STEP, "whole steps only");

        let reads = [
            (0, 32),
            (PREFIX_STEP - 10, 20),
            (2 * PREFIX_STEP - 300, 300),
            // Across the end of the map and past it: `pread`.
            (2 * PREFIX_STEP - 10, 60),
            (2 * PREFIX_STEP, 100),
        ];
        for (offset, len) in reads {
            let got = file.read_at(offset as u64, len).unwrap();
            assert_eq!(&got[..], &data[offset..offset + len], "read at {offset}");
        }
        assert!(file.read_at(first as u64, 1).is_err(), "past the end");

        file.write_at(first as u64, &data[first..]).unwrap();
        file.written_prefix(data.len() as u64);
        assert_eq!(mapped(&file), 5 * PREFIX_STEP);
        let got = file.read_at(3 * PREFIX_STEP as u64 - 5, 10).unwrap();
        assert_eq!(&got[..], &data[3 * PREFIX_STEP - 5..3 * PREFIX_STEP + 5]);

        file.seal().unwrap();
        file.written_prefix(data.len() as u64);
        let got = file.read_at(123, 4000).unwrap();
        assert_eq!(&got[..], &data[123..4123]);
    }

    #[test]
    fn mapped_reads_borrow_exactly_the_bytes_a_read_copies_and_only_from_a_map() {
        let dir = TempDir::new("mapped");
        let file = create(&dir.0.join("c.seg"));
        let data = pattern(3 * PREFIX_STEP);
        let written = 2 * PREFIX_STEP + 100;
        file.write_at(0, &data[..written]).unwrap();
        assert_eq!(file.read_mapped(0, 32), None, "nothing mapped yet");
        file.written_prefix(written as u64);
        for (offset, len) in [
            (0, 32),
            (PREFIX_STEP - 10, 20),
            (2 * PREFIX_STEP - 300, 300),
        ] {
            let read = file.read_at(offset as u64, len).unwrap();
            assert_eq!(file.read_mapped(offset as u64, len), Some(&read[..]));
        }
        // Past the mapped steps (pread territory), and past the end: never from the map.
        assert_eq!(file.read_mapped(2 * PREFIX_STEP as u64 - 10, 60), None);
        assert_eq!(file.read_mapped(written as u64, 1), None);
        assert_eq!(file.read_mapped(u64::MAX, 1), None);

        file.write_at(written as u64, &data[written..]).unwrap();
        file.seal().unwrap();
        let read = file.read_at(2 * PREFIX_STEP as u64 + 50, 500).unwrap();
        assert_eq!(
            file.read_mapped(2 * PREFIX_STEP as u64 + 50, 500),
            Some(&read[..]),
            "a sealed file is read through its whole map"
        );
        assert_eq!(file.read_mapped(data.len() as u64 - 1, 2), None);
    }

    #[test]
    fn a_sealed_file_gets_no_prefix_map() {
        let dir = TempDir::new("sealed");
        let file = create(&dir.0.join("b.seg"));
        let data = pattern(3 * PREFIX_STEP);
        file.write_at(0, &data).unwrap();
        file.seal().unwrap();
        file.written_prefix(data.len() as u64);
        assert_eq!(mapped(&file), 0);
        let got = file.read_at(PREFIX_STEP as u64, 64).unwrap();
        assert_eq!(&got[..], &data[PREFIX_STEP..PREFIX_STEP + 64]);
    }
}
