//! An in-memory file system that remembers what is durable, for crash and fault tests.
//!
//! Each file keeps its current bytes, its durable bytes (as of its last successful fdatasync) and the
//! list of writes since. Each directory entry is durable only once its directory was synced. A
//! simulated crash ([`FaultyStorage::crash`]) rebuilds the file system from that durable state, with
//! the unsynced writes dropped, kept, or torn, and invalidates every handle of the crashed "process" so
//! that nothing it does afterwards (such as flushing in a destructor) can reach the new state.
//!
//! Faults are counted, not timed: fail the n-th fdatasync, the n-th write, or every mutation after the
//! n-th (a crash point), so tests are deterministic.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use super::{LockGuard, Storage, StorageFile};

/// How a simulated crash treats data written but not yet fdatasync'ed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashMode {
    /// The process died but the machine did not: every write and directory change survives.
    ProcessOnly,
    /// Power loss: only synced data and synced directory entries survive.
    DropUnsynced,
    /// Power loss mid-flush: per file, a seeded-random prefix of the unsynced writes survives and the
    /// first write after that prefix is cut at a random length. Directory entries as for power loss.
    TornTail {
        /// Seed for the choice of prefix and cut.
        seed: u64,
    },
}

/// The in-memory, fault-injecting [`Storage`]. Clones share one file system.
#[derive(Clone, Default)]
pub struct FaultyStorage {
    state: Arc<Mutex<FsState>>,
}

#[derive(Default, Clone)]
struct FsState {
    generation: u64,
    next_inode: u64,
    inodes: BTreeMap<u64, Inode>,
    names: BTreeMap<PathBuf, u64>,
    durable_names: BTreeMap<PathBuf, u64>,
    dirs: BTreeSet<PathBuf>,
    locks: BTreeSet<PathBuf>,
    mutations: u64,
    syncs: u64,
    writes: u64,
    fail_sync_at: Option<u64>,
    fail_write_at: Option<u64>,
    crash_after: Option<u64>,
}

#[derive(Default, Clone)]
struct Inode {
    data: Vec<u8>,
    durable: Vec<u8>,
    unsynced: Vec<Change>,
}

#[derive(Clone)]
enum Change {
    Write { offset: u64, bytes: Vec<u8> },
    SetLen(u64),
}

impl Change {
    fn apply(&self, data: &mut Vec<u8>) {
        match self {
            Change::Write { offset, bytes } => write_into(data, *offset, bytes),
            Change::SetLen(len) => data.resize(usize::try_from(*len).unwrap_or(usize::MAX), 0),
        }
    }
}

fn write_into(data: &mut Vec<u8>, offset: u64, bytes: &[u8]) {
    let start = usize::try_from(offset).expect("test file offsets fit in memory");
    let end = start + bytes.len();
    if data.len() < end {
        data.resize(end, 0);
    }
    data[start..end].copy_from_slice(bytes);
}

fn injected(what: &str) -> io::Error {
    io::Error::other(format!("injected fault: {what}"))
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{} not found", path.display()),
    )
}

impl FsState {
    /// Counts a mutating call and fails it once the crash point has passed.
    fn mutate(&mut self, generation: u64) -> io::Result<()> {
        if generation != self.generation {
            return Err(injected("handle from before a simulated crash"));
        }
        if self.crash_after.is_some_and(|n| self.mutations >= n) {
            return Err(injected("simulated crash point reached"));
        }
        self.mutations += 1;
        Ok(())
    }

    fn check_generation(&self, generation: u64) -> io::Result<()> {
        if generation != self.generation {
            return Err(injected("handle from before a simulated crash"));
        }
        Ok(())
    }
}

impl FaultyStorage {
    /// An empty file system.
    pub fn new() -> Self {
        Self::default()
    }

    /// An independent copy of this file system in its current state (handles of the copy are fresh;
    /// nothing done to one is seen by the other). Used to try many crash points from one state.
    pub fn fork(&self) -> FaultyStorage {
        let mut state = self.state.lock().clone();
        state.locks.clear();
        FaultyStorage {
            state: Arc::new(Mutex::new(state)),
        }
    }

    /// Fails the `n`-th fdatasync from now (1 = the next one), once.
    pub fn fail_sync_after(&self, n: u64) {
        let mut s = self.state.lock();
        s.fail_sync_at = Some(s.syncs + n);
    }

    /// Fails the `n`-th write from now (1 = the next one), once, as a full disk would.
    pub fn fail_write_after(&self, n: u64) {
        let mut s = self.state.lock();
        s.fail_write_at = Some(s.writes + n);
    }

    /// Lets `n` more mutating calls (write, fdatasync, truncate, create, rename, remove, directory sync)
    /// succeed and fails every one after, as if the process died at that point.
    pub fn crash_after(&self, n: u64) {
        let mut s = self.state.lock();
        s.crash_after = Some(s.mutations + n);
    }

    /// Successful and failed fdatasync calls so far.
    pub fn syncs(&self) -> u64 {
        self.state.lock().syncs
    }

    /// Mutating calls so far; used to enumerate crash points.
    pub fn mutations(&self) -> u64 {
        self.state.lock().mutations
    }

    /// Simulates a crash: every open handle and lock of the old "process" becomes dead, and the file
    /// system is rebuilt from what `mode` says survives. Pending faults are cleared.
    pub fn crash(&self, mode: CrashMode) {
        let mut s = self.state.lock();
        s.generation += 1;
        s.locks.clear();
        s.fail_sync_at = None;
        s.fail_write_at = None;
        s.crash_after = None;
        let mut rng = match mode {
            CrashMode::TornTail { seed } => SplitMix(seed),
            _ => SplitMix(0),
        };
        if mode != CrashMode::ProcessOnly {
            s.names = s.durable_names.clone();
        }
        let live: BTreeSet<u64> = s.names.values().copied().collect();
        s.inodes.retain(|id, _| live.contains(id));
        for inode in s.inodes.values_mut() {
            let mut data = inode.durable.clone();
            match mode {
                CrashMode::ProcessOnly => data = inode.data.clone(),
                CrashMode::DropUnsynced => {}
                CrashMode::TornTail { .. } => {
                    let n = inode.unsynced.len() as u64;
                    let keep = rng.below(n + 1) as usize;
                    for change in &inode.unsynced[..keep] {
                        change.apply(&mut data);
                    }
                    if let Some(Change::Write { offset, bytes }) = inode.unsynced.get(keep) {
                        let cut = rng.below(bytes.len() as u64) as usize;
                        write_into(&mut data, *offset, &bytes[..cut]);
                    }
                }
            }
            inode.data = data.clone();
            inode.durable = data;
            inode.unsynced.clear();
        }
        s.durable_names = s.names.clone();
    }

    /// Every file with its current length and whether its directory entry is durable (for debugging).
    pub fn describe(&self) -> Vec<(PathBuf, usize, bool)> {
        let s = self.state.lock();
        s.names
            .iter()
            .map(|(p, id)| {
                (
                    p.clone(),
                    s.inodes[id].data.len(),
                    s.durable_names.get(p) == Some(id),
                )
            })
            .collect()
    }

    /// The current bytes of a file, for tests that damage or inspect the log directly.
    pub fn read_file(&self, path: &Path) -> Option<Vec<u8>> {
        let s = self.state.lock();
        let id = s.names.get(path)?;
        Some(s.inodes[id].data.clone())
    }

    /// Replaces a file's bytes, durably, for tests that damage the log directly.
    pub fn write_file(&self, path: &Path, bytes: &[u8]) {
        let mut s = self.state.lock();
        let id = match s.names.get(path) {
            Some(id) => *id,
            None => {
                let id = s.next_inode;
                s.next_inode += 1;
                s.names.insert(path.to_owned(), id);
                s.durable_names.insert(path.to_owned(), id);
                id
            }
        };
        let inode = s.inodes.entry(id).or_default();
        inode.data = bytes.to_vec();
        inode.durable = bytes.to_vec();
        inode.unsynced.clear();
    }

    fn handle(&self, id: u64, generation: u64) -> Arc<dyn StorageFile> {
        Arc::new(FaultyFile {
            state: Arc::clone(&self.state),
            id,
            generation,
        })
    }
}

impl Storage for FaultyStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut s = self.state.lock();
        for ancestor in dir.ancestors() {
            s.dirs.insert(ancestor.to_owned());
        }
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let s = self.state.lock();
        if !s.dirs.contains(dir) {
            return Err(not_found(dir));
        }
        Ok(s.names
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
            .collect())
    }

    fn open(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        let s = self.state.lock();
        let id = *s.names.get(path).ok_or_else(|| not_found(path))?;
        Ok(self.handle(id, s.generation))
    }

    fn create_new(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        let mut s = self.state.lock();
        let generation = s.generation;
        s.mutate(generation)?;
        if s.names.contains_key(path) {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, "file exists"));
        }
        let parent = path.parent().unwrap_or(Path::new(""));
        if !s.dirs.contains(parent) {
            return Err(not_found(parent));
        }
        let id = s.next_inode;
        s.next_inode += 1;
        s.inodes.insert(id, Inode::default());
        s.names.insert(path.to_owned(), id);
        Ok(self.handle(id, generation))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut s = self.state.lock();
        let generation = s.generation;
        s.mutate(generation)?;
        s.names
            .remove(path)
            .map(|_| ())
            .ok_or_else(|| not_found(path))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut s = self.state.lock();
        let generation = s.generation;
        s.mutate(generation)?;
        let id = s.names.remove(from).ok_or_else(|| not_found(from))?;
        s.names.insert(to.to_owned(), id);
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut s = self.state.lock();
        let generation = s.generation;
        s.mutate(generation)?;
        let in_dir = |p: &PathBuf| p.parent() == Some(dir);
        let current: Vec<(PathBuf, u64)> = s
            .names
            .iter()
            .filter(|(p, _)| in_dir(p))
            .map(|(p, id)| (p.clone(), *id))
            .collect();
        s.durable_names.retain(|p, _| !in_dir(p));
        s.durable_names.extend(current);
        Ok(())
    }

    fn try_lock(&self, path: &Path) -> io::Result<Option<Box<dyn LockGuard>>> {
        let mut s = self.state.lock();
        if !s.locks.insert(path.to_owned()) {
            return Ok(None);
        }
        Ok(Some(Box::new(FaultyLock {
            state: Arc::clone(&self.state),
            path: path.to_owned(),
            generation: s.generation,
        })))
    }
}

struct FaultyLock {
    state: Arc<Mutex<FsState>>,
    path: PathBuf,
    generation: u64,
}

impl LockGuard for FaultyLock {}

impl Drop for FaultyLock {
    fn drop(&mut self) {
        let mut s = self.state.lock();
        if s.generation == self.generation {
            s.locks.remove(&self.path);
        }
    }
}

struct FaultyFile {
    state: Arc<Mutex<FsState>>,
    id: u64,
    generation: u64,
}

impl FaultyFile {
    fn inode<'a>(&self, s: &'a mut FsState) -> io::Result<&'a mut Inode> {
        s.inodes
            .get_mut(&self.id)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "file was removed"))
    }
}

impl StorageFile for FaultyFile {
    fn size(&self) -> io::Result<u64> {
        let mut s = self.state.lock();
        s.check_generation(self.generation)?;
        Ok(self.inode(&mut s)?.data.len() as u64)
    }

    fn read_at(&self, offset: u64, len: usize) -> io::Result<Bytes> {
        let mut s = self.state.lock();
        s.check_generation(self.generation)?;
        let data = &self.inode(&mut s)?.data;
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        match start.checked_add(len) {
            Some(end) if end <= data.len() => Ok(Bytes::copy_from_slice(&data[start..end])),
            _ => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "short read")),
        }
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut s = self.state.lock();
        s.mutate(self.generation)?;
        s.writes += 1;
        if s.fail_write_at == Some(s.writes) {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "injected fault: disk full",
            ));
        }
        let inode = self.inode(&mut s)?;
        write_into(&mut inode.data, offset, data);
        inode.unsynced.push(Change::Write {
            offset,
            bytes: data.to_vec(),
        });
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut s = self.state.lock();
        s.mutate(self.generation)?;
        s.syncs += 1;
        if s.fail_sync_at == Some(s.syncs) {
            return Err(injected("fdatasync failed"));
        }
        let inode = self.inode(&mut s)?;
        inode.durable = inode.data.clone();
        inode.unsynced.clear();
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut s = self.state.lock();
        s.mutate(self.generation)?;
        let inode = self.inode(&mut s)?;
        let change = Change::SetLen(len);
        change.apply(&mut inode.data);
        inode.unsynced.push(change);
        Ok(())
    }
}

/// A small deterministic generator (SplitMix64), enough to pick torn lengths.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> PathBuf {
        PathBuf::from("/db")
    }

    #[test]
    fn unsynced_writes_are_dropped_on_power_loss() {
        let fs = FaultyStorage::new();
        fs.create_dir_all(&dir()).unwrap();
        let f = fs.create_new(&dir().join("a")).unwrap();
        fs.sync_dir(&dir()).unwrap();
        f.write_at(0, b"durable").unwrap();
        f.sync_data().unwrap();
        f.write_at(7, b" lost").unwrap();
        fs.crash(CrashMode::DropUnsynced);
        assert_eq!(fs.read_file(&dir().join("a")).unwrap(), b"durable");
        assert!(f.write_at(0, b"zombie").is_err(), "old handles are dead");
    }

    #[test]
    fn a_file_never_made_durable_in_its_directory_vanishes() {
        let fs = FaultyStorage::new();
        fs.create_dir_all(&dir()).unwrap();
        let f = fs.create_new(&dir().join("a")).unwrap();
        f.write_at(0, b"x").unwrap();
        f.sync_data().unwrap();
        fs.crash(CrashMode::DropUnsynced);
        assert!(fs.read_file(&dir().join("a")).is_none());
    }

    #[test]
    fn process_crash_keeps_everything_written() {
        let fs = FaultyStorage::new();
        fs.create_dir_all(&dir()).unwrap();
        let f = fs.create_new(&dir().join("a")).unwrap();
        f.write_at(0, b"kept").unwrap();
        fs.crash(CrashMode::ProcessOnly);
        assert_eq!(fs.read_file(&dir().join("a")).unwrap(), b"kept");
    }

    #[test]
    fn failed_sync_makes_nothing_durable() {
        let fs = FaultyStorage::new();
        fs.create_dir_all(&dir()).unwrap();
        let f = fs.create_new(&dir().join("a")).unwrap();
        fs.sync_dir(&dir()).unwrap();
        f.write_at(0, b"x").unwrap();
        fs.fail_sync_after(1);
        assert!(f.sync_data().is_err());
        fs.crash(CrashMode::DropUnsynced);
        assert_eq!(fs.read_file(&dir().join("a")).unwrap(), b"");
    }

    #[test]
    fn crash_point_fails_every_later_mutation() {
        let fs = FaultyStorage::new();
        fs.create_dir_all(&dir()).unwrap();
        fs.crash_after(1);
        let f = fs.create_new(&dir().join("a")).unwrap();
        assert!(f.write_at(0, b"x").is_err());
    }
}
