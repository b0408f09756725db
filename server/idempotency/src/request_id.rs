//! Request ids: every response carries `X-Request-Id`, every log line of a request names it, and
//! every problem+json body has it as the `request_id` member.
//!
//! The id is the client's `X-Request-Id` when it is sane (1 to [`MAX_REQUEST_ID_LEN`] visible ASCII
//! characters, 0x21–0x7E), and a fresh UUID otherwise. [`request_context`] (the outermost
//! middleware) settles it, puts it in the request headers for everything inside, runs the rest of
//! the request with it in a task-local ([`current`]) and sets it on the response.
//!
//! Problem bodies take the id from that task-local when they are built
//! ([`crate::problem::Problem`]), *before* the idempotency layer stores a handler's 4xx. A
//! replayed response is therefore the stored one byte for byte: its body names the id of the
//! request that produced it, while its `X-Request-Id` header names the replaying request. Nothing
//! rewrites a body on the way out.

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
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

/// Middleware (outermost): settles the request id, and runs the request with it (see the module
/// docs).
pub async fn request_context(mut request: Request, next: Next) -> Response {
    let id = match request.headers().get(&REQUEST_ID) {
        Some(value) if is_sane(value) => value.clone(),
        _ => MakeRequestUuid
            .make_request_id(&request)
            .map(|id| id.header_value().clone())
            .unwrap_or_else(|| HeaderValue::from_static("unknown")),
    };
    request.headers_mut().insert(REQUEST_ID, id.clone());
    let mut response = CURRENT.scope(id.clone(), next.run(request)).await;
    response.headers_mut().insert(REQUEST_ID, id);
    response
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
}
