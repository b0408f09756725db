//! The public store: claim, complete, release, extend, inspect.
//!
//! Every mutation follows the same shape: lock the key's shard, decide against the current entry and
//! the clock, append one frame, apply it to the index through the same function recovery uses, unlock,
//! then wait for the frame to be durable (group commit). Every observation of an existing record waits
//! until that record's frame is durable before it is returned, so no caller ever acts on (or replays)
//! a record a crash could still take back.

use std::num::NonZeroU64;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;

use crate::claim::{ClaimOptions, ClaimOutcome, ClaimToken, Fingerprint, RequestDigest, Takeover};
use crate::clock::duration_ms;
use crate::dir_lock;
use crate::error::{Corruption, Error, Result};
use crate::index::{
    self, Entry, Sharded, SideEntry, fp_prefix, record_key, side_key, split_record_key,
};
use crate::limits;
use crate::log::flusher::Flusher;
use crate::log::op::{self, Head, NEVER, Op, RecordTail, Response};
use crate::log::segment::{Kind, Loc};
use crate::log::segments::{SegmentFile, Segments};
use crate::log::writer::LogWriter;
use crate::maintenance::Maintenance;
use crate::metrics::HistogramSnapshot;
use crate::options::{CompactionPolicy, Durability, Options};
use crate::pending::{Deferred, Durable, Pending};
use crate::quota::{Admit, ScopeCounts};
use crate::record::{Record, RecordState};
use crate::recovery::{self, RecoveredLeases, RecoveryReport, Replay};
use crate::response::StoredResponse;
use crate::side::SideWrite;
use crate::storage::LockGuard;

const SHARDS: usize = 64;

/// Fencing tokens reserved by one durable fence-floor operation (see [`Store::new_fence`]).
const FENCE_RESERVE: u64 = 1 << 20;

/// An open idempotency store. Cheap to clone; clones share one store.
#[derive(Clone)]
pub struct Store {
    core: Arc<Core>,
    threads: Arc<Threads>,
}

/// The shared state of a store; the background threads hold it too.
pub(crate) struct Core {
    pub(crate) dir: PathBuf,
    pub(crate) options: Options,
    pub(crate) lease_ms: u64,
    pub(crate) segments: Arc<Segments>,
    pub(crate) writer: Arc<LogWriter>,
    pub(crate) records: Sharded<Entry>,
    /// Sharded like `records`: one table would hold every side record, and growing it rehashes all
    /// of them under the lock every completion with business records needs (15 ms at 0.9 M entries,
    /// twice as long at each doubling). A write to several side keys locks their shards together
    /// ([`Sharded::lock_shards`]), so it still applies atomically.
    pub(crate) side: Sharded<SideEntry>,
    /// Live records per scope, for [`ClaimOptions::max_live_per_scope`]. Lock order: a record
    /// shard, then a scope shard.
    pub(crate) scopes: ScopeCounts,
    pub(crate) next_fence: AtomicU64,
    /// Fences below this are covered by a fence floor that is durable in the log (or in the
    /// manifest), so no crash can make the store hand them out again.
    pub(crate) fence_limit: AtomicU64,
    /// Held while a block of fences is reserved: one reservation at a time.
    fence_reserve: Mutex<()>,
    pub(crate) closed: AtomicBool,
    pub(crate) report: RecoveryReport,
    /// Held for the whole of a compaction: one at a time.
    pub(crate) compaction: Mutex<()>,
    pub(crate) compactions: AtomicU64,
    pub(crate) compaction_failures: AtomicU64,
    pub(crate) compaction_leftovers: AtomicU64,
    /// Segment bytes compactions deleted less the bytes they wrote, since open.
    pub(crate) compaction_reclaimed: AtomicU64,
    /// The directory lock; `close` releases it even while other handles (and so this `Core`) live.
    lock: Mutex<Option<Box<dyn LockGuard>>>,
}

/// Counts for monitoring and operator tools.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Live (unexpired) idempotency records.
    pub records: usize,
    /// Of those, claims still in progress.
    pub in_progress: usize,
    /// Live side records.
    pub side_records: usize,
    /// Entries held in memory, including expired ones not yet swept.
    pub index_entries: usize,
    /// Segment files.
    pub segments: usize,
    /// Bytes of all segment files.
    pub disk_bytes: u64,
    /// Bytes of live operations (the latest version of every live record and side record).
    pub live_bytes: u64,
    /// Bytes of sealed segments that compaction would reclaim.
    pub garbage_bytes: u64,
    /// Compactions finished since open.
    pub compactions: u64,
    /// Automatic compactions that failed since open (each is retried at the next check).
    pub compaction_failures: u64,
    /// Files of failed compactions that could not be removed since open (the next open deletes them).
    pub compaction_leftovers: u64,
    /// Frames appended since open.
    pub frames_appended: u64,
    /// Bytes appended since open.
    pub bytes_appended: u64,
    /// `pwrite` calls since open.
    pub writes: u64,
    /// fdatasync calls since open (frames per sync shows group commit at work).
    pub syncs: u64,
}

/// Figures for monitoring, read in O(1) in the number of keys ([`Store::metrics`]): running counts
/// kept as records come and go, counters and histograms, and a look at the segment list.
///
/// Record counts are of the index's entries: a record past its TTL counts until the sweep (run by
/// the maintenance thread every [`CompactionPolicy::interval`](crate::CompactionPolicy)) removes it, as
/// it keeps its memory until then. [`Store::stats`] instead walks every entry and counts only the
/// unexpired ones.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StoreMetrics {
    /// Idempotency records held (in progress or completed).
    pub records: u64,
    /// Of those, claims in progress.
    pub in_progress: u64,
    /// Side records held.
    pub side_records: u64,
    /// Bytes of the log operations the held records and side records point at.
    pub live_bytes: u64,
    /// Segment files.
    pub segments: u64,
    /// Bytes of all segment files.
    pub disk_bytes: u64,
    /// Compactions finished since open.
    pub compactions: u64,
    /// Automatic compactions that failed since open.
    pub compaction_failures: u64,
    /// Files of failed compactions that could not be removed since open.
    pub compaction_leftovers: u64,
    /// Segment bytes compactions deleted, less the bytes they wrote, since open.
    pub compaction_reclaimed_bytes: u64,
    /// Frames appended since open.
    pub frames_appended: u64,
    /// Bytes appended since open.
    pub bytes_appended: u64,
    /// `pwrite` calls since open.
    pub writes: u64,
    /// fdatasync calls since open.
    pub syncs: u64,
    /// Duration of each fdatasync of the log, in seconds, since open.
    pub fdatasync_seconds: HistogramSnapshot,
    /// Operations made durable by each fdatasync (the group-commit batch), since open.
    pub commit_batch_operations: HistogramSnapshot,
}

impl Stats {
    /// Share of the disk bytes that is garbage.
    pub fn garbage_ratio(&self) -> f64 {
        if self.disk_bytes == 0 {
            0.0
        } else {
            self.garbage_bytes as f64 / self.disk_bytes as f64
        }
    }
}

impl Store {
    /// Opens (creating if needed) the store in `dir`: takes the directory lock, replays the log, cuts a
    /// torn tail, and drops records whose TTL has passed.
    pub fn open(dir: impl AsRef<Path>, options: Options) -> Result<Store> {
        options.validate()?;
        let dir = dir.as_ref().to_owned();
        let storage = Arc::clone(&options.storage);
        crate::storage::create_dir_durable(&*storage, &dir)
            .map_err(|e| Error::io("create directory", &dir, e))?;
        let lock = dir_lock::lock(&*storage, &dir)?;

        let segments = Arc::new(Segments::new(&dir));
        let records = Sharded::new(SHARDS);
        let side = Sharded::new(SHARDS);
        let mut replay = Replay {
            records: &records,
            side: &side,
            next_fence: 1,
            leases: RecoveredLeases::from_options(&options),
        };
        let recovered = recovery::recover(&*storage, &dir, &segments, &mut replay)?;
        let writer = Arc::new(LogWriter::new(
            Arc::clone(&storage),
            dir.clone(),
            Arc::clone(&segments),
            &options,
            recovered.active,
            recovered.active_len,
        ));
        let flusher = Flusher::start(&writer, options.durability);
        let scopes = ScopeCounts::rebuild(&records, options.clock.now_ms());
        let recovered_next_fence = recovered.next_fence;
        let core = Arc::new(Core {
            dir,
            lease_ms: duration_ms(options.lease),
            options,
            segments,
            writer,
            records,
            side,
            scopes,
            next_fence: AtomicU64::new(recovered.next_fence),
            // Nothing reserved yet: open reserves the first block below.
            fence_limit: AtomicU64::new(recovered.next_fence),
            fence_reserve: Mutex::new(()),
            closed: AtomicBool::new(false),
            report: recovered.report,
            compaction: Mutex::new(()),
            compactions: AtomicU64::new(0),
            compaction_failures: AtomicU64::new(0),
            compaction_leftovers: AtomicU64::new(0),
            compaction_reclaimed: AtomicU64::new(0),
            lock: Mutex::new(Some(lock)),
        });
        core.sweep();
        let maintenance = core.options.compaction.and_then(|policy| {
            let core = Arc::clone(&core);
            Maintenance::start(policy.interval, move || core.maintain(&policy))
        });
        let threads = Arc::new(Threads {
            core: Arc::clone(&core),
            flusher: Mutex::new(flusher),
            maintenance: Mutex::new(maintenance),
        });
        let store = Store { core, threads };
        // Reserved here rather than at the first claim, which may run where a flush must not wait
        // (inside an async task, or behind a rotation it is part of).
        store.reserve_fences(recovered_next_fence)?;
        Ok(store)
    }

    /// True once an I/O failure (a failed write or fdatasync, a full disk, an ambiguous compaction
    /// switch) has poisoned this store: every later call fails with [`Error::Poisoned`]. The only way
    /// on is to [`Store::close`] (or drop every handle) and [`Store::open`] the directory again, which
    /// replays what is on disk; that works in the same process.
    pub fn is_poisoned(&self) -> bool {
        self.core.writer.check_poisoned().is_err()
    }

    /// What opening found: segments and frames replayed, and any torn tail cut off.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.core.report
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.core.dir
    }

    /// The durability mode in force: how long a write waits for the disk (see [`Durability`]).
    pub fn durability(&self) -> Durability {
        self.core.options.durability
    }

    pub(crate) fn core(&self) -> &Core {
        &self.core
    }

    fn now(&self) -> u64 {
        self.core.options.clock.now_ms()
    }

    /// The monotonic reading leases are judged by, at least 1 (see [`index::LEASE_RECOVERED`]).
    fn monotonic(&self) -> u64 {
        self.core.options.clock.monotonic_ms().max(1)
    }

    /// The in-memory lease deadline of a claim made or extended now.
    fn lease_deadline(&self) -> u64 {
        self.monotonic().saturating_add(self.core.lease_ms)
    }

    fn check_usable(&self) -> Result<()> {
        if self.core.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        self.core.writer.check_poisoned()
    }

    /// Atomically claims `(scope, key)` for a request with this fingerprint.
    ///
    /// Of any number of concurrent claims of one key, exactly one is [`ClaimOutcome::Acquired`]. A
    /// record past its TTL is replaced in the same step; an in-progress claim whose lease ran out is
    /// taken over with a larger fencing token ([`Takeover::LeaseExpired`]). Leases run on the clock's
    /// monotonic reading, so wall-clock steps do not move them; an in-progress claim recovered when
    /// the store was opened belongs to a process that is gone, so the first claim of it takes it over
    /// at once. A different fingerprint
    /// on a live record is [`ClaimOutcome::Mismatch`], whatever its state.
    pub fn claim(
        &self,
        scope: &[u8],
        key: &[u8],
        fingerprint: &Fingerprint,
        ttl: Duration,
    ) -> Result<ClaimOutcome> {
        self.claim_with(scope, key, fingerprint, ttl, &ClaimOptions::default())
    }

    /// [`Store::claim`], storing a request digest with the record and/or enforcing a per-scope
    /// quota of live records (see [`ClaimOptions`]). A refused claim
    /// ([`ClaimOutcome::QuotaExceeded`]) writes nothing.
    pub fn claim_with(
        &self,
        scope: &[u8],
        key: &[u8],
        fingerprint: &Fingerprint,
        ttl: Duration,
        options: &ClaimOptions<'_>,
    ) -> Result<ClaimOutcome> {
        let (outcome, pending) =
            self.until_visible(|| self.claim_deferred(scope, key, fingerprint, ttl, options))?;
        self.wait(pending)?;
        Ok(outcome)
    }

    /// Makes a deferred call until its answer is [`Deferred::Ready`], waiting (blocking) for each
    /// [`Deferred::NotVisible`] record first; returns the answer and what its own write waits for.
    pub fn until_visible<T>(
        &self,
        mut call: impl FnMut() -> Result<Deferred<T>>,
    ) -> Result<(T, Pending)> {
        loop {
            match call()? {
                Deferred::Ready(value, pending) => return Ok((value, pending)),
                Deferred::NotVisible(pending) => self.wait(pending)?,
            }
        }
    }

    /// [`Store::claim_with`] without any wait for the disk: the claim is applied (later calls see
    /// it) and its frame appended, and the [`Pending`] says what to wait for before acting on the
    /// outcome (see the `pending` module). An outcome that shows an existing record (a replay, a
    /// mismatch, a claim in progress) is only returned once that record is durable; before that the
    /// answer is [`Deferred::NotVisible`]: wait for it, then claim again.
    pub fn claim_deferred(
        &self,
        scope: &[u8],
        key: &[u8],
        fingerprint: &Fingerprint,
        ttl: Duration,
        options: &ClaimOptions<'_>,
    ) -> Result<Deferred<ClaimOutcome>> {
        self.check_usable()?;
        limits::check_record_key(scope, key)?;
        if let RequestDigest::Given(bytes) = options.request_digest
            && bytes.len() > op::MAX_DIGEST
        {
            return Err(Error::InvalidArgument("request digest longer than 8 KiB"));
        }
        // A lazy digest, once computed (only when the claim is known to write; see below).
        let mut computed: Option<Bytes> = None;
        let ttl_ms = duration_ms(ttl);
        if ttl_ms == 0 {
            return Err(Error::InvalidArgument("ttl must be at least 1 ms"));
        }
        let core = &*self.core;
        let id = record_key(scope, key);
        let hash = core.records.hash(id.as_bytes());
        let shard = core.records.shard(hash);
        let prefix = fp_prefix(&fingerprint.0);
        loop {
            let now = self.now();
            let mut map = shard.lock();
            let seen = map.get(hash, id.as_bytes()).copied();
            let takeover = match seen {
                Some(entry) if entry.is_live(now) => {
                    if entry.fp_prefix != prefix {
                        drop(map);
                        if let Some(pending) = self.observe(entry.loc.end())? {
                            return Ok(Deferred::NotVisible(pending));
                        }
                        return Ok(ready(ClaimOutcome::Mismatch));
                    }
                    // Same prefix: the full fingerprint is in the log. Read it without the shard
                    // lock. A record already visible (every replay but one racing its own
                    // completion) is read under the segment list's read lock, taken before the
                    // shard lock is let go so that compaction cannot remove the segment in
                    // between, and released before anything below waits or locks again.
                    let end = entry.loc.end();
                    let seen = if core.writer.is_visible(end) {
                        let file = core
                            .segments
                            .read(entry.loc.segment)
                            .ok_or_else(|| no_segment(core, entry.loc))?;
                        drop(map);
                        claim_view(&file, &entry, scope, key, fingerprint)?
                    } else {
                        let file = core.segments.get(entry.loc.segment);
                        drop(map);
                        if let Some(pending) = self.observe(end)? {
                            return Ok(Deferred::NotVisible(pending));
                        }
                        claim_view(&file, &entry, scope, key, fingerprint)?
                    };
                    match seen {
                        Seen::Mismatch => return Ok(ready(ClaimOutcome::Mismatch)),
                        Seen::Completed(response) => {
                            return Ok(ready(ClaimOutcome::Completed(response)));
                        }
                        // Judged on the monotonic clock: a wall-clock step must neither expire a
                        // running handler's claim nor stretch a dead one's.
                        Seen::InProgress(lease) if lease.get() > self.monotonic() => {
                            return Ok(ready(ClaimOutcome::InProgress {
                                retry_after: Duration::from_millis(
                                    lease.get() - self.monotonic().min(lease.get()),
                                ),
                            }));
                        }
                        Seen::InProgress(_) => {
                            // Take over, unless the record changed while we were reading.
                            map = shard.lock();
                            if map.get(hash, id.as_bytes()) != Some(&entry) {
                                continue;
                            }
                            Some(Takeover::LeaseExpired)
                        }
                    }
                }
                Some(_) => Some(Takeover::Expired),
                None => None,
            };
            // This claim writes. A digest still to compute is computed with the shard lock let
            // go, and the claim starts over: the record may have changed meanwhile.
            let digest: &[u8] = match (options.request_digest, &computed) {
                (RequestDigest::Given(bytes), _) => bytes,
                (RequestDigest::Lazy(_), Some(bytes)) => bytes,
                (RequestDigest::Lazy(compute), None) => {
                    drop(map);
                    let bytes = compute();
                    if bytes.len() > op::MAX_DIGEST {
                        return Err(Error::InvalidArgument("request digest longer than 8 KiB"));
                    }
                    computed = Some(bytes);
                    continue;
                }
            };
            let expires_at = now.saturating_add(ttl_ms);
            let admit = Admit {
                replaces: seen.map(|e| e.expires_at),
                new_key: takeover != Some(Takeover::LeaseExpired),
                expires_at,
            };
            if let Err(wait_ms) = core
                .scopes
                .admit(scope, now, admit, options.max_live_per_scope)
            {
                return Ok(ready(ClaimOutcome::QuotaExceeded {
                    retry_after: Duration::from_millis(wait_ms),
                }));
            }
            let fence = match self.new_fence() {
                Ok(fence) => fence,
                Err(e) => {
                    core.scopes.undo(scope, admit);
                    return Err(e);
                }
            };
            let op = Op::InProgress {
                head: Head {
                    scope,
                    key,
                    fingerprint: fingerprint.0,
                    fence,
                    created_at: now,
                    expires_at,
                    digest,
                },
                lease_until: now.saturating_add(core.lease_ms),
            };
            let mut loc = [Loc::default()];
            let appended = match core.writer.append(&[op], &mut loc) {
                Ok(appended) => appended,
                Err(e) => {
                    core.scopes.undo(scope, admit);
                    return Err(e);
                }
            };
            let deadline = self.lease_deadline();
            index::apply_record(&mut map, hash, id.as_bytes(), &op, loc[0], deadline);
            drop(map);
            core.writer.nudge(appended)?;
            let token = ClaimToken {
                id: id.as_bytes().into(),
                fence,
                takeover,
                fingerprint: fingerprint.0,
                created_at: now,
                expires_at,
                digest: Bytes::copy_from_slice(digest),
            };
            return Ok(Deferred::Ready(
                ClaimOutcome::Acquired(token),
                Pending::at(appended.end),
            ));
        }
    }

    /// A fencing token no claim of this directory has had before, not even one that a crash took
    /// back before it was durable: a claim is handed out before its frame is durable (see
    /// [`Store::claim_deferred`]), so the largest fence in the log does not bound the fences handed
    /// out. Fences are therefore handed out below a *fence floor* that is already durable: when
    /// they run out, a fence-floor operation reserving the next [`FENCE_RESERVE`] is appended and
    /// fdatasynced first (at open, then once per that many claims), and
    /// recovery starts above every floor it replays.
    fn new_fence(&self) -> Result<u64> {
        let core = &*self.core;
        let fence = core.next_fence.fetch_add(1, Ordering::Relaxed);
        loop {
            if fence < core.fence_limit.load(Ordering::Acquire) {
                return Ok(fence);
            }
            let _one = core.fence_reserve.lock();
            if fence < core.fence_limit.load(Ordering::Acquire) {
                return Ok(fence);
            }
            self.reserve_fences(fence)?;
        }
    }

    /// Makes fences `from..from + FENCE_RESERVE` safe to hand out: appends a fence floor above
    /// them and fdatasyncs it (in every durability mode), then raises the limit.
    fn reserve_fences(&self, from: u64) -> Result<()> {
        let core = &*self.core;
        let limit = from.saturating_add(FENCE_RESERVE);
        let op = Op::FenceFloor { next_fence: limit };
        let mut loc = [Loc::default()];
        let appended = core.writer.append(&[op], &mut loc)?;
        core.writer.flush_to(appended.end, true)?;
        core.fence_limit.store(limit, Ordering::Release);
        Ok(())
    }

    /// Completes a held claim with its final response and, in the same atomic append, the side
    /// records of the business write. Fails with [`Error::LeaseLost`], writing nothing, if the claim
    /// was taken over, released, completed or expired.
    pub fn complete(
        &self,
        token: &ClaimToken,
        response: &StoredResponse,
        side: &[SideWrite],
    ) -> Result<()> {
        let pending = self.complete_deferred(token, response, side)?;
        self.wait(pending)
    }

    /// [`Store::complete`] without the wait for the disk: the completion is applied and appended;
    /// the response may be sent once the [`Pending`] is durable.
    pub fn complete_deferred(
        &self,
        token: &ClaimToken,
        response: &StoredResponse,
        side: &[SideWrite],
    ) -> Result<Pending> {
        self.check_usable()?;
        let core = &*self.core;
        limits::check_response(response, core.options.max_value_bytes)?;
        for write in side {
            limits::check_side_write(write, core.options.max_value_bytes)?;
        }
        let now = self.now();
        let hash = core.records.hash(&token.id);
        let mut map = core.records.shard(hash).lock();
        let held = held(map.get(hash, &token.id), token, now)?;
        let mut ops = Vec::with_capacity(1 + side.len());
        ops.push(Op::Completed {
            head: head_of(token, &held),
            response: Response::Value(response),
        });
        let side_hashes = core.side_hashes(side);
        ops.extend(side.iter().map(|w| side_op(w, now)));
        let mut side_maps = core.side.lock_shards(&side_hashes);
        let mut locs = vec![Loc::default(); ops.len()];
        let appended = core.writer.append(&ops, &mut locs)?;
        index::apply_record(&mut map, hash, &token.id, &ops[0], locs[0], 0);
        let applied = ops[1..].iter().zip(&locs[1..]);
        for ((op, loc), (write, hash)) in applied.zip(side.iter().zip(&side_hashes)) {
            let (namespace, key) = write.namespace_and_key();
            let id = side_key(namespace, key);
            index::apply_side(side_maps.table(*hash), *hash, id.as_bytes(), op, *loc);
        }
        drop(side_maps);
        drop(map);
        core.writer.nudge(appended)?;
        Ok(Pending::at(appended.end))
    }

    /// Gives up a held claim (the handler failed with a 5xx): the key is free again at once.
    pub fn release(&self, token: &ClaimToken) -> Result<()> {
        let pending = self.release_deferred(token)?;
        self.wait(pending)
    }

    /// [`Store::release`] without the wait for the disk.
    pub fn release_deferred(&self, token: &ClaimToken) -> Result<Pending> {
        self.check_usable()?;
        let core = &*self.core;
        let now = self.now();
        let hash = core.records.hash(&token.id);
        let mut map = core.records.shard(hash).lock();
        let entry = held(map.get(hash, &token.id), token, now)?;
        let (scope, key) = split_record_key(&token.id);
        let op = Op::Released {
            scope,
            key,
            fence: token.fence,
        };
        let mut loc = [Loc::default()];
        let appended = core.writer.append(&[op], &mut loc)?;
        index::apply_record(&mut map, hash, &token.id, &op, loc[0], 0);
        core.scopes.remove(scope, entry.expires_at);
        drop(map);
        core.writer.nudge(appended)?;
        Ok(Pending::at(appended.end))
    }

    /// Live records of `scope` as the quota counts them ([`ClaimOptions::max_live_per_scope`]): a
    /// record stops counting at most 1 s after it expires. No scan: the count is kept per scope.
    pub fn live_records(&self, scope: &[u8]) -> u64 {
        self.core.scopes.live(scope, self.now())
    }

    /// Renews a held claim's lease (a heartbeat for long handlers); returns the new lease length.
    pub fn extend(&self, token: &ClaimToken) -> Result<Duration> {
        self.check_usable()?;
        let core = &*self.core;
        let now = self.now();
        let hash = core.records.hash(&token.id);
        let mut map = core.records.shard(hash).lock();
        let held = held(map.get(hash, &token.id), token, now)?;
        let op = Op::InProgress {
            head: head_of(token, &held),
            lease_until: now.saturating_add(core.lease_ms),
        };
        let mut loc = [Loc::default()];
        let appended = core.writer.append(&[op], &mut loc)?;
        let deadline = self.lease_deadline();
        index::apply_record(&mut map, hash, &token.id, &op, loc[0], deadline);
        drop(map);
        core.writer.nudge(appended)?;
        self.wait(Pending::at(appended.end))?;
        Ok(core.options.lease)
    }

    /// The live record for `(scope, key)`, if any.
    pub fn get(&self, scope: &[u8], key: &[u8]) -> Result<Option<Record>> {
        self.check_usable()?;
        limits::check_record_key(scope, key)?;
        let core = &*self.core;
        let now = self.now();
        let id = record_key(scope, key);
        let hash = core.records.hash(id.as_bytes());
        let map = core.records.shard(hash).lock();
        let Some(entry) = map
            .get(hash, id.as_bytes())
            .filter(|e| e.is_live(now))
            .copied()
        else {
            return Ok(None);
        };
        let file = core.segments.get(entry.loc.segment);
        drop(map);
        self.wait_readable(&file, entry.loc)?;
        record_at(&file, &entry).map(Some)
    }

    /// The live side record `(namespace, key)`, if any.
    pub fn side_get(&self, namespace: &[u8], key: &[u8]) -> Result<Option<Bytes>> {
        self.until_visible(|| self.side_get_deferred(namespace, key))
            .map(|(value, _)| value)
    }

    /// [`Store::side_get`] that never waits for the disk: a record whose frame is not yet durable
    /// is [`Deferred::NotVisible`] (wait, then call again).
    pub fn side_get_deferred(
        &self,
        namespace: &[u8],
        key: &[u8],
    ) -> Result<Deferred<Option<Bytes>>> {
        self.check_usable()?;
        limits::check_side_key(namespace, key)?;
        let core = &*self.core;
        let now = self.now();
        let id = side_key(namespace, key);
        let hash = core.side.hash(id.as_bytes());
        let map = core.side.shard(hash).lock();
        let Some(entry) = map
            .get(hash, id.as_bytes())
            .filter(|e| e.is_live(now))
            .copied()
        else {
            return Ok(ready(None));
        };
        let file = core.segments.get(entry.loc.segment);
        drop(map);
        if let Some(pending) = self.observe(entry.loc.end())? {
            return Ok(Deferred::NotVisible(pending));
        }
        let bytes = self.read_op(&file, entry.loc)?;
        match op::decode_at(&bytes) {
            Ok(Op::SidePut { value, .. }) => Ok(ready(Some(bytes.slice_ref(value)))),
            _ => Err(bad_location(&file, entry.loc)),
        }
    }

    /// Applies side-record writes as one atomic append.
    pub fn side_write(&self, writes: &[SideWrite]) -> Result<()> {
        let pending = self.side_write_deferred(writes)?;
        self.wait(pending)
    }

    /// [`Store::side_write`] without the wait for the disk.
    pub fn side_write_deferred(&self, writes: &[SideWrite]) -> Result<Pending> {
        self.check_usable()?;
        let core = &*self.core;
        if writes.is_empty() {
            return Ok(Pending::none());
        }
        for write in writes {
            limits::check_side_write(write, core.options.max_value_bytes)?;
        }
        let now = self.now();
        let ops: Vec<Op<'_>> = writes.iter().map(|w| side_op(w, now)).collect();
        let hashes = core.side_hashes(writes);
        // Every key's shard is held across the append, so the index applies writes to a key in
        // the order the log holds them.
        let mut maps = core.side.lock_shards(&hashes);
        let mut locs = vec![Loc::default(); ops.len()];
        let appended = core.writer.append(&ops, &mut locs)?;
        for ((op, loc), (write, hash)) in ops.iter().zip(&locs).zip(writes.iter().zip(&hashes)) {
            let (namespace, key) = write.namespace_and_key();
            let id = side_key(namespace, key);
            index::apply_side(maps.table(*hash), *hash, id.as_bytes(), op, *loc);
        }
        drop(maps);
        core.writer.nudge(appended)?;
        Ok(Pending::at(appended.end))
    }

    /// Blocks until `pending` is as durable as the durability mode promises: fdatasynced under
    /// `Sync`, written to the OS under `Periodic`, nothing under `None`.
    pub fn wait(&self, pending: Pending) -> Result<()> {
        match pending.end {
            None => Ok(()),
            Some(end) => match self.core.options.durability {
                Durability::Sync => self.core.writer.flush_to(end, true),
                Durability::Periodic(_) => self.core.writer.flush_to(end, false),
                Durability::None => Ok(()),
            },
        }
    }

    /// A future that resolves when `pending` is as durable as [`Store::wait`] would make it,
    /// without blocking a thread: the store's committer thread flushes for every waiting task (group
    /// commit). Fails with the error that poisoned the store, or [`Error::Closed`].
    pub fn durable(&self, pending: Pending) -> Durable {
        match pending.end {
            Some(end) if self.core.options.durability != Durability::None => Durable {
                writer: Some(Arc::clone(&self.core.writer)),
                end,
            },
            _ => Durable {
                writer: None,
                end: crate::log::segment::Pos(0),
            },
        }
    }

    /// `None` if the log up to `end` may be shown to a caller now; otherwise what to wait for first.
    /// Under `Sync` that means durable, which only a flush can make it, so the caller is told to
    /// wait; in the other modes it means written to the OS, which is done here (no fdatasync).
    fn observe(&self, end: crate::log::segment::Pos) -> Result<Option<Pending>> {
        if self.core.options.durability == Durability::Sync {
            Ok((!self.core.writer.is_synced(end)).then_some(Pending::at(end)))
        } else {
            self.core.writer.wait_visible(end)?;
            Ok(None)
        }
    }

    /// Makes everything appended so far durable, whatever the durability mode.
    pub fn sync(&self) -> Result<()> {
        self.check_usable()?;
        self.core.writer.sync_all()
    }

    /// Removes records and side records whose TTL has passed from memory; returns how many. Their
    /// bytes on disk are reclaimed by compaction. The maintenance thread does this periodically.
    pub fn sweep(&self) -> usize {
        self.core.sweep()
    }

    /// Current counts.
    pub fn stats(&self) -> Stats {
        let core = &*self.core;
        let now = self.now();
        let mut stats = Stats::default();
        // One pass over the index, a chunk at a time like the sweep: `/metrics` calls this while
        // requests run.
        let (mut records, mut in_progress, mut record_entries) = (0, 0, 0);
        let (mut side_records, mut side_entries) = (0, 0);
        let space = core.space_and_visit(
            |entry| {
                record_entries += 1;
                if entry.is_live(now) {
                    records += 1;
                    in_progress += usize::from(entry.lease_until.is_some());
                }
            },
            |entry| {
                side_entries += 1;
                side_records += usize::from(entry.is_live(now));
            },
        );
        stats.index_entries = record_entries + side_entries;
        stats.records = records;
        stats.in_progress = in_progress;
        stats.side_records = side_records;
        let segments = core.segments.all();
        stats.segments = segments.len();
        stats.disk_bytes = segments.iter().filter_map(|s| s.file.size().ok()).sum();
        stats.live_bytes = space.live;
        stats.garbage_bytes = space.garbage();
        stats.compactions = core.compactions.load(Ordering::Relaxed);
        stats.compaction_failures = core.compaction_failures.load(Ordering::Relaxed);
        stats.compaction_leftovers = core.compaction_leftovers.load(Ordering::Relaxed);
        let counters = &core.writer.counters;
        stats.frames_appended = counters.frames.load(Ordering::Relaxed);
        stats.bytes_appended = counters.bytes.load(Ordering::Relaxed);
        stats.writes = counters.writes.load(Ordering::Relaxed);
        stats.syncs = counters.syncs.load(Ordering::Relaxed);
        stats
    }

    /// Figures for monitoring, without visiting the index: O(1) in the number of keys (O(shards +
    /// segments)), no lock a request waits on. See [`StoreMetrics`] for how they differ from
    /// [`Store::stats`].
    pub fn metrics(&self) -> StoreMetrics {
        let core = &*self.core;
        let records = core.records.counts();
        let side = core.side.counts();
        let segments = core.segments.all();
        let counters = &core.writer.counters;
        let histograms = &core.writer.histograms;
        StoreMetrics {
            records: records.entries,
            in_progress: records.in_progress,
            side_records: side.entries,
            live_bytes: records.bytes + side.bytes,
            segments: segments.len() as u64,
            disk_bytes: segments.iter().filter_map(|s| s.file.size().ok()).sum(),
            compactions: core.compactions.load(Ordering::Relaxed),
            compaction_failures: core.compaction_failures.load(Ordering::Relaxed),
            compaction_leftovers: core.compaction_leftovers.load(Ordering::Relaxed),
            compaction_reclaimed_bytes: core.compaction_reclaimed.load(Ordering::Relaxed),
            frames_appended: counters.frames.load(Ordering::Relaxed),
            bytes_appended: counters.bytes.load(Ordering::Relaxed),
            writes: counters.writes.load(Ordering::Relaxed),
            syncs: counters.syncs.load(Ordering::Relaxed),
            fdatasync_seconds: histograms.fdatasync.snapshot(),
            commit_batch_operations: histograms.commit_batch.snapshot(),
        }
    }

    /// Checks that the running counts behind [`Store::metrics`] equal a walk of the whole index.
    /// Exact only while no other thread writes. For tests (the engine's model test calls it after
    /// every step). Feature `testkit`.
    #[cfg(any(test, feature = "testkit"))]
    pub fn check_running_counts(&self) -> std::result::Result<(), String> {
        let core = &*self.core;
        let (records, walked) = (core.records.counts(), core.records.walk_counts());
        if records != walked {
            return Err(format!(
                "record counts: running {records:?}, walked {walked:?}"
            ));
        }
        let (side, walked) = (core.side.counts(), core.side.walk_counts());
        if side != walked {
            return Err(format!("side counts: running {side:?}, walked {walked:?}"));
        }
        Ok(())
    }

    /// Flushes and syncs everything, stops the background threads, makes every handle of this store
    /// fail with [`Error::Closed`], and releases the directory lock, so the directory can be opened
    /// again at once, in this process too, even while other handles of this store still exist.
    ///
    /// On a poisoned store the flush is skipped and the poisoning error returned, but everything is
    /// released all the same: closing and reopening is how a server recovers from a full disk.
    /// Closing twice is a no-op.
    pub fn close(&self) -> Result<()> {
        let core = &*self.core;
        if core.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.threads.stop();
        let synced = core
            .writer
            .check_poisoned()
            .and_then(|()| core.writer.sync_all());
        // No write after this point: a caller that got past `check_usable` before `closed` was set
        // finds the writer shut and gets `Closed`, its frame unacknowledged.
        core.writer.shut();
        // A compaction started by a caller finishes (or fails) before the lock goes; later ones see
        // `closed` and refuse.
        drop(core.compaction.lock());
        drop(core.lock.lock().take());
        synced
    }

    /// Waits until the log is visible up to the end of `loc` (in `file`), then lets `file` serve
    /// those bytes from a memory map ([`SegmentFile::written_up_to`]).
    fn wait_readable(&self, file: &SegmentFile, loc: Loc) -> Result<()> {
        self.core.writer.wait_visible(loc.end())?;
        file.written_up_to(loc);
        Ok(())
    }

    /// The bytes of the operation at `loc`, once the log is visible up to it.
    fn read_op(&self, file: &SegmentFile, loc: Loc) -> Result<Bytes> {
        self.wait_readable(file, loc)?;
        file.read(loc)
    }
}

/// The public view of the record `entry` describes, read from `file` (which holds `entry.loc`).
pub(crate) fn record_at(file: &SegmentFile, entry: &Entry) -> Result<Record> {
    let stored = stored_record(file, entry.loc)?;
    let state = match (entry.lease_until, stored.response) {
        (Some(_), _) => RecordState::InProgress {
            lease_until_ms: stored.lease_until,
        },
        (None, Some(response)) => RecordState::Completed(response),
        (None, None) => return Err(bad_location(file, entry.loc)),
    };
    Ok(Record {
        fingerprint: Fingerprint(stored.fingerprint),
        created_at_ms: stored.created_at,
        expires_at_ms: entry.expires_at,
        fence: entry.fence,
        state,
        request_digest: stored.digest,
    })
}

/// The record snapshot at `loc`: its full fingerprint, creation time and, if completed, response.
fn stored_record(file: &SegmentFile, loc: Loc) -> Result<StoredRecord> {
    let bytes = file.read(loc)?;
    let bad = || bad_location(file, loc);
    match op::decode_at(&bytes).map_err(|_| bad())? {
        Op::InProgress { head, lease_until } => Ok(StoredRecord {
            fingerprint: head.fingerprint,
            created_at: head.created_at,
            lease_until,
            response: None,
            digest: digest_of(&bytes, &head),
        }),
        Op::Completed {
            head,
            response: Response::Encoded(raw),
        } => Ok(StoredRecord {
            fingerprint: head.fingerprint,
            created_at: head.created_at,
            lease_until: 0,
            response: Some(op::response_from(&bytes, raw).map_err(|_| bad())?),
            digest: digest_of(&bytes, &head),
        }),
        _ => Err(bad()),
    }
}

/// What a claim learns from the snapshot of a live record whose fingerprint prefix matched its own.
enum Seen {
    /// The full fingerprint differs.
    Mismatch,
    /// Completed, with the same fingerprint: the response to replay.
    Completed(StoredResponse),
    /// In progress, with the same fingerprint, under this lease deadline (the entry's).
    InProgress(NonZeroU64),
}

/// Reads what a claim of `(scope, key)` with `fingerprint` needs from the snapshot `entry` points at
/// in `file`, whose bytes the caller has made visible ([`LogWriter::is_visible`] or
/// [`Store::observe`]). The bytes are decoded where they lie (in the file's memory map when one
/// covers them): only a replayed response is copied out. The snapshot must be the record's own:
/// its scope and key are compared with the claim's, so a broken index location can never serve one
/// key's response to another key or scope.
fn claim_view(
    file: &SegmentFile,
    entry: &Entry,
    scope: &[u8],
    key: &[u8],
    fingerprint: &Fingerprint,
) -> Result<Seen> {
    let loc = entry.loc;
    file.written_up_to(loc);
    let bad = || bad_location(file, loc);
    file.with_bytes(loc, |bytes| {
        let (head, tail) = op::decode_record_at(bytes).map_err(|_| bad())?;
        if head.scope != scope || head.key != key {
            return Err(bad());
        }
        let same = head.fingerprint == fingerprint.0;
        match (entry.lease_until, tail) {
            (None, RecordTail::Completed { response }) if same => Ok(Seen::Completed(
                op::owned_response(response).map_err(|_| bad())?,
            )),
            (None, RecordTail::InProgress) => Err(bad()),
            (lease, tail) => {
                // Checked as a read of the whole operation would check it, though not returned.
                if let RecordTail::Completed { response } = tail {
                    op::check_response(response).map_err(|_| bad())?;
                }
                Ok(match lease {
                    Some(lease) if same => Seen::InProgress(lease),
                    _ => Seen::Mismatch,
                })
            }
        }
    })?
}

/// The error for an index location whose segment is not open: a broken invariant, reported as
/// corruption at that location rather than a panic.
fn no_segment(core: &Core, loc: Loc) -> Error {
    Error::corrupt(
        core.segments.path(loc.segment, Kind::Log),
        u64::from(loc.offset),
        Corruption::Malformed("index location names no open segment"),
    )
}

/// A record read back from the log.
struct StoredRecord {
    fingerprint: [u8; 32],
    created_at: u64,
    /// The persisted wall-clock lease end of an in-progress record (0 otherwise); shown, never
    /// used for decisions.
    lease_until: u64,
    response: Option<StoredResponse>,
    digest: Option<Bytes>,
}

/// The request digest of a head decoded from `owner`, sharing its memory.
fn digest_of(owner: &Bytes, head: &Head<'_>) -> Option<Bytes> {
    (!head.digest.is_empty()).then(|| owner.slice_ref(head.digest))
}

impl Core {
    /// The index hash of each side write's key. Only the hashes are kept (the shard locks are taken
    /// before the writes are applied); each key is built again where it is applied: a
    /// [`SideKey`](crate::index::SideKey) is sized for the longest key (1.3 KB), and collecting
    /// them moved that much per write.
    fn side_hashes(&self, writes: &[SideWrite]) -> Vec<u64> {
        writes
            .iter()
            .map(|w| {
                let (namespace, key) = w.namespace_and_key();
                self.side.hash(side_key(namespace, key).as_bytes())
            })
            .collect()
    }

    /// Removes records and side records whose TTL has passed from memory; returns how many.
    /// One pass of the maintenance thread: sweep, then compact if `policy` says so. False once
    /// the store is closed or poisoned (the thread then ends).
    pub(crate) fn maintain(&self, policy: &CompactionPolicy) -> bool {
        if self.writer.check_poisoned().is_err() || self.closed.load(Ordering::Acquire) {
            return false;
        }
        self.sweep();
        if self.space().wants_compaction(policy) && self.compact().is_err() {
            self.compaction_failures.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    pub(crate) fn sweep(&self) -> usize {
        let now = self.options.clock.now_ms();
        self.scopes.prune_all(now);
        // A chunk of slots at a time, so that a sweep holds a shard's lock for microseconds, not
        // for as long as visiting every record in it takes.
        self.records.retain_chunked(|e| e.is_live(now))
            + self.side.retain_chunked(|e| e.is_live(now))
    }
}

/// The background threads of a store; the last handle to drop stops them and syncs the log.
struct Threads {
    core: Arc<Core>,
    flusher: Mutex<Option<Flusher>>,
    maintenance: Mutex<Option<Maintenance>>,
}

impl Threads {
    fn stop(&self) {
        if let Some(mut maintenance) = self.maintenance.lock().take() {
            maintenance.stop();
        }
        if let Some(mut flusher) = self.flusher.lock().take() {
            flusher.stop();
        }
    }
}

impl Drop for Threads {
    fn drop(&mut self) {
        self.stop();
        if !self.core.closed.load(Ordering::Acquire) {
            // Best effort: a failure has poisoned the writer and there is no caller left to tell.
            if self.core.writer.sync_all().is_ok() {
                self.core.writer.trim();
            }
        }
    }
}

/// An answer that needs no wait.
fn ready<T>(value: T) -> Deferred<T> {
    Deferred::Ready(value, Pending::none())
}

/// The entry a token holds, or `LeaseLost`.
fn held(entry: Option<&Entry>, token: &ClaimToken, now: u64) -> Result<Entry> {
    match entry {
        Some(e) if e.fence == token.fence && e.lease_until.is_some() && e.is_live(now) => Ok(*e),
        _ => {
            let (scope, key) = split_record_key(&token.id);
            Err(Error::LeaseLost {
                scope: String::from_utf8_lossy(scope).into_owned(),
                key: String::from_utf8_lossy(key).into_owned(),
                fence: token.fence,
            })
        }
    }
}

/// The snapshot head of the record a token holds.
fn head_of<'a>(token: &'a ClaimToken, entry: &Entry) -> Head<'a> {
    let (scope, key) = split_record_key(&token.id);
    Head {
        scope,
        key,
        fingerprint: token.fingerprint,
        fence: token.fence,
        created_at: token.created_at,
        expires_at: entry.expires_at,
        digest: &token.digest,
    }
}

fn side_op(write: &SideWrite, now: u64) -> Op<'_> {
    match write {
        SideWrite::Put {
            namespace,
            key,
            value,
            ttl,
        } => Op::SidePut {
            namespace,
            key,
            expires_at: ttl.map_or(NEVER, |t| now.saturating_add(duration_ms(t).max(1))),
            value,
        },
        SideWrite::Remove { namespace, key } => Op::SideRemove { namespace, key },
    }
}

/// The index pointed at bytes that are not the operation it expected: a broken invariant or a file
/// changed under us; reported as corruption at that location rather than a panic.
fn bad_location(file: &SegmentFile, loc: Loc) -> Error {
    Error::corrupt(
        &file.path,
        u64::from(loc.offset),
        Corruption::Malformed("index location does not hold the expected operation"),
    )
}
