//! [`PostgresBackend`] and its [`IdempotencyStore`] implementation: each call checks its input,
//! then runs its statement (see [`super::sql`]) through [`Inner::with_retry`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use deadpool_postgres::{Object, Pool};
use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio_postgres::types::ToSql;

use super::batch::BatchRunner;
use super::batch::claims::{ClaimJob, Claims};
use super::batch::finish::{Finish, FinishJob, Finishes};
use super::batch::inserts::{InsertJob, Inserts};
use super::batch_sizes::BatchSizes;
use super::codec::{
    MAX_NAMESPACE, MAX_REQUEST_DIGEST, MAX_SIDE_KEY, WriteArrays, check_key, check_response,
    check_text, check_write, encode_headers, expiry_params, fence_of, lease_lost, millis,
    owned_writes, response_from, to_i64,
};
use super::error::{Fail, MAX_ATTEMPTS, jitter, retries, settle};
use super::lanes::Lanes;
use super::latency;
use super::sql::{IN_PROGRESS, Statements};
use super::state::DbState;
use super::statement::Pooling;
use super::url;
use crate::store::{
    Claim, ClaimExtras, Fingerprint, Gauge, Health, HeldClaim, HistogramMetric, IdempotencyStore,
    InsertOnce, KeyRecord, KeyState, RecordWrite, StoreError, StoredResponse,
};

/// The PostgreSQL implementation of [`IdempotencyStore`]. Cheap to clone (one shared pool).
#[derive(Clone)]
pub struct PostgresBackend {
    pub(super) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(super) pool: Pool,
    pub(super) sql: Statements,
    /// How statements are sent (see [`super::statement`]).
    pub(super) pooling: Pooling,
    pub(super) lease: Duration,
    pub(super) lease_ms: i64,
    /// Client-side bound on one attempt of a call (pool wait, connect, statement).
    pub(super) attempt_timeout: Duration,
    pub(super) pool_wait: Duration,
    /// Set when the last database interaction failed with a connection error.
    pub(super) state: Arc<DbState>,
    pub(super) tasks: Mutex<Vec<JoinHandle<()>>>,
    pub(super) password: Option<Vec<u8>>,
    /// Statement latency for `/metrics`.
    pub(super) latency: latency::StatementLatency,
    /// Calls per batch statement for `/metrics`.
    pub(super) batch_sizes: BatchSizes,
    /// The lanes that batch claims ([`super::batch::claims`]).
    pub(super) claims: Lanes<ClaimJob, BatchRunner<Claims>>,
    /// The lanes that batch completions and releases ([`super::batch::finish`]).
    pub(super) finishes: Lanes<FinishJob, BatchRunner<Finishes>>,
    /// The lanes that batch write-once inserts ([`super::batch::inserts`]).
    pub(super) inserts: Lanes<InsertJob, BatchRunner<Inserts>>,
    /// The scope the cleanup's walk over the scopes goes on from ('' is the start; see
    /// [`super::cleanup`]).
    pub(super) cleanup_from: Mutex<String>,
}

impl PostgresBackend {
    /// The configured lease.
    pub fn lease(&self) -> Duration {
        self.inner.lease
    }
}

impl Inner {
    /// Runs `attempt` with a pooled connection, retrying serialization failures, deadlocks and
    /// stale reads a bounded number of times, and maps the outcome to the store's errors.
    pub(super) async fn with_retry<T, F, Fut>(
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
            if retries(&result) && tries < MAX_ATTEMPTS {
                tokio::time::sleep(jitter(Duration::from_millis(2), tries)).await;
                continue;
            }
            return settle(what, result, &self.state, self.pool_wait, |s| {
                url::scrub(&s, self.password.as_deref())
            });
        }
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
        extras: &ClaimExtras<'_>,
    ) -> Result<Claim, StoreError> {
        check_key(scope, key)?;
        let ttl_ms = millis(ttl);
        if ttl_ms < 1 {
            return Err(StoreError::Rejected("ttl must be at least 1 ms".into()));
        }
        // The claim statement stores the digest: computed before it is queued.
        let digest = extras.request_digest.map(|compute| compute());
        if digest
            .as_ref()
            .is_some_and(|d| d.len() > MAX_REQUEST_DIGEST)
        {
            return Err(StoreError::Rejected(
                "request digest longer than 8 KiB".into(),
            ));
        }
        let inner = &*self.inner;
        let job = || {
            ClaimJob::new(
                scope.to_owned(),
                key.to_owned(),
                fingerprint.0,
                ttl_ms,
                digest.clone(),
                to_i64(extras.max_live_keys.unwrap_or(0)),
            )
        };
        let outcome = inner.claims.submit(job()).await?;
        if !matches!(outcome, Claim::QuotaExceeded { .. }) {
            return Ok(outcome);
        }
        // Refused by the quota: the scope's expired keys still count until the cleanup removes
        // them. Delete them now and, if that freed a place, try once more.
        let freed = inner
            .with_retry("claim", |c| async move {
                let row = inner
                    .sql
                    .purge_scope
                    .query_one(&c, inner.pooling, &[&scope])
                    .await?;
                Ok(row.try_get::<_, i64>(0)?)
            })
            .await?;
        if freed == 0 {
            return Ok(outcome);
        }
        inner.claims.submit(job()).await
    }

    async fn complete(
        &self,
        token: &HeldClaim,
        response: &StoredResponse,
        records: &[RecordWrite],
    ) -> Result<(), StoreError> {
        check_response(response)?;
        let (puts, removals) = owned_writes(records)?;
        self.inner
            .finishes
            .submit(FinishJob {
                scope: token.scope.clone(),
                key: token.key.clone(),
                fence: fence_of(token),
                finish: Finish::Complete {
                    status: i32::from(response.status),
                    headers: encode_headers(&response.headers),
                    body: response.body.clone(),
                    puts,
                    removals,
                },
            })
            .await
    }

    async fn release(&self, token: &HeldClaim) -> Result<(), StoreError> {
        self.inner
            .finishes
            .submit(FinishJob {
                scope: token.scope.clone(),
                key: token.key.clone(),
                fence: fence_of(token),
                finish: Finish::Release,
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
                let extended = inner
                    .sql
                    .extend
                    .query_opt(&c, inner.pooling, &[&scope, &key, &fence, &lease_ms])
                    .await?;
                match extended {
                    None => Err(lease_lost(token)),
                    Some(_) => Ok(inner.lease),
                }
            })
            .await
    }

    async fn get(&self, scope: &str, key: &str) -> Result<Option<KeyRecord>, StoreError> {
        check_key(scope, key)?;
        let inner = &*self.inner;
        inner
            .with_retry("get", |c| async move {
                let found = inner
                    .sql
                    .get
                    .query_opt(&c, inner.pooling, &[&scope, &key])
                    .await?;
                let Some(row) = found else {
                    return Ok(None);
                };
                let fp: Vec<u8> = row.try_get("fingerprint")?;
                let fingerprint = Fingerprint(fp.try_into().map_err(|_| {
                    Fail::Store(StoreError::Internal(
                        "stored fingerprint is not 32 bytes".into(),
                    ))
                })?);
                let state = match row.try_get::<_, i16>("state")? {
                    IN_PROGRESS => {
                        // A claim in progress may have committed without its flush (see `sql`).
                        inner.sql.flush_wal.query(&c, inner.pooling, &[]).await?;
                        KeyState::InProgress {
                            lease_left: Duration::from_millis(
                                row.try_get::<_, Option<i64>>("lease_left_ms")?
                                    .unwrap_or(0)
                                    .max(0) as u64,
                            ),
                        }
                    }
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
        check_text("record key", key, MAX_SIDE_KEY)?;
        let inner = &*self.inner;
        inner
            .with_retry("record", |c| async move {
                let row = inner
                    .sql
                    .record
                    .query_opt(&c, inner.pooling, &[&namespace, &key])
                    .await?;
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
                let (puts, del, pooling) = (
                    &inner.sql.write_puts,
                    &inner.sql.delete_records,
                    inner.pooling,
                );
                let put_params: [&(dyn ToSql + Sync); 5] =
                    [&a.ns, &a.keys, &a.values, &a.after_ms, &a.at_ms];
                let del_params: [&(dyn ToSql + Sync); 2] = [&a.del_ns, &a.del_keys];
                match (a.ns.is_empty(), a.del_ns.is_empty()) {
                    (false, true) => {
                        puts.query_one(&c, pooling, &put_params).await?;
                    }
                    (true, false) => {
                        del.query(&c, pooling, &del_params).await?;
                    }
                    _ => {
                        let tx = c.transaction().await?;
                        puts.query_one(&tx, pooling, &put_params).await?;
                        del.query(&tx, pooling, &del_params).await?;
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
        let Some(value) = write.value.clone() else {
            return Err(StoreError::Rejected(
                "insert_once needs a value, not a removal".into(),
            ));
        };
        let (after_ms, at_ms) = expiry_params(write.expiry);
        self.inner
            .inserts
            .submit(InsertJob {
                namespace: write.namespace,
                key: write.key.clone(),
                value,
                after_ms,
                at_ms,
                counter,
                general: Default::default(),
            })
            .await
    }

    async fn counter(&self, name: &'static str) -> Result<u64, StoreError> {
        let inner = &*self.inner;
        inner
            .with_retry("counter", |c| async move {
                let row = inner
                    .sql
                    .counter
                    .query_opt(&c, inner.pooling, &[&name])
                    .await?;
                Ok(match row {
                    Some(row) => row.try_get::<_, i64>(0)?.max(0) as u64,
                    None => 0,
                })
            })
            .await
    }

    /// The database is shared by every instance: its outage is not this process's failure.
    fn liveness(&self) -> Health {
        Health::Ready
    }

    fn health(&self) -> Health {
        if self.inner.state.is_down() {
            Health::Unavailable(self.inner.state.reason())
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
                help: "1 while the database answers, 0 after a connection failure or a failed \
                       check (checked every second while no call succeeds).",
                value: if self.inner.state.is_down() { 0.0 } else { 1.0 },
            },
        ];
        // The planner's estimate of the keys table: cheap, never a scan; skipped when the database
        // does not answer quickly.
        let inner = &*self.inner;
        let estimate = tokio::time::timeout(Duration::from_millis(500), async {
            let c = inner.pool.get().await.ok()?;
            let row = inner
                .sql
                .keys_estimate
                .query_opt(&c, inner.pooling, &[])
                .await
                .ok()??;
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
        let mut all = self.inner.latency.snapshot();
        all.extend(self.inner.batch_sizes.snapshot());
        all
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
