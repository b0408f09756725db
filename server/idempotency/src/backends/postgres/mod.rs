//! The PostgreSQL backend: one database shared by any number of server instances.
//!
//! [`PostgresBackend::connect`] opens a bounded pool ([`PgConfig`]), creates or migrates the schema
//! ([`schema`]), and starts two background tasks: the cleanup of expired rows ([`cleanup`]) and,
//! while the database is unreachable, a probe that lets [`IdempotencyStore::health`] recover by
//! itself.
//!
//! Every call is one statement in its own implicit transaction (see [`sql`]): claim, complete,
//! release, extend, insert_once and write_records each take one round trip when nothing races, and
//! return `Ok` only after the server has committed. (A complete or write_records that also removes
//! records adds a `DELETE` and runs both in one explicit transaction: CockroachDB refuses two
//! modifications of one table in one statement.) Serialization failures and deadlocks (SQLSTATE
//! 40001, 40P01) are retried a bounded number of times with jittered backoff; connection failures
//! become [`StoreError::Unavailable`] and mark the store unhealthy until a probe or a call succeeds;
//! other database errors are [`StoreError::Internal`]. All times are the database's `now()`.

mod cleanup;
mod config;
mod latency;
mod schema;
mod sql;
mod url;

use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use deadpool_postgres::{
    Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod, Runtime, TimeoutType,
};
use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio_postgres::NoTls;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tracing::{info, warn};

pub use cleanup::CleanupReport;
pub use config::{PgConfig, PgError};
pub use schema::SCHEMA_VERSION;
pub use url::redacted_url;

use crate::store::{
    Claim, ClaimExtras, Expiry, Fingerprint, Gauge, Health, HeldClaim, HistogramMetric,
    IdempotencyStore, InsertOnce, KeyRecord, KeyState, RecordWrite, StoreError, StoredResponse,
    Takeover,
};
use sql::{COMPLETED, IN_PROGRESS, Statements};

/// Attempts of one call when the database reports a serialization failure or deadlock, or a claim
/// finds the key changing under it.
const MAX_ATTEMPTS: u32 = 8;

/// Bound on all of [`PostgresBackend::connect`] (connection attempts and migration), so that a binary that
/// cannot reach its database exits within 30 s.
pub const STARTUP_DEADLINE: Duration = Duration::from_secs(25);

const MAX_NAMESPACE: usize = 255;
const MAX_RECORD_KEY: usize = 1024;
const MAX_HEADERS: usize = 64;
const MAX_HEADER_NAME: usize = 255;
const MAX_HEADER_VALUE: usize = 8 * 1024;

/// The PostgreSQL implementation of [`IdempotencyStore`]. Cheap to clone (one shared pool).
#[derive(Clone)]
pub struct PostgresBackend {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pool: Pool,
    sql: Statements,
    lease: Duration,
    lease_ms: i64,
    /// Client-side bound on one attempt of a call (pool wait, connect, statement).
    attempt_timeout: Duration,
    pool_wait: Duration,
    /// Set when the last database interaction failed with a connection error.
    down: AtomicBool,
    down_reason: Mutex<String>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    password: Option<Vec<u8>>,
    /// Statement latency for `/metrics`.
    latency: latency::StatementLatency,
}

/// Why one attempt of a call failed.
enum Fail {
    Pool(PoolError),
    Db(tokio_postgres::Error),
    /// The attempt outlived its client-side bound.
    TimedOut,
    /// The row changed between the statement's snapshot and its write: run the statement again.
    Stale,
    /// A final answer that is not a database failure (lease lost).
    Store(StoreError),
}

impl From<tokio_postgres::Error> for Fail {
    fn from(e: tokio_postgres::Error) -> Self {
        Fail::Db(e)
    }
}

/// How a database error is handled.
#[derive(Debug, PartialEq, Eq)]
enum Class {
    /// Serialization failure or deadlock: run the call again.
    Retry,
    /// The database cannot be reached: 503 and unhealthy until it answers again.
    Down,
    /// The database answered but cannot serve this call now (timeout, lock, resources): 503.
    Busy,
    /// A fault that retrying will not fix.
    Internal,
}

fn classify(e: &tokio_postgres::Error) -> Class {
    if let Some(code) = e.code() {
        if *code == SqlState::T_R_SERIALIZATION_FAILURE || *code == SqlState::T_R_DEADLOCK_DETECTED
        {
            return Class::Retry;
        }
        let c = code.code();
        return if c.starts_with("08") || c.starts_with("57P") || c.starts_with("28") {
            // Connection exceptions, admin/crash shutdown, cannot connect now, authentication.
            Class::Down
        } else if c == "57014" || c == "55P03" || c.starts_with("53") || c == "40003" {
            // Statement timeout, lock not available, insufficient resources, completion unknown.
            Class::Busy
        } else {
            Class::Internal
        };
    }
    let text = e.to_string();
    let internal = [
        "error serializing",
        "error deserializing",
        "invalid column",
        "query returned",
        "expected ",
        "invalid configuration",
        "invalid connection string",
    ];
    if internal.iter().any(|p| text.starts_with(p)) {
        Class::Internal
    } else {
        Class::Down
    }
}

/// A database error in one line: the server's code and message, or the driver's error and cause.
pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{} {}: {}", db.severity(), db.code().code(), db.message());
    }
    match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}

/// `base` doubled per attempt (capped at 64×), times a random factor in [0.5, 1.5).
pub(crate) fn jitter(base: Duration, attempt: u32) -> Duration {
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let factor = 0.5 + (random % 1000) as f64 / 1000.0;
    base.mul_f64(f64::from(1u32 << attempt.min(6)) * factor)
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn rejected(what: &str, problem: impl std::fmt::Display) -> StoreError {
    StoreError::Rejected(format!("{what} {problem}"))
}

fn check_text(what: &str, s: &str, max: usize) -> Result<(), StoreError> {
    if s.is_empty() {
        return Err(rejected(what, "is empty"));
    }
    if s.len() > max {
        return Err(rejected(
            what,
            format_args!("is {} bytes; at most {max}", s.len()),
        ));
    }
    if s.contains('\0') {
        return Err(rejected(what, "contains a NUL character"));
    }
    Ok(())
}

fn check_key(scope: &str, key: &str) -> Result<(), StoreError> {
    check_text("scope", scope, idemlog::MAX_SCOPE)?;
    check_text("idempotency key", key, idemlog::MAX_KEY)
}

fn check_write(w: &RecordWrite) -> Result<(), StoreError> {
    check_text("record namespace", w.namespace, MAX_NAMESPACE)?;
    check_text("record key", &w.key, MAX_RECORD_KEY)?;
    match &w.value {
        Some(v) if v.len() > idemlog::MAX_VALUE => Err(rejected(
            "record value",
            format_args!("is {} bytes; at most {}", v.len(), idemlog::MAX_VALUE),
        )),
        _ => Ok(()),
    }
}

fn check_response(r: &StoredResponse) -> Result<(), StoreError> {
    if r.headers.len() > MAX_HEADERS {
        return Err(rejected(
            "response",
            format_args!("has {} headers; at most {MAX_HEADERS}", r.headers.len()),
        ));
    }
    for (name, value) in &r.headers {
        check_text("header name", name, MAX_HEADER_NAME)?;
        if value.len() > MAX_HEADER_VALUE {
            return Err(rejected(
                "header value",
                format_args!("is {} bytes; at most {MAX_HEADER_VALUE}", value.len()),
            ));
        }
    }
    if r.body.len() > idemlog::MAX_VALUE {
        return Err(rejected(
            "response body",
            format_args!("is {} bytes; at most {}", r.body.len(), idemlog::MAX_VALUE),
        ));
    }
    Ok(())
}

/// Headers as stored in `keys.headers`: `[count u32]` then per header `[len u32][name][len u32][value]`
/// (big-endian lengths).
fn encode_headers(headers: &[(String, Bytes)]) -> Vec<u8> {
    let size: usize = headers.iter().map(|(n, v)| 8 + n.len() + v.len()).sum();
    let mut out = Vec::with_capacity(4 + size);
    out.extend_from_slice(&(headers.len() as u32).to_be_bytes());
    for (name, value) in headers {
        out.extend_from_slice(&(name.len() as u32).to_be_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(value.len() as u32).to_be_bytes());
        out.extend_from_slice(value);
    }
    out
}

fn decode_headers(bytes: &[u8]) -> Result<Vec<(String, Bytes)>, StoreError> {
    let bad = || StoreError::Internal("stored response headers do not parse".to_string());
    let mut rest = bytes;
    let mut take = |n: usize| -> Result<&[u8], StoreError> {
        if rest.len() < n {
            return Err(bad());
        }
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Ok(head)
    };
    let len = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
    let count = len(take(4)?);
    let mut headers = Vec::with_capacity(count.min(MAX_HEADERS));
    for _ in 0..count {
        let n = len(take(4)?);
        let name = String::from_utf8(take(n)?.to_vec()).map_err(|_| bad())?;
        let n = len(take(4)?);
        let value = Bytes::copy_from_slice(take(n)?);
        headers.push((name, value));
    }
    Ok(headers)
}

fn response_from(
    status: Option<i32>,
    headers: Option<Vec<u8>>,
    body: Option<Vec<u8>>,
) -> Result<StoredResponse, StoreError> {
    let status = status
        .and_then(|s| u16::try_from(s).ok())
        .ok_or_else(|| StoreError::Internal("completed key without a status".to_string()))?;
    Ok(StoredResponse {
        status,
        headers: decode_headers(headers.as_deref().unwrap_or(&0u32.to_be_bytes()))?,
        body: Bytes::from(body.unwrap_or_default()),
    })
}

/// Record writes as the arrays the statements unnest; the last write to a `(namespace, key)` wins.
#[derive(Default)]
struct WriteArrays<'a> {
    ns: Vec<&'a str>,
    keys: Vec<&'a str>,
    values: Vec<&'a [u8]>,
    after_ms: Vec<Option<i64>>,
    at_ms: Vec<Option<i64>>,
    del_ns: Vec<&'a str>,
    del_keys: Vec<&'a str>,
}

fn expiry_params(expiry: Expiry) -> (Option<i64>, Option<i64>) {
    match expiry {
        Expiry::Never => (None, None),
        Expiry::After(d) => (Some(millis(d)), None),
        Expiry::AtMs(ms) => (None, Some(to_i64(ms))),
    }
}

impl<'a> WriteArrays<'a> {
    fn new(writes: &'a [RecordWrite]) -> Result<Self, StoreError> {
        let mut last: HashMap<(&str, &str), usize> = HashMap::with_capacity(writes.len());
        for (i, w) in writes.iter().enumerate() {
            check_write(w)?;
            last.insert((w.namespace, w.key.as_str()), i);
        }
        let mut a = WriteArrays::default();
        for (i, w) in writes.iter().enumerate() {
            if last[&(w.namespace, w.key.as_str())] != i {
                continue;
            }
            match &w.value {
                Some(v) => {
                    let (after, at) = expiry_params(w.expiry);
                    a.ns.push(w.namespace);
                    a.keys.push(&w.key);
                    a.values.push(v);
                    a.after_ms.push(after);
                    a.at_ms.push(at);
                }
                None => {
                    a.del_ns.push(w.namespace);
                    a.del_keys.push(&w.key);
                }
            }
        }
        Ok(a)
    }
}

fn lease_lost(token: &HeldClaim) -> Fail {
    Fail::Store(StoreError::LeaseLost {
        scope: token.scope.clone(),
        key: token.key.clone(),
        fence: token.fence,
    })
}

/// Longest request digest stored with a key (the engine's limit too).
const MAX_REQUEST_DIGEST: usize = 8 * 1024;

/// What a row of the claim statement says.
fn claim_outcome(row: &tokio_postgres::Row, scope: &str, key: &str) -> Result<Claim, Fail> {
    if row.try_get::<_, bool>("quota_full")? {
        let wait = row
            .try_get::<_, Option<i64>>("next_expiry_ms")?
            .unwrap_or(1000);
        return Ok(Claim::QuotaExceeded {
            retry_after: Duration::from_millis(wait.max(1) as u64),
        });
    }
    let fence: i64 = row.try_get("fence")?;
    let expires_ms: i64 = row.try_get("expires_ms")?;
    if row.try_get::<_, bool>("acquired")? {
        let takeover = match row.try_get::<_, Option<i16>>("takeover")? {
            Some(1) => Some(Takeover::Expired),
            Some(2) => Some(Takeover::LeaseExpired),
            _ => None,
        };
        return Ok(Claim::Acquired(HeldClaim {
            scope: scope.to_string(),
            key: key.to_string(),
            fence: fence as u64,
            takeover,
            expires_at_ms: expires_ms.max(0) as u64,
            handle: None,
        }));
    }
    // The snapshot shows a record the upsert should have taken over: it changed in between
    // (another claim took it); look again.
    if row.try_get::<_, Option<bool>>("takeable")? == Some(true) {
        return Err(Fail::Stale);
    }
    if row.try_get::<_, Option<bool>>("same_fp")? != Some(true) {
        let digest: Option<Vec<u8>> = row.try_get("request_digest")?;
        return Ok(Claim::Mismatch {
            request_digest: digest.map(Bytes::from),
        });
    }
    match row.try_get::<_, Option<i16>>("state")? {
        Some(IN_PROGRESS) => Ok(Claim::InProgress {
            lease_left: Duration::from_millis(
                row.try_get::<_, Option<i64>>("lease_left_ms")?
                    .unwrap_or(0)
                    .max(0) as u64,
            ),
        }),
        Some(COMPLETED) => Ok(Claim::Completed(
            response_from(
                row.try_get("status")?,
                row.try_get("headers")?,
                row.try_get("body")?,
            )
            .map_err(Fail::Store)?,
        )),
        other => Err(Fail::Store(StoreError::Internal(format!(
            "key in unknown state {other:?}"
        )))),
    }
}

fn fence_of(token: &HeldClaim) -> i64 {
    to_i64(token.fence)
}

impl PostgresBackend {
    /// Connects (bounded: [`PgConfig::connect_attempts`] attempts of at most
    /// [`PgConfig::connect_timeout`] each), creates or migrates the schema, and starts the
    /// background cleanup ([`PgConfig::cleanup_interval`]) and the health probe. Errors name the
    /// database by [`redacted_url`], never with its password.
    pub async fn connect(config: PgConfig) -> Result<PostgresBackend, PgError> {
        config::validate_schema(&config.schema)?;
        if config.pool_size == 0 {
            return Err(PgError::Config("pool_size must be at least 1".into()));
        }
        if config.lease < Duration::from_millis(1) {
            return Err(PgError::Config("lease must be at least 1 ms".into()));
        }
        let shown = redacted_url(&config.url);
        let mut pg: tokio_postgres::Config =
            config
                .url
                .parse()
                .map_err(|e: tokio_postgres::Error| PgError::Url {
                    url: shown.clone(),
                    reason: match std::error::Error::source(&e) {
                        Some(cause) => url::scrub(&format!("{e}: {cause}"), None),
                        None => e.to_string(),
                    },
                })?;
        let password = pg.get_password().map(<[u8]>::to_vec);
        let statement_ms = millis(config.statement_timeout).max(1);
        let mut options = pg.get_options().unwrap_or_default().to_string();
        if !options.is_empty() {
            options.push(' ');
        }
        options.push_str(&format!(
            "-c statement_timeout={statement_ms} -c idle_in_transaction_session_timeout={}",
            statement_ms.saturating_mul(2)
        ));
        pg.options(options)
            .connect_timeout(config.connect_timeout)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(10))
            .keepalives_interval(Duration::from_secs(2))
            .keepalives_retries(3)
            .tcp_user_timeout(config.statement_timeout + Duration::from_secs(5));
        if pg.get_application_name().is_none() {
            pg.application_name("idemlog");
        }
        let manager = Manager::from_config(
            pg,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(config.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(config.pool_wait_timeout))
            .create_timeout(Some(config.connect_timeout + Duration::from_secs(1)))
            .recycle_timeout(Some(config.connect_timeout))
            .build()
            .map_err(|e| PgError::Config(e.to_string()))?;

        // Start-up: a bounded number of attempts, one second apart.
        let scrub = |s: String| url::scrub(&s, password.as_deref());
        let attempts = config.connect_attempts.max(1);
        let mut client = None;
        let mut last = String::new();
        let deadline = tokio::time::Instant::now() + STARTUP_DEADLINE;
        for attempt in 1..=attempts {
            let got = tokio::time::timeout_at(deadline, pool.get())
                .await
                .unwrap_or(Err(PoolError::Timeout(TimeoutType::Create)));
            match got {
                Ok(c) => {
                    client = Some(c);
                    break;
                }
                Err(e) => {
                    let fatal = match &e {
                        PoolError::Backend(db) => db.code().is_some_and(|c| {
                            let c = c.code();
                            c.starts_with("28") || c == "3D000"
                        }),
                        _ => false,
                    };
                    last = scrub(match &e {
                        PoolError::Backend(db) => describe(db),
                        PoolError::Timeout(_) => format!(
                            "no connection within {} ms",
                            config.connect_timeout.as_millis()
                        ),
                        other => other.to_string(),
                    });
                    warn!(database = %shown, attempt, attempts, error = %last, "cannot connect to the database");
                    if fatal {
                        break;
                    }
                    if attempt < attempts {
                        if tokio::time::Instant::now() + Duration::from_secs(1) >= deadline {
                            break;
                        }
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        }
        let Some(mut client) = client else {
            pool.close();
            return Err(PgError::Connect {
                url: shown,
                reason: last,
            });
        };
        let migrated =
            tokio::time::timeout_at(deadline, schema::migrate(&mut client, &config.schema))
                .await
                .unwrap_or_else(|_| {
                    Err(format!("not done within {} s", STARTUP_DEADLINE.as_secs()))
                })
                .map_err(scrub);
        if let Err(reason) = migrated {
            pool.close();
            return Err(PgError::Migrate {
                url: shown,
                schema: config.schema.clone(),
                reason,
            });
        }
        drop(client);
        info!(database = %shown, schema = %config.schema, pool = config.pool_size, "PostgreSQL store ready");

        let inner = Arc::new(Inner {
            pool,
            sql: Statements::new(&config.schema),
            lease: config.lease,
            lease_ms: millis(config.lease),
            attempt_timeout: config.pool_wait_timeout
                + config.connect_timeout
                + config.statement_timeout
                + Duration::from_secs(1),
            pool_wait: config.pool_wait_timeout,
            down: AtomicBool::new(false),
            down_reason: Mutex::new(String::new()),
            tasks: Mutex::new(Vec::new()),
            password,
            latency: latency::StatementLatency::default(),
        });
        let probe = tokio::spawn(cleanup::probe(Arc::downgrade(&inner)));
        inner.tasks.lock().push(probe);
        let store = PostgresBackend { inner };
        if let Some(interval) = config.cleanup_interval {
            store.spawn_cleanup(interval, config.cleanup_batch);
        }
        Ok(store)
    }

    /// Starts a background task that deletes expired keys and records every `interval`, `batch`
    /// rows per statement (`FOR UPDATE SKIP LOCKED`, so every instance may run one). It logs what it
    /// deleted, survives database errors, and stops on [`IdempotencyStore::close`] or when the
    /// store is dropped.
    pub fn spawn_cleanup(&self, interval: Duration, batch: u32) {
        let task = tokio::spawn(cleanup::run(
            Arc::downgrade(&self.inner),
            interval.max(Duration::from_millis(10)),
            batch,
        ));
        self.inner.tasks.lock().push(task);
    }

    /// One cleanup pass now: deletes expired rows, `batch` per statement, until none are left (or
    /// a pass-size cap is reached).
    pub async fn cleanup_once(&self, batch: u32) -> Result<CleanupReport, StoreError> {
        self.inner.cleanup_once(batch).await
    }

    /// The configured lease.
    pub fn lease(&self) -> Duration {
        self.inner.lease
    }
}

impl Inner {
    fn is_down(&self) -> bool {
        self.down.load(Ordering::Acquire)
    }

    fn mark_up(&self) {
        if self.down.swap(false, Ordering::AcqRel) {
            info!("PostgreSQL store healthy again");
        }
    }

    fn mark_down(&self, reason: &str) {
        *self.down_reason.lock() = reason.to_string();
        if !self.down.swap(true, Ordering::AcqRel) {
            warn!(
                error = reason,
                "PostgreSQL store unavailable: the database cannot be reached"
            );
        }
    }

    fn scrub(&self, s: String) -> String {
        url::scrub(&s, self.password.as_deref())
    }

    /// Runs `attempt` with a pooled connection, retrying serialization failures, deadlocks and
    /// stale reads a bounded number of times, and maps the outcome to the store's errors.
    async fn with_retry<T, F, Fut>(
        &self,
        what: &'static str,
        mut attempt: F,
    ) -> Result<T, StoreError>
    where
        F: FnMut(Object) -> Fut,
        Fut: Future<Output = Result<T, Fail>>,
    {
        let mut tries = 0;
        loop {
            tries += 1;
            let result = tokio::time::timeout(self.attempt_timeout, async {
                let client = self.pool.get().await.map_err(Fail::Pool)?;
                let started = std::time::Instant::now();
                let result = attempt(client).await;
                self.latency.observe(what, started.elapsed());
                result
            })
            .await
            .unwrap_or(Err(Fail::TimedOut));
            let retry = match &result {
                Err(Fail::Stale) => true,
                Err(Fail::Db(e)) => classify(e) == Class::Retry,
                _ => false,
            };
            if retry && tries < MAX_ATTEMPTS {
                tokio::time::sleep(jitter(Duration::from_millis(2), tries)).await;
                continue;
            }
            return self.settle(what, result);
        }
    }

    fn settle<T>(&self, what: &'static str, result: Result<T, Fail>) -> Result<T, StoreError> {
        let fail = match result {
            Ok(v) => {
                self.mark_up();
                return Ok(v);
            }
            Err(f) => f,
        };
        let error = match fail {
            Fail::Store(e) => {
                self.mark_up();
                return Err(e);
            }
            Fail::Stale => StoreError::Unavailable(format!(
                "{what}: the key kept changing under concurrent calls ({MAX_ATTEMPTS} attempts)"
            )),
            Fail::TimedOut => {
                let reason = format!("{what}: no answer from the database in time");
                self.mark_down(&reason);
                StoreError::Unavailable(reason)
            }
            Fail::Pool(PoolError::Timeout(TimeoutType::Wait)) => StoreError::Unavailable(format!(
                "{what}: no database connection free within {} ms",
                self.pool_wait.as_millis()
            )),
            Fail::Pool(PoolError::Timeout(_)) => {
                let reason = format!("{what}: connecting to the database timed out");
                self.mark_down(&reason);
                StoreError::Unavailable(reason)
            }
            Fail::Pool(PoolError::Closed) => {
                StoreError::Unavailable(format!("{what}: the store is closed"))
            }
            Fail::Pool(PoolError::Backend(e)) | Fail::Db(e) => {
                let detail = self.scrub(format!("{what}: {}", describe(&e)));
                match classify(&e) {
                    Class::Down => {
                        self.mark_down(&detail);
                        StoreError::Unavailable(detail)
                    }
                    Class::Busy | Class::Retry => {
                        self.mark_up();
                        StoreError::Unavailable(detail)
                    }
                    Class::Internal => {
                        self.mark_up();
                        StoreError::Internal(detail)
                    }
                }
            }
            Fail::Pool(other) => StoreError::Unavailable(format!("{what}: {other}")),
        };
        warn!(error = %error, "PostgreSQL store call failed");
        Err(error)
    }
}

#[async_trait]
impl IdempotencyStore for PostgresBackend {
    async fn claim_with(
        &self,
        scope: &str,
        key: &str,
        fingerprint: &Fingerprint,
        ttl: Duration,
        extras: &ClaimExtras,
    ) -> Result<Claim, StoreError> {
        check_key(scope, key)?;
        let ttl_ms = millis(ttl);
        if ttl_ms < 1 {
            return Err(StoreError::Rejected("ttl must be at least 1 ms".into()));
        }
        if extras
            .request_digest
            .as_ref()
            .is_some_and(|d| d.len() > MAX_REQUEST_DIGEST)
        {
            return Err(StoreError::Rejected(
                "request digest longer than 8 KiB".into(),
            ));
        }
        let inner = &*self.inner;
        let fp: &[u8] = &fingerprint.0;
        let digest: Option<&[u8]> = extras.request_digest.as_deref();
        let max_live = to_i64(extras.max_live_keys.unwrap_or(0));
        let lease_ms = inner.lease_ms;
        // A claim refused by the quota first deletes the scope's expired keys (they still count
        // until cleanup removes them) and, if that freed a place, tries once more.
        let mut purged = false;
        loop {
            let outcome = inner
                .with_retry("claim", |mut c| async move {
                    let stmt = c.prepare_cached(&inner.sql.claim).await?;
                    let tx = c.transaction().await?;
                    let rows = tx
                        .query(
                            &stmt,
                            &[&scope, &key, &fp, &ttl_ms, &lease_ms, &digest, &max_live],
                        )
                        .await?;
                    // No row: the key was written after this statement's snapshot; look again.
                    let Some(row) = rows.first() else {
                        tx.rollback().await?;
                        return Err(Fail::Stale);
                    };
                    let acquired: bool = row.try_get("acquired")?;
                    let inserted: bool =
                        row.try_get::<_, Option<bool>>("inserted")?.unwrap_or(false);
                    let bumped: bool = row.try_get::<_, Option<bool>>("bumped")?.unwrap_or(false);
                    // The count went up exactly when a row was inserted, or the key changed
                    // under the statement: undo and look again.
                    if bumped != (acquired && inserted) {
                        tx.rollback().await?;
                        return Err(Fail::Stale);
                    }
                    tx.commit().await?;
                    claim_outcome(row, scope, key)
                })
                .await?;
            match outcome {
                Claim::QuotaExceeded { .. } if !purged => {
                    purged = true;
                    let freed = inner
                        .with_retry("claim", |c| async move {
                            let stmt = c.prepare_cached(&inner.sql.purge_scope).await?;
                            let row = c.query_one(&stmt, &[&scope]).await?;
                            Ok(row.try_get::<_, i64>(0)?)
                        })
                        .await?;
                    if freed == 0 {
                        return Ok(outcome);
                    }
                }
                outcome => return Ok(outcome),
            }
        }
    }

    async fn complete(
        &self,
        token: &HeldClaim,
        response: &StoredResponse,
        records: &[RecordWrite],
    ) -> Result<(), StoreError> {
        check_response(response)?;
        let arrays = &WriteArrays::new(records)?;
        let headers = &encode_headers(&response.headers);
        let body: &[u8] = &response.body;
        let status = i32::from(response.status);
        let fence = fence_of(token);
        let (scope, key) = (token.scope.as_str(), token.key.as_str());
        let inner = &*self.inner;
        inner
            .with_retry("complete", |mut c| async move {
                let stmt = c.prepare_cached(&inner.sql.complete).await?;
                let a = arrays;
                let params: [&(dyn ToSql + Sync); 11] = [
                    &scope,
                    &key,
                    &fence,
                    &status,
                    headers,
                    &body,
                    &a.ns,
                    &a.keys,
                    &a.values,
                    &a.after_ms,
                    &a.at_ms,
                ];
                if a.del_ns.is_empty() {
                    // One statement: the response and the puts, or nothing.
                    let row = c.query_one(&stmt, &params).await?;
                    if row.try_get::<_, i64>(0)? == 0 {
                        return Err(lease_lost(token));
                    }
                    return Ok(());
                }
                // With removals: the same statement, then the deletes, in one transaction.
                let del = c.prepare_cached(&inner.sql.delete_records).await?;
                let tx = c.transaction().await?;
                let row = tx.query_one(&stmt, &params).await?;
                if row.try_get::<_, i64>(0)? == 0 {
                    tx.rollback().await?;
                    return Err(lease_lost(token));
                }
                tx.execute(&del, &[&a.del_ns, &a.del_keys]).await?;
                tx.commit().await?;
                Ok(())
            })
            .await
    }

    async fn release(&self, token: &HeldClaim) -> Result<(), StoreError> {
        let inner = &*self.inner;
        let fence = fence_of(token);
        let (scope, key) = (token.scope.as_str(), token.key.as_str());
        inner
            .with_retry("release", |c| async move {
                let stmt = c.prepare_cached(&inner.sql.release).await?;
                let row = c.query_one(&stmt, &[&scope, &key, &fence]).await?;
                match row.try_get::<_, i64>(0)? {
                    0 => Err(lease_lost(token)),
                    _ => Ok(()),
                }
            })
            .await
    }

    async fn extend(&self, token: &HeldClaim) -> Result<Duration, StoreError> {
        let inner = &*self.inner;
        let fence = fence_of(token);
        let lease_ms = inner.lease_ms;
        let (scope, key) = (token.scope.as_str(), token.key.as_str());
        inner
            .with_retry("extend", |c| async move {
                let stmt = c.prepare_cached(&inner.sql.extend).await?;
                match c.execute(&stmt, &[&scope, &key, &fence, &lease_ms]).await? {
                    0 => Err(lease_lost(token)),
                    _ => Ok(inner.lease),
                }
            })
            .await
    }

    async fn get(&self, scope: &str, key: &str) -> Result<Option<KeyRecord>, StoreError> {
        check_key(scope, key)?;
        let inner = &*self.inner;
        inner
            .with_retry("get", |c| async move {
                let stmt = c.prepare_cached(&inner.sql.get).await?;
                let Some(row) = c.query_opt(&stmt, &[&scope, &key]).await? else {
                    return Ok(None);
                };
                let fp: Vec<u8> = row.try_get("fingerprint")?;
                let fingerprint = Fingerprint(fp.try_into().map_err(|_| {
                    Fail::Store(StoreError::Internal(
                        "stored fingerprint is not 32 bytes".into(),
                    ))
                })?);
                let state = match row.try_get::<_, i16>("state")? {
                    IN_PROGRESS => KeyState::InProgress {
                        lease_left: Duration::from_millis(
                            row.try_get::<_, Option<i64>>("lease_left_ms")?
                                .unwrap_or(0)
                                .max(0) as u64,
                        ),
                    },
                    _ => KeyState::Completed(
                        response_from(
                            row.try_get("status")?,
                            row.try_get("headers")?,
                            row.try_get("body")?,
                        )
                        .map_err(Fail::Store)?,
                    ),
                };
                Ok(Some(KeyRecord {
                    fingerprint,
                    fence: row.try_get::<_, i64>("fence")? as u64,
                    created_at_ms: row.try_get::<_, i64>("created_ms")?.max(0) as u64,
                    expires_at_ms: row.try_get::<_, i64>("expires_ms")?.max(0) as u64,
                    state,
                }))
            })
            .await
    }

    async fn record(&self, namespace: &str, key: &str) -> Result<Option<Bytes>, StoreError> {
        check_text("record namespace", namespace, MAX_NAMESPACE)?;
        check_text("record key", key, MAX_RECORD_KEY)?;
        let inner = &*self.inner;
        inner
            .with_retry("record", |c| async move {
                let stmt = c.prepare_cached(&inner.sql.record).await?;
                let row = c.query_opt(&stmt, &[&namespace, &key]).await?;
                Ok(match row {
                    Some(row) => Some(Bytes::from(row.try_get::<_, Vec<u8>>(0)?)),
                    None => None,
                })
            })
            .await
    }

    async fn write_records(&self, writes: &[RecordWrite]) -> Result<(), StoreError> {
        if writes.is_empty() {
            return Ok(());
        }
        let arrays = &WriteArrays::new(writes)?;
        let inner = &*self.inner;
        inner
            .with_retry("write_records", |mut c| async move {
                let a = arrays;
                let puts = c.prepare_cached(&inner.sql.write_puts).await?;
                let del = c.prepare_cached(&inner.sql.delete_records).await?;
                let put_params: [&(dyn ToSql + Sync); 5] =
                    [&a.ns, &a.keys, &a.values, &a.after_ms, &a.at_ms];
                match (a.ns.is_empty(), a.del_ns.is_empty()) {
                    (false, true) => {
                        c.query_one(&puts, &put_params).await?;
                    }
                    (true, false) => {
                        c.execute(&del, &[&a.del_ns, &a.del_keys]).await?;
                    }
                    _ => {
                        let tx = c.transaction().await?;
                        tx.query_one(&puts, &put_params).await?;
                        tx.execute(&del, &[&a.del_ns, &a.del_keys]).await?;
                        tx.commit().await?;
                    }
                }
                Ok(())
            })
            .await
    }

    async fn insert_once(
        &self,
        write: &RecordWrite,
        counter: &'static str,
    ) -> Result<InsertOnce, StoreError> {
        check_write(write)?;
        check_text("counter name", counter, MAX_NAMESPACE)?;
        let Some(value) = write.value.as_deref() else {
            return Err(StoreError::Rejected(
                "insert_once needs a value, not a removal".into(),
            ));
        };
        let (after, at) = expiry_params(write.expiry);
        let (namespace, key) = (write.namespace, write.key.as_str());
        let inner = &*self.inner;
        inner
            .with_retry("insert_once", |c| async move {
                let stmt = c.prepare_cached(&inner.sql.insert_once).await?;
                let row = c
                    .query_one(&stmt, &[&namespace, &key, &value, &after, &at, &counter])
                    .await?;
                if row.try_get::<_, bool>("inserted")? {
                    return Ok(InsertOnce::Inserted);
                }
                match row.try_get::<_, Option<Vec<u8>>>("existing")? {
                    Some(v) => Ok(InsertOnce::Existing(Bytes::from(v))),
                    // Not inserted, yet no live record in this statement's snapshot: a concurrent
                    // insert committed after the snapshot, or the snapshot's record had expired
                    // and another call replaced it. Look again.
                    None => Err(Fail::Stale),
                }
            })
            .await
    }

    async fn counter(&self, name: &'static str) -> Result<u64, StoreError> {
        let inner = &*self.inner;
        inner
            .with_retry("counter", |c| async move {
                let stmt = c.prepare_cached(&inner.sql.counter).await?;
                let row = c.query_opt(&stmt, &[&name]).await?;
                Ok(match row {
                    Some(row) => row.try_get::<_, i64>(0)?.max(0) as u64,
                    None => 0,
                })
            })
            .await
    }

    fn health(&self) -> Health {
        if self.inner.is_down() {
            Health::Unavailable(self.inner.down_reason.lock().clone())
        } else {
            Health::Ready
        }
    }

    async fn gauges(&self) -> Vec<Gauge> {
        let status = self.inner.pool.status();
        let mut gauges = vec![
            Gauge {
                name: "idemlog_pg_pool_max",
                help: "Most pooled PostgreSQL connections.",
                value: status.max_size as f64,
            },
            Gauge {
                name: "idemlog_pg_pool_connections",
                help: "Open pooled PostgreSQL connections.",
                value: status.size as f64,
            },
            Gauge {
                name: "idemlog_pg_pool_available",
                help: "Idle pooled PostgreSQL connections.",
                value: status.available as f64,
            },
            Gauge {
                name: "idemlog_pg_pool_in_use",
                help: "Pooled PostgreSQL connections in use.",
                value: status.size.saturating_sub(status.available) as f64,
            },
            Gauge {
                name: "idemlog_pg_pool_waiting",
                help: "Calls waiting for a pooled PostgreSQL connection.",
                value: status.waiting as f64,
            },
            Gauge {
                name: "idemlog_pg_up",
                help: "1 while the database answers, 0 after a connection failure.",
                value: if self.inner.is_down() { 0.0 } else { 1.0 },
            },
        ];
        // The planner's estimate of the keys table: cheap, never a scan; skipped when the database
        // does not answer quickly.
        let inner = &*self.inner;
        let estimate = tokio::time::timeout(Duration::from_millis(500), async {
            let c = inner.pool.get().await.ok()?;
            let row = c.query_opt(&inner.sql.keys_estimate, &[]).await.ok()??;
            row.try_get::<_, f64>(0).ok()
        })
        .await
        .ok()
        .flatten();
        if let Some(value) = estimate {
            gauges.push(Gauge {
                name: "idemlog_pg_keys_estimate",
                help: "Rows in the keys table (planner estimate, refreshed by ANALYZE).",
                value,
            });
        }
        gauges
    }

    fn histograms(&self) -> Vec<HistogramMetric> {
        self.inner.latency.snapshot()
    }

    fn kind(&self) -> &'static str {
        "postgres"
    }

    async fn close(&self) -> Result<(), StoreError> {
        for task in self.inner.tasks.lock().drain(..) {
            task.abort();
        }
        self.inner.pool.close();
        Ok(())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        for task in self.tasks.get_mut().drain(..) {
            task.abort();
        }
    }
}
