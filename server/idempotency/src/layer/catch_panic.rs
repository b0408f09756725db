//! A future that turns a panic of the future it wraps into an error.
//!
//! The layer runs the inner service on its own task rather than spawning it: one task per request
//! instead of two. A panicking handler must still release its key and answer 500 instead of tearing
//! down the request task with the claim held, which is what `tokio::spawn`'s `JoinError` gave for
//! free; this wrapper gives the same on the current task.

use std::any::Any;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

/// What a panic carried.
pub(crate) type Panic = Box<dyn Any + Send + 'static>;

pin_project! {
    /// Polls the wrapped future, catching a panic. After a panic it must not be polled again (the
    /// layer stops at the first `Ready`). The future stays where it is (no box of its own): the
    /// caller pins it, on its stack or in a box it moves.
    pub(crate) struct CatchPanic<F> {
        #[pin]
        inner: F,
    }
}

impl<F: Future> CatchPanic<F> {
    pub(crate) fn new(inner: F) -> Self {
        Self { inner }
    }
}

impl<F: Future> Future for CatchPanic<F> {
    type Output = Result<F::Output, Panic>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = self.project().inner;
        // Unwind safety: after a panic the wrapped future is never polled again, and the layer only
        // uses the claim token it kept outside the future, so no broken state is observed.
        match catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}

/// The panic's message, when it has one.
pub(crate) fn message(panic: &Panic) -> &str {
    if let Some(s) = panic.downcast_ref::<&'static str>() {
        s
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s
    } else {
        "(no message)"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_inside_the_future_becomes_an_error_with_its_message() {
        let caught: Result<(), Panic> = CatchPanic::new(async {
            tokio::task::yield_now().await;
            panic!("handler bug");
        })
        .await;
        let Err(panic) = caught else {
            panic!("the panic was not caught")
        };
        assert_eq!(message(&panic), "handler bug");
    }

    #[tokio::test]
    async fn a_future_that_completes_passes_its_output_through() {
        let done = CatchPanic::new(async {
            tokio::task::yield_now().await;
            7
        })
        .await;
        assert_eq!(done.ok(), Some(7));
    }
}
