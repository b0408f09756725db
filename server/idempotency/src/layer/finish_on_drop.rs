//! A future that is finished on a task of its own if whoever polls it drops it early.
//!
//! Once a key is claimed, the claim, the handler and the completion (or release) must run to the
//! end: a client that disconnects makes axum drop the request's future, and stopping there would
//! leave the key held until its lease runs out, or a business action done but not recorded.
//! Spawning a task per request gives that guarantee but costs a task and a wake-up on every
//! request; this wrapper runs the work on the request's own task and spawns only what is left when
//! the future is dropped before the end, which happens only on a disconnect.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tracing::error;

use super::catch_panic::{CatchPanic, Panic};

/// See the module docs. Its output is the wrapped future's, or the panic that stopped it.
pub(crate) struct FinishOnDrop<F>
where
    F: Future + Send + 'static,
{
    /// `None` once the wrapped future finished or panicked: nothing is left to finish. Boxed, so
    /// that what is left can move to a task of its own.
    inner: Option<Pin<Box<CatchPanic<F>>>>,
}

impl<F> FinishOnDrop<F>
where
    F: Future + Send + 'static,
{
    pub(crate) fn new(inner: F) -> Self {
        Self {
            inner: Some(Box::pin(CatchPanic::new(inner))),
        }
    }
}

impl<F> Future for FinishOnDrop<F>
where
    F: Future + Send + 'static,
{
    type Output = Result<F::Output, Panic>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let Some(inner) = this.inner.as_mut() else {
            panic!("FinishOnDrop polled after it completed");
        };
        let polled = inner.as_mut().poll(cx);
        if polled.is_ready() {
            // Finished or panicked: a future that panicked is never polled or spawned again.
            this.inner = None;
        }
        polled
    }
}

impl<F> Drop for FinishOnDrop<F>
where
    F: Future + Send + 'static,
{
    fn drop(&mut self) {
        let Some(rest) = self.inner.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                // With the request's id and span: a problem body it builds names the request.
                runtime.spawn(crate::request_id::carry(async move {
                    // The output has nobody to go to; a panic is reported by the runtime.
                    let _ = rest.await;
                }));
            }
            // Only while the runtime itself is being torn down: the claim's lease frees the key.
            Err(_) => error!("request dropped outside a runtime: its remaining work is abandoned"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use tokio::sync::Notify;

    use super::*;

    #[tokio::test]
    async fn a_future_dropped_before_the_end_still_runs_to_completion() {
        let finished = Arc::new(AtomicBool::new(false));
        let done = Arc::new(Notify::new());
        let work = FinishOnDrop::new({
            let (finished, done) = (Arc::clone(&finished), Arc::clone(&done));
            async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                finished.store(true, Ordering::SeqCst);
                done.notify_one();
            }
        });
        // The caller gives up after the first poll, as axum does when a client disconnects.
        let gave_up = tokio::time::timeout(Duration::from_millis(1), work).await;
        assert!(gave_up.is_err(), "the work should still have been running");
        assert!(!finished.load(Ordering::SeqCst));
        tokio::time::timeout(Duration::from_secs(5), done.notified())
            .await
            .expect("the rest of the work ran on its own task");
        assert!(finished.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_panic_is_returned_and_the_future_is_not_run_again() {
        let caught: Result<(), Panic> = FinishOnDrop::new(async {
            tokio::task::yield_now().await;
            panic!("layer bug");
        })
        .await;
        let Err(panic) = caught else {
            panic!("the panic was not caught")
        };
        assert_eq!(super::super::catch_panic::message(&panic), "layer bug");
    }
}
