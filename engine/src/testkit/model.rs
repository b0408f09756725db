//! A reference model of the store and a simulation that checks the real store against it.
//!
//! Not part of the stable API: it exists so that the engine's proptest and the fuzz target drive the
//! same model. A [`Simulation`] runs [`Step`]s — claims, completions, releases, extensions, clock
//! moves, clean reopens, crashes (process, power loss, torn tail), injected I/O failures, sweeps,
//! compactions, and a claim racing a segment rotation that crashes half-way — against
//! a [`Store`] on [`FaultyStorage`] and against a plain in-memory model, and reports the first
//! observation where they differ. After every crash it checks that every acknowledged operation is
//! still there. Durability is `Sync`, so every acknowledged operation must survive every crash mode.
//!
//! An operation that fails because the I/O layer failed is *in doubt*: its frame may or may not have
//! reached the disk. The simulation accepts either outcome after the next open, but only those two,
//! and checks that a completion's side records share its fate.
//!
//! *Unacknowledged* writes ([`Step::ClaimUnacked`], [`Step::SideUnacked`]) are the deferred calls
//! whose `Pending` nobody waits for, as a server does for a request's claim and the write-once
//! record. The model applies them at once (the process sees them) and remembers the world before
//! each. The argument that makes skipping those waits safe is checked here:
//! - any later acknowledged write makes every earlier one durable (prefix durability), so the
//!   worlds are forgotten;
//! - showing a record (a `get`, a claim that replays, refuses or answers "in progress") makes it
//!   durable first, so the worlds before the write that made it are forgotten;
//! - a crash may only lose a suffix of the unacknowledged writes: the store must reopen to one of
//!   the remembered worlds, never to a mix.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::claim::{ClaimOutcome, ClaimToken, Fingerprint, Takeover};
use crate::clock::ManualClock;
use crate::options::{Durability, Options};
use crate::record::RecordState;
use crate::response::StoredResponse;
use crate::side::SideWrite;
use crate::store::Store;
use crate::testkit::{CrashMode, FaultOp, FaultyStorage};

const SCOPES: [&str; 2] = ["acct_a", "acct_b"];
const KEYS: [&str; 4] = ["k0", "k1", "k2", "k3"];
const TTLS_S: [u64; 3] = [5, 60, 3600];
/// The lease the simulated store runs with.
pub const LEASE: Duration = Duration::from_secs(10);
const SIDE_NS: &str = "invoices";

/// One step of a simulation. Small integers index into fixed universes, so any value is valid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Claim (scope, key) with fingerprint `fp` and the `ttl`-th TTL.
    Claim {
        /// Scope index.
        scope: u8,
        /// Key index.
        key: u8,
        /// Fingerprint number (0–3; 0 and 1, 2 and 3 share an 8-byte prefix).
        fp: u8,
        /// TTL index.
        ttl: u8,
    },
    /// Complete the `token`-th token ever handed out, with a response and maybe a side record.
    Complete {
        /// Token index.
        token: u8,
        /// Response status.
        status: u16,
        /// Body length.
        body_len: u8,
        /// Also write a side record in the same append.
        side: bool,
    },
    /// Release a token.
    Release {
        /// Token index.
        token: u8,
    },
    /// Extend a token's lease.
    Extend {
        /// Token index.
        token: u8,
    },
    /// Claim like [`Step::Claim`], through `claim_deferred`, and do not wait for the claim's own
    /// write if it acquires (an answer that shows an existing record is durable already).
    ClaimUnacked {
        /// Scope index.
        scope: u8,
        /// Key index.
        key: u8,
        /// Fingerprint number.
        fp: u8,
        /// TTL index.
        ttl: u8,
    },
    /// Put a side record (like a downstream dedup record) through `side_write_deferred`, and do
    /// not wait for it.
    SideUnacked {
        /// Key index (the side record of that key).
        key: u8,
        /// Distinguishes the value.
        value: u8,
    },
    /// Read a record back.
    Get {
        /// Scope index.
        scope: u8,
        /// Key index.
        key: u8,
    },
    /// Let time pass: move the wall and the monotonic clock forward.
    Advance {
        /// Milliseconds.
        ms: u32,
    },
    /// Step only the wall clock (NTP), forward or back; a step back stops short of reviving a record
    /// that has already expired.
    StepWall {
        /// Step back instead of forward.
        back: bool,
        /// Milliseconds.
        ms: u32,
    },
    /// Close cleanly and open again; tokens stay valid.
    Reopen,
    /// Crash and open again; tokens die with the process.
    Crash {
        /// 0: process only, 1: power loss, else: torn tail with this seed.
        mode: u64,
    },
    /// The next fdatasync fails.
    FailSync,
    /// The next write fails.
    FailWrite,
    /// Compact now.
    Compact,
    /// Sweep expired records out of memory.
    Sweep,
    /// Fill the active segment until it rotates; while the rotation has created the next segment and
    /// not yet synced the old one, claim (scope, key) from another thread (its frame goes to the old
    /// segment), then fail every I/O call from the old segment's last fdatasync on, as a crash there
    /// would. The claim is in doubt; a process crash then keeps its frame in the page cache only.
    RotationRace {
        /// Scope index.
        scope: u8,
        /// Key index.
        key: u8,
        /// Fingerprint number.
        fp: u8,
        /// TTL index.
        ttl: u8,
    },
}

impl Step {
    /// Decodes a sequence of steps from arbitrary bytes (for fuzzing): every input is some sequence.
    pub fn decode_all(bytes: &[u8]) -> Vec<Step> {
        let mut steps = Vec::new();
        let mut it = bytes.iter().copied();
        while let Some(tag) = it.next() {
            let mut next = || it.next().unwrap_or(0);
            let step = match tag % 22 {
                20 => Step::ClaimUnacked {
                    scope: next(),
                    key: next(),
                    fp: next() % 4,
                    ttl: next(),
                },
                21 => Step::SideUnacked {
                    key: next(),
                    value: next(),
                },
                0..=4 => Step::Claim {
                    scope: next(),
                    key: next(),
                    fp: next() % 4,
                    ttl: next(),
                },
                5..=7 => Step::Complete {
                    token: next(),
                    status: [200, 201, 400, 422][usize::from(next() % 4)],
                    body_len: next(),
                    side: next() % 2 == 0,
                },
                8 => Step::Release { token: next() },
                9 => Step::Extend { token: next() },
                10 => Step::Get {
                    scope: next(),
                    key: next(),
                },
                11 | 12 => Step::Advance {
                    ms: u32::from(next()) * 250,
                },
                13 => Step::Reopen,
                14 => Step::Crash {
                    mode: u64::from(next()),
                },
                16 => Step::Compact,
                17 => Step::Sweep,
                19 => Step::StepWall {
                    back: next() % 2 == 0,
                    ms: u32::from(next()) * 500,
                },
                18 => Step::RotationRace {
                    scope: next(),
                    key: next(),
                    fp: next() % 4,
                    ttl: next(),
                },
                _ => {
                    if next() % 2 == 0 {
                        Step::FailSync
                    } else {
                        Step::FailWrite
                    }
                }
            };
            steps.push(step);
        }
        steps
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum MState {
    InProgress {
        /// The wall-clock lease end written to the log (what `get` shows).
        lease_until: u64,
        /// The lease's deadline on the monotonic clock, which decides takeovers; `None` once the
        /// store was reopened (the claim then belongs to a dead process and is taken over at once).
        deadline: Option<u64>,
        /// Index of the token that holds it; `None` when its holder died in a crash.
        holder: Option<usize>,
    },
    Completed(StoredResponse),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct MRecord {
    fp: u8,
    /// The fencing token of the claim that wrote it, when known (not for a claim whose outcome is in
    /// doubt: its token was never handed out).
    fence: Option<u64>,
    created: u64,
    expires: u64,
    state: MState,
}

/// The reference: plain maps, no I/O.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Model {
    records: BTreeMap<(usize, usize), MRecord>,
    side: BTreeMap<String, Bytes>,
}

impl Model {
    fn live(&self, id: (usize, usize), now: u64) -> Option<&MRecord> {
        self.records.get(&id).filter(|r| r.expires > now)
    }

    /// The record a token holds, if it still holds one.
    fn held(&self, id: (usize, usize), token: usize, now: u64) -> bool {
        matches!(
            self.live(id, now),
            Some(MRecord { state: MState::InProgress { holder: Some(h), .. }, .. }) if *h == token
        )
    }

    /// A reopen: every in-progress claim was recovered from the log and its lease is over.
    fn end_leases(&mut self) {
        for r in self.records.values_mut() {
            if let MState::InProgress { deadline, .. } = &mut r.state {
                *deadline = None;
            }
        }
    }

    fn forget_holders(&mut self) {
        for r in self.records.values_mut() {
            if let MState::InProgress { holder, .. } = &mut r.state {
                *holder = None;
            }
        }
    }
}

/// A state a crash may leave while unacknowledged writes are outstanding.
#[derive(Debug, Clone)]
struct World {
    /// What the write that led here wrote (`None` for the world before the first of them).
    touch: Option<Touch>,
    model: Model,
}

/// What an unacknowledged write wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Touch {
    Record((usize, usize)),
    Side(String),
}

/// An operation whose outcome is unknown because the I/O under it failed.
#[derive(Debug, Clone)]
struct InDoubt {
    /// The model if the operation reached the disk.
    applied: Model,
}

/// Runs steps against a real store and the model side by side.
pub struct Simulation {
    fs: FaultyStorage,
    clock: ManualClock,
    dir: PathBuf,
    store: Option<Store>,
    model: Model,
    tokens: Vec<((usize, usize), ClaimToken)>,
    last_fence: u64,
    poisoned: bool,
    in_doubt: Option<InDoubt>,
    /// While unacknowledged writes are outstanding: the world before the first of them, then the
    /// world after each, with what it wrote. Empty when everything applied is durable.
    worlds: Vec<World>,
    segment_size: u32,
    /// The expiry of every record any claim may have written, to bound wall-clock steps back.
    expiries: Vec<u64>,
}

impl Default for Simulation {
    fn default() -> Self {
        Self::new(4096)
    }
}

impl Simulation {
    /// A simulation whose store rotates segments at `segment_size` bytes.
    pub fn new(segment_size: u32) -> Self {
        let mut sim = Simulation {
            fs: FaultyStorage::new(),
            clock: ManualClock::new(1_000_000),
            dir: PathBuf::from("/sim"),
            store: None,
            model: Model::default(),
            tokens: Vec::new(),
            last_fence: 0,
            poisoned: false,
            in_doubt: None,
            worlds: Vec::new(),
            segment_size,
            expiries: Vec::new(),
        };
        sim.store = Some(sim.open_store().expect("a fresh store opens"));
        sim
    }

    /// The simulated file system (for debugging a failing sequence).
    pub fn storage(&self) -> &FaultyStorage {
        &self.fs
    }

    fn options(&self) -> Options {
        Options::default()
            .storage(Arc::new(self.fs.clone()))
            .clock(Arc::new(self.clock.clone()))
            .durability(Durability::Sync)
            .lease(LEASE)
            .segment_size(self.segment_size)
            .compaction(None)
    }

    fn open_store(&self) -> crate::Result<Store> {
        Store::open(&self.dir, self.options())
    }

    fn store(&self) -> &Store {
        self.store
            .as_ref()
            .expect("the simulation always holds an open store")
    }

    fn now(&self) -> u64 {
        use crate::clock::Clock;
        self.clock.now_ms()
    }

    /// The monotonic reading the store judges leases by (it never uses less than 1).
    fn monotonic(&self) -> u64 {
        use crate::clock::Clock;
        self.clock.monotonic_ms().max(1)
    }

    /// Runs one step; `Err` describes the first divergence from the model.
    pub fn run(&mut self, step: &Step) -> Result<(), String> {
        self.run_step(step)?;
        // The running counts behind `Store::metrics` must equal a walk of the index after every
        // step: claims, takeovers, completions, releases, sweeps, compactions, recoveries.
        self.store().check_running_counts()
    }

    fn run_step(&mut self, step: &Step) -> Result<(), String> {
        match *step {
            Step::Claim {
                scope,
                key,
                fp,
                ttl,
            } => self.claim(
                usize::from(scope) % SCOPES.len(),
                usize::from(key) % KEYS.len(),
                fp,
                TTLS_S[usize::from(ttl) % TTLS_S.len()],
            ),
            Step::Complete {
                token,
                status,
                body_len,
                side,
            } => self.with_token(token, |sim, index| {
                sim.complete(index, status, body_len, side)
            }),
            Step::Release { token } => self.with_token(token, Self::release),
            Step::Extend { token } => self.with_token(token, Self::extend),
            Step::ClaimUnacked {
                scope,
                key,
                fp,
                ttl,
            } => self.claim_unacked(
                usize::from(scope) % SCOPES.len(),
                usize::from(key) % KEYS.len(),
                fp,
                TTLS_S[usize::from(ttl) % TTLS_S.len()],
            ),
            Step::SideUnacked { key, value } => {
                self.side_unacked(usize::from(key) % KEYS.len(), value)
            }
            Step::Get { scope, key } => {
                let id = (
                    usize::from(scope) % SCOPES.len(),
                    usize::from(key) % KEYS.len(),
                );
                if !self.poisoned && !self.worlds.is_empty() {
                    // Showing an unacknowledged record makes it durable first: this read may be
                    // the flush an injected fault hits, which leaves those writes in doubt.
                    let store = self.store().clone();
                    if let Err(e) = store.get(SCOPES[id.0].as_bytes(), KEYS[id.1].as_bytes()) {
                        return self.failed("get", e, None);
                    }
                }
                let checked = self.check_key(id);
                // Only a live record is shown (and so made durable first).
                if checked.is_ok() && !self.poisoned && self.model.live(id, self.now()).is_some() {
                    self.observed(&Touch::Record(id));
                }
                checked
            }
            Step::Advance { ms } => {
                self.clock.advance(Duration::from_millis(u64::from(ms)));
                Ok(())
            }
            Step::StepWall { back: false, ms } => {
                self.clock
                    .step_wall_forward(Duration::from_millis(u64::from(ms)));
                Ok(())
            }
            Step::StepWall { back: true, ms } => {
                // Records past their TTL may or may not have been swept or compacted away, and a
                // reopen replays whatever the log still holds; the model does not track which, so
                // the wall clock never goes back past an expiry it has already passed.
                let now = self.now();
                let floor = self
                    .expiries
                    .iter()
                    .copied()
                    .filter(|&e| e <= now)
                    .max()
                    .unwrap_or(0);
                self.clock.set(now.saturating_sub(u64::from(ms)).max(floor));
                Ok(())
            }
            Step::Reopen => self.reopen(None),
            Step::Crash { mode } => self.reopen(Some(match mode {
                0 => CrashMode::ProcessOnly,
                1 => CrashMode::DropUnsynced,
                seed => CrashMode::TornTail { seed },
            })),
            Step::FailSync => {
                self.fs.fail_sync_after(1);
                Ok(())
            }
            Step::FailWrite => {
                self.fs.fail_write_after(1);
                Ok(())
            }
            Step::Compact => self.compact(),
            Step::Sweep => {
                self.store().sweep();
                Ok(())
            }
            Step::RotationRace {
                scope,
                key,
                fp,
                ttl,
            } => self.rotation_race(
                usize::from(scope) % SCOPES.len(),
                usize::from(key) % KEYS.len(),
                fp % 4,
                TTLS_S[usize::from(ttl) % TTLS_S.len()],
            ),
        }
    }

    /// Checks every key and side record against the model.
    pub fn check_all(&mut self) -> Result<(), String> {
        if self.poisoned {
            return Ok(());
        }
        let store = self.store().clone();
        self.check_all_in(&store, &self.model)?;
        // Every record was shown, so every one of them is durable now.
        self.worlds.clear();
        Ok(())
    }

    /// Opens a copy of the file system after a simulated power loss and checks that it holds exactly
    /// the model: every acknowledged operation survived. Skipped while an operation is in doubt.
    pub fn probe_power_loss(&self) -> Result<(), String> {
        if self.poisoned || self.in_doubt.is_some() {
            return Ok(());
        }
        let fork = self.fs.fork();
        fork.crash(CrashMode::DropUnsynced);
        let options = self.options().storage(Arc::new(fork));
        let store = Store::open(&self.dir, options).map_err(|e| format!("probe open: {e}"))?;
        // Unacknowledged writes may be lost, but only as a suffix: one of the worlds must match.
        let mut first_error = None;
        for model in self.possible_worlds() {
            match self.check_all_in(&store, model) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        Err(format!(
            "after a power loss here ({} possible worlds): {}",
            self.worlds.len().max(1),
            first_error.unwrap_or_default()
        ))
    }

    /// The states a crash now may leave: the model itself, or with unacknowledged writes
    /// outstanding, the world after each of them, the latest first, down to the world before them.
    fn possible_worlds(&self) -> Vec<&Model> {
        if self.worlds.is_empty() {
            vec![&self.model]
        } else {
            self.worlds.iter().rev().map(|w| &w.model).collect()
        }
    }

    fn check_all_in(&self, store: &Store, model: &Model) -> Result<(), String> {
        for scope in 0..SCOPES.len() {
            for key in 0..KEYS.len() {
                self.check_key_in(store, (scope, key), model)?;
            }
        }
        for key in 0..KEYS.len() {
            let name = side_key(key);
            let found = store
                .side_get(SIDE_NS.as_bytes(), name.as_bytes())
                .map_err(|e| format!("side_get {name}: {e}"))?;
            if found.as_ref() != model.side.get(&name) {
                return Err(format!(
                    "side {name}: store {found:?}, model {:?}",
                    model.side.get(&name)
                ));
            }
        }
        Ok(())
    }

    /// An acknowledged write is durable, and with it every write before it.
    fn acknowledged(&mut self) {
        self.worlds.clear();
    }

    /// The store showed the record `touch` names, so the write that made it is durable, and every
    /// write before it: the worlds before that write are no longer possible.
    fn observed(&mut self, touch: &Touch) {
        if let Some(i) = self
            .worlds
            .iter()
            .rposition(|w| w.touch.as_ref() == Some(touch))
        {
            self.worlds.drain(..i);
            if self.worlds.len() == 1 {
                self.worlds.clear();
            }
        }
    }

    /// Records an unacknowledged write that took the model from `before` to its current state.
    fn unacked(&mut self, touch: Touch, before: Model) {
        if self.worlds.is_empty() {
            self.worlds.push(World {
                touch: None,
                model: before,
            });
        }
        self.worlds.push(World {
            touch: Some(touch),
            model: self.model.clone(),
        });
    }

    fn with_token(
        &mut self,
        token: u8,
        f: impl FnOnce(&mut Self, usize) -> Result<(), String>,
    ) -> Result<(), String> {
        if self.tokens.is_empty() {
            return Ok(());
        }
        let index = usize::from(token) % self.tokens.len();
        f(self, index)
    }

    /// Handles a store error: only I/O-induced poisoning is acceptable, and it puts `applied` in doubt.
    fn failed(
        &mut self,
        what: &str,
        err: crate::Error,
        doubt: Option<InDoubt>,
    ) -> Result<(), String> {
        if !err.is_poisoned() {
            return Err(format!("{what}: unexpected error {err}"));
        }
        if !self.poisoned {
            self.poisoned = true;
            self.in_doubt = doubt;
        }
        Ok(())
    }

    /// Compaction changes no logical content. An injected fault may make it fail: before its switch
    /// that leaves the store running, during it the store is poisoned; nothing is in doubt either way.
    fn compact(&mut self) -> Result<(), String> {
        match self.store().compact() {
            Ok(_) if self.poisoned => Err("compact succeeded on a poisoned store".into()),
            Ok(_) => Ok(()),
            Err(e) if e.is_poisoned() => {
                self.poisoned = true;
                Ok(())
            }
            Err(crate::Error::Io { .. }) if !self.poisoned => Ok(()),
            Err(e) => Err(format!("compact: {e}")),
        }
    }

    fn claim(&mut self, scope: usize, key: usize, fp: u8, ttl_s: u64) -> Result<(), String> {
        let result = self.store().claim(
            SCOPES[scope].as_bytes(),
            KEYS[key].as_bytes(),
            &fingerprint(fp),
            Duration::from_secs(ttl_s),
        );
        self.claimed_and(scope, key, fp, ttl_s, result, |sim, _| sim.acknowledged())
    }

    /// [`Simulation::claimed`], then: a claim that acquired runs `acquired` (with the model before
    /// it); one that answered from an existing live record showed it, so that record is durable.
    fn claimed_and(
        &mut self,
        scope: usize,
        key: usize,
        fp: u8,
        ttl_s: u64,
        result: crate::Result<ClaimOutcome>,
        acquired: impl FnOnce(&mut Self, Model),
    ) -> Result<(), String> {
        let (before, tokens) = (self.model.clone(), self.tokens.len());
        self.claimed(scope, key, fp, ttl_s, result)?;
        if self.tokens.len() > tokens {
            acquired(self, before);
        } else if !self.poisoned {
            self.observed(&Touch::Record((scope, key)));
        }
        Ok(())
    }

    /// See [`Step::ClaimUnacked`].
    fn claim_unacked(
        &mut self,
        scope: usize,
        key: usize,
        fp: u8,
        ttl_s: u64,
    ) -> Result<(), String> {
        let store = self.store().clone();
        let (scope_b, key_b) = (SCOPES[scope].as_bytes(), KEYS[key].as_bytes());
        let options = crate::claim::ClaimOptions::default();
        let ttl = Duration::from_secs(ttl_s);
        // Waiting for a NotVisible record is what the server does: only the answer's record.
        let result = store
            .until_visible(|| store.claim_deferred(scope_b, key_b, &fingerprint(fp), ttl, &options))
            .and_then(|(outcome, pending)| {
                if !matches!(outcome, ClaimOutcome::Acquired(_)) && !pending.is_done() {
                    return Err(crate::Error::InvalidArgument(
                        "a claim that acquired nothing came with a write to wait for",
                    ));
                }
                Ok(outcome)
            });
        // A failure here is an I/O failure on a flush for an observed record, or a poisoned store:
        // `claimed` handles both as for a waited claim.
        self.claimed_and(scope, key, fp, ttl_s, result, |sim, before| {
            sim.unacked(Touch::Record((scope, key)), before);
        })
    }

    /// See [`Step::SideUnacked`].
    fn side_unacked(&mut self, key: usize, value: u8) -> Result<(), String> {
        let name = side_key(key);
        let value = Bytes::from(format!("charge {value}"));
        let write = SideWrite::put(SIDE_NS, name.clone(), value.clone());
        match self.store().side_write_deferred(&[write]) {
            Ok(_) if self.poisoned => Err("side write succeeded on a poisoned store".into()),
            Ok(pending) => {
                if pending.is_done() {
                    return Err("a side write came without a write to wait for".into());
                }
                let before = self.model.clone();
                self.model.side.insert(name.clone(), value);
                self.unacked(Touch::Side(name), before);
                Ok(())
            }
            // Appending writes nothing to disk, so only an earlier poisoning can refuse it.
            Err(e) => self.failed("side write", e, None),
        }
    }

    /// See [`Step::RotationRace`].
    fn rotation_race(
        &mut self,
        scope: usize,
        key: usize,
        fp: u8,
        ttl_s: u64,
    ) -> Result<(), String> {
        use std::sync::atomic::{AtomicBool, Ordering};
        type Claimed = std::thread::JoinHandle<crate::Result<ClaimOutcome>>;
        if self.poisoned {
            return Ok(());
        }
        let store = self.store().clone();
        // Everything durable first: a racing claim of a record not durable yet would wait for a
        // flush before it appends, and the rotation's first phase, held in the hook below until
        // the claim appends, keeps that flush from happening; the two would wait on each other
        // until the hook's deadline (30 s: a fuzz input found it).
        if let Err(e) = store.sync() {
            return self.failed("sync before the rotation race", e, None);
        }
        self.acknowledged();
        let racer: Arc<parking_lot::Mutex<Option<Claimed>>> = Arc::default();
        let fired = Arc::new(AtomicBool::new(false));
        let hung = Arc::new(AtomicBool::new(false));
        let (hook_store, hook_fs) = (store.clone(), self.fs.clone());
        let (hook_racer, hook_fired) = (Arc::clone(&racer), Arc::clone(&fired));
        let hook_hung = Arc::clone(&hung);
        self.fs.on_next(FaultOp::Create, ".seg", move || {
            hook_fired.store(true, Ordering::SeqCst);
            // The rotation is in its first phase, writer unlocked: the racing claim appends to the
            // old segment and then waits for the flush the rotation's second phase makes.
            let frames = &hook_store.core().writer.counters.frames;
            let before = frames.load(Ordering::SeqCst);
            let claimer = hook_store.clone();
            let handle = std::thread::spawn(move || {
                claimer.claim(
                    SCOPES[scope].as_bytes(),
                    KEYS[key].as_bytes(),
                    &fingerprint(fp),
                    Duration::from_secs(ttl_s),
                )
            });
            // Not a timing assumption: the loop ends when the claim has appended or has returned
            // without appending (a replay, a mismatch); the deadline only guards against a hang.
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            let appended = loop {
                if frames.load(Ordering::SeqCst) > before {
                    break true;
                }
                if handle.is_finished() {
                    break false;
                }
                if std::time::Instant::now() > deadline {
                    hook_hung.store(true, Ordering::SeqCst);
                    break false;
                }
                std::thread::yield_now();
            };
            if appended {
                // Creation, header write, header fdatasync, directory fsync and the second phase's
                // write of the racing frame succeed; the old segment's final fdatasync does not.
                hook_fs.crash_after(5);
            }
            *hook_racer.lock() = Some(handle);
        });
        let filler = vec![0u8; (self.segment_size / 8) as usize];
        let mut filled = Ok(());
        for i in 0..64 {
            if fired.load(Ordering::SeqCst) {
                break;
            }
            filled = store.side_write(&[SideWrite::put("filler", format!("f{i}"), filler.clone())]);
            if filled.is_err() {
                break;
            }
        }
        self.fs.clear_hooks();
        let claimed = racer.lock().take();
        if let Some(handle) = claimed {
            let result = handle
                .join()
                .map_err(|_| "racing claim panicked".to_owned())?;
            self.claimed(scope, key, fp, ttl_s, result)?;
        }
        if hung.load(Ordering::SeqCst) {
            return Err(
                "the racing claim neither appended nor returned while the rotation waited".into(),
            );
        }
        match filled {
            Err(e) if e.is_poisoned() => {
                self.poisoned = true;
                Ok(())
            }
            Err(e) => Err(format!("filler side write: {e}")),
            Ok(()) => {
                // The filler's writes were waited for, and everything before them with them.
                self.acknowledged();
                Ok(())
            }
        }
    }

    /// Checks the outcome of a claim of (scope, key) made now against the model, and applies it.
    fn claimed(
        &mut self,
        scope: usize,
        key: usize,
        fp: u8,
        ttl_s: u64,
        result: crate::Result<ClaimOutcome>,
    ) -> Result<(), String> {
        let id = (scope, key);
        let now = self.now();
        let mono = self.monotonic();
        self.expiries.push(now + ttl_s * 1000);
        let acquire = |takeover: Option<Takeover>| (takeover, ttl_s);
        let expected = match self.model.live(id, now) {
            Some(r) if r.fp != fp => Expect::Mismatch,
            Some(MRecord {
                state: MState::Completed(resp),
                ..
            }) => Expect::Completed(resp.clone()),
            Some(MRecord {
                state:
                    MState::InProgress {
                        deadline: Some(deadline),
                        ..
                    },
                ..
            }) if *deadline > mono => Expect::InProgress(*deadline - mono),
            Some(_) => Expect::Acquire(acquire(Some(Takeover::LeaseExpired))),
            None if self.model.records.contains_key(&id) => {
                Expect::Acquire(acquire(Some(Takeover::Expired)))
            }
            None => Expect::Acquire(acquire(None)),
        };
        let mut applied = self.model.clone();
        let token_index = self.tokens.len();
        applied.records.insert(
            id,
            MRecord {
                fp,
                fence: None,
                created: now,
                expires: now + ttl_s * 1000,
                state: MState::InProgress {
                    lease_until: now + LEASE.as_millis() as u64,
                    deadline: Some(mono + LEASE.as_millis() as u64),
                    holder: Some(token_index),
                },
            },
        );
        let outcome = match result {
            Ok(outcome) => outcome,
            Err(e) => {
                if self.poisoned {
                    return self.failed("claim", e, None);
                }
                let doubt = matches!(expected, Expect::Acquire(_)).then(|| {
                    // The token was never handed out, so if the claim landed nobody holds it.
                    let mut applied = applied.clone();
                    if let Some(MRecord {
                        state: MState::InProgress { holder, .. },
                        ..
                    }) = applied.records.get_mut(&id)
                    {
                        *holder = None;
                    }
                    InDoubt { applied }
                });
                return self.failed("claim", e, doubt);
            }
        };
        if self.poisoned {
            return Err(format!("claim succeeded on a poisoned store: {outcome:?}"));
        }
        match (expected, outcome) {
            (Expect::Mismatch, ClaimOutcome::Mismatch) => Ok(()),
            (Expect::Completed(want), ClaimOutcome::Completed(got)) if want == got => Ok(()),
            (Expect::InProgress(left), ClaimOutcome::InProgress { retry_after })
                if retry_after == Duration::from_millis(left) =>
            {
                Ok(())
            }
            (Expect::Acquire((takeover, _)), ClaimOutcome::Acquired(token)) => {
                let takeover_ok = token.takeover() == takeover
                    // A sweep may already have dropped an expired record.
                    || (takeover == Some(Takeover::Expired) && token.takeover().is_none());
                if !takeover_ok {
                    return Err(format!(
                        "claim {id:?}: takeover {:?}, model {takeover:?}",
                        token.takeover()
                    ));
                }
                if token.fence() <= self.last_fence {
                    return Err(format!(
                        "fence {} not above previous {}",
                        token.fence(),
                        self.last_fence
                    ));
                }
                self.last_fence = token.fence();
                let fence = token.fence();
                self.tokens.push((id, token));
                self.model = applied;
                if let Some(r) = self.model.records.get_mut(&id) {
                    r.fence = Some(fence);
                }
                Ok(())
            }
            (expected, got) => Err(format!("claim {id:?}: store {got:?}, model {expected:?}")),
        }
    }

    fn complete(
        &mut self,
        index: usize,
        status: u16,
        body_len: u8,
        side: bool,
    ) -> Result<(), String> {
        let (id, token) = self.tokens[index].clone();
        let now = self.now();
        let response = StoredResponse::new(status, vec![b'x'; usize::from(body_len)])
            .with_header("Content-Type", "application/json")
            .with_header("Location", format!("/invoices/{index}"));
        let side_key = side_key(id.1);
        let side_value = Bytes::from(format!("invoice {index}"));
        let writes: Vec<SideWrite> = if side {
            vec![SideWrite::put(
                SIDE_NS,
                side_key.clone(),
                side_value.clone(),
            )]
        } else {
            Vec::new()
        };
        let held = self.model.held(id, index, now);
        let mut applied = self.model.clone();
        if let Some(r) = applied.records.get_mut(&id) {
            r.state = MState::Completed(response.clone());
        }
        if side {
            applied.side.insert(side_key, side_value);
        }
        match self.store().complete(&token, &response, &writes) {
            Ok(()) if self.poisoned => Err("complete succeeded on a poisoned store".into()),
            Ok(()) if held => {
                self.model = applied;
                self.acknowledged();
                Ok(())
            }
            Ok(()) => Err(format!(
                "complete of token {index} for {id:?} succeeded; model says lost"
            )),
            Err(crate::Error::LeaseLost { .. }) if !held && !self.poisoned => Ok(()),
            Err(e) => {
                let doubt = held.then_some(InDoubt { applied });
                self.failed("complete", e, doubt)
            }
        }
    }

    fn release(&mut self, index: usize) -> Result<(), String> {
        let (id, token) = self.tokens[index].clone();
        let held = self.model.held(id, index, self.now());
        let mut applied = self.model.clone();
        applied.records.remove(&id);
        match self.store().release(&token) {
            Ok(()) if self.poisoned => Err("release succeeded on a poisoned store".into()),
            Ok(()) if held => {
                self.model = applied;
                self.acknowledged();
                Ok(())
            }
            Ok(()) => Err(format!(
                "release of token {index} succeeded; model says lost"
            )),
            Err(crate::Error::LeaseLost { .. }) if !held && !self.poisoned => Ok(()),
            Err(e) => {
                let doubt = held.then_some(InDoubt { applied });
                self.failed("release", e, doubt)
            }
        }
    }

    fn extend(&mut self, index: usize) -> Result<(), String> {
        let (id, token) = self.tokens[index].clone();
        let now = self.now();
        let held = self.model.held(id, index, now);
        let mut applied = self.model.clone();
        if let Some(MRecord {
            state:
                MState::InProgress {
                    lease_until,
                    deadline,
                    ..
                },
            ..
        }) = applied.records.get_mut(&id)
        {
            *lease_until = now + LEASE.as_millis() as u64;
            *deadline = Some(self.monotonic() + LEASE.as_millis() as u64);
        }
        match self.store().extend(&token) {
            Ok(_) if self.poisoned => Err("extend succeeded on a poisoned store".into()),
            Ok(_) if held => {
                self.model = applied;
                self.acknowledged();
                Ok(())
            }
            Ok(_) => Err(format!(
                "extend of token {index} succeeded; model says lost"
            )),
            Err(crate::Error::LeaseLost { .. }) if !held && !self.poisoned => Ok(()),
            Err(e) => {
                let doubt = held.then_some(InDoubt { applied });
                self.failed("extend", e, doubt)
            }
        }
    }

    /// Compares what `get` shows for one key with the model.
    fn check_key(&mut self, id: (usize, usize)) -> Result<(), String> {
        let store = self.store().clone();
        self.check_key_in(&store, id, &self.model)
    }

    fn check_key_in(&self, store: &Store, id: (usize, usize), model: &Model) -> Result<(), String> {
        let now = self.now();
        let got = store.get(SCOPES[id.0].as_bytes(), KEYS[id.1].as_bytes());
        let got = match got {
            Err(e) if e.is_poisoned() && self.poisoned => return Ok(()),
            Err(e) => return Err(format!("get {id:?}: {e}")),
            Ok(got) => got,
        };
        if self.poisoned {
            return Err("get succeeded on a poisoned store".into());
        }
        let want = model.live(id, now);
        match (got, want) {
            (None, None) => Ok(()),
            (Some(g), Some(w)) => {
                let state_ok = match (&g.state, &w.state) {
                    (
                        RecordState::InProgress { lease_until_ms },
                        MState::InProgress { lease_until, .. },
                    ) => lease_until_ms == lease_until,
                    (RecordState::Completed(a), MState::Completed(b)) => a == b,
                    _ => false,
                };
                if state_ok
                    && g.fingerprint == fingerprint(w.fp)
                    && g.created_at_ms == w.created
                    && w.fence.is_none_or(|f| f == g.fence)
                    && g.expires_at_ms == w.expires
                {
                    Ok(())
                } else {
                    Err(format!("get {id:?}: store {g:?}, model {w:?}"))
                }
            }
            (g, w) => Err(format!("get {id:?}: store {g:?}, model {w:?}")),
        }
    }

    fn reopen(&mut self, crash: Option<CrashMode>) -> Result<(), String> {
        let store = self.store.take().expect("open store");
        match crash {
            None if !self.poisoned => match store.close() {
                Ok(()) => {}
                // The close's flush is the first wait for unacknowledged writes: it may be what an
                // injected fault hits. They are then in doubt, as after any failed flush.
                Err(e) if e.is_poisoned() && !self.worlds.is_empty() => self.poisoned = true,
                Err(e) => return Err(format!("close: {e}")),
            },
            None => {
                let _ = store.close();
            }
            Some(mode) => self.fs.crash(mode),
        }
        drop(store);
        // A crash ends the process that held the tokens: they are gone, and so is every holder
        // that names one, in whichever world the store comes back (token indices are reused).
        let mut tokens_lost = crash.is_some();
        let store = match self.open_store() {
            Ok(store) => store,
            // An injected fault may hit the truncation or segment creation during open; a crash clears
            // it, as a restart would.
            Err(e) if e.is_poisoned() || matches!(e, crate::Error::Io { .. }) => {
                self.fs.crash(CrashMode::DropUnsynced);
                tokens_lost = true;
                self.open_store()
                    .map_err(|e| format!("open after crash: {e}"))?
            }
            Err(e) => return Err(format!("open: {e}")),
        };
        if tokens_lost {
            self.tokens.clear();
            self.model.forget_holders();
        }
        self.store = Some(store);
        let was_poisoned = std::mem::replace(&mut self.poisoned, false);
        // The worlds the reopened store may show. A clean close of a healthy store syncs
        // everything, so only the model itself; otherwise any world the unacknowledged writes
        // allow (latest first), and last the world with the operation in doubt, if any. The worlds
        // without it are tried first: they know the fence of every record, while the world with it
        // cannot know the fence of a claim whose token was never handed out, so only they can tell
        // the worlds apart when they look alike otherwise.
        let mut candidates: Vec<Model> = if crash.is_none() && !was_poisoned {
            vec![self.model.clone()]
        } else {
            self.possible_worlds().into_iter().cloned().collect()
        };
        self.worlds.clear();
        if let Some(doubt) = self.in_doubt.take() {
            candidates.push(doubt.applied);
        }
        // Fences keep growing whichever world this is: the store hands them out below a durable
        // floor, so not even a claim lost in the crash has its fence handed out again.
        let mut first_error = None;
        for mut candidate in candidates {
            candidate.end_leases();
            if tokens_lost {
                candidate.forget_holders();
            }
            self.model = candidate;
            match self.check_all() {
                Ok(()) => return Ok(()),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        Err(first_error.unwrap_or_default())
    }
}

#[derive(Debug)]
enum Expect {
    Mismatch,
    Completed(StoredResponse),
    InProgress(u64),
    Acquire((Option<Takeover>, u64)),
}

/// The fingerprint for model fingerprint `n`: 0 and 1 share their first 8 bytes, as do 2 and 3, so the
/// store's in-memory prefix cannot tell them apart and must read the full fingerprint from the log.
fn fingerprint(n: u8) -> Fingerprint {
    let mut fp = [n; 32];
    fp[..8].fill(n / 2);
    Fingerprint(fp)
}

fn side_key(key: usize) -> String {
    format!("inv-{}", KEYS[key])
}
