//! Tracing of requests: the span every log line of a request is recorded in.
//!
//! The request id itself is settled by the idempotency crate's
//! [`request_context`](idemlog_idempotency::request_id::request_context) middleware (outermost), so
//! the span can name it; the route label is the matched template, or [`UNMATCHED_ROUTE`].

use axum::extract::{MatchedPath, Request};
use idemlog_idempotency::request_id::REQUEST_ID;
use tracing::Span;

use crate::routes::UNMATCHED_ROUTE;

/// The span of one request (for tower-http's `TraceLayer`): request id, method and route template,
/// so that every log line of the request names them. At ERROR level, so that it is enabled
/// whatever the log filter lets through (a span filtered out would leave the request's warnings
/// without their id).
pub fn make_span(request: &Request) -> Span {
    let id = request
        .headers()
        .get(&REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or(UNMATCHED_ROUTE, MatchedPath::as_str);
    tracing::error_span!(
        "request",
        request_id = %id,
        method = %request.method(),
        route = %route,
    )
}
