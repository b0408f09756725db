//! The maintenance thread: sweeps expired records out of memory and compacts when the policy says so.
//!
//! It wakes every [`CompactionPolicy::interval`], sweeps, measures how much of the sealed segments is
//! garbage, and compacts when both the ratio and the byte threshold are reached. A failed compaction is
//! counted in the stats and retried at the next tick; compaction poisons the store itself when a
//! failure leaves the disk state unknown.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use crate::options::CompactionPolicy;
use crate::store::Core;

/// Owns the thread; stopping it (or dropping this) joins it.
pub(crate) struct Maintenance {
    stop: Arc<(Mutex<bool>, Condvar)>,
    handle: Option<JoinHandle<()>>,
}

impl Maintenance {
    /// Starts the thread if the options ask for one.
    pub(crate) fn start(core: &Arc<Core>) -> Option<Maintenance> {
        let policy = core.options.compaction?;
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let thread_stop = Arc::clone(&stop);
        let core = Arc::clone(core);
        let handle = std::thread::Builder::new()
            .name("idemlog-maintenance".into())
            .spawn(move || run(&core, &thread_stop, policy))
            .ok()?;
        Some(Maintenance {
            stop,
            handle: Some(handle),
        })
    }

    /// Stops and joins the thread (a compaction in progress finishes first).
    pub(crate) fn stop(&mut self) {
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

impl Drop for Maintenance {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(core: &Core, stop: &(Mutex<bool>, Condvar), policy: CompactionPolicy) {
    loop {
        {
            let mut stopped = stop.0.lock();
            if !*stopped {
                stop.1.wait_for(&mut stopped, policy.interval);
            }
            if *stopped {
                return;
            }
        }
        if core.writer.check_poisoned().is_err() || core.closed.load(Ordering::Acquire) {
            return;
        }
        core.sweep();
        if core.space().wants_compaction(&policy) && core.compact().is_err() {
            core.compaction_failures.fetch_add(1, Ordering::Relaxed);
        }
    }
}
