//! The store's view of the database: up or down, why, and when it last answered. Calls that fail
//! with a connection error mark it down ([`DbState::mark_down`]), any answer marks it up; the
//! readiness probe ([`super::health`]) reads and sets it too. Its own module so that the retry
//! policy ([`super::error`]) and the probe both depend on it and not on each other.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tracing::{info, warn};

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

impl DbState {
    pub(super) fn is_down(&self) -> bool {
        self.down.load(Ordering::Acquire)
    }

    /// Whether the database answered a call or check in the last `within`.
    pub(super) fn answered_within(&self, within: Duration) -> bool {
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
