//! Background work: deleting expired rows, and probing the database while it is unreachable.
//!
//! Both tasks hold only a weak reference to the store, so they end when it is dropped, and are
//! aborted by [`super::PostgresBackend::close`]. Neither ever panics on a database error: it logs and tries
//! again on its next tick.

use std::sync::Weak;
use std::time::Duration;

use tracing::{debug, info, warn};

use super::Inner;

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

/// While the store is marked down, probes the database every second and marks it up again once a
/// `SELECT 1` succeeds.
pub(super) async fn probe(inner: Weak<Inner>) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let Some(store) = inner.upgrade() else { return };
        if !store.is_down() {
            continue;
        }
        let result = tokio::time::timeout(Duration::from_secs(2), async {
            let client = store.pool.get().await.map_err(|e| e.to_string())?;
            client
                .simple_query("SELECT 1")
                .await
                .map_err(|e| super::describe(&e))?;
            Ok::<_, String>(())
        })
        .await
        .unwrap_or_else(|_| Err("probe timed out".to_string()));
        match result {
            Ok(()) => {
                store.mark_up();
                info!("database reachable again");
            }
            Err(e) => debug!(error = %e, "database still unreachable"),
        }
    }
}

impl Inner {
    /// Deletes expired keys and records in batches of `batch`.
    pub(super) async fn cleanup_once(
        &self,
        batch: u32,
    ) -> Result<CleanupReport, crate::StoreError> {
        let mut report = CleanupReport::default();
        let limit = i64::from(batch.max(1));
        for (table, sql) in [
            ("keys", &self.sql.cleanup_keys),
            ("records", &self.sql.cleanup_records),
        ] {
            for _ in 0..MAX_BATCHES_PER_PASS {
                let counted = table == "keys";
                let deleted = self
                    .with_retry("cleanup", |c| async move {
                        let stmt = c.prepare_cached(sql).await?;
                        if counted {
                            // The keys statement also fixes the scopes' counts: it returns a count.
                            let row = c.query_one(&stmt, &[&limit]).await?;
                            Ok(row.try_get::<_, i64>(0)?.max(0) as u64)
                        } else {
                            Ok(c.execute(&stmt, &[&limit]).await?)
                        }
                    })
                    .await?;
                report.batches += 1;
                match table {
                    "keys" => report.keys += deleted,
                    _ => report.records += deleted,
                }
                if deleted < limit as u64 {
                    break;
                }
            }
        }
        Ok(report)
    }
}
