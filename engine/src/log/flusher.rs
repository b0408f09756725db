//! The background thread behind `Durability::Periodic` and `Durability::None`.
//!
//! `Periodic(t)` fdatasyncs whatever was appended every `t`; `None` writes buffered frames to the OS
//! every 50 ms so that a process crash loses at most that much. A failure poisons the writer like any
//! other I/O failure, so the next caller learns of it.

use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::writer::LogWriter;
use crate::options::Durability;

const NONE_INTERVAL: Duration = Duration::from_millis(50);

/// Owns the thread; stopping it (or dropping this) joins it.
pub(crate) struct Flusher {
    stop: Arc<(Mutex<bool>, Condvar)>,
    handle: Option<JoinHandle<()>>,
}

impl Flusher {
    /// Starts the thread the durability mode needs, if any.
    pub(crate) fn start(writer: &Arc<LogWriter>, durability: Durability) -> Option<Flusher> {
        let (interval, sync) = match durability {
            Durability::Sync => return None,
            Durability::Periodic(interval) => (interval, true),
            Durability::None => (NONE_INTERVAL, false),
        };
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let weak: Weak<LogWriter> = Arc::downgrade(writer);
        let thread_stop = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("idemlog-flusher".into())
            .spawn(move || run(weak, thread_stop, interval, sync))
            .ok()?;
        Some(Flusher {
            stop,
            handle: Some(handle),
        })
    }

    /// Stops and joins the thread.
    pub(crate) fn stop(&mut self) {
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(writer: Weak<LogWriter>, stop: Arc<(Mutex<bool>, Condvar)>, interval: Duration, sync: bool) {
    let (flag, wake) = &*stop;
    let mut stopped = flag.lock();
    while !*stopped {
        wake.wait_for(&mut stopped, interval);
        if *stopped {
            break;
        }
        let Some(writer) = writer.upgrade() else {
            break;
        };
        let result = if sync {
            writer.sync_all()
        } else {
            writer.write_all()
        };
        if result.is_err() {
            // The writer is poisoned and reports the cause to every caller; nothing more to do here.
            break;
        }
    }
}
