//! The log writer: appends frames, and group-commits them.
//!
//! Appending only encodes a frame into an in-memory buffer under a short mutex and returns the frame's
//! end position. Making it durable is a separate step (`Store::wait`, or the `Store::durable` future,
//! see `pending.rs`) taken after the caller has released its index lock. There, callers elect a leader: the first caller that finds no flush in
//! progress takes the whole buffer (its own frame and everything appended since the last flush), writes
//! it with one `pwrite`, and issues one fdatasync, with the mutex released; everyone else waits on a
//! condition variable until the durable position passes their own. A leader whose own frames are durable
//! flushes what others appended meanwhile before it returns (a few rounds at most), so the disk does not
//! idle while a sleeping follower is scheduled. Throughput therefore grows with the number of concurrent
//! callers instead of being capped at one fdatasync per operation.
//!
//! Outside `Sync` no caller waits for an fdatasync, only (under `Periodic`) for its frames to be
//! written. There a sync of everything (`sync_all`: the `Periodic` flusher's round, `Store::sync`,
//! compaction) leads only the write and runs its fdatasync as a non-leader, so callers' writes are
//! not held up behind it.
//!
//! Invariants:
//! - Frames reach the file in append order, each whole: the buffer only ever holds whole frames and a
//!   flush takes all of it, so the written and synced positions always fall on frame boundaries.
//! - `written` and `synced` point into the active segment and only grow. Every other segment is
//!   durable: a log segment is fully written and synced before the next one is created, and a compacted
//!   segment is synced before the manifest names it. So a position outside the active segment is
//!   durable by construction (see `Pos::covers`).
//! - After a failed write or fdatasync the writer is poisoned: the failure is never retried (the
//!   kernel may have dropped the dirty pages) and every later call fails until the store is reopened.
//! - The active segment's file is `allocated` bytes long: `written` bytes of frames, then zeros the
//!   writer put there ahead of time ([`PREALLOCATE`]). A sealed segment and a cleanly closed active
//!   segment hold no such zeros; recovery cuts them from a segment a crash left open (`FORMAT.md`).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Poll, Waker};
use std::time::Instant;

use parking_lot::{Condvar, Mutex, MutexGuard};

use super::frame::{self, MAX_PAYLOAD, TAG_OPS};
use super::group_commit::{Batcher, Due};
use super::op::Op;
use super::segment::{self, Kind, Loc, Pos};
use super::segments::{SegmentFile, Segments};
use super::wakeup::Wakeup;
use crate::error::{Error, Result};
use crate::metrics::EngineHistograms;
use crate::options::{Durability, Options};
use crate::storage::Storage;

/// Flush rounds a leader runs for others after its own frames are durable.
const EXTRA_ROUNDS: u32 = 4;

/// Longest a leader waits for just-woken callers to append before a round for others: well under one
/// fdatasync on this class of disk (~250 µs), so it can only add that much latency.
const GATHER: std::time::Duration = std::time::Duration::from_micros(150);

/// How far ahead of its frames the active segment's file is filled with zeros. An fdatasync after a
/// write that makes the file longer must also commit the new size to the filesystem's journal (on
/// ext4, a journal commit with its own flush, every time); over bytes that already exist it only
/// writes data. So a leader whose write runs past the end first extends the file with zeros to the
/// next multiple of this size, and the following fdatasyncs, until the frames reach the end again,
/// find no size change. Measured on the 2-core test machine's virtual disk (ext4; the repository's
/// benches/NOTEBOOK.md, "Zeros ahead of the log's frames", 2026-12-06): a 3 KB write and fdatasync
/// about 140 µs instead of about 200, sync claims +38-60 % on one thread and +119-124 % for 64
/// tasks, and over HTTP in `Sync` 7-8 % less server CPU per request in alternated wrk runs. Not
/// under `Durability::None`.
pub(crate) const PREALLOCATE: u32 = 1 << 20;

/// The zeros written ahead ([`PREALLOCATE`]): a zero-initialised static costs no memory until read.
static ZEROS: [u8; PREALLOCATE as usize] = [0; PREALLOCATE as usize];

/// In `Durability::None`, a caller whose frame takes the buffer past this size kicks the flusher
/// thread to write it out.
const NONE_KICK_BYTES: usize = 256 << 10;

/// In `Durability::None`, a caller that finds this much buffered (the flusher is not keeping up)
/// writes it out itself, which bounds the buffer.
const NONE_FLUSH_BYTES: usize = 4 << 20;

/// Where a frame went and how much is buffered behind it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Appended {
    pub(crate) end: Pos,
    buffered: usize,
    frame_len: usize,
}

/// Counters for `stats()`.
#[derive(Debug, Default)]
pub(crate) struct WriterCounters {
    pub(crate) frames: AtomicU64,
    pub(crate) bytes: AtomicU64,
    pub(crate) writes: AtomicU64,
    pub(crate) syncs: AtomicU64,
}

struct State {
    active: SegmentFile,
    /// Bytes of the active segment handed to the OS.
    written: u32,
    /// Length of the active segment's file: `written` plus the zeros written ahead of it
    /// ([`PREALLOCATE`]). `written <= allocated`.
    allocated: u32,
    /// Bytes of the active segment covered by fdatasync.
    synced: u32,
    /// Offset in the active segment of `buf[0]`. Between `written` and here are the bytes a leader is
    /// writing right now: `synced <= written <= buf_start`.
    buf_start: u32,
    /// Whole frames appended after `buf_start`.
    buf: Vec<u8>,
    /// An empty buffer kept to swap in during a flush, so its capacity is reused.
    spare: Vec<u8>,
    /// A leader is writing outside the mutex.
    flushing: bool,
    /// Generation of `buf`: each flush takes the buffer of one generation and wakes only the callers
    /// waiting on it (see `LogWriter::wake`).
    generation: u64,
    /// Frames in `buf`.
    frames: usize,
    /// Operations in `buf`.
    ops: u64,
    /// Operations written since the last fdatasync (and so made durable by the next one).
    unsynced_ops: u64,
    /// Blocked callers the last flush woke: they are about to append again. Tasks woken through
    /// `async_waiters` are not counted (see `lead`).
    woken: usize,
    /// While a leader gathers, the frame count it waits for (0 otherwise).
    gather_until: usize,
    /// A leader is waiting for appends before its flush (`Sync` only): nobody else may lead.
    gathering: bool,
    /// Rotations waiting for the leader to finish.
    idle_waiters: usize,
    /// A rotation is under way: appends keep going to the old segment until it switches.
    rotating: bool,
    poison: Option<Arc<Error>>,
    /// [`LogWriter::shut`] was called: nothing may be written any more.
    shut: bool,
    /// Tasks awaiting a position ([`LogWriter::poll_durable`]): woken by the flush that covers it.
    async_waiters: Vec<(Pos, Waker)>,
    /// When the committer syncs for `async_waiters` (`Sync` only).
    batcher: Batcher,
}

/// Appends frames to the active segment and makes them durable (see the module docs).
pub(crate) struct LogWriter {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    segments: Arc<Segments>,
    durability: Durability,
    segment_size: u32,
    state: Mutex<State>,
    /// Callers waiting for a flush, by the parity of the buffer generation holding their frames.
    flushed: [Condvar; 2],
    /// A gathering leader waits here for appends.
    appended: Condvar,
    /// Rotations wait here for the leader to finish.
    idle: Condvar,
    written: AtomicU64,
    synced: AtomicU64,
    poisoned: AtomicBool,
    wakeup: Arc<Wakeup>,
    pub(crate) counters: WriterCounters,
    /// fdatasync durations and group-commit batch sizes.
    pub(crate) histograms: EngineHistograms,
}

impl LogWriter {
    /// A writer appending to `active`, whose first `len` bytes are valid and durable, with the
    /// durability mode, group commit and segment size of `options`.
    pub(crate) fn new(
        storage: Arc<dyn Storage>,
        dir: PathBuf,
        segments: Arc<Segments>,
        options: &Options,
        active: SegmentFile,
        len: u32,
    ) -> Self {
        let pos = Pos::new(active.id, len).0;
        Self {
            storage,
            dir,
            segments,
            durability: options.durability,
            segment_size: options.segment_size,
            state: Mutex::new(State {
                active,
                written: len,
                allocated: len,
                synced: len,
                buf_start: len,
                buf: Vec::with_capacity(64 << 10),
                spare: Vec::with_capacity(64 << 10),
                flushing: false,
                generation: 0,
                frames: 0,
                ops: 0,
                unsynced_ops: 0,
                woken: 0,
                gather_until: 0,
                gathering: false,
                idle_waiters: 0,
                rotating: false,
                poison: None,
                shut: false,
                async_waiters: Vec::new(),
                batcher: Batcher::new(options.group_commit),
            }),
            flushed: [Condvar::new(), Condvar::new()],
            appended: Condvar::new(),
            idle: Condvar::new(),
            written: AtomicU64::new(pos),
            synced: AtomicU64::new(pos),
            poisoned: AtomicBool::new(false),
            wakeup: Arc::default(),
            counters: WriterCounters::default(),
            histograms: EngineHistograms::default(),
        }
    }

    /// Fails if an earlier I/O error poisoned the writer.
    pub(crate) fn check_poisoned(&self) -> Result<()> {
        if self.poisoned.load(Ordering::Acquire) {
            let st = self.state.lock();
            if let Some(cause) = &st.poison {
                return Err(Error::Poisoned(Arc::clone(cause)));
            }
        }
        Ok(())
    }

    fn check(&self, st: &State) -> Result<()> {
        match &st.poison {
            Some(cause) => Err(Error::Poisoned(Arc::clone(cause))),
            None if st.shut => Err(Error::Closed),
            None => Ok(()),
        }
    }

    /// Stops all writing for good: waits for a leader writing outside the mutex to finish, then makes
    /// every later append and flush fail with [`Error::Closed`]. After this returns, this writer never
    /// touches a file again, so the directory may be handed to another store (in this process too).
    pub(crate) fn shut(&self) {
        let mut st = self.state.lock();
        self.wait_idle(&mut st);
        st.shut = true;
        Self::cut_zeros(&mut st);
        for waiting in &self.flushed {
            waiting.notify_all();
        }
        Self::wake_all_async(&mut st);
        drop(st);
        // The committer thread may be asleep waiting for work: let it see the shutdown.
        self.wakeup.stop();
    }

    /// Cuts the zeros written ahead of the active segment's frames (see [`PREALLOCATE`]), so that a
    /// store closed or dropped cleanly leaves its last segment ending with its last frame. Best
    /// effort: every frame stays, and recovery cuts zeros a failure here leaves behind.
    pub(crate) fn trim(&self) {
        let mut st = self.state.lock();
        self.wait_idle(&mut st);
        Self::cut_zeros(&mut st);
    }

    /// Waits until no leader is writing outside the mutex and none is gathering.
    fn wait_idle(&self, st: &mut MutexGuard<'_, State>) {
        st.idle_waiters += 1;
        while st.flushing || st.gathering {
            self.idle.wait(st);
        }
        st.idle_waiters -= 1;
    }

    fn cut_zeros(st: &mut State) {
        if st.poison.is_none() && st.allocated > st.written {
            let cut = st.active.file.set_len(u64::from(st.written));
            if cut.and_then(|()| st.active.file.sync_data()).is_ok() {
                st.allocated = st.written;
            }
        }
    }

    fn poison(&self, st: &mut State, cause: Error) -> Error {
        let cause = Arc::new(cause);
        st.poison = Some(Arc::clone(&cause));
        self.poisoned.store(true, Ordering::Release);
        for waiting in &self.flushed {
            waiting.notify_all();
        }
        self.idle.notify_all();
        Self::wake_all_async(st);
        Error::Poisoned(cause)
    }

    /// Encodes `ops` as one frame at the end of the log and stores each operation's location in the
    /// matching element of `locs`. Nothing is durable yet: pass the result to [`LogWriter::nudge`], then wait (`Store::wait`).
    pub(crate) fn append(&self, ops: &[Op<'_>], locs: &mut [Loc]) -> Result<Appended> {
        assert_eq!(ops.len(), locs.len(), "one location per operation");
        let payload: usize = ops.iter().map(Op::encoded_len).sum();
        if payload > MAX_PAYLOAD {
            return Err(Error::TooLarge {
                what: "frame",
                len: payload,
                max: MAX_PAYLOAD,
            });
        }
        let frame_len = frame::HEADER_LEN + payload;
        let mut st = self.state.lock();
        self.check(&st)?;
        let tail = st.buf_start as usize + st.buf.len();
        if tail + frame_len > self.segment_size as usize
            && tail > segment::HEADER_LEN
            && !st.rotating
        {
            self.rotate(&mut st)?;
        }
        let st = &mut *st;
        let base = st.buf_start as usize + st.buf.len();
        let segment = st.active.id;
        let start = st.buf.len();
        frame::encode(&mut st.buf, TAG_OPS, u64::from(st.synced), |buf| {
            for (op, loc) in ops.iter().zip(locs.iter_mut()) {
                let before = buf.len();
                op.encode(buf);
                *loc = Loc {
                    segment,
                    offset: (base + before - start) as u32,
                    len: (buf.len() - before) as u32,
                };
            }
        });
        debug_assert_eq!(st.buf.len() - start, frame_len);
        st.frames += 1;
        st.ops += ops.len() as u64;
        if st.gather_until != 0 && st.frames >= st.gather_until {
            self.appended.notify_one();
        }
        self.counters.frames.fetch_add(1, Ordering::Relaxed);
        self.counters
            .bytes
            .fetch_add(frame_len as u64, Ordering::Relaxed);
        Ok(Appended {
            end: Pos::new(segment, (base + frame_len) as u32),
            buffered: st.buf.len(),
            frame_len,
        })
    }

    /// What every append owes the writer right after it, whether or not its caller waits: under
    /// `Durability::None`, a frame that takes the buffer past [`NONE_KICK_BYTES`] kicks the flusher,
    /// and one that finds [`NONE_FLUSH_BYTES`] buffered writes the buffer out itself (which bounds
    /// it). Nothing in the other modes, whose buffer is drained by the callers that wait.
    pub(crate) fn nudge(&self, appended: Appended) -> Result<()> {
        if self.durability != Durability::None {
            return Ok(());
        }
        if appended.buffered >= NONE_FLUSH_BYTES {
            return self.flush(appended.end, false);
        }
        // Only the frame that crosses the line kicks, so the mutex is not taken per call.
        if appended.buffered >= NONE_KICK_BYTES
            && appended.buffered - appended.frame_len < NONE_KICK_BYTES
        {
            self.wakeup.kick();
        }
        Ok(())
    }

    /// Whether the log up to `end` is as durable as a blocking `Store::wait` would make it,
    /// or, once not, registers `waker` to be woken by the flush that makes it so (or by a failure).
    /// Registering kicks the committer thread, which flushes for async waiters (see
    /// `flusher.rs`). Under `Durability::None` nothing is waited for.
    pub(crate) fn poll_durable(&self, end: Pos, waker: &Waker) -> Poll<Result<()>> {
        let target = match self.durability {
            Durability::None => return Poll::Ready(Ok(())),
            Durability::Sync => &self.synced,
            Durability::Periodic(_) => &self.written,
        };
        if Pos(target.load(Ordering::Acquire)).covers(end) {
            return Poll::Ready(Ok(()));
        }
        let mut st = self.state.lock();
        if let Err(e) = self.check(&st) {
            return Poll::Ready(Err(e));
        }
        // Positions move under the mutex, and waiters are woken under it: no wake-up is lost.
        if Pos(target.load(Ordering::Acquire)).covers(end) {
            return Poll::Ready(Ok(()));
        }
        let kick = match st
            .async_waiters
            .iter_mut()
            .find(|(at, w)| *at == end && w.will_wake(waker))
        {
            Some(_) => true,
            None => {
                st.async_waiters.push((end, waker.clone()));
                let waiting = st.async_waiters.len();
                st.batcher.registered(waiting, Instant::now)
            }
        };
        drop(st);
        if kick {
            self.wakeup.kick();
        }
        Poll::Pending
    }

    /// Wakes the async waiters the current positions cover; returns how many.
    fn wake_async(&self, st: &mut State) -> usize {
        if st.async_waiters.is_empty() {
            return 0;
        }
        let target = match self.durability {
            Durability::Sync => Pos::new(st.active.id, st.synced),
            _ => Pos::new(st.active.id, st.written),
        };
        let mut woken = 0;
        st.async_waiters.retain(|(end, waker)| {
            if target.covers(*end) {
                waker.wake_by_ref();
                woken += 1;
                false
            } else {
                true
            }
        });
        let remaining = st.async_waiters.len();
        st.batcher.woke(woken, remaining, Instant::now);
        woken
    }

    /// Wakes every async waiter: after a failure or a shutdown, each finds out when it polls.
    fn wake_all_async(st: &mut State) {
        for (_, waker) in st.async_waiters.drain(..) {
            waker.wake();
        }
        st.batcher.woke(0, 0, Instant::now);
    }

    /// The synced position (for the committer's progress check).
    pub(crate) fn synced_pos(&self) -> u64 {
        self.synced.load(Ordering::Acquire)
    }

    /// Whether the committer should sync for the async waiters now
    /// ([`GroupCommit`](crate::GroupCommit)).
    pub(crate) fn commit_due(&self) -> Due {
        let st = self.state.lock();
        let waiting = st.async_waiters.len();
        st.batcher.due(waiting, Instant::now)
    }

    /// Wakes the flusher thread early (see [`LogWriter::nudge`]).
    pub(crate) fn wakeup(&self) -> Arc<Wakeup> {
        Arc::clone(&self.wakeup)
    }

    /// Waits until the log up to `end` may be shown to a caller: durable under `Sync`, written to the
    /// OS (and so readable from the file) otherwise.
    pub(crate) fn wait_visible(&self, end: Pos) -> Result<()> {
        self.flush(end, self.durability == Durability::Sync)
    }

    /// Waits until the log up to `end` is written (and fdatasynced if `sync`).
    pub(crate) fn flush_to(&self, end: Pos, sync: bool) -> Result<()> {
        self.flush(end, sync)
    }

    /// Whether the log up to `end` may be shown to a caller now, without waiting: what
    /// [`LogWriter::wait_visible`] waits for (durable under `Sync`, written to the OS otherwise).
    pub(crate) fn is_visible(&self, end: Pos) -> bool {
        let target = if self.durability == Durability::Sync {
            &self.synced
        } else {
            &self.written
        };
        Pos(target.load(Ordering::Acquire)).covers(end)
    }

    /// Whether the log up to `end` is fdatasynced.
    pub(crate) fn is_synced(&self, end: Pos) -> bool {
        Pos(self.synced.load(Ordering::Acquire)).covers(end)
    }

    /// Writes and fdatasyncs everything appended so far.
    pub(crate) fn sync_all(&self) -> Result<()> {
        let end = self.appended_end();
        if self.durability == Durability::Sync {
            // Callers wait for durability: the group commit (one leader writes and syncs).
            return self.flush(end, true);
        }
        // Callers wait for their frames to be written (`Periodic`) or not at all (`None`): lead
        // only the write, then fdatasync as a non-leader so that their writes go on meanwhile.
        self.flush(end, false)?;
        self.sync_written()
    }

    /// fdatasyncs the active segment up to what is written now, without being the leader: appends
    /// and other callers' writes go on during the fdatasync. Only outside `Sync`, where no caller
    /// waits for `synced` to move. A rotation meanwhile is harmless: it fdatasyncs the old segment
    /// itself before it switches, and this sync then leaves the new segment's position alone.
    fn sync_written(&self) -> Result<()> {
        debug_assert_ne!(self.durability, Durability::Sync);
        let (segment, upto, batch) = {
            let mut st = self.state.lock();
            self.check(&st)?;
            if st.synced >= st.written {
                return Ok(());
            }
            // `unsynced_ops` may include the operations of a buffer a leader is writing right now;
            // they are counted in this batch although the next sync makes them durable (metrics
            // only).
            let batch = std::mem::take(&mut st.unsynced_ops);
            (st.active.clone(), st.written, batch)
        };
        let result = timed_sync(&segment, &self.histograms);
        let mut st = self.state.lock();
        if let Err(e) = result {
            // As everywhere: a failed fdatasync is never retried (the kernel may have dropped the
            // dirty pages), so the store is poisoned.
            return Err(self.poison(&mut st, e));
        }
        self.counters.syncs.fetch_add(1, Ordering::Relaxed);
        self.observe_batch(batch);
        // Everything written before the fdatasync started is durable; `synced` only grows.
        if st.active.id == segment.id && st.synced < upto {
            st.synced = upto;
            self.synced
                .store(Pos::new(segment.id, upto).0, Ordering::Release);
        }
        Ok(())
    }

    /// Writes (without syncing) everything appended so far.
    pub(crate) fn write_all(&self) -> Result<()> {
        let end = self.appended_end();
        self.flush(end, false)
    }

    fn appended_end(&self) -> Pos {
        let st = self.state.lock();
        Pos::new(st.active.id, st.buf_start + st.buf.len() as u32)
    }

    /// The id of the segment being appended to.
    pub(crate) fn active_segment(&self) -> u32 {
        self.state.lock().active.id
    }

    /// Poisons the writer with a failure found elsewhere: a compaction that could not tell whether
    /// its switch reached the disk.
    pub(crate) fn poison_with(&self, cause: Error) -> Error {
        let mut st = self.state.lock();
        self.poison(&mut st, cause)
    }

    fn flush(&self, end: Pos, sync: bool) -> Result<()> {
        let reached = |w: &Self| {
            let target = if sync { &w.synced } else { &w.written };
            Pos(target.load(Ordering::Acquire)).covers(end)
        };
        if reached(self) {
            return Ok(());
        }
        let mut st = self.state.lock();
        loop {
            self.check(&st)?;
            if reached(self) {
                return Ok(());
            }
            if st.flushing {
                // Our frame is either in the buffer being flushed or in the one accumulating after it;
                // sleep on that generation only, so that a flush wakes just the callers it covered.
                let in_flight = end.offset() <= st.buf_start;
                let generation = st.generation - u64::from(in_flight);
                self.wait_for(&mut st, generation);
                continue;
            }
            if st.gathering {
                // `Sync` mode, nothing in flight: our frame is in the buffer the gatherer will flush.
                let generation = st.generation;
                self.wait_for(&mut st, generation);
                continue;
            }
            self.gather(&mut st);
            self.lead(&mut st, sync)?;
            // Frames appended during that flush belong to callers now asleep; flushing them at once
            // keeps the disk busy instead of waiting for one of them to be scheduled and lead. Bounded,
            // so this caller's own latency stays bounded too.
            let mut extra = 0;
            while reached(self) && !st.buf.is_empty() && extra < EXTRA_ROUNDS {
                self.gather(&mut st);
                self.lead(&mut st, sync)?;
                extra += 1;
            }
            if !st.buf.is_empty() {
                // Stopping with frames buffered: wake their callers, one of them leads next.
                self.wake(st.generation);
            }
        }
    }

    /// Before a flush round under `Sync`: when the last flush woke several callers, they are about to
    /// append again; waiting a moment for them (at most [`GATHER`]) lets one fdatasync cover all of
    /// them instead of about half. With one or no caller woken (low concurrency) it returns at once,
    /// so a lone caller never waits.
    fn gather(&self, st: &mut MutexGuard<'_, State>) {
        if self.durability != Durability::Sync || st.woken < 2 {
            return;
        }
        let target = st.frames + st.woken;
        st.gather_until = target;
        // Still the leader while waiting: nobody else may take the buffer meanwhile.
        st.gathering = true;
        let deadline = std::time::Instant::now() + GATHER;
        while st.frames < target && !self.appended.wait_until(st, deadline).timed_out() {}
        st.gathering = false;
        st.gather_until = 0;
        self.signal_idle(st);
    }

    /// Records the operations one fdatasync made durable (none: a sync of headers only).
    fn observe_batch(&self, ops: u64) {
        if ops > 0 {
            self.histograms.commit_batch.observe(ops);
        }
    }

    /// Wakes rotations waiting for the leader to finish, if any.
    fn signal_idle(&self, st: &State) {
        if st.idle_waiters > 0 {
            self.idle.notify_all();
        }
    }

    /// Sleeps until the flush of buffer `generation` (or a poisoning) wakes us.
    fn wait_for(&self, st: &mut MutexGuard<'_, State>, generation: u64) {
        self.flushed[(generation % 2) as usize].wait(st);
    }

    /// Wakes the callers waiting on buffer `generation`. Only two generations can have waiters at a
    /// time (the one being flushed and the one accumulating), so two condition variables suffice.
    fn wake(&self, generation: u64) -> usize {
        self.flushed[(generation % 2) as usize].notify_all()
    }

    /// Takes the accumulating buffer for a flush; returns it and its generation.
    fn take_buffer(st: &mut State) -> (Vec<u8>, u64) {
        let spare = std::mem::take(&mut st.spare);
        let data = std::mem::replace(&mut st.buf, spare);
        let generation = st.generation;
        st.generation += 1;
        st.frames = 0;
        st.unsynced_ops += std::mem::take(&mut st.ops);
        st.buf_start += data.len() as u32;
        (data, generation)
    }

    /// One flush round as leader: take the buffer, write and maybe sync it with the mutex released.
    fn lead(&self, st: &mut MutexGuard<'_, State>, sync: bool) -> Result<()> {
        debug_assert_eq!(st.written, st.buf_start, "one leader at a time");
        let offset = st.buf_start;
        let (mut data, generation) = Self::take_buffer(st);
        let active = st.active.clone();
        let new_written = st.buf_start;
        // Zeros ahead of the frames when they run past the file's end (see `PREALLOCATE`); not
        // under `None`, which fdatasyncs only on request and would only pay for the extra write.
        // They start at the file's end, not the frames' end, so no write ever leaves a hole (a
        // read of a hole through a map must allocate, and on a full tmpfs that is a SIGBUS); the
        // frames then overwrite the zeros' first bytes.
        let fill = (new_written > st.allocated && self.durability != Durability::None)
            .then(|| (st.allocated, preallocate_to(new_written, self.segment_size)));
        let do_sync = (sync || self.durability == Durability::Sync) && st.synced < new_written;
        let batch = if do_sync {
            std::mem::take(&mut st.unsynced_ops)
        } else {
            0
        };
        st.flushing = true;
        let result = MutexGuard::unlocked(st, || -> Result<()> {
            // The zeros first: a disk too full for them fails the round before any frame of it
            // reaches the file.
            if let Some((from, to)) = fill {
                // In pieces: under a big frame the span runs several MiB.
                let mut at = from;
                while at < to {
                    let len = (to - at).min(PREALLOCATE);
                    active
                        .file
                        .write_at(u64::from(at), &ZEROS[..len as usize])
                        .map_err(|e| Error::io("write", &active.path, e))?;
                    at += len;
                }
            }
            if !data.is_empty() {
                active
                    .file
                    .write_at(u64::from(offset), &data)
                    .map_err(|e| Error::io("write", &active.path, e))?;
                self.counters.writes.fetch_add(1, Ordering::Relaxed);
            }
            if do_sync {
                timed_sync(&active, &self.histograms)?;
                self.counters.syncs.fetch_add(1, Ordering::Relaxed);
                self.observe_batch(batch);
            }
            Ok(())
        });
        st.flushing = false;
        self.signal_idle(st);
        if let Err(e) = result {
            return Err(self.poison(st, e));
        }
        st.written = new_written;
        st.allocated = st.allocated.max(fill.map_or(new_written, |(_, to)| to));
        self.written
            .store(Pos::new(active.id, new_written).0, Ordering::Release);
        if do_sync {
            st.synced = new_written;
            self.synced
                .store(Pos::new(active.id, new_written).0, Ordering::Release);
        }
        data.clear();
        st.spare = data;
        // Only woken threads count towards the next gather: a blocked thread appends again as soon
        // as it runs, but a woken task may not append at all (a server's request is done and
        // answers), and when it does, its runtime polls the woken tasks one after another, so
        // waiting for all of them idles the disk while they run. Measured (`claim_new_async`, 64
        // tasks on one thread): 122 k claims/s with them counted, 192 k/s without.
        self.wake_async(st);
        st.woken = self.wake(generation);
        Ok(())
    }

    /// Seals the active segment and starts the next one, in two phases so that appends are not held
    /// up by the expensive part:
    ///
    /// 1. As leader, with the mutex released: write and fdatasync everything buffered so far (in
    ///    `None` or `Periodic` mode that can be a whole segment of unsynced data) and create the next
    ///    segment, durably but still empty. Meanwhile other callers keep appending to the old segment.
    /// 2. With the mutex held: write and fdatasync what they appended (little), seal the old segment,
    ///    and switch. Only this short step pauses appends.
    ///
    /// No frame goes to the next segment before the old one is fully durable; recovery relies on it.
    fn rotate(&self, st: &mut MutexGuard<'_, State>) -> Result<()> {
        st.rotating = true;
        let result = self.rotate_phases(st);
        st.rotating = false;
        result
    }

    fn rotate_phases(&self, st: &mut MutexGuard<'_, State>) -> Result<()> {
        self.wait_idle(st);
        self.check(st)?;
        let old = st.active.clone();

        // Phase 1.
        let offset = st.buf_start;
        let (data, first) = Self::take_buffer(st);
        let batch = std::mem::take(&mut st.unsynced_ops);
        st.flushing = true;
        let id = self.segments.allocate_id();
        let prepared = MutexGuard::unlocked(st, || -> Result<SegmentFile> {
            write_and_sync(&old, offset, &data, &self.histograms)?;
            self.observe_batch(batch);
            create_segment(&*self.storage, &self.segments, &self.dir, id)
        });
        st.flushing = false;
        self.wake(first);
        let next = match prepared {
            Ok(next) => next,
            Err(e) => return Err(self.poison(st, e)),
        };
        st.written = st.buf_start;
        st.synced = st.buf_start;
        st.allocated = st.allocated.max(st.written);
        self.written
            .store(Pos::new(old.id, st.written).0, Ordering::Release);
        self.synced
            .store(Pos::new(old.id, st.synced).0, Ordering::Release);
        self.wake_async(st);
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        self.counters.syncs.fetch_add(1, Ordering::Relaxed);

        // Phase 2. A sealed segment ends with its last frame: the zeros written ahead are cut, in
        // the same fdatasync (a size change is part of what fdatasync makes durable).
        let offset = st.buf_start;
        let (data, second) = Self::take_buffer(st);
        let batch = std::mem::take(&mut st.unsynced_ops);
        let end = u64::from(st.buf_start);
        let cut = (u64::from(st.allocated) > end).then_some(end);
        let sealed = write_cut_and_sync(&old, offset, &data, cut, &self.histograms)
            .inspect(|()| self.observe_batch(batch))
            .and_then(|()| old.file.seal().map_err(|e| Error::io("map", &old.path, e)));
        if let Err(e) = sealed {
            return Err(self.poison(st, e));
        }
        let len = segment::HEADER_LEN as u32;
        st.active = next;
        st.written = len;
        st.allocated = len;
        st.synced = len;
        st.buf_start = len;
        let pos = Pos::new(st.active.id, len).0;
        self.written.store(pos, Ordering::Release);
        self.synced.store(pos, Ordering::Release);
        self.wake(second);
        self.wake_async(st);
        Ok(())
    }
}

/// Writes `data` at `offset` of `segment` and fdatasyncs it.
fn write_and_sync(
    segment: &SegmentFile,
    offset: u32,
    data: &[u8],
    histograms: &EngineHistograms,
) -> Result<()> {
    write_cut_and_sync(segment, offset, data, None, histograms)
}

/// Writes `data` at `offset` of `segment`, cuts the file to `cut` bytes if given (the zeros written
/// ahead of the last frame), and fdatasyncs it.
fn write_cut_and_sync(
    segment: &SegmentFile,
    offset: u32,
    data: &[u8],
    cut: Option<u64>,
    histograms: &EngineHistograms,
) -> Result<()> {
    if !data.is_empty() {
        segment
            .file
            .write_at(u64::from(offset), data)
            .map_err(|e| Error::io("write", &segment.path, e))?;
    }
    if let Some(len) = cut {
        segment
            .file
            .set_len(len)
            .map_err(|e| Error::io("truncate", &segment.path, e))?;
    }
    timed_sync(segment, histograms)
}

/// Where the zeros written ahead of frames ending at `end` stop: the next multiple of
/// [`PREALLOCATE`], but not past the segment's size (unless the frames already are).
fn preallocate_to(end: u32, segment_size: u32) -> u32 {
    let next = end.div_ceil(PREALLOCATE).saturating_mul(PREALLOCATE);
    next.min(segment_size).max(end)
}

/// fdatasyncs `segment`, recording how long it took.
fn timed_sync(segment: &SegmentFile, histograms: &EngineHistograms) -> Result<()> {
    let started = std::time::Instant::now();
    segment
        .file
        .sync_data()
        .map_err(|e| Error::io("fdatasync", &segment.path, e))?;
    let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
    histograms.fdatasync.observe(nanos);
    Ok(())
}

/// Creates log segment `id` durably (header written and synced, directory synced) and registers it.
pub(crate) fn create_segment(
    storage: &dyn Storage,
    segments: &Segments,
    dir: &std::path::Path,
    id: u32,
) -> Result<SegmentFile> {
    let path = segments.path(id, Kind::Log);
    let file = storage
        .create_new(&path)
        .map_err(|e| Error::io("create", &path, e))?;
    file.write_at(0, &segment::encode_header(id))
        .map_err(|e| Error::io("write", &path, e))?;
    file.sync_data()
        .map_err(|e| Error::io("fdatasync", &path, e))?;
    storage
        .sync_dir(dir)
        .map_err(|e| Error::io("sync directory", dir, e))?;
    let segment = SegmentFile {
        id,
        kind: Kind::Log,
        path,
        file,
    };
    segments.insert(segment.clone());
    Ok(segment)
}
