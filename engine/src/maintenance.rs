//! The maintenance thread: sweeps expired records out of memory and compacts when the policy says so.
//!
//! It wakes every [`CompactionPolicy::interval`] and runs one maintenance pass, which the store
//! hands it as a closure (`Core::maintain`: sweep, measure how much of the sealed segments is garbage,
//! compact when both the ratio and the byte threshold are reached). A failed compaction is counted in
//! the stats and retried at the next tick; compaction poisons the store itself when a failure leaves
//! the disk state unknown. The thread knows only the closure, so this module does not depend on
//! the store's internals.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// Owns the thread; stopping it (or dropping this) joins it.
pub(crate) struct Maintenance {
    stop: Arc<(Mutex<bool>, Condvar)>,
    handle: Option<JoinHandle<()>>,
}

impl Maintenance {
    /// Starts the thread: every `interval` it calls `pass`, and ends when `pass` returns false (the
    /// store is closed or poisoned) or when stopped. `None` if the thread could not be spawned.
    pub(crate) fn start(
        interval: Duration,
        pass: impl Fn() -> bool + Send + 'static,
    ) -> Option<Maintenance> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let thread_stop = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("idemlog-maintenance".into())
            .spawn(move || run(&thread_stop, interval, pass))
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

fn run(stop: &(Mutex<bool>, Condvar), interval: Duration, pass: impl Fn() -> bool) {
    loop {
        {
            let mut stopped = stop.0.lock();
            if !*stopped {
                stop.1.wait_for(&mut stopped, interval);
            }
            if *stopped {
                return;
            }
        }
        if !pass() {
            return;
        }
    }
}
