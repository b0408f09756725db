//! Background work: deleting expired rows.
//!
//! The task holds only a weak reference to the store, so it ends when the store is dropped, and is
//! aborted by [`super::PostgresBackend::close`]. It never panics on a database error: it logs and
//! tries again on its next tick.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tracing::{debug, info, warn};

use super::store::{Inner, PostgresBackend};
use crate::StoreError;

/// What one cleanup pass deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CleanupReport {
    /// Expired idempotency keys deleted.
    pub keys: u64,
    /// Expired business records deleted.
    pub records: u64,
    /// Delete statements run.
    pub batches: u32,
}

/// Most batches per table in one pass, so a huge backlog is worked off over several ticks rather
/// than in one long burst.
const MAX_BATCHES_PER_PASS: u32 = 200;

/// Scopes one key cleanup statement visits (one index descent each; see `sql::cleanup_keys`).
const SCOPES_PER_BATCH: i64 = 1_000;

/// Runs cleanup passes every `interval` until the store goes away.
pub(super) async fn run(inner: Weak<Inner>, interval: Duration, batch: u32) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        ticker.tick().await;
        let Some(store) = inner.upgrade() else { return };
        match store.cleanup_once(batch).await {
            Ok(r) if r.keys + r.records > 0 => info!(
                keys = r.keys,
                records = r.records,
                batches = r.batches,
                "cleanup deleted expired rows"
            ),
            Ok(_) => debug!("cleanup: nothing expired"),
            Err(e) => warn!(error = %e, "cleanup failed; trying again next tick"),
        }
    }
}

impl PostgresBackend {
    /// Starts a background task that deletes expired keys and records every `interval`, `batch`
    /// rows per statement (`FOR UPDATE SKIP LOCKED`, so every instance may run one). It logs what it
    /// deleted, survives database errors, and stops on [`IdempotencyStore::close`](crate::IdempotencyStore::close) or when the
    /// store is dropped.
    pub fn spawn_cleanup(&self, interval: Duration, batch: u32) {
        let task = tokio::spawn(run(
            Arc::downgrade(&self.inner),
            interval.max(Duration::from_millis(10)),
            batch,
        ));
        self.inner.tasks.lock().push(task);
    }

    /// One cleanup pass now: deletes expired rows, `batch` per statement, until none are left (or
    /// a pass-size cap is reached). Expired keys are found scope by scope; a pass stopped by the
    /// cap goes on, at the next pass, from the scope where it stopped.
    pub async fn cleanup_once(&self, batch: u32) -> Result<CleanupReport, StoreError> {
        self.inner.cleanup_once(batch).await
    }
}

impl Inner {
    /// Deletes expired keys and records in batches of `batch`.
    pub(super) async fn cleanup_once(&self, batch: u32) -> Result<CleanupReport, StoreError> {
        let mut report = CleanupReport::default();
        let limit = i64::from(batch.max(1));
        let pooling = self.pooling;
        // Keys: a walk over the scopes in order, `SCOPES_PER_BATCH` per statement, from where the
        // last pass left it ('' is the start).
        for _ in 0..MAX_BATCHES_PER_PASS {
            let from = self.cleanup_from.lock().clone();
            let (deleted, next) = self
                .with_retry("cleanup", |c| {
                    let from = from.as_str();
                    async move {
                        let row = self
                            .sql
                            .cleanup_keys
                            .query_one(&c, pooling, &[&limit, &from, &SCOPES_PER_BATCH])
                            .await?;
                        let deleted = row.try_get::<_, i64>("deleted")?.max(0) as u64;
                        Ok((deleted, row.try_get::<_, Option<String>>("next_scope")?))
                    }
                })
                .await?;
            report.batches += 1;
            report.keys += deleted;
            if deleted >= limit as u64 {
                // A full batch may have stopped inside a scope: the same scopes again.
                continue;
            }
            let done = next.is_none();
            *self.cleanup_from.lock() = next.unwrap_or_default();
            if done {
                break;
            }
        }
        for _ in 0..MAX_BATCHES_PER_PASS {
            let deleted = self
                .with_retry("cleanup", |c| async move {
                    // Returns the count of rows it deleted.
                    let row = self
                        .sql
                        .cleanup_records
                        .query_one(&c, pooling, &[&limit])
                        .await?;
                    Ok(row.try_get::<_, i64>(0)?.max(0) as u64)
                })
                .await?;
            report.batches += 1;
            report.records += deleted;
            if deleted < limit as u64 {
                break;
            }
        }
        Ok(report)
    }
}
