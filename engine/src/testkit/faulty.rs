//! An in-memory file system that remembers what is durable, for crash and fault tests.
//!
//! Each file keeps its current bytes, its durable bytes (as of its last successful fdatasync) and the
//! list of writes since. Each directory entry (of a file or of a subdirectory) is durable only once its
//! parent directory was synced. A simulated crash ([`FaultyStorage::crash`]) invalidates every handle
//! of the crashed "process", so that nothing it does afterwards (such as flushing in a destructor) can
//! reach the new state, and then:
//!
//! - a process crash ([`CrashMode::ProcessOnly`]) keeps the page cache: every write and directory
//!   change stays visible, *but nothing becomes durable*: what was unsynced stays unsynced, so a later
//!   power loss can still drop it unless something fdatasyncs it (or syncs its directory) in between;
//! - a power loss rebuilds the file system from the durable state, with the unsynced writes dropped or
//!   torn, and directories (with everything in them) whose entry was never synced gone.
//!
//! Faults are counted, not timed: fail the n-th fdatasync, the n-th write, the n-th call of any kind
//! on a chosen file ([`FaultyStorage::fail_op`]), or every mutation after the n-th (a crash point), so
//! tests are deterministic. [`FaultyStorage::on_next`] runs a test's code just before a chosen call,
//! which makes races (an append during a rotation) reproducible.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use crate::storage::{LockGuard, Storage, StorageFile};

/// How a simulated crash treats data written but not yet fdatasync'ed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashMode {
    /// The process died but the machine did not: every write and directory change stays visible, and
    /// stays exactly as (un)durable as it was, so a later power loss can still drop it.
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

/// A kind of storage call, for [`FaultyStorage::fail_op`] and [`FaultyStorage::on_next`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultOp {
    /// `create_new` of a file.
    Create,
    /// `write_at`.
    Write,
    /// `sync_data` (fdatasync) of a file.
    Sync,
    /// `sync_dir` of a directory.
    SyncDir,
    /// `rename`; matched against the source path.
    Rename,
    /// `remove`.
    Remove,
    /// `set_len`.
    SetLen,
}

/// The in-memory, fault-injecting [`Storage`]. Clones share one file system.
#[derive(Clone, Default)]
pub struct FaultyStorage {
    state: Arc<Mutex<FsState>>,
    hooks: Arc<Mutex<Vec<Hook>>>,
}

/// Code to run just before the next matching call.
struct Hook {
    op: FaultOp,
    suffix: String,
    run: Box<dyn FnOnce() + Send>,
}

/// A one-shot injected failure of the `left`-th matching call.
#[derive(Clone)]
struct Fault {
    op: FaultOp,
    suffix: String,
    left: u64,
    kind: io::ErrorKind,
}

#[derive(Default, Clone)]
struct FsState {
    generation: u64,
    next_inode: u64,
    inodes: BTreeMap<u64, Inode>,
    names: BTreeMap<PathBuf, u64>,
    durable_names: BTreeMap<PathBuf, u64>,
    dirs: BTreeSet<PathBuf>,
    /// Directories whose own entry (in their parent) is durable; roots always are.
    durable_dirs: BTreeSet<PathBuf>,
    locks: BTreeSet<PathBuf>,
    faults: Vec<Fault>,
    mutations: u64,
    syncs: u64,
    writes: u64,
    fail_sync_at: Option<u64>,
    fail_write_at: Option<u64>,
    crash_after: Option<u64>,
    /// Size of the disk: writes that would grow the files past it fail (see `set_capacity`).
    capacity: Option<u64>,
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
    /// Bytes of every file that has a name, as `set_capacity` counts them (a removed file's
    /// space counts as freed at once, open handles or not).
    fn used_bytes(&self) -> u64 {
        let named: BTreeSet<u64> = self.names.values().copied().collect();
        named
            .iter()
            .filter_map(|id| self.inodes.get(id))
            .map(|i| i.data.len() as u64)
            .sum()
    }

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

    /// Fails the call if an injected fault for `op` on `path` is due.
    fn fault(&mut self, op: FaultOp, path: &Path) -> io::Result<()> {
        let name = path.to_string_lossy();
        let Some(i) = self
            .faults
            .iter()
            .position(|f| f.op == op && name.ends_with(f.suffix.as_str()))
        else {
            return Ok(());
        };
        self.faults[i].left -= 1;
        if self.faults[i].left > 0 {
            return Ok(());
        }
        let fault = self.faults.remove(i);
        Err(io::Error::new(
            fault.kind,
            format!("injected fault: {op:?} of {name}"),
        ))
    }

    /// A current name of inode `id` (for matching faults against file handles).
    fn name_of(&self, id: u64) -> PathBuf {
        self.names
            .iter()
            .find(|(_, i)| **i == id)
            .map(|(p, _)| p.clone())
            .unwrap_or_default()
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
            hooks: Arc::default(),
        }
    }

    /// Fails, once, the `nth` call (1 = the next one) of kind `op` on a path ending with `suffix`
    /// (`""` matches every path), with an error of kind `kind`. Nothing of the failed call happens.
    pub fn fail_op(&self, op: FaultOp, suffix: &str, nth: u64, kind: io::ErrorKind) {
        self.state.lock().faults.push(Fault {
            op,
            suffix: suffix.to_owned(),
            left: nth.max(1),
            kind,
        });
    }

    /// Runs `hook` once, just before the next call of kind `op` on a path ending with `suffix`, on the
    /// thread making that call and with no lock of this file system held.
    pub fn on_next(&self, op: FaultOp, suffix: &str, hook: impl FnOnce() + Send + 'static) {
        self.hooks.lock().push(Hook {
            op,
            suffix: suffix.to_owned(),
            run: Box::new(hook),
        });
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

    /// Makes the disk `bytes` big (`None`: unbounded, the default): a write that would grow the
    /// files' total size past it fails with `StorageFull` and writes nothing, as on a full disk,
    /// until space is freed or the capacity is raised.
    pub fn set_capacity(&self, bytes: Option<u64>) {
        self.state.lock().capacity = bytes;
    }

    /// Bytes the files take now (every file's current length, synced or not).
    pub fn used_bytes(&self) -> u64 {
        self.state.lock().used_bytes()
    }

    /// Lets `n` more mutating calls (write, fdatasync, truncate, create, rename, remove, directory sync)
    /// succeed and fails every one after, as if the process died at that point.
    pub fn crash_after(&self, n: u64) {
        let mut s = self.state.lock();
        s.crash_after = Some(s.mutations + n);
    }

    /// Forgets every hook that has not run yet.
    pub fn clear_hooks(&self) {
        self.hooks.lock().clear();
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
        self.hooks.lock().clear();
        let mut s = self.state.lock();
        s.generation += 1;
        s.locks.clear();
        s.fail_sync_at = None;
        s.fail_write_at = None;
        s.crash_after = None;
        s.faults.clear();
        if mode == CrashMode::ProcessOnly {
            // The page cache survives: nothing visible changes and nothing becomes durable. Inodes
            // only a durable name still points at (removed, removal not yet synced) are kept, since a
            // later power loss brings them back.
            let named: BTreeSet<u64> = s
                .names
                .values()
                .chain(s.durable_names.values())
                .copied()
                .collect();
            s.inodes.retain(|id, _| named.contains(id));
            return;
        }
        let mut rng = match mode {
            CrashMode::TornTail { seed } => SplitMix(seed),
            _ => SplitMix(0),
        };
        // A directory survives only if its entry, and those of all its ancestors, were synced.
        let durable_dirs = s.durable_dirs.clone();
        s.dirs = durable_dirs
            .iter()
            .filter(|d| d.ancestors().all(|a| durable_dirs.contains(a)))
            .cloned()
            .collect();
        s.durable_dirs = s.dirs.clone();
        let dirs = s.dirs.clone();
        s.names = s
            .durable_names
            .iter()
            .filter(|(p, _)| p.parent().is_some_and(|d| dirs.contains(d)))
            .map(|(p, id)| (p.clone(), *id))
            .collect();
        let live: BTreeSet<u64> = s.names.values().copied().collect();
        s.inodes.retain(|id, _| live.contains(id));
        for inode in s.inodes.values_mut() {
            let mut data = inode.durable.clone();
            match mode {
                CrashMode::ProcessOnly | CrashMode::DropUnsynced => {}
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

    /// Replaces a file's bytes, durably (its directories included), for tests that damage the log
    /// directly.
    pub fn write_file(&self, path: &Path, bytes: &[u8]) {
        let mut s = self.state.lock();
        for dir in path.ancestors().skip(1) {
            s.dirs.insert(dir.to_owned());
            s.durable_dirs.insert(dir.to_owned());
        }
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
            hooks: Arc::clone(&self.hooks),
            id,
            generation,
        })
    }

    fn run_hook(&self, op: FaultOp, path: &Path) {
        run_hook(&self.hooks, op, path);
    }
}

/// Runs (and forgets) the first hook waiting for `op` on `path`, with no lock held.
fn run_hook(hooks: &Mutex<Vec<Hook>>, op: FaultOp, path: &Path) {
    let hook = {
        let mut hooks = hooks.lock();
        if hooks.is_empty() {
            return;
        }
        let name = path.to_string_lossy();
        let found = hooks
            .iter()
            .position(|h| h.op == op && name.ends_with(h.suffix.as_str()));
        found.map(|i| hooks.remove(i))
    };
    if let Some(hook) = hook {
        (hook.run)();
    }
}

impl Storage for FaultyStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut s = self.state.lock();
        for ancestor in dir.ancestors() {
            s.dirs.insert(ancestor.to_owned());
            if ancestor.parent().is_none() {
                // A root has no entry to lose.
                s.durable_dirs.insert(ancestor.to_owned());
            }
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
        self.run_hook(FaultOp::Create, path);
        let mut s = self.state.lock();
        let generation = s.generation;
        s.mutate(generation)?;
        s.fault(FaultOp::Create, path)?;
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
        self.run_hook(FaultOp::Remove, path);
        let mut s = self.state.lock();
        let generation = s.generation;
        s.mutate(generation)?;
        s.fault(FaultOp::Remove, path)?;
        s.names
            .remove(path)
            .map(|_| ())
            .ok_or_else(|| not_found(path))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.run_hook(FaultOp::Rename, from);
        let mut s = self.state.lock();
        let generation = s.generation;
        s.mutate(generation)?;
        s.fault(FaultOp::Rename, from)?;
        let id = s.names.remove(from).ok_or_else(|| not_found(from))?;
        s.names.insert(to.to_owned(), id);
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.run_hook(FaultOp::SyncDir, dir);
        let mut s = self.state.lock();
        let generation = s.generation;
        s.mutate(generation)?;
        s.fault(FaultOp::SyncDir, dir)?;
        if !s.dirs.contains(dir) {
            return Err(not_found(dir));
        }
        let in_dir = |p: &PathBuf| p.parent() == Some(dir);
        let subdirs: Vec<PathBuf> = s.dirs.iter().filter(|p| in_dir(p)).cloned().collect();
        s.durable_dirs.extend(subdirs);
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
    hooks: Arc<Mutex<Vec<Hook>>>,
    id: u64,
    generation: u64,
}

impl FaultyFile {
    /// Runs a hook waiting for `op` on this file, if any.
    fn hook(&self, op: FaultOp) {
        if self.hooks.lock().is_empty() {
            return;
        }
        let path = self.state.lock().name_of(self.id);
        run_hook(&self.hooks, op, &path);
    }

    /// Fails the call if an injected fault for `op` on this file is due.
    fn fault(&self, s: &mut FsState, op: FaultOp) -> io::Result<()> {
        if s.faults.is_empty() {
            return Ok(());
        }
        let path = s.name_of(self.id);
        s.fault(op, &path)
    }

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
        self.hook(FaultOp::Write);
        let mut s = self.state.lock();
        s.mutate(self.generation)?;
        s.writes += 1;
        if s.fail_write_at == Some(s.writes) {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "injected fault: disk full",
            ));
        }
        self.fault(&mut s, FaultOp::Write)?;
        if let Some(capacity) = s.capacity {
            let current = self.inode(&mut s)?.data.len() as u64;
            let growth = (offset + data.len() as u64).saturating_sub(current);
            if s.used_bytes() + growth > capacity {
                return Err(io::Error::new(
                    io::ErrorKind::StorageFull,
                    "injected fault: no space left on the disk",
                ));
            }
        }
        let inode = self.inode(&mut s)?;
        if offset > inode.data.len() as u64 {
            // The engine never writes past a file's end: the gap would be a hole, which a read
            // through a memory map must fill, and on a full tmpfs that fault is a SIGBUS.
            return Err(io::Error::other(format!(
                "write at {offset} would leave a hole after the file's end at {}",
                inode.data.len()
            )));
        }
        write_into(&mut inode.data, offset, data);
        inode.unsynced.push(Change::Write {
            offset,
            bytes: data.to_vec(),
        });
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        self.hook(FaultOp::Sync);
        let mut s = self.state.lock();
        s.mutate(self.generation)?;
        s.syncs += 1;
        if s.fail_sync_at == Some(s.syncs) {
            return Err(injected("fdatasync failed"));
        }
        self.fault(&mut s, FaultOp::Sync)?;
        let inode = self.inode(&mut s)?;
        inode.durable = inode.data.clone();
        inode.unsynced.clear();
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.hook(FaultOp::SetLen);
        let mut s = self.state.lock();
        s.mutate(self.generation)?;
        self.fault(&mut s, FaultOp::SetLen)?;
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

    /// Creates `/db` with a durable entry in `/`.
    fn make_dir(fs: &FaultyStorage) {
        fs.create_dir_all(&dir()).unwrap();
        fs.sync_dir(Path::new("/")).unwrap();
    }

    #[test]
    fn unsynced_writes_are_dropped_on_power_loss() {
        let fs = FaultyStorage::new();
        make_dir(&fs);
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
        make_dir(&fs);
        let f = fs.create_new(&dir().join("a")).unwrap();
        f.write_at(0, b"x").unwrap();
        f.sync_data().unwrap();
        fs.crash(CrashMode::DropUnsynced);
        assert!(fs.read_file(&dir().join("a")).is_none());
    }

    #[test]
    fn process_crash_keeps_everything_written() {
        let fs = FaultyStorage::new();
        make_dir(&fs);
        let f = fs.create_new(&dir().join("a")).unwrap();
        f.write_at(0, b"kept").unwrap();
        fs.crash(CrashMode::ProcessOnly);
        assert_eq!(fs.read_file(&dir().join("a")).unwrap(), b"kept");
    }

    #[test]
    fn unsynced_writes_survive_a_process_crash_only_until_a_power_loss() {
        let fs = FaultyStorage::new();
        make_dir(&fs);
        let f = fs.create_new(&dir().join("a")).unwrap();
        fs.sync_dir(&dir()).unwrap();
        f.write_at(0, b"synced").unwrap();
        f.sync_data().unwrap();
        f.write_at(6, b" cached").unwrap();
        fs.crash(CrashMode::ProcessOnly);
        assert_eq!(fs.read_file(&dir().join("a")).unwrap(), b"synced cached");
        fs.crash(CrashMode::DropUnsynced);
        assert_eq!(fs.read_file(&dir().join("a")).unwrap(), b"synced");
    }

    #[test]
    fn a_file_created_before_a_process_crash_vanishes_at_a_later_power_loss() {
        let fs = FaultyStorage::new();
        make_dir(&fs);
        fs.create_new(&dir().join("a"))
            .unwrap()
            .sync_data()
            .unwrap();
        fs.crash(CrashMode::ProcessOnly);
        assert!(fs.read_file(&dir().join("a")).is_some());
        fs.crash(CrashMode::DropUnsynced);
        assert!(fs.read_file(&dir().join("a")).is_none());
    }

    #[test]
    fn a_directory_whose_parent_was_never_synced_vanishes_at_power_loss() {
        let fs = FaultyStorage::new();
        let sub = dir().join("sub");
        fs.create_dir_all(&sub).unwrap();
        let f = fs.create_new(&sub.join("a")).unwrap();
        f.sync_data().unwrap();
        fs.sync_dir(&sub).unwrap();
        fs.crash(CrashMode::DropUnsynced);
        assert!(fs.read_file(&sub.join("a")).is_none());
        assert!(fs.list(&sub).is_err(), "the directory itself is gone");

        fs.create_dir_all(&sub).unwrap();
        fs.create_new(&sub.join("a")).unwrap().sync_data().unwrap();
        fs.sync_dir(&sub).unwrap();
        fs.sync_dir(&dir()).unwrap();
        fs.sync_dir(Path::new("/")).unwrap();
        fs.crash(CrashMode::DropUnsynced);
        assert!(fs.read_file(&sub.join("a")).is_some());
    }

    #[test]
    fn an_injected_fault_fails_only_the_chosen_call_on_the_chosen_file() {
        let fs = FaultyStorage::new();
        make_dir(&fs);
        let a = fs.create_new(&dir().join("a.tmp")).unwrap();
        let b = fs.create_new(&dir().join("b")).unwrap();
        fs.fail_op(FaultOp::Sync, ".tmp", 2, io::ErrorKind::StorageFull);
        b.sync_data().unwrap();
        a.sync_data().unwrap();
        let err = a.sync_data().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::StorageFull);
        a.sync_data().unwrap();
    }

    #[test]
    fn failed_sync_makes_nothing_durable() {
        let fs = FaultyStorage::new();
        make_dir(&fs);
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
        make_dir(&fs);
        fs.crash_after(1);
        let f = fs.create_new(&dir().join("a")).unwrap();
        assert!(f.write_at(0, b"x").is_err());
    }
}
