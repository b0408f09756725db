//! The flusher thread's doorbell: the writer rings it when a lot is buffered or a caller waits for
//! a sync, and `Flusher::stop` rings it to end the thread. Its own module so that the writer and the
//! flusher both depend on it and not on each other.

use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// How the writer (and `Flusher::stop`) wake the flusher thread before its interval is up.
#[derive(Default)]
pub(crate) struct Wakeup {
    state: Mutex<WakeState>,
    changed: Condvar,
}

#[derive(Default)]
struct WakeState {
    stopped: bool,
    kicked: bool,
}

impl Wakeup {
    /// Asks for a round now. A kick that arrives during a round makes the next one start at once.
    pub(crate) fn kick(&self) {
        self.state.lock().kicked = true;
        self.changed.notify_one();
    }

    pub(crate) fn stop(&self) {
        self.state.lock().stopped = true;
        self.changed.notify_all();
    }

    /// Waits until kicked, stopped or `interval` is up; false once stopped.
    pub(crate) fn wait(&self, interval: Duration) -> bool {
        let mut st = self.state.lock();
        if !st.kicked && !st.stopped {
            self.changed.wait_for(&mut st, interval);
        }
        st.kicked = false;
        !st.stopped
    }
}
