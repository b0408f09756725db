//! Self-healing: taking a failed store out of service and reopening its directory.
//!
//! An I/O failure poisons the engine (after a failed fsync the kernel may have dropped dirty pages),
//! and a poisoned store refuses all work. The healer closes it, then reopens the directory (full
//! recovery from the log, as at start-up) with capped exponential backoff until it opens *and*
//! takes a synced probe write as large as the largest record a request writes. Invariants: one healer at a time (`healing`); none after
//! `close`; the old store is closed before a new one is opened, and an open that fails because
//! straggling handles still hold the directory lock is simply retried.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use idemlog::{Options, SideWrite, Store};
use tracing::{error, info, warn};

use crate::backends::embedded::{EmbeddedBackend, Opened};

/// First wait before a reopen attempt after the store failed.
const HEAL_FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// Longest wait between reopen attempts.
const HEAL_MAX_BACKOFF: Duration = Duration::from_secs(5);

impl EmbeddedBackend {
    /// Takes the store out of service and starts the healer, unless one runs already.
    pub(super) fn start_healing(&self, cause: &dyn std::fmt::Display) {
        if self.shared.closed.load(Ordering::Acquire)
            || self.shared.healing.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let reason = format!("the store failed and is being reopened: {cause}");
        error!(error = %cause, dir = %self.shared.dir.display(), "store failed: out of service until it is reopened");
        *self.shared.reason.lock() = Some(reason);
        let old = self.shared.current.write().take();
        let this = self.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move { this.heal(old).await });
            }
            Err(_) => {
                // No runtime (a blocking caller outside tokio): heal on a thread of our own.
                std::thread::spawn(move || {
                    if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                        .enable_time()
                        .build()
                    {
                        rt.block_on(this.heal(old));
                    }
                });
            }
        }
    }

    /// Starts healing a store found poisoned without a failing call to name the cause.
    pub(super) fn start_healing_poisoned(&self) {
        self.start_healing(&"the store was poisoned by a background write (flusher or compaction)");
    }

    /// Closes the failed store and reopens the directory until that works.
    async fn heal(self, old: Option<Opened>) {
        if let Some(old) = old {
            let store = old.store;
            // A poisoned store refuses to sync; closing still stops its threads. The directory lock
            // goes when the last handle (some may still be in callers' hands) drops.
            let closed = tokio::task::spawn_blocking(move || store.close()).await;
            if let Ok(Err(e)) = closed {
                info!(error = %e, "closed the failed store (its unsynced writes were never acknowledged)");
            }
        }
        let mut backoff = HEAL_FIRST_BACKOFF;
        let mut attempt = 1u32;
        loop {
            tokio::time::sleep(backoff).await;
            if self.shared.closed.load(Ordering::Acquire) {
                return;
            }
            let (dir, options) = (self.shared.dir.clone(), self.shared.options.clone());
            let opened = tokio::task::spawn_blocking(move || open_and_probe(&dir, options)).await;
            match opened {
                Ok(Ok(store)) => {
                    let report = store.recovery_report();
                    info!(
                        attempt,
                        operations = report.operations,
                        segments = report.segments,
                        "store reopened after a failure: back in service"
                    );
                    *self.shared.current.write() = Some(Opened::new(store));
                    *self.shared.reason.lock() = None;
                    self.shared.healing.store(false, Ordering::Release);
                    return;
                }
                Ok(Err(e)) => {
                    let next = (backoff * 2).min(HEAL_MAX_BACKOFF);
                    warn!(attempt, error = %e, next_attempt_in_ms = next.as_millis() as u64, "reopening the store failed");
                    *self.shared.reason.lock() = Some(format!("reopening the store failed: {e}"));
                    backoff = next;
                }
                Err(join) => {
                    error!(error = %join, "store reopen task failed");
                    backoff = (backoff * 2).min(HEAL_MAX_BACKOFF);
                }
            }
            attempt = attempt.saturating_add(1);
        }
    }
}

/// Namespace of the records the healer writes to prove the store can write again.
const PROBE_NAMESPACE: &str = "idemlog.health";

/// Room for what a request writes beside its largest response body: headers, the request
/// digest, the business records of its completion, and frame overhead.
const PROBE_HEADROOM: usize = 64 * 1024;

/// Opens the directory and proves it can take a durable write as large as the largest a request
/// makes: opening alone needs no free space, and a probe smaller than a real record passes on a
/// disk with a few bytes free, so the store would be declared healthy, fail the next request
/// that writes a full-size response, and alternate between serving and 503. The probe writes
/// one record of [`Options::max_value_bytes`] (the largest stored response) plus
/// [`PROBE_HEADROOM`], syncs, then removes both records, so it leaves no live data behind (its
/// bytes are garbage for compaction).
fn open_and_probe(dir: &Path, options: Options) -> idemlog::Result<Store> {
    let body = Bytes::from(vec![0u8; options.max_value_bytes]);
    let headroom = Bytes::from(vec![0u8; PROBE_HEADROOM.min(options.max_value_bytes)]);
    let store = Store::open(dir, options)?;
    let probe = [
        SideWrite::put(PROBE_NAMESPACE, "write-probe", body),
        SideWrite::put(PROBE_NAMESPACE, "write-probe-headroom", headroom),
    ];
    let cleanup = [
        SideWrite::remove(PROBE_NAMESPACE, "write-probe"),
        SideWrite::remove(PROBE_NAMESPACE, "write-probe-headroom"),
    ];
    let proved = store
        .side_write(&probe)
        .and_then(|()| store.sync())
        .and_then(|()| store.side_write(&cleanup));
    match proved {
        Ok(()) => Ok(store),
        Err(e) => {
            // The probe's failure is the news; closing a store that just failed can only fail too.
            let _ = store.close();
            Err(e)
        }
    }
}
