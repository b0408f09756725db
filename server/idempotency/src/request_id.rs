//! Request ids: every response carries `X-Request-Id`, every log line of a request names it, and
//! every problem+json body has it as the `request_id` member.
//!
//! The id is the client's `X-Request-Id` when it is sane (1 to [`MAX_REQUEST_ID_LEN`] visible ASCII
//! characters, 0x21–0x7E), and a fresh UUID otherwise. [`RequestContextLayer`] (the outermost
//! middleware) settles it, puts it in the request headers for everything inside, runs the rest of
//! the request with it in a task-local ([`current`]) and sets it on the response.
//!
//! Problem bodies take the id from that task-local when they are built
//! ([`crate::problem::Problem`]), *before* the idempotency layer stores a handler's 4xx. A
//! replayed response is therefore the stored one byte for byte: its body names the id of the
//! request that produced it, while its `X-Request-Id` header names the replaying request. Nothing
//! rewrites a body on the way out.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use axum::http::{HeaderName, HeaderValue, Request, Response};
use pin_project_lite::pin_project;
use tokio::task::futures::TaskLocalFuture;
use tower::{Layer, Service};
use tower_http::request_id::{MakeRequestId, MakeRequestUuid};
use tracing::Span;

/// The request-id header.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Longest client-supplied request id kept.
pub const MAX_REQUEST_ID_LEN: usize = 128;

tokio::task_local! {
    static CURRENT: HeaderValue;
}

/// The id of the request being served on this task, if any.
pub fn current() -> Option<String> {
    CURRENT
        .try_with(|id| id.to_str().ok().map(str::to_owned))
        .ok()
        .flatten()
}

/// Wraps `f` so that it runs with the current request's id and span wherever it is polled: for
/// the rest of a request that is spawned when its client goes away
/// ([`crate::layer`]'s finish-on-drop), so that a 4xx it stores still names the request.
pub fn carry<F: Future>(f: F) -> impl Future<Output = F::Output> {
    let id = CURRENT.try_with(HeaderValue::clone).ok();
    let f = tracing::Instrument::instrument(f, Span::current());
    async move {
        match id {
            Some(id) => CURRENT.scope(id, f).await,
            None => f.await,
        }
    }
}

/// True if a client's id may be kept: 1 to [`MAX_REQUEST_ID_LEN`] visible ASCII characters.
pub fn is_sane(value: &HeaderValue) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_REQUEST_ID_LEN
        && bytes.iter().all(|b| (0x21..=0x7e).contains(b))
}

/// The request-id middleware: put it outermost, so that everything inside (the trace span, the
/// problem bodies, the idempotency layer) sees the settled id.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestContextLayer;

impl<S> Layer<S> for RequestContextLayer {
    type Service = RequestContext<S>;

    fn layer(&self, inner: S) -> RequestContext<S> {
        RequestContext { inner }
    }
}

/// The service of [`RequestContextLayer`]: settles the request id and runs the request with it
/// (see the module docs).
///
/// A service of its own rather than `axum::middleware::from_fn`, which clones the whole service
/// below it and boxes two futures on every request (the repository's benches/NOTEBOOK.md,
/// "no `from_fn` on the request path").
#[derive(Debug, Clone)]
pub struct RequestContext<S> {
    inner: S,
}

impl<S, B, R> Service<Request<B>> for RequestContext<S>
where
    S: Service<Request<B>, Response = Response<R>>,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = RequestContextFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let id = match request.headers().get(&REQUEST_ID) {
            Some(value) if is_sane(value) => value.clone(),
            _ => MakeRequestUuid
                .make_request_id(&request)
                .map(|id| id.header_value().clone())
                .unwrap_or_else(|| HeaderValue::from_static("unknown")),
        };
        request.headers_mut().insert(REQUEST_ID, id.clone());
        // The inner services' `call` runs under the id as well as their futures: a layer may
        // answer there (a 401 before any future), and its problem body must name the request.
        let inner = CURRENT.sync_scope(id.clone(), || self.inner.call(request));
        RequestContextFuture {
            inner: CURRENT.scope(id.clone(), inner),
            id: Some(id),
        }
    }
}

pin_project! {
    /// The future of [`RequestContext`]: the rest of the request under its id, then the id on the
    /// response.
    pub struct RequestContextFuture<F> {
        #[pin]
        inner: TaskLocalFuture<HeaderValue, F>,
        id: Option<HeaderValue>,
    }
}

impl<F, R, E> Future for RequestContextFuture<F>
where
    F: Future<Output = Result<Response<R>, E>>,
{
    type Output = Result<Response<R>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut result = ready!(this.inner.poll(cx));
        if let (Ok(response), Some(id)) = (&mut result, this.id.take()) {
            response.headers_mut().insert(REQUEST_ID, id);
        }
        Poll::Ready(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sane_ids_are_short_visible_ascii() {
        assert!(is_sane(&HeaderValue::from_static("abc-123_XYZ")));
        assert!(is_sane(
            &HeaderValue::from_str(&"a".repeat(MAX_REQUEST_ID_LEN)).unwrap()
        ));
        assert!(!is_sane(
            &HeaderValue::from_str(&"a".repeat(MAX_REQUEST_ID_LEN + 1)).unwrap()
        ));
        assert!(!is_sane(&HeaderValue::from_static("")));
        assert!(!is_sane(&HeaderValue::from_static("has space")));
        assert!(!is_sane(&HeaderValue::from_bytes(b"tab\there").unwrap()));
        assert!(!is_sane(
            &HeaderValue::from_bytes("caf\u{e9}".as_bytes()).unwrap()
        ));
    }

    /// A service that answers in `call` itself (as an authentication layer refusing a request
    /// does), with the request id it sees there and then in its future.
    #[derive(Clone)]
    struct AnswersInCall;

    impl Service<Request<()>> for AnswersInCall {
        type Response = Response<String>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Response<String>, Self::Error>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _request: Request<()>) -> Self::Future {
            std::future::ready(Ok(Response::new(current().unwrap_or_default())))
        }
    }

    #[tokio::test]
    async fn an_answer_built_in_the_inner_call_names_the_request_id() {
        let mut service = RequestContextLayer.layer(AnswersInCall);
        let request = Request::builder()
            .header(REQUEST_ID, "req-in-call")
            .body(())
            .expect("request");
        let response = tower::ServiceExt::oneshot(&mut service, request)
            .await
            .expect("infallible");
        assert_eq!(response.body(), "req-in-call");
        assert_eq!(response.headers()[REQUEST_ID], "req-in-call");
    }
}
