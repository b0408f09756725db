//! Reading the request body before anything is claimed.
//!
//! The body is read whole, up to the configured limit, because the fingerprint covers it: a body
//! declared or found larger is refused without being read further. Every failure here happens
//! before the claim, so the client may retry with the same key; the caller turns each
//! [`BodyError`] into its problem response.

use axum::body::Body;
use axum::http::HeaderMap;
use axum::http::header::CONTENT_LENGTH;
use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};

/// Why the body could not be read.
pub(crate) enum BodyError {
    TooLarge,
    /// The client stopped sending the body (the server's body-read timeout fired).
    TimedOut,
    Unreadable(String),
}

/// True if `error` or anything it wraps is the body-read timeout of `tower_http`.
fn is_body_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(e) = current {
        if e.is::<tower_http::timeout::TimeoutError>() {
            return true;
        }
        current = e.source();
    }
    false
}

pub(crate) async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<Bytes, BodyError> {
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(BodyError::TooLarge);
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(BodyError::TooLarge),
        Err(e) if is_body_timeout(&*e) => Err(BodyError::TimedOut),
        Err(e) => Err(BodyError::Unreadable(e.to_string())),
    }
}
