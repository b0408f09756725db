//! Lease renewal while a handler runs.
//!
//! A claim's lease is what lets a retry take over from a holder that died; a holder that is merely
//! slow must keep its key, so its lease is renewed every `heartbeat` for as long as the handler
//! runs. A failed renewal is logged and renewal stops: the claim then stands on the lease it has,
//! and completing it after a takeover is refused by the store's fencing (see `fenced`).

use std::future::Future;
use std::time::Duration;

use tokio::time::{Instant, Interval, MissedTickBehavior};
use tracing::{debug, warn};

use crate::store::{HeldClaim, IdempotencyStore};

/// Waits for the first interval tick, or forever when renewal is off.
async fn tick(interval: &mut Option<Interval>) {
    match interval {
        Some(interval) => {
            interval.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// Awaits a handler that did not finish on its first poll, renewing the claim's lease every
/// `heartbeat` (never if `None`) meanwhile, so that only a holder that died loses its key.
pub(crate) async fn with_renewal<F: Future + Unpin>(
    store: &dyn IdempotencyStore,
    heartbeat: Option<Duration>,
    token: &HeldClaim,
    mut handler: F,
) -> F::Output {
    let mut renew = heartbeat.map(|period| {
        let mut interval = tokio::time::interval_at(Instant::now() + period, period);
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        interval
    });
    loop {
        let renew_failed = tokio::select! {
            joined = &mut handler => return joined,
            () = tick(&mut renew) => {
                match store.extend(token).await {
                    Ok(lease) => {
                        debug!(lease_ms = lease.as_millis() as u64, "lease renewed");
                        false
                    }
                    Err(e) => {
                        warn!(error = %e, "could not renew the lease: a retry may take the key over");
                        true
                    }
                }
            }
        };
        if renew_failed {
            renew = None;
        }
    }
}
