//! Counting the layer's requests in flight, so shutdown can wait for them.
//!
//! The work of a request whose client disconnected goes on in a task of its own (see
//! `finish_on_drop`). Such a task is not tied to any connection, so the server's graceful shutdown
//! (which waits for connections) does not see it: [`InFlight::wait_idle`] does.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

/// A count of running tasks with a way to wait until it is zero. Clones share the count.
#[derive(Debug, Clone, Default)]
pub struct InFlight {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    count: AtomicUsize,
    idle: Notify,
}

/// Held by a running task; dropping it ends the task's count.
#[derive(Debug)]
pub struct InFlightGuard {
    inner: Arc<Inner>,
}

impl InFlight {
    /// Counts a task until the guard drops.
    pub fn enter(&self) -> InFlightGuard {
        self.inner.count.fetch_add(1, Ordering::SeqCst);
        InFlightGuard {
            inner: Arc::clone(&self.inner),
        }
    }

    /// Tasks running now.
    pub fn count(&self) -> usize {
        self.inner.count.load(Ordering::SeqCst)
    }

    /// Returns once no task is running.
    pub async fn wait_idle(&self) {
        loop {
            let notified = self.inner.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.count() == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if self.inner.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.inner.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn wait_idle_returns_when_the_last_guard_drops() {
        let in_flight = InFlight::default();
        let guard = in_flight.enter();
        let waiter = tokio::spawn({
            let in_flight = in_flight.clone();
            async move { in_flight.wait_idle().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        drop(guard);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("wait_idle returns")
            .expect("task");
    }
}
