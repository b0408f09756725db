//! The in-memory index: (scope, key) → record state and the location of its latest operation.
//!
//! Memory per key is the point of this module. The index never holds a response body, only where the
//! record's latest operation is in the log, and it keeps only an 8-byte prefix of the fingerprint (the
//! full one is in the log and in the holder's [`crate::ClaimToken`]). Each shard is a
//! `hashbrown::HashTable` of (slot number, 32-bit hash) pairs — 8 bytes and a control byte per
//! bucket, and growing the table rehashes from the stored hash without touching the keys — over a slab
//! of 104-byte slots allocated in fixed chunks, so growth never doubles a large array and freed slots
//! are reused. A key of up to 62 bytes (scope and key together) lives inside its slot; a longer one
//! gets its own allocation. Per live key that is about 104 + 9 to 18 bytes (depending on the table's
//! load), the key included when it fits inline.
//!
//! Keys are hashed once per operation with std's randomly keyed SipHash (`RandomState`): clients choose
//! idempotency keys, and a seeded hash keeps them from forcing collisions (hash flooding). The seed
//! never reaches the disk; the on-disk identity of a record is its (scope, key) bytes.
//!
//! The state machine lives here, in [`apply_record`] and [`apply_side`]: recovery replays the log
//! through them, and the store applies every operation it appends through them too, so the state after
//! a restart is the state before it by construction.
//!
//! Lock order: a record shard, then side shards in ascending shard order ([`Sharded::lock_shards`]),
//! then the log writer.

use std::hash::{BuildHasher, RandomState};
use std::num::NonZeroU64;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hashbrown::HashTable;
use parking_lot::{Mutex, MutexGuard};

use crate::log::op::Op;
use crate::log::segment::Loc;

/// State of one idempotency record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    /// The first 4 bytes of the request fingerprint: a differing prefix is a mismatch without a read.
    pub(crate) fp_prefix: u32,
    pub(crate) fence: u64,
    pub(crate) expires_at: u64,
    /// `Some` while in progress, `None` once completed. The value is the lease's deadline on the
    /// store's *monotonic* clock ([`crate::Clock::monotonic_ms`], never the persisted wall-clock
    /// `lease_until`), or [`LEASE_RECOVERED`] for a claim replayed at open, whose holder died with the
    /// previous process.
    pub(crate) lease_until: Option<NonZeroU64>,
    /// The operation holding the current snapshot of this record.
    pub(crate) loc: Loc,
}

impl Entry {
    pub(crate) fn is_live(&self, now: u64) -> bool {
        self.expires_at > now
    }
}

/// The lease deadline of a claim recovered from the log: already over for every monotonic reading
/// the store uses (those are at least 1, see `Store::monotonic`), while live deadlines are at least 2.
pub(crate) const LEASE_RECOVERED: u64 = 1;

/// State of one side record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SideEntry {
    pub(crate) expires_at: u64,
    pub(crate) loc: Loc,
}

impl SideEntry {
    pub(crate) fn is_live(&self, now: u64) -> bool {
        self.expires_at > now
    }
}

/// What a value adds to its table's running counts ([`Counts`]).
pub(crate) trait Tally {
    /// 1 if the value is an in-progress claim.
    fn in_progress(&self) -> u64;
    /// Bytes of the log operation the value points at.
    fn bytes(&self) -> u64;
}

impl Tally for Entry {
    fn in_progress(&self) -> u64 {
        u64::from(self.lease_until.is_some())
    }

    fn bytes(&self) -> u64 {
        u64::from(self.loc.len)
    }
}

impl Tally for SideEntry {
    fn in_progress(&self) -> u64 {
        0
    }

    fn bytes(&self) -> u64 {
        u64::from(self.loc.len)
    }
}

#[cfg(test)]
impl Tally for u64 {
    fn in_progress(&self) -> u64 {
        0
    }

    fn bytes(&self) -> u64 {
        *self
    }
}

/// Running counts of one table, changed with every insert, replacement and removal, always under
/// the table's lock (so each table's counts are exact), and read without it.
///
/// With one writer at a time (the lock holder), an update is a plain load and store of each counter
/// rather than an atomic read-modify-write: a locked instruction would first wait for every store
/// before it to complete, such as the cache miss of the bucket an insert just wrote (about 5 % of an
/// open of a million keys).
#[derive(Debug, Default)]
pub(crate) struct Counts {
    entries: AtomicU64,
    in_progress: AtomicU64,
    bytes: AtomicU64,
}

/// A reading of [`Counts`], or their sum over shards.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CountsSnapshot {
    pub(crate) entries: u64,
    pub(crate) in_progress: u64,
    pub(crate) bytes: u64,
}

/// `counter += delta` (wrapping, as `fetch_add` would), for the single writer holding the lock.
fn bump(counter: &AtomicU64, delta: u64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(delta),
        Ordering::Relaxed,
    );
}

/// `counter -= delta`, as [`bump`].
fn drop_by(counter: &AtomicU64, delta: u64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_sub(delta),
        Ordering::Relaxed,
    );
}

impl Counts {
    // Every method below runs under the lock of the table that owns these counts (see the type).

    fn add(&self, v: &impl Tally) {
        bump(&self.entries, 1);
        bump(&self.in_progress, v.in_progress());
        bump(&self.bytes, v.bytes());
    }

    fn sub(&self, v: &impl Tally) {
        drop_by(&self.entries, 1);
        drop_by(&self.in_progress, v.in_progress());
        drop_by(&self.bytes, v.bytes());
    }

    /// A value changed in place from `old` to `new`.
    fn change(&self, old: (u64, u64), new: &impl Tally) {
        if old != (new.in_progress(), new.bytes()) {
            drop_by(&self.in_progress, old.0);
            bump(&self.in_progress, new.in_progress());
            drop_by(&self.bytes, old.1);
            bump(&self.bytes, new.bytes());
        }
    }

    fn read(&self) -> CountsSnapshot {
        CountsSnapshot {
            entries: self.entries.load(Ordering::Relaxed),
            in_progress: self.in_progress.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
        }
    }
}

impl std::ops::AddAssign for CountsSnapshot {
    fn add_assign(&mut self, other: Self) {
        self.entries += other.entries;
        self.in_progress += other.in_progress;
        self.bytes += other.bytes;
    }
}

/// The fingerprint prefix kept in memory.
pub(crate) fn fp_prefix(fingerprint: &[u8; 32]) -> u32 {
    u32::from_le_bytes([
        fingerprint[0],
        fingerprint[1],
        fingerprint[2],
        fingerprint[3],
    ])
}

const CHUNK: usize = 1024;

/// Keys up to this long live inside their slot: a lookup then touches one cache line less, and no
/// allocation (with its own overhead) is made per key. A scope and a UUID key take about 50 bytes.
const INLINE_KEY: usize = 62;

/// A stored key: inline when short, on the heap otherwise.
enum StoredKey {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Heap(Box<[u8]>),
}

impl StoredKey {
    fn new(key: &[u8]) -> Self {
        if key.len() <= INLINE_KEY {
            let mut bytes = [0u8; INLINE_KEY];
            bytes[..key.len()].copy_from_slice(key);
            StoredKey::Inline {
                len: key.len() as u8,
                bytes,
            }
        } else {
            StoredKey::Heap(key.into())
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            StoredKey::Inline { len, bytes } => &bytes[..usize::from(*len)],
            StoredKey::Heap(bytes) => bytes,
        }
    }
}

/// One key and its value; `None` marks a free slot (the key's enum tag makes that free of charge).
type Slot<V> = Option<(StoredKey, V)>;

/// A bucket: the slot holding the key, and the low 32 bits of the key's hash.
#[derive(Clone, Copy)]
struct Bucket {
    slot: u32,
    hash: u32,
}

/// The 64-bit hash hashbrown sees for a stored 32-bit hash: it takes the bucket from the low bits and
/// its 7-bit tag from the top ones, so both come from the 32 bits kept.
fn spread(hash: u32) -> u64 {
    (u64::from(hash) << 32) | u64::from(hash)
}

/// A hash table from byte keys to `V`, hashed by the caller.
pub(crate) struct Table<V> {
    table: HashTable<Bucket>,
    chunks: Vec<Vec<Slot<V>>>,
    free: Vec<u32>,
    /// Running counts of what the table holds; every mutation below keeps them exact. Shared with
    /// [`Sharded`], which reads them without taking the table's lock.
    counts: Arc<Counts>,
}

impl<V: Tally> Table<V> {
    fn new() -> Self {
        Self {
            table: HashTable::new(),
            chunks: Vec::new(),
            free: Vec::new(),
            counts: Arc::default(),
        }
    }

    fn slot(&self, index: u32) -> &Slot<V> {
        let i = index as usize;
        &self.chunks[i / CHUNK][i % CHUNK]
    }

    fn slot_mut(&mut self, index: u32) -> &mut Slot<V> {
        let i = index as usize;
        &mut self.chunks[i / CHUNK][i % CHUNK]
    }

    fn key_at(chunks: &[Vec<Slot<V>>], index: u32) -> &[u8] {
        let i = index as usize;
        match &chunks[i / CHUNK][i % CHUNK] {
            Some((key, _)) => key.as_bytes(),
            None => unreachable!("the table only holds occupied slots"),
        }
    }

    /// Entries held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    pub(crate) fn get(&self, hash: u64, key: &[u8]) -> Option<&V> {
        let h = hash as u32;
        let mut found = None;
        self.table.find(spread(h), |b| {
            if b.hash != h {
                return false;
            }
            let Some((stored, value)) = self.slot(b.slot) else {
                return false;
            };
            // A slot spans two or three cache lines, and in an index larger than the cache each
            // is a miss. Load the value's before comparing the key, so that the two misses
            // overlap instead of the value's waiting behind the key comparison.
            std::hint::black_box(value.bytes());
            let equal = stored.as_bytes() == key;
            if equal {
                found = Some(value);
            }
            equal
        });
        found
    }

    /// Inserts or replaces, with one probe of the table.
    pub(crate) fn insert(&mut self, hash: u64, key: &[u8], value: V) {
        let h = hash as u32;
        let chunks = &self.chunks;
        let entry = self.table.entry(
            spread(h),
            |b| b.hash == h && Self::key_at(chunks, b.slot) == key,
            |b| spread(b.hash),
        );
        let vacant = match entry {
            hashbrown::hash_table::Entry::Occupied(occupied) => {
                let slot = occupied.get().slot;
                if let Some((_, v)) = self.slot(slot) {
                    self.counts.change((v.in_progress(), v.bytes()), &value);
                }
                if let Some((_, v)) = self.slot_mut(slot) {
                    *v = value;
                }
                return;
            }
            hashbrown::hash_table::Entry::Vacant(vacant) => vacant,
        };
        let index = match self.free.pop() {
            Some(index) => index,
            None => {
                if self.chunks.last().is_none_or(|c| c.len() == CHUNK) {
                    self.chunks.push(Vec::with_capacity(CHUNK));
                }
                let last = self.chunks.len() - 1;
                let index = last * CHUNK + self.chunks[last].len();
                self.chunks[last].push(None);
                u32::try_from(index).expect("fewer than 4 billion keys per shard")
            }
        };
        vacant.insert(Bucket {
            slot: index,
            hash: h,
        });
        self.counts.add(&value);
        *self.slot_mut(index) = Some((StoredKey::new(key), value));
    }

    pub(crate) fn remove(&mut self, hash: u64, key: &[u8]) -> Option<V> {
        let chunks = &self.chunks;
        let h = hash as u32;
        let entry = self
            .table
            .find_entry(spread(h), |b| {
                b.hash == h && Self::key_at(chunks, b.slot) == key
            })
            .ok()?;
        let (Bucket { slot: index, .. }, _) = entry.remove();
        self.free.push(index);
        let removed = self.slot_mut(index).take().map(|(_, v)| v);
        if let Some(v) = &removed {
            self.counts.sub(v);
        }
        removed
    }

    /// Gives the memory back after a burst: an idle store should not keep its peak.
    fn shrink_if_empty(&mut self) {
        if self.table.is_empty() && !self.chunks.is_empty() {
            self.chunks = Vec::new();
            self.free = Vec::new();
            self.table.shrink_to_fit(|b| spread(b.hash));
        }
    }

    /// Removes the entries of chunk `chunk` for which `keep` returns false; `hash_of` gives a key's
    /// hash (the one it was inserted with). Returns how many were removed, or `None` past the last
    /// chunk. Scanning slots in memory order, a chunk per lock, is what lets a sweep be cheap (the
    /// buckets point into the slots at random) and release the lock between chunks.
    fn retain_chunk(
        &mut self,
        chunk: usize,
        hash_of: impl Fn(&[u8]) -> u64,
        mut keep: impl FnMut(&mut V) -> bool,
    ) -> Option<usize> {
        let slots = self.chunks.get_mut(chunk)?;
        let counts = &*self.counts;
        let mut removed = 0;
        for (j, slot) in slots.iter_mut().enumerate() {
            let Some((key, v)) = slot.as_mut() else {
                continue;
            };
            // `keep` may change the value (compaction moves its location): count the change.
            let before = (v.in_progress(), v.bytes());
            let kept = keep(v);
            counts.change(before, &*v);
            if kept {
                continue;
            }
            counts.sub(&*v);
            let index = (chunk * CHUNK + j) as u32;
            let h = hash_of(key.as_bytes()) as u32;
            match self.table.find_entry(spread(h), |b| b.slot == index) {
                Ok(bucket) => {
                    bucket.remove();
                }
                Err(_) => unreachable!("an occupied slot has its bucket"),
            }
            *slot = None;
            self.free.push(index);
            removed += 1;
        }
        Some(removed)
    }

    /// Every key and value.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], &V)> {
        self.chunks
            .iter()
            .flatten()
            .filter_map(|s| s.as_ref().map(|(k, v)| (k.as_bytes(), v)))
    }
}

/// A map split into independently locked shards, with one hash per key for both the shard and the
/// table inside it.
pub(crate) struct Sharded<V> {
    shards: Box<[Mutex<Table<V>>]>,
    /// Each shard's running counts (the same `Arc` its table updates).
    counts: Box<[Arc<Counts>]>,
    hasher: RandomState,
}

impl<V: Tally> Sharded<V> {
    /// `count` must be a power of two.
    pub(crate) fn new(count: usize) -> Self {
        assert!(count.is_power_of_two());
        let tables: Vec<Table<V>> = (0..count).map(|_| Table::new()).collect();
        Self {
            counts: tables.iter().map(|t| Arc::clone(&t.counts)).collect(),
            shards: tables.into_iter().map(Mutex::new).collect(),
            hasher: RandomState::new(),
        }
    }

    pub(crate) fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    pub(crate) fn shard(&self, hash: u64) -> &Mutex<Table<V>> {
        &self.shards[self.shard_index(hash)]
    }

    fn shard_index(&self, hash: u64) -> usize {
        // The table inside uses the low 32 bits; the shard comes from the high ones.
        (hash >> 32) as usize & (self.shards.len() - 1)
    }

    /// Locks the shards holding the keys of `hashes`, each once, in ascending shard order: every
    /// caller that holds more than one shard of a map at a time takes them this way, so no two can
    /// wait on each other. A write to several keys applies under all of their locks at once, so no
    /// reader sees it half applied.
    pub(crate) fn lock_shards(&self, hashes: &[u64]) -> LockedShards<'_, V> {
        // Writes name a few keys: their shard numbers are sorted on the stack, not in a `Vec`.
        let mut small = [0usize; 8];
        let mut large = Vec::new();
        let indices = if hashes.len() <= small.len() {
            &mut small[..hashes.len()]
        } else {
            large.resize(hashes.len(), 0);
            &mut large[..]
        };
        for (index, &hash) in indices.iter_mut().zip(hashes) {
            *index = self.shard_index(hash);
        }
        indices.sort_unstable();
        let mut guards: Vec<(usize, MutexGuard<'_, Table<V>>)> = Vec::with_capacity(indices.len());
        for &index in indices.iter() {
            if guards.last().is_none_or(|(last, _)| *last != index) {
                guards.push((index, self.shards[index].lock()));
            }
        }
        LockedShards {
            guards,
            sharded: self,
        }
    }

    pub(crate) fn shards(&self) -> &[Mutex<Table<V>>] {
        &self.shards
    }

    /// Removes the entries for which `keep` returns false, holding each shard's lock for one chunk of
    /// slots at a time, so that the callers waiting on that lock are held up for microseconds rather
    /// than for the whole shard. Entries inserted meanwhile may or may not be visited. Returns how
    /// many were removed.
    pub(crate) fn retain_chunked(&self, mut keep: impl FnMut(&mut V) -> bool) -> usize {
        let mut removed = 0;
        for shard in self.shards.iter() {
            for chunk in 0.. {
                let mut table = shard.lock();
                match table.retain_chunk(chunk, |key| self.hash(key), &mut keep) {
                    Some(n) => removed += n,
                    None => {
                        table.shrink_if_empty();
                        break;
                    }
                }
            }
        }
        removed
    }

    /// The running counts summed over the shards: O(shards), no lock taken. Each shard's counts are
    /// exact; with writes going on, the sum mixes readings microseconds apart.
    pub(crate) fn counts(&self) -> CountsSnapshot {
        let mut sum = CountsSnapshot::default();
        for counts in self.counts.iter() {
            sum += counts.read();
        }
        sum
    }

    /// The same figures counted by visiting every entry (tests compare it with [`Sharded::counts`]).
    #[cfg(any(test, feature = "testkit"))]
    pub(crate) fn walk_counts(&self) -> CountsSnapshot {
        let mut sum = CountsSnapshot::default();
        self.for_each_chunked(|v| {
            sum += CountsSnapshot {
                entries: 1,
                in_progress: v.in_progress(),
                bytes: v.bytes(),
            };
        });
        sum
    }

    /// Calls `f` on every value, holding each shard's lock for one chunk of slots at a time (see
    /// [`Sharded::retain_chunked`]).
    pub(crate) fn for_each_chunked(&self, mut f: impl FnMut(&V)) {
        for shard in self.shards.iter() {
            for chunk in 0.. {
                let table = shard.lock();
                let Some(slots) = table.chunks.get(chunk) else {
                    break;
                };
                slots.iter().flatten().for_each(|(_, v)| f(v));
            }
        }
    }
}

/// Shards of one [`Sharded`] map held together ([`Sharded::lock_shards`]); dropping it unlocks them.
pub(crate) struct LockedShards<'a, V> {
    /// One guard per distinct shard, sorted by shard index.
    guards: Vec<(usize, MutexGuard<'a, Table<V>>)>,
    sharded: &'a Sharded<V>,
}

impl<V: Tally> LockedShards<'_, V> {
    /// The locked table that holds the key of `hash`.
    ///
    /// # Panics
    /// If `hash` was not among those the shards were locked for: a caller's bug, never input's.
    pub(crate) fn table(&mut self, hash: u64) -> &mut Table<V> {
        let index = self.sharded.shard_index(hash);
        match self.guards.binary_search_by_key(&index, |(i, _)| *i) {
            Ok(at) => &mut self.guards[at].1,
            Err(_) => panic!("shard {index} was not locked for this hash"),
        }
    }
}

/// Longest record key: scope length byte, scope, key.
const RECORD_KEY_MAX: usize = 1 + crate::limits::MAX_SCOPE + crate::limits::MAX_KEY;
/// Longest side key: namespace length byte, namespace, key.
const SIDE_KEY_MAX: usize = 1 + crate::limits::MAX_NAMESPACE + crate::limits::MAX_SIDE_KEY;

/// Index keys up to this long (a scope and a UUID key take about 50 bytes) are built in a buffer of
/// this size, so that building one does not first zero a buffer sized for the longest key allowed
/// (511 bytes for a record, 1280 for a side record): that zeroing was 1.8 % of a replay.
const SHORT_KEY: usize = 64;

/// An index key built on the stack: `[prefix length u8][prefix][rest]`. Lookups need no allocation;
/// only an insert copies it to the heap.
// Variant sizes differ on purpose: the value lives on the stack for one call, and building the
// short variant writes only its own bytes.
#[allow(clippy::large_enum_variant)]
pub(crate) enum KeyBuf<const N: usize> {
    /// At most [`SHORT_KEY`] bytes.
    Short { buf: [u8; SHORT_KEY], len: usize },
    /// At most `N` bytes.
    Long { buf: [u8; N], len: usize },
}

impl<const N: usize> KeyBuf<N> {
    fn new(prefix: &[u8], rest: &[u8]) -> Self {
        let len = 1 + prefix.len() + rest.len();
        if len <= SHORT_KEY {
            let mut buf = [0u8; SHORT_KEY];
            Self::fill(&mut buf[..len], prefix, rest);
            KeyBuf::Short { buf, len }
        } else {
            assert!(len <= N, "limits bound the key");
            let mut buf = [0u8; N];
            Self::fill(&mut buf[..len], prefix, rest);
            KeyBuf::Long { buf, len }
        }
    }

    /// Writes `[prefix length][prefix][rest]` into `out`, which is exactly that long.
    fn fill(out: &mut [u8], prefix: &[u8], rest: &[u8]) {
        out[0] = u8::try_from(prefix.len()).expect("limits bound the prefix");
        out[1..1 + prefix.len()].copy_from_slice(prefix);
        out[1 + prefix.len()..].copy_from_slice(rest);
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self {
            KeyBuf::Short { buf, len } => &buf[..*len],
            KeyBuf::Long { buf, len } => &buf[..*len],
        }
    }
}

/// A record key: scope and key must have passed `limits`.
pub(crate) type RecordKey = KeyBuf<RECORD_KEY_MAX>;
/// A side key: namespace and key must have passed `limits`.
pub(crate) type SideKey = KeyBuf<SIDE_KEY_MAX>;

pub(crate) fn record_key(scope: &[u8], key: &[u8]) -> RecordKey {
    KeyBuf::new(scope, key)
}

pub(crate) fn side_key(namespace: &[u8], key: &[u8]) -> SideKey {
    KeyBuf::new(namespace, key)
}

/// Splits `[prefix length][prefix][rest]` back into its parts.
pub(crate) fn split_record_key(id: &[u8]) -> (&[u8], &[u8]) {
    let prefix_len = usize::from(id[0]);
    (&id[1..1 + prefix_len], &id[1 + prefix_len..])
}

/// Applies a record operation found at `loc` to the shard holding its key (`id`, hashed to `hash`).
/// Side and fence operations are ignored here.
///
/// `lease_deadline` is the monotonic deadline an in-progress operation's lease gets in memory (the
/// persisted wall-clock `lease_until` is not used for decisions): the store passes its monotonic
/// reading plus the lease, recovery passes [`LEASE_RECOVERED`]. Other operations ignore it.
pub(crate) fn apply_record(
    map: &mut Table<Entry>,
    hash: u64,
    id: &[u8],
    op: &Op<'_>,
    loc: Loc,
    lease_deadline: u64,
) {
    match op {
        Op::InProgress { head, .. } | Op::Completed { head, .. } => {
            let lease_until = match op {
                Op::InProgress { .. } => {
                    Some(NonZeroU64::new(lease_deadline).unwrap_or(NonZeroU64::MIN))
                }
                _ => None,
            };
            let entry = Entry {
                fp_prefix: fp_prefix(&head.fingerprint),
                fence: head.fence,
                expires_at: head.expires_at,
                lease_until,
                loc,
            };
            map.insert(hash, id, entry);
        }
        Op::Released { fence, .. } => {
            if map.get(hash, id).is_some_and(|e| e.fence == *fence) {
                map.remove(hash, id);
            }
        }
        Op::SidePut { .. } | Op::SideRemove { .. } | Op::FenceFloor { .. } => {}
    }
}

/// Applies a side operation found at `loc` (`id`, hashed to `hash`). Record and fence operations are
/// ignored here.
pub(crate) fn apply_side(map: &mut Table<SideEntry>, hash: u64, id: &[u8], op: &Op<'_>, loc: Loc) {
    match op {
        Op::SidePut { expires_at, .. } => map.insert(
            hash,
            id,
            SideEntry {
                expires_at: *expires_at,
                loc,
            },
        ),
        Op::SideRemove { .. } => {
            map.remove(hash, id);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_every_length_round_trip_short_or_long() {
        let scope = [b's'; crate::limits::MAX_SCOPE];
        let key = [b'k'; crate::limits::MAX_KEY];
        for (scope_len, key_len) in [
            (1, 1),
            (10, 36),
            (1, 61),
            (1, 62),
            (1, 63),
            (2, 62),
            (255, 255),
        ] {
            let id = record_key(&scope[..scope_len], &key[..key_len]);
            assert_eq!(
                matches!(id, KeyBuf::Short { .. }),
                1 + scope_len + key_len <= SHORT_KEY
            );
            assert_eq!(id.as_bytes().len(), 1 + scope_len + key_len);
            assert_eq!(
                split_record_key(id.as_bytes()),
                (&scope[..scope_len], &key[..key_len])
            );
        }
        let side = side_key(b"ns", &[b'x'; crate::limits::MAX_SIDE_KEY]);
        assert_eq!(side.as_bytes().len(), 3 + crate::limits::MAX_SIDE_KEY);
    }

    fn table() -> Table<u64> {
        Table::new()
    }

    fn h(k: &[u8]) -> u64 {
        // A deliberately weak hash, so that buckets collide and keys must be compared.
        u64::from(k.first().copied().unwrap_or(0) % 7)
    }

    #[test]
    fn insert_get_replace_remove() {
        let mut t = table();
        let (ha, hb) = (h(b"a"), h(b"b"));
        t.insert(ha, b"a", 1);
        t.insert(hb, b"b", 2);
        t.insert(ha, b"a", 3);
        assert_eq!(t.len(), 2);
        assert_eq!(t.get(ha, b"a"), Some(&3));
        assert_eq!(t.remove(ha, b"a"), Some(3));
        assert_eq!(t.get(ha, b"a"), None);
        assert_eq!(t.get(hb, b"b"), Some(&2));
    }

    fn sharded_insert(map: &Sharded<u64>, key: &[u8], value: u64) {
        let hash = map.hash(key);
        map.shard(hash).lock().insert(hash, key, value);
    }

    fn sharded_get(map: &Sharded<u64>, key: &[u8]) -> Option<u64> {
        let hash = map.hash(key);
        map.shard(hash).lock().get(hash, key).copied()
    }

    fn chunk_counts(map: &Sharded<u64>) -> Vec<usize> {
        map.shards().iter().map(|s| s.lock().chunks.len()).collect()
    }

    /// A hash whose shard (in a map of 8) is `shard`.
    fn in_shard(shard: u64, low: u64) -> u64 {
        shard << 32 | low
    }

    #[test]
    fn lock_shards_takes_each_shard_once_in_ascending_order() {
        let map: Sharded<u64> = Sharded::new(8);
        let hashes = [
            in_shard(5, 1),
            in_shard(2, 2),
            in_shard(5, 3),
            in_shard(0, 4),
        ];
        let mut locked = map.lock_shards(&hashes);
        let order: Vec<usize> = locked.guards.iter().map(|(i, _)| *i).collect();
        assert_eq!(order, [0, 2, 5]);
        for (i, shard) in map.shards().iter().enumerate() {
            assert_eq!(shard.try_lock().is_none(), order.contains(&i), "shard {i}");
        }
        for (n, &hash) in hashes.iter().enumerate() {
            locked.table(hash).insert(hash, &[n as u8], n as u64);
        }
        drop(locked);
        for (n, &hash) in hashes.iter().enumerate() {
            assert_eq!(
                map.shard(hash).lock().get(hash, &[n as u8]),
                Some(&(n as u64))
            );
        }
    }

    #[test]
    fn lock_shards_handles_more_keys_than_its_stack_buffer() {
        let map: Sharded<u64> = Sharded::new(8);
        let hashes: Vec<u64> = (0..12).map(|n| in_shard(7 - n % 8, n)).collect();
        let locked = map.lock_shards(&hashes);
        let order: Vec<usize> = locked.guards.iter().map(|(i, _)| *i).collect();
        assert_eq!(order, (0..8).collect::<Vec<_>>());
    }

    #[test]
    #[should_panic(expected = "was not locked")]
    fn a_hash_outside_the_locked_shards_is_a_bug() {
        let map: Sharded<u64> = Sharded::new(8);
        let mut locked = map.lock_shards(&[in_shard(1, 0)]);
        locked.table(in_shard(2, 0));
    }

    #[test]
    fn a_chunked_sweep_frees_slots_for_reuse_and_keeps_every_other_key() {
        let map = Sharded::new(2);
        let keys: Vec<Vec<u8>> = (0..5000u32).map(|i| i.to_le_bytes().to_vec()).collect();
        for (i, k) in keys.iter().enumerate() {
            sharded_insert(&map, k, i as u64);
        }
        assert!(
            chunk_counts(&map).iter().all(|&c| c > 1),
            "several chunks per shard"
        );
        assert_eq!(map.retain_chunked(|v| *v % 2 == 0), 2500);
        for (i, k) in keys.iter().enumerate() {
            let expected = (i % 2 == 0).then_some(i as u64);
            assert_eq!(sharded_get(&map, k), expected);
        }
        let chunks = chunk_counts(&map);
        for (i, k) in keys.iter().enumerate().filter(|(i, _)| i % 2 == 1) {
            sharded_insert(&map, k, i as u64);
        }
        assert_eq!(chunk_counts(&map), chunks, "freed slots were reused");
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(sharded_get(&map, k), Some(i as u64));
        }
        let mut seen = 0;
        map.for_each_chunked(|_| seen += 1);
        assert_eq!(seen, 5000);
    }

    #[test]
    fn a_sweep_that_empties_a_shard_gives_its_memory_back() {
        let map = Sharded::new(1);
        for i in 0..3000u32 {
            sharded_insert(&map, &i.to_le_bytes(), 1);
        }
        assert_eq!(map.retain_chunked(|_| false), 3000);
        assert_eq!(chunk_counts(&map), vec![0]);
        assert_eq!(sharded_get(&map, &7u32.to_le_bytes()), None);
    }

    #[test]
    fn slots_are_104_bytes_and_buckets_8() {
        assert_eq!(std::mem::size_of::<Slot<Entry>>(), 104);
        assert_eq!(std::mem::size_of::<Bucket>(), 8);
    }

    #[test]
    fn long_keys_go_to_the_heap_and_still_match() {
        let mut t = table();
        let long = vec![b'k'; INLINE_KEY + 1];
        let short = vec![b'k'; INLINE_KEY];
        t.insert(h(&long), &long, 1);
        t.insert(h(&short), &short, 2);
        assert_eq!(t.get(h(&long), &long), Some(&1));
        assert_eq!(t.get(h(&short), &short), Some(&2));
        assert_eq!(
            t.iter().map(|(k, _)| k.len()).sum::<usize>(),
            2 * INLINE_KEY + 1
        );
    }
}
