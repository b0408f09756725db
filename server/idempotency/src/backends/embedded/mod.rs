//! The embedded backend: [`IdempotencyStore`] on the idemlog engine in one data directory.
//!
//! It owns three things the engine does not:
//! - **where calls run** (`calls::StoreCalls`): inline under `Durability::None`, on the blocking pool
//!   when a call may wait for an fdatasync;
//! - **atomic check-and-insert with a counter** ([`IdempotencyStore::insert_once`]): one process
//!   owns the directory, so a striped mutex serialises the check and the write for keys of one
//!   stripe; the counter is kept in [`COUNTER_STRIPES`] side records (`{name}/{stripe:02}` in
//!   [`COUNTERS_NAMESPACE`]) written in the same atomic append as the record;
//! - **self-healing**: an I/O failure (a full disk, a failed fdatasync) poisons the engine, which then
//!   refuses all work, because after a failed fsync the kernel may have dropped dirty pages. This
//!   backend then reports [`Health::Unavailable`], closes the store and opens the directory again
//!   (full recovery from the log, exactly as at start-up) with capped exponential backoff until it
//!   opens *and* takes a small synced probe write (a disk still full fails it), and serves again
//!   without a process restart. Nothing acknowledged is lost: recovery
//!   keeps every synced frame, and only acknowledged work was synced.
//!
//! Invariant: at most one engine [`Store`] of the directory is open at a time (the engine's
//! directory lock enforces it); the healer closes the old one before it opens the new one, and
//! retries while straggling handles of the old one still hold the lock.
//!
//! Where each part lives: `calls` (where engine calls run), `counters` (persisted counters and the
//! locks of `insert_once`), `heal` (the reopen loop and its probe write), `convert` (the engine's
//! types to the store interface's), `metrics` (the engine's numbers as gauges and histograms). This
//! file holds the backend's state, the dispatch of engine calls with its error mapping, and the
//! [`IdempotencyStore`] implementation.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use idemlog::{Deferred, Durability, Options, Pending, RecoveredClaims, SideWrite, Store};
use parking_lot::{Mutex, RwLock};

mod calls;
mod convert;
mod counters;
mod heal;
mod metrics;

pub use self::counters::{COUNTER_STRIPES, COUNTERS_NAMESPACE, LEGACY_COUNTERS_NAMESPACE};
use crate::backends::embedded::calls::StoreCalls;
use crate::backends::embedded::convert::{engine_token, held_claim, side_write, side_writes};
use crate::backends::embedded::counters::{Counters, Stripe, counter_key, read_stripe, stripe_of};
use crate::store::{
    Claim, ClaimExtras, Fingerprint, Gauge, Health, HeldClaim, HistogramMetric, IdempotencyStore,
    InsertOnce, KeyRecord, KeyState, RecordWrite, StoreError, StoredResponse,
};

/// The embedded store. Cheap to clone.
#[derive(Clone)]
pub struct EmbeddedBackend {
    shared: Arc<Shared>,
}

struct Shared {
    dir: PathBuf,
    options: Options,
    /// The open store, or `None` while it is being reopened.
    current: RwLock<Option<Opened>>,
    /// Set while a healer task runs, so only one does.
    healing: AtomicBool,
    /// Why the store is out of service (for `/readyz` and logs).
    reason: Mutex<Option<String>>,
    /// Set by `close`: no healing after shutdown.
    closed: AtomicBool,
}

#[derive(Clone)]
struct Opened {
    store: Store,
    /// Where blocking engine calls run.
    calls: StoreCalls,
    counters: Arc<Counters>,
}

/// Whether a deferred call's caller waits for its own write to be durable before it returns.
///
/// Only a write whose effect leaves the process needs its own wait: the completion and the release
/// that precede a response. A claim and a write-once record (`insert_once`) are followed by the
/// request's completion or release, and the log makes frames durable in append order, so that
/// wait covers them; a crash before it loses them together with a request that never got an
/// answer (the engine's `DURABILITY.md`).
///
/// The exception is a store opened with [`RecoveredClaims::HeldUntilLeaseEnd`]: there the handler's
/// work leaves the process before the completion (a reverse proxy's upstream), and a claim lost in
/// a crash would let the first retry after the restart run that work a second time while the first
/// run may still be going. Such a store waits for the claim itself before the handler runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OwnWrite {
    /// Wait until the call's own write is durable.
    Wait,
    /// Return once it is applied; a later wait of the same request covers it.
    Covered,
}

impl EmbeddedBackend {
    /// Opens (creating if missing) the store in `dir`. Blocking: call it from a blocking context.
    pub fn open(dir: impl AsRef<Path>, options: Options) -> idemlog::Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        let store = Store::open(&dir, options.clone())?;
        Ok(Self::from_store(store, dir, options))
    }

    fn from_store(store: Store, dir: PathBuf, options: Options) -> Self {
        Self {
            shared: Arc::new(Shared {
                dir,
                options,
                current: RwLock::new(Some(Opened::new(store))),
                healing: AtomicBool::new(false),
                reason: Mutex::new(None),
                closed: AtomicBool::new(false),
            }),
        }
    }

    /// The engine store currently open (`None` while it is being reopened): for start-up reports,
    /// operator tools and tests.
    pub fn engine(&self) -> Option<Store> {
        self.shared
            .current
            .read()
            .as_ref()
            .map(|opened| opened.store.clone())
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// The durability mode the store runs in.
    pub fn durability(&self) -> Durability {
        self.shared.options.durability
    }

    /// The open store, or the 503 a caller gets while there is none.
    fn opened(&self) -> Result<Opened, StoreError> {
        match self.shared.current.read().as_ref() {
            Some(opened) => Ok(opened.clone()),
            None => Err(StoreError::Unavailable(
                self.shared
                    .reason
                    .lock()
                    .clone()
                    .unwrap_or_else(|| "the store is being reopened".to_owned()),
            )),
        }
    }

    /// Runs a blocking engine call where the durability mode allows, mapping its errors; an I/O
    /// failure takes the store out of service and starts healing.
    async fn call<T: Send + 'static>(
        &self,
        call: impl FnOnce(&Opened) -> idemlog::Result<T> + Send + 'static,
    ) -> Result<T, StoreError> {
        let opened = self.opened()?;
        let calls = opened.calls;
        let result = calls.run(move || call(&opened)).await;
        match result {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(self.engine_error(e)),
            Err(join) => Err(StoreError::Internal(format!("store task failed: {join}"))),
        }
    }

    /// Runs a deferred engine call: one that appends and applies its write without waiting for the
    /// disk, and answers [`Deferred::NotVisible`] rather than show a record that is not durable yet.
    /// Such an answer is waited for and the call made again; then the call's own write is waited for
    /// if `own` says so. The call runs on the calling task in every mode (see [`Self::wait_for`]).
    async fn call_deferred<T>(
        &self,
        own: OwnWrite,
        call: impl Fn(&Opened) -> idemlog::Result<Deferred<T>>,
    ) -> Result<T, StoreError> {
        let opened = self.opened()?;
        let result = async {
            loop {
                match call(&opened)? {
                    Deferred::NotVisible(pending) => Self::wait_for(&opened, pending).await?,
                    Deferred::Ready(value, pending) => {
                        if own == OwnWrite::Wait {
                            Self::wait_for(&opened, pending).await?;
                        }
                        return Ok(value);
                    }
                }
            }
        }
        .await;
        result.map_err(|e| self.engine_error(e))
    }

    /// Waits for `pending` as the durability mode requires, holding no thread for the disk:
    /// - `Sync`: the fdatasync, through the future the engine's committer thread resolves;
    /// - `Periodic`: the write to the OS, done here. At most a `pwrite` of the buffered frames (or
    ///   a wait for the one in progress); the engine runs the flusher's fdatasync apart from the
    ///   writes. A segment rotation is the rare, bounded exception, as under `None`;
    /// - `None`: nothing.
    async fn wait_for(opened: &Opened, pending: Pending) -> idemlog::Result<()> {
        match opened.store.durability() {
            Durability::Periodic(_) => opened.store.wait(pending),
            Durability::Sync | Durability::None => opened.store.durable(pending).await,
        }
    }

    fn engine_error(&self, e: idemlog::Error) -> StoreError {
        use idemlog::Error as E;
        match e {
            E::LeaseLost { scope, key, fence } => StoreError::LeaseLost { scope, key, fence },
            e @ (E::TooLarge { .. } | E::Empty(_) | E::InvalidArgument(_)) => {
                StoreError::Rejected(e.to_string())
            }
            e @ (E::Io { .. } | E::Poisoned(_)) => {
                self.start_healing(&e);
                StoreError::Unavailable(e.to_string())
            }
            e @ E::Closed => StoreError::Unavailable(e.to_string()),
            e => StoreError::Internal(e.to_string()),
        }
    }
}

impl Opened {
    fn new(store: Store) -> Self {
        Self {
            calls: StoreCalls::for_store(&store),
            store,
            counters: Arc::default(),
        }
    }
}

#[async_trait]
impl IdempotencyStore for EmbeddedBackend {
    async fn claim_with(
        &self,
        scope: &str,
        key: &str,
        fingerprint: &Fingerprint,
        ttl: Duration,
        extras: &ClaimExtras<'_>,
    ) -> Result<Claim, StoreError> {
        let options = idemlog::ClaimOptions {
            request_digest: extras.request_digest.map_or(
                idemlog::RequestDigest::Given(&[]),
                idemlog::RequestDigest::Lazy,
            ),
            max_live_per_scope: extras.max_live_keys,
        };
        // See `OwnWrite`: a claim whose holder's work outlives the process is on disk before the
        // work starts.
        let own = match self.shared.options.recovered_claims {
            RecoveredClaims::HeldUntilLeaseEnd => OwnWrite::Wait,
            RecoveredClaims::Abandoned => OwnWrite::Covered,
        };
        let outcome = self
            .call_deferred(own, |o| {
                let (scope, key) = (scope.as_bytes(), key.as_bytes());
                o.store
                    .claim_deferred(scope, key, fingerprint, ttl, &options)
            })
            .await?;
        Ok(match outcome {
            idemlog::ClaimOutcome::Acquired(token) => Claim::Acquired(held_claim(token)),
            idemlog::ClaimOutcome::InProgress { retry_after } => Claim::InProgress {
                lease_left: retry_after,
            },
            idemlog::ClaimOutcome::Completed(stored) => Claim::Completed(stored),
            // The engine answers a mismatch from memory when it can; the digest is in the log,
            // read only for this (rare) answer. The record may have changed in between: the
            // digest is then that of the record there now, as good a comparison for the client.
            idemlog::ClaimOutcome::Mismatch => {
                let (scope, key) = (scope.to_owned(), key.to_owned());
                let request_digest = self
                    .call(move |o| o.store.get(scope.as_bytes(), key.as_bytes()))
                    .await?
                    .and_then(|record| record.request_digest);
                Claim::Mismatch { request_digest }
            }
            idemlog::ClaimOutcome::QuotaExceeded { retry_after } => {
                Claim::QuotaExceeded { retry_after }
            }
        })
    }

    async fn complete(
        &self,
        token: &HeldClaim,
        response: &StoredResponse,
        records: &[RecordWrite],
    ) -> Result<(), StoreError> {
        let engine = engine_token(token)?;
        let now = self.shared.options.clock.now_ms();
        self.call_deferred(OwnWrite::Wait, |o| {
            let side = side_writes(records, now);
            let pending = o.store.complete_deferred(engine, response, &side)?;
            Ok(Deferred::Ready((), pending))
        })
        .await
    }

    async fn release(&self, token: &HeldClaim) -> Result<(), StoreError> {
        let engine = engine_token(token)?;
        self.call_deferred(OwnWrite::Wait, |o| {
            Ok(Deferred::Ready((), o.store.release_deferred(engine)?))
        })
        .await
    }

    async fn extend(&self, token: &HeldClaim) -> Result<Duration, StoreError> {
        let engine = engine_token(token)?.clone();
        self.call(move |o| o.store.extend(&engine)).await
    }

    async fn get(&self, scope: &str, key: &str) -> Result<Option<KeyRecord>, StoreError> {
        let (scope, key) = (scope.to_owned(), key.to_owned());
        let clock = Arc::clone(&self.shared.options.clock);
        self.call(move |o| {
            let Some(record) = o.store.get(scope.as_bytes(), key.as_bytes())? else {
                return Ok(None);
            };
            let state = match record.state {
                idemlog::RecordState::InProgress { lease_until_ms } => KeyState::InProgress {
                    lease_left: Duration::from_millis(
                        lease_until_ms.saturating_sub(clock.now_ms()),
                    ),
                },
                idemlog::RecordState::Completed(stored) => KeyState::Completed(stored),
            };
            Ok(Some(KeyRecord {
                fingerprint: record.fingerprint,
                fence: record.fence,
                created_at_ms: record.created_at_ms,
                expires_at_ms: record.expires_at_ms,
                state,
            }))
        })
        .await
    }

    async fn record(&self, namespace: &str, key: &str) -> Result<Option<Bytes>, StoreError> {
        let (ns, key) = (namespace.to_owned(), key.to_owned());
        self.call(move |o| o.store.side_get(ns.as_bytes(), key.as_bytes()))
            .await
    }

    async fn write_records(&self, writes: &[RecordWrite]) -> Result<(), StoreError> {
        let now = self.shared.options.clock.now_ms();
        self.call_deferred(OwnWrite::Wait, |o| {
            let pending = o.store.side_write_deferred(&side_writes(writes, now))?;
            Ok(Deferred::Ready((), pending))
        })
        .await
    }

    async fn insert_once(
        &self,
        write: &RecordWrite,
        counter: &'static str,
    ) -> Result<InsertOnce, StoreError> {
        let now = self.shared.options.clock.now_ms();
        // The insert's own write is covered by the wait of the request that made it (its
        // completion or release): see `OwnWrite`. An existing record is only shown once durable.
        self.call_deferred(OwnWrite::Covered, |o| {
            let stripe = stripe_of(write.namespace, &write.key);
            let stripes = o.counters.stripes(&o.store, counter)?;
            let mut count = stripes[stripe].lock();
            let ns = write.namespace.as_bytes();
            match o.store.side_get_deferred(ns, write.key.as_bytes())? {
                Deferred::NotVisible(pending) => return Ok(Deferred::NotVisible(pending)),
                Deferred::Ready(Some(existing), pending) => {
                    return Ok(Deferred::Ready(InsertOnce::Existing(existing), pending));
                }
                Deferred::Ready(None, _) => {}
            }
            let next = count.value + 1;
            let key = counter_key(counter, stripe);
            let put = SideWrite::put(
                COUNTERS_NAMESPACE,
                key.clone(),
                itoa::Buffer::new().format(next).to_owned(),
            );
            let pending = if count.legacy {
                // The stripe moves to the current namespace in this append (see `counters`).
                o.store.side_write_deferred(&[
                    side_write(write, now),
                    put,
                    SideWrite::remove(LEGACY_COUNTERS_NAMESPACE, key),
                ])?
            } else {
                o.store
                    .side_write_deferred(&[side_write(write, now), put])?
            };
            *count = Stripe {
                value: next,
                legacy: false,
            };
            Ok(Deferred::Ready(InsertOnce::Inserted, pending))
        })
        .await
    }

    async fn counter(&self, name: &'static str) -> Result<u64, StoreError> {
        // Read from the log, not from the in-memory copies: an increment whose charge record is not
        // durable yet must not be shown (a crash could still take both back).
        self.call(move |o| {
            (0..COUNTER_STRIPES)
                .map(|stripe| read_stripe(&o.store, name, stripe).map(|s| s.value))
                .sum()
        })
        .await
    }

    fn health(&self) -> Health {
        let poisoned = match self.shared.current.read().as_ref() {
            Some(opened) => opened.store.is_poisoned(),
            None => true,
        };
        if !poisoned {
            Health::Ready
        } else {
            // A background write (the flusher, a compaction) can poison the store while no request
            // is in flight: a probe must see that, and start the healing a request would have.
            if self.shared.current.read().is_some() {
                self.start_healing_poisoned();
            }
            Health::Unavailable(
                self.shared
                    .reason
                    .lock()
                    .clone()
                    .unwrap_or_else(|| "the store is closed".to_owned()),
            )
        }
    }

    async fn gauges(&self) -> Vec<Gauge> {
        // Running counts: O(1) in the number of keys, so no blocking task is needed.
        let Some(store) = self.engine() else {
            return Vec::new();
        };
        metrics::gauges(&store.metrics())
    }

    fn histograms(&self) -> Vec<HistogramMetric> {
        let Some(store) = self.engine() else {
            return Vec::new();
        };
        metrics::histograms(store.metrics())
    }

    fn kind(&self) -> &'static str {
        "embedded"
    }

    async fn close(&self) -> Result<(), StoreError> {
        self.shared.closed.store(true, Ordering::Release);
        let Some(store) = self.engine() else {
            return Ok(());
        };
        tokio::task::spawn_blocking(move || store.close())
            .await
            .map_err(|e| StoreError::Internal(format!("close task failed: {e}")))?
            .map_err(|e| StoreError::Unavailable(e.to_string()))
    }
}
