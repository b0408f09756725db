//! Whether the database answers: the store's up/down state and the probe that restores it.
//!
//! Readiness follows the database, also on an instance that serves no traffic: a call that fails
//! with a connection error marks the store down (`DbState::mark_down`, in [`super::state`]), any answer marks it up,
//! and [`probe`] checks the database actively every [`PROBE_INTERVAL`] with a `SELECT 1` bounded
//! by [`PROBE_TIMEOUT`], so a database that stops (or stops answering) is seen within
//! `PROBE_INTERVAL + PROBE_TIMEOUT` (2.5 s) and its return within about one interval. The check is
//! skipped while calls keep succeeding (they prove the database answers), so it costs one trivial
//! query per second per idle instance and nothing on a busy one. The probe task is aborted when the
//! store is closed or dropped.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Pool, PoolError, TimeoutType};
use tracing::debug;

use super::error::describe;
use super::state::DbState;

/// How often the probe checks the database when no call has shown it answering.
pub(super) const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// Longest the probe waits for a connection and its `SELECT 1`.
pub(super) const PROBE_TIMEOUT: Duration = Duration::from_millis(1500);

/// Checks the database every [`PROBE_INTERVAL`] unless a call has just shown it answering: marks
/// the store down when the check fails or outlives [`PROBE_TIMEOUT`], up when it succeeds.
pub(super) async fn probe(pool: Pool, state: Arc<DbState>) {
    let mut ticker = tokio::time::interval(PROBE_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if !state.is_down() && state.answered_within(PROBE_INTERVAL) {
            continue;
        }
        let result = tokio::time::timeout(PROBE_TIMEOUT, async {
            let client = match pool.get().await {
                Ok(client) => client,
                // Every connection is busy with calls: a saturated pool is not a dead database,
                // and those calls mark the store down themselves if the database fails them.
                Err(PoolError::Timeout(TimeoutType::Wait)) => return Ok(false),
                Err(e) => return Err(e.to_string()),
            };
            client
                .simple_query("SELECT 1")
                .await
                .map_err(|e| describe(&e))?;
            Ok::<_, String>(true)
        })
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "readiness check: no answer within {} ms",
                PROBE_TIMEOUT.as_millis()
            ))
        });
        match result {
            Ok(true) => state.mark_up(),
            Ok(false) => debug!("readiness check skipped: every pooled connection is in use"),
            Err(e) if state.is_down() => debug!(error = %e, "database still unreachable"),
            Err(e) => state.mark_down(&format!("readiness check failed: {e}")),
        }
    }
}
