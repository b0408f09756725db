//! Whether the database answers: the store's up/down state and the probe that restores it.
//!
//! A call that fails with a connection error marks the store down ([`DbState::mark_down`]); while
//! it is down, [`probe`] runs `SELECT 1` every second and marks it up again when that succeeds. The
//! probe task is aborted when the store is closed or dropped.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use deadpool_postgres::Pool;
use parking_lot::Mutex;
use tracing::{debug, info, warn};

/// Whether the database answered the last call or probe, and why not.
#[derive(Default)]
pub(crate) struct DbState {
    down: AtomicBool,
    reason: Mutex<String>,
}

/// While the store is marked down, probes the database every second and marks it up again once a
/// `SELECT 1` succeeds.
pub(super) async fn probe(pool: Pool, state: Arc<DbState>) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if !state.is_down() {
            continue;
        }
        let result = tokio::time::timeout(Duration::from_secs(2), async {
            let client = pool.get().await.map_err(|e| e.to_string())?;
            client
                .simple_query("SELECT 1")
                .await
                .map_err(|e| super::error::describe(&e))?;
            Ok::<_, String>(())
        })
        .await
        .unwrap_or_else(|_| Err("probe timed out".to_string()));
        match result {
            Ok(()) => {
                state.mark_up();
                info!("database reachable again");
            }
            Err(e) => debug!(error = %e, "database still unreachable"),
        }
    }
}

impl DbState {
    pub(super) fn is_down(&self) -> bool {
        self.down.load(Ordering::Acquire)
    }

    pub(super) fn mark_up(&self) {
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
