//! The store interface the idempotency layer owns, and that every backend implements.
//!
//! The layer, and the handlers that write business records through it, talk only to
//! [`IdempotencyStore`]; the embedded engine and PostgreSQL ([`crate::backends`]) implement it.
//! Nothing above this trait knows which backend it runs on.
//!
//! What every implementation guarantees (the conformance suite, `testkit::conformance` behind the
//! `testkit` feature, checks them against any store):
//! - **claim** is atomic per `(scope, key)`: of any number of concurrent claims exactly one is
//!   [`Claim::Acquired`]; a record past its TTL, or an in-progress claim whose lease ran out,
//!   is taken over with a strictly larger fencing token;
//! - **complete** stores the response *and* the business records ([`RecordWrite`]) atomically, and
//!   only while the token still holds the key; otherwise it writes nothing and fails with
//!   [`StoreError::LeaseLost`];
//! - **release** and **extend** are guarded by the token the same way;
//! - **durability**, in the backend's terms (the engine's durability mode; a committed PostgreSQL
//!   transaction):
//!   - `complete`, `release` and `write_records` return `Ok` only once what they wrote is durable,
//!     so a response is never sent for a record that a crash could lose;
//!   - writes become durable in the order their calls returned: whatever a call wrote is durable
//!     once a later call's write is. `claim` and `insert_once` may therefore return before their
//!     own write is durable (the embedded engine does, the database does not): the request that
//!     made them ends with a `complete` or `release`, whose wait covers them, and a crash before
//!     that loses them together with a request that never got an answer;
//!   - anything a call *shows* (a replayed response, a mismatch, a claim in progress, an existing
//!     record) is durable: nobody acts on what a crash could take back;
//! - a scope never sees another scope's keys: `(scope, key)` pairs are compared as pairs, never
//!   joined into one ambiguous string.
//!
//! Times: TTLs and leases are measured by the backend (the engine's clocks, the database's `now()`),
//! never by the caller.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
pub use idemlog::{Fingerprint, StoredResponse, Takeover};

/// Proof of an acquired claim, handed back to complete, release or extend it.
#[derive(Clone)]
pub struct HeldClaim {
    /// The scope the claim was made in.
    pub scope: String,
    /// The idempotency key.
    pub key: String,
    /// The fencing token: strictly larger than that of any earlier claim of this key.
    pub fence: u64,
    /// Set when the claim replaced an existing record.
    pub takeover: Option<Takeover>,
    /// When the key expires, in ms since the Unix epoch as the backend's clock reads it; downstream
    /// keys derived from this one should live as long.
    pub expires_at_ms: u64,
    /// Backend-specific state (the engine's own token); opaque to everyone else.
    pub handle: Option<Arc<dyn Any + Send + Sync>>,
}

impl fmt::Debug for HeldClaim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeldClaim")
            .field("scope", &self.scope)
            .field("key", &self.key)
            .field("fence", &self.fence)
            .field("takeover", &self.takeover)
            .field("expires_at_ms", &self.expires_at_ms)
            .finish()
    }
}

/// What a claim found.
#[derive(Debug, Clone)]
pub enum Claim {
    /// The caller owns the key and must complete or release it (or let the lease run out).
    Acquired(HeldClaim),
    /// Another claim with the same fingerprint is running; its lease has `lease_left` to run.
    InProgress {
        /// Time left on the running claim's lease.
        lease_left: Duration,
    },
    /// The key was completed with the same fingerprint: replay this response.
    Completed(StoredResponse),
    /// The key is held or completed with a different fingerprint.
    Mismatch {
        /// The request digest stored with the key's record ([`ClaimExtras::request_digest`]), if
        /// it has one: the layer compares it with the new request's to name the differing fields.
        request_digest: Option<Bytes>,
    },
    /// The key is new and the scope already holds [`ClaimExtras::max_live_keys`] live keys:
    /// nothing was claimed or written.
    QuotaExceeded {
        /// Time until the scope's next live key expires (at least 1 ms).
        retry_after: Duration,
    },
}

/// The optional parts of a claim ([`IdempotencyStore::claim_with`]).
#[derive(Clone, Copy, Default)]
pub struct ClaimExtras<'a> {
    /// Stored with the record (never in memory): the per-member digests of the request, returned
    /// by a later [`Claim::Mismatch`]; at most 8 KiB; `None`: none. A function, called only when
    /// the backend needs the bytes: the embedded store only for a claim that writes a record (a
    /// new, expired or taken-over key), never for a replay, a 409 or a mismatch; PostgreSQL, whose
    /// claim is one statement, before sending it. The layer passes one that hashes the request
    /// (`digest.rs`).
    pub request_digest: Option<&'a (dyn Fn() -> Bytes + Sync)>,
    /// A claim of a *new* key (none, or only an expired one) is refused with
    /// [`Claim::QuotaExceeded`] while the scope holds this many live keys. Exact under
    /// concurrency (across processes, for a shared backend); `None`: no limit.
    pub max_live_keys: Option<u64>,
}

impl std::fmt::Debug for ClaimExtras<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimExtras")
            .field("request_digest", &self.request_digest.map(|_| "fn"))
            .field("max_live_keys", &self.max_live_keys)
            .finish()
    }
}

/// The state of one key, as [`IdempotencyStore::get`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    /// Fingerprint of the request that claimed the key.
    pub fingerprint: Fingerprint,
    /// The claim's fencing token.
    pub fence: u64,
    /// When the key was claimed (ms since the Unix epoch, backend clock).
    pub created_at_ms: u64,
    /// When the record stops counting (ms since the Unix epoch, backend clock).
    pub expires_at_ms: u64,
    /// In progress or completed.
    pub state: KeyState,
}

/// The two states of a live key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyState {
    /// A handler is running; its lease has `lease_left` to run (zero: a retry may take it over).
    InProgress {
        /// Time left on the lease.
        lease_left: Duration,
    },
    /// Completed with this response.
    Completed(StoredResponse),
}

/// How long a business record lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// Forever (until removed).
    Never,
    /// For this long from the write, by the backend's clock.
    After(Duration),
    /// Until this instant (ms since the Unix epoch, backend clock): a record derived from a claim
    /// lives exactly as long as the claim's key ([`HeldClaim::expires_at_ms`]).
    AtMs(u64),
}

/// One business-record write: a value put under `(namespace, key)`, or removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordWrite {
    /// The record family (`orders`, `invoices`).
    pub namespace: &'static str,
    /// The record's key inside its namespace.
    pub key: String,
    /// The value; `None` removes the record.
    pub value: Option<Bytes>,
    /// How long the value lives.
    pub expiry: Expiry,
}

impl RecordWrite {
    /// Puts `value` under `(namespace, key)` for good.
    pub fn put(namespace: &'static str, key: impl Into<String>, value: impl Into<Bytes>) -> Self {
        Self {
            namespace,
            key: key.into(),
            value: Some(value.into()),
            expiry: Expiry::Never,
        }
    }

    /// Puts `value` under `(namespace, key)` until `expiry`.
    pub fn put_until(
        namespace: &'static str,
        key: impl Into<String>,
        value: impl Into<Bytes>,
        expiry: Expiry,
    ) -> Self {
        Self {
            namespace,
            key: key.into(),
            value: Some(value.into()),
            expiry,
        }
    }
}

/// What [`IdempotencyStore::insert_once`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InsertOnce {
    /// The record was new: it was written, and the counter (if any) went up by one.
    Inserted,
    /// A live record was already there: nothing was written; this is its value.
    Existing(Bytes),
}

/// Whether a backend can serve requests right now (`/healthz`, `/readyz`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// Serving.
    Ready,
    /// Not serving; requests get 503. The reason is for logs and operators, never for clients.
    Unavailable(String),
}

/// One number for `/metrics`.
#[derive(Debug, Clone, PartialEq)]
pub struct Gauge {
    /// Metric name (`idemlog_records`).
    pub name: &'static str,
    /// Help text.
    pub help: &'static str,
    /// Current value.
    pub value: f64,
}

/// One histogram for `/metrics` (a backend's latencies or batch sizes), as read at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramMetric {
    /// Metric name (`idemlog_fdatasync_duration_seconds`); several entries may share one name
    /// with different `label` values.
    pub name: &'static str,
    /// Help text.
    pub help: &'static str,
    /// One label (`statement="claim"`), if any.
    pub label: Option<(&'static str, &'static str)>,
    /// Inclusive upper bound of each bucket, ascending.
    pub bounds: Vec<f64>,
    /// Observations per bucket, not cumulative, with one extra last element for those above the
    /// last bound.
    pub counts: Vec<u64>,
    /// Sum of the observations.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
}

impl HistogramMetric {
    /// An engine histogram under `name`.
    pub fn from_engine(
        name: &'static str,
        help: &'static str,
        snapshot: idemlog::HistogramSnapshot,
    ) -> Self {
        Self {
            name,
            help,
            label: None,
            bounds: snapshot.bounds,
            counts: snapshot.counts,
            sum: snapshot.sum,
            count: snapshot.count,
        }
    }
}

/// Why a store call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The token no longer holds its key (taken over after its lease ran out, released, completed
    /// or expired); nothing was written.
    #[error("claim on scope {scope:?} key {key:?} (fence {fence}) no longer holds the key")]
    LeaseLost {
        /// The scope.
        scope: String,
        /// The key.
        key: String,
        /// The refused fencing token.
        fence: u64,
    },
    /// The input cannot be stored (too large, empty): the caller's data, not the store, is at fault.
    #[error("cannot be stored: {0}")]
    Rejected(String),
    /// The backend cannot serve now (disk full, poisoned after an I/O failure, database down, no
    /// pooled connection in time): answer 503; it heals by itself.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A stored record does not parse, or another fault that retrying will not fix.
    #[error("store failed: {0}")]
    Internal(String),
}

impl StoreError {
    /// Short class of the failure for clients and metrics; never contains paths, hosts or OS text.
    pub fn class(&self) -> &'static str {
        match self {
            StoreError::LeaseLost { .. } => "lease-lost",
            StoreError::Rejected(_) => "rejected",
            StoreError::Unavailable(_) => "unavailable",
            StoreError::Internal(_) => "internal",
        }
    }
}

/// The interface of an idempotency store backend (see the module docs for the guarantees).
#[async_trait]
pub trait IdempotencyStore: Send + Sync + 'static {
    /// Atomically claims `(scope, key)` for a request with this fingerprint, for `ttl`; stores
    /// `extras.request_digest` with the record, and refuses a new key over `extras.max_live_keys`.
    async fn claim_with(
        &self,
        scope: &str,
        key: &str,
        fingerprint: &Fingerprint,
        ttl: Duration,
        extras: &ClaimExtras<'_>,
    ) -> Result<Claim, StoreError>;

    /// [`IdempotencyStore::claim_with`] without a digest or a quota.
    async fn claim(
        &self,
        scope: &str,
        key: &str,
        fingerprint: &Fingerprint,
        ttl: Duration,
    ) -> Result<Claim, StoreError> {
        self.claim_with(scope, key, fingerprint, ttl, &ClaimExtras::default())
            .await
    }

    /// Completes a held claim: stores `response` and writes `records` in one atomic step.
    async fn complete(
        &self,
        token: &HeldClaim,
        response: &StoredResponse,
        records: &[RecordWrite],
    ) -> Result<(), StoreError>;

    /// Gives the key up so a retry can run again.
    async fn release(&self, token: &HeldClaim) -> Result<(), StoreError>;

    /// Renews the claim's lease; returns its new length.
    async fn extend(&self, token: &HeldClaim) -> Result<Duration, StoreError>;

    /// The live record of `(scope, key)`, if any.
    async fn get(&self, scope: &str, key: &str) -> Result<Option<KeyRecord>, StoreError>;

    /// A live business record.
    async fn record(&self, namespace: &str, key: &str) -> Result<Option<Bytes>, StoreError>;

    /// Writes business records atomically, outside any claim (routes served without the layer).
    async fn write_records(&self, writes: &[RecordWrite]) -> Result<(), StoreError>;

    /// Writes `write` unless a live record is already under its `(namespace, key)`, and in the same
    /// atomic step adds one to the persisted counter `counter`: check-and-insert is atomic across
    /// every process sharing the store. What a handler needs to call a downstream system once per
    /// key: a write-once record under a key derived from the idempotency key (the downstream
    /// call's own dedup record), and an all-time count of such calls that never goes down.
    ///
    /// Like a claim, the insert may return before its write is durable (the request's completion
    /// or release covers it, see the module docs); an [`InsertOnce::Existing`] it returns is
    /// durable.
    async fn insert_once(
        &self,
        write: &RecordWrite,
        counter: &'static str,
    ) -> Result<InsertOnce, StoreError>;

    /// The persisted value of a counter that [`IdempotencyStore::insert_once`] adds to (never
    /// decreases; counts every process sharing the store).
    async fn counter(&self, name: &'static str) -> Result<u64, StoreError>;

    /// Whether the backend is serving now (readiness). Cheap: no I/O.
    fn health(&self) -> Health;

    /// Whether this process's own part of the store works (liveness). Cheap: no I/O. By default
    /// the same as [`IdempotencyStore::health`] (an embedded store's disk is part of the process);
    /// a backend whose state lives in a service shared by every instance answers
    /// [`Health::Ready`] here, so that an outage of that service does not restart every instance
    /// at once.
    fn liveness(&self) -> Health {
        self.health()
    }

    /// Backend numbers for `/metrics`.
    async fn gauges(&self) -> Vec<Gauge>;

    /// Backend histograms for `/metrics` (latencies, batch sizes). Cheap: no I/O.
    fn histograms(&self) -> Vec<HistogramMetric> {
        Vec::new()
    }

    /// A short name for logs (`embedded`, `postgres`).
    fn kind(&self) -> &'static str;

    /// Flushes and closes (shutdown).
    async fn close(&self) -> Result<(), StoreError>;
}

/// A shared store handle, as the layer, its handlers and their background tasks hold it.
pub type StoreHandle = Arc<dyn IdempotencyStore>;
