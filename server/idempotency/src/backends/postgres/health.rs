//! Whether the database answers: the store's up/down state and the probe that restores it.
//!
//! Readiness follows the database, also on an instance that serves no traffic: a call that fails
//! with a connection error marks the store down ([`DbState::mark_down`]), any answer marks it up,
//! and [`probe`] checks the database actively every [`PROBE_INTERVAL`] with a `SELECT 1` bounded
//! by [`PROBE_TIMEOUT`], so a database that stops (or stops answering) is seen within
//! `PROBE_INTERVAL + PROBE_TIMEOUT` (2.5 s) and its return within about one interval. The check is
//! skipped while calls keep succeeding (they prove the database answers), so it costs one trivial
//! query per second per idle instance and nothing on a busy one. The probe task is aborted when the
//! store is closed or dropped.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use parking_lot::Mutex;
use tracing::{debug, info, warn};

/// How often the probe checks the database when no call has shown it answering.
pub(super) const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// Longest the probe waits for a connection and its `SELECT 1`.
pub(super) const PROBE_TIMEOUT: Duration = Duration::from_millis(1500);

/// Whether the database answered the last call or probe, and why not.
pub(crate) struct DbState {
    down: AtomicBool,
    reason: Mutex<String>,
    /// When the database last answered, in milliseconds since `epoch`.
    last_ok_ms: AtomicU64,
    epoch: Instant,
}

impl Default for DbState {
    fn default() -> Self {
        Self {
            down: AtomicBool::new(false),
            reason: Mutex::new(String::new()),
            last_ok_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }
}

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
            let client = pool.get().await.map_err(|e| e.to_string())?;
            client
                .simple_query("SELECT 1")
                .await
                .map_err(|e| super::error::describe(&e))?;
            Ok::<_, String>(())
        })
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "readiness check: no answer within {} ms",
                PROBE_TIMEOUT.as_millis()
            ))
        });
        match result {
            Ok(()) => state.mark_up(),
            Err(e) if state.is_down() => debug!(error = %e, "database still unreachable"),
            Err(e) => state.mark_down(&format!("readiness check failed: {e}")),
        }
    }
}

impl DbState {
    pub(super) fn is_down(&self) -> bool {
        self.down.load(Ordering::Acquire)
    }

    /// Whether the database answered a call or check in the last `within`.
    fn answered_within(&self, within: Duration) -> bool {
        let last = self.last_ok_ms.load(Ordering::Acquire);
        last != 0 && self.now_ms().saturating_sub(last) < within.as_millis() as u64
    }

    fn now_ms(&self) -> u64 {
        // At least 1, so that 0 means "never".
        (self.epoch.elapsed().as_millis() as u64).max(1)
    }

    pub(super) fn mark_up(&self) {
        self.last_ok_ms.store(self.now_ms(), Ordering::Release);
        if self.down.swap(false, Ordering::AcqRel) {
            info!("PostgreSQL store healthy again");
        }
    }

    pub(super) fn mark_down(&self, reason: &str) {
        *self.reason.lock() = reason.to_string();
        if !self.down.swap(true, Ordering::AcqRel) {
            warn!(
                error = reason,
                "PostgreSQL store unavailable: the database cannot be reached"
            );
        }
    }

    pub(super) fn reason(&self) -> String {
        self.reason.lock().clone()
    }
}
