//! Problem responses built in more than one place of the request flow.
//!
//! Bodies sent to clients name the failure class only; the details go to the log. A `Retry-After`
//! hint never asks a client to wait longer than the lease has left.

use std::time::Duration;

use axum::body::Body;
use axum::http::StatusCode;
use axum::http::header::CONTENT_LENGTH;
use axum::response::{IntoResponse, Response};
use tracing::error;

use crate::outcome::{Outcome, OutcomeCounts};
use crate::problem::Problem;
use crate::store::StoreError;

/// The `Retry-After` seconds of a 409: the configured hint, but never more than the lease has
/// left (rounded up to whole seconds, at least 1, as the header counts whole seconds).
pub fn retry_after_hint(hint: Duration, lease_left: Duration) -> u64 {
    let seconds = |d: Duration| d.as_millis().div_ceil(1000).max(1) as u64;
    seconds(hint).min(seconds(lease_left))
}

/// A problem response with one more member in its body (RFC 9457 extension members).
pub(crate) fn with_member(problem: &Problem, name: &str, value: serde_json::Value) -> Response {
    let mut body: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&problem.body()).unwrap_or_default();
    body.insert(name.to_owned(), value);
    let mut response = problem.clone().into_response();
    *response.body_mut() = Body::from(serde_json::to_vec(&body).unwrap_or_default());
    response.headers_mut().remove(CONTENT_LENGTH);
    response
}

/// The 409 for a key whose request is still running.
pub(crate) fn in_progress(seconds: u64) -> Response {
    Problem::new(
        StatusCode::CONFLICT,
        "request-in-progress",
        "A request with this Idempotency-Key is in progress",
        format!("the first request with this key is still running; retry in {seconds} s"),
    )
    .retry_after(seconds)
    .into_response()
}

/// A 503 that names the failure class only; the error itself goes to the log.
pub(crate) fn store_failure(
    counts: &OutcomeCounts,
    during: &'static str,
    e: &StoreError,
) -> Response {
    counts.record(Outcome::StoreError);
    error!(during, class = e.class(), error = %e, "idempotency store failed: 503");
    Problem::store_unavailable(format!(
        "the idempotency store could not {during} this request; retry with the same Idempotency-Key"
    ))
    .into_response()
}
