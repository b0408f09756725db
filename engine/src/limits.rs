//! Input limits, checked before anything is written.
//!
//! Every length the log stores behind a length prefix is bounded here, so an over-long input is a
//! typed [`Error::TooLarge`] at the API and never a panic in the encoder or an oversized frame.

use crate::error::{Error, Result};
use crate::response::StoredResponse;
use crate::side::SideWrite;

/// Longest scope, in bytes.
pub const MAX_SCOPE: usize = 255;
/// Longest idempotency key, in bytes (the draft's and Stripe's limit).
pub const MAX_KEY: usize = 255;
/// Most headers in a stored response.
pub const MAX_HEADERS: usize = 64;
/// Longest header name.
pub const MAX_HEADER_NAME: usize = 255;
/// Longest header value.
pub const MAX_HEADER_VALUE: usize = 8 * 1024;
/// Longest side-record namespace.
pub const MAX_NAMESPACE: usize = 255;
/// Longest side-record key.
pub const MAX_SIDE_KEY: usize = 1024;
/// Longest request digest stored with a claim (the per-field digests behind a 422's
/// `differing_fields`).
pub const MAX_REQUEST_DIGEST: usize = 8 * 1024;
/// Hard ceiling for a body or side value; [`crate::Options::max_value_bytes`] may only lower it.
pub const MAX_VALUE: usize = 16 << 20;

fn bounded(what: &'static str, len: usize, max: usize) -> Result<()> {
    if len == 0 {
        return Err(Error::Empty(what));
    }
    if len > max {
        return Err(Error::TooLarge { what, len, max });
    }
    Ok(())
}

pub(crate) fn check_record_key(scope: &[u8], key: &[u8]) -> Result<()> {
    bounded("scope", scope.len(), MAX_SCOPE)?;
    bounded("idempotency key", key.len(), MAX_KEY)
}

pub(crate) fn check_response(response: &StoredResponse, max_value: usize) -> Result<()> {
    if response.headers.len() > MAX_HEADERS {
        return Err(Error::TooLarge {
            what: "header count",
            len: response.headers.len(),
            max: MAX_HEADERS,
        });
    }
    for (name, value) in &response.headers {
        bounded("header name", name.len(), MAX_HEADER_NAME)?;
        if value.len() > MAX_HEADER_VALUE {
            return Err(Error::TooLarge {
                what: "header value",
                len: value.len(),
                max: MAX_HEADER_VALUE,
            });
        }
    }
    check_value("response body", response.body.len(), max_value)
}

pub(crate) fn check_side_key(namespace: &[u8], key: &[u8]) -> Result<()> {
    bounded("side namespace", namespace.len(), MAX_NAMESPACE)?;
    bounded("side key", key.len(), MAX_SIDE_KEY)
}

pub(crate) fn check_side_write(write: &SideWrite, max_value: usize) -> Result<()> {
    let (namespace, key) = write.namespace_and_key();
    check_side_key(namespace, key)?;
    if let SideWrite::Put { value, .. } = write {
        check_value("side value", value.len(), max_value)?;
    }
    Ok(())
}

fn check_value(what: &'static str, len: usize, max: usize) -> Result<()> {
    if len > max {
        return Err(Error::TooLarge { what, len, max });
    }
    Ok(())
}
