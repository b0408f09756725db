//! Rate limits for the log lines that a flood of connections would otherwise multiply: one line
//! per interval, the others counted.

use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, warn};

/// Minimum time between two log lines of the same kind of event (the others are counted).
const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Lets one event of a kind through per [`LOG_INTERVAL`], counting the others.
#[derive(Default)]
pub(super) struct RateLimit {
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLimit {
    /// `Some(events suppressed since the last one let through)` when this one may be logged.
    pub(super) fn allow(&mut self) -> Option<u64> {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|last| now.duration_since(last) < LOG_INTERVAL)
        {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// Warns once per episode of being at the connection cap (episodes closer than [`LOG_INTERVAL`]
/// are counted, not logged).
#[derive(Default)]
pub(super) struct CapLog {
    at_cap: bool,
    log: RateLimit,
}

impl CapLog {
    pub(super) fn reached(&mut self, max_connections: usize) {
        if std::mem::replace(&mut self.at_cap, true) {
            return;
        }
        if let Some(suppressed) = self.log.allow() {
            warn!(
                max_connections,
                earlier_episodes_not_logged = suppressed,
                "connection cap reached: not accepting new connections until one closes"
            );
        }
    }

    pub(super) fn relieved(&mut self) {
        if std::mem::replace(&mut self.at_cap, false) {
            debug!("below the connection cap again: accepting");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn rate_limit_lets_one_event_through_per_interval_and_counts_the_rest() {
        let mut limit = RateLimit::default();
        assert_eq!(limit.allow(), Some(0));
        assert_eq!(limit.allow(), None);
        assert_eq!(limit.allow(), None);
        tokio::time::advance(LOG_INTERVAL).await;
        assert_eq!(limit.allow(), Some(2));
        assert_eq!(limit.allow(), None);
    }
}
