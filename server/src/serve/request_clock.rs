//! The HTTP/2 request clock: hyper has no header read timer for HTTP/2, so the connection's
//! service counts the requests in flight and when the last one was answered, and the connection
//! task closes a connection that completes no request head in time.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Instant;

/// Requests in flight on one connection, and since when none has been: the HTTP/2 counterpart of
/// hyper's HTTP/1 header read timer (hyper calls the service once a request head is complete).
pub(super) struct RequestClock {
    start: Instant,
    in_flight: AtomicU64,
    /// Milliseconds from `start` to the moment the last request in flight was answered.
    idle_since_ms: AtomicU64,
}

impl RequestClock {
    pub(super) fn new() -> Self {
        Self {
            start: Instant::now(),
            in_flight: AtomicU64::new(0),
            idle_since_ms: AtomicU64::new(0),
        }
    }

    fn started(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
    }

    fn answered(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.idle_since_ms.store(ms, Ordering::Release);
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    /// How long the connection has been waiting for a request head, or `None` while a request is
    /// in flight.
    pub(super) fn waiting_for_head(&self) -> Option<Duration> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let since = Duration::from_millis(self.idle_since_ms.load(Ordering::Acquire));
        Some(self.start.elapsed().saturating_sub(since))
    }
}

/// Marks a request answered when its response future completes or is dropped.
struct Answered(Arc<RequestClock>);

impl Drop for Answered {
    fn drop(&mut self) {
        self.0.answered();
    }
}

/// The connection's service, counting requests in [`RequestClock`].
#[derive(Clone)]
pub(super) struct Clocked<S> {
    pub(super) inner: S,
    pub(super) clock: Arc<RequestClock>,
}

impl<S, B> tower::Service<axum::http::Request<B>> for Clocked<S>
where
    S: tower::Service<axum::http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ClockedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: axum::http::Request<B>) -> Self::Future {
        self.clock.started();
        let answered = Answered(Arc::clone(&self.clock));
        ClockedFuture {
            inner: self.inner.call(request),
            answered: Some(answered),
        }
    }
}

pin_project! {
    /// The response future of [`Clocked`]: the request counts as answered when its response is
    /// ready, or when the future is dropped before (its [`Answered`] goes with it). A named future
    /// rather than a boxed one per request.
    pub(super) struct ClockedFuture<F> {
        #[pin]
        inner: F,
        answered: Option<Answered>,
    }
}

impl<F: Future> Future for ClockedFuture<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let output = std::task::ready!(this.inner.poll(cx));
        this.answered.take();
        Poll::Ready(output)
    }
}
