//! Turning a handler's response into a stored one, and a stored one back into a replay.
//!
//! Only an allow-list of headers is stored and replayed: `Content-Type`, `Location` and `ETag`.
//! Everything else (notably `Set-Cookie`, which may carry a session for the first caller only) is
//! left out. Status and body bytes are stored exactly; a replay adds `Idempotent-Replayed: true`.

use axum::body::Body;
use axum::http::header::{CONTENT_TYPE, ETAG, LOCATION};
use axum::http::response::Parts;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use idemlog::StoredResponse;

use crate::problem::Problem;

/// Header added to every replayed response.
pub const REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Headers that are stored and replayed.
pub const STORED_HEADERS: [HeaderName; 3] = [CONTENT_TYPE, LOCATION, ETAG];

/// The stored form of a response.
pub fn to_stored(parts: &Parts, body: Bytes) -> StoredResponse {
    let mut stored = StoredResponse::new(parts.status.as_u16(), body);
    for name in &STORED_HEADERS {
        for value in parts.headers.get_all(name) {
            stored = stored.with_header(name.as_str(), Bytes::copy_from_slice(value.as_bytes()));
        }
    }
    stored
}

/// The replay of a stored response.
pub fn replay(stored: StoredResponse) -> Response {
    let Ok(status) = StatusCode::from_u16(stored.status) else {
        return Problem::internal(format!(
            "stored response has invalid status {}",
            stored.status
        ))
        .into_response();
    };
    let mut response = Response::new(Body::from(stored.body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    for (name, value) in stored.headers {
        // Only allow-listed names were stored; check again so nothing else can ever be replayed.
        let Some(name) = STORED_HEADERS
            .iter()
            .find(|allowed| allowed.as_str().eq_ignore_ascii_case(&name))
        else {
            continue;
        };
        if let Ok(value) = HeaderValue::from_maybe_shared(value) {
            headers.append(name.clone(), value);
        }
    }
    headers.insert(REPLAYED, HeaderValue::from_static("true"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::header::SET_COOKIE;

    #[test]
    fn only_allow_listed_headers_are_stored_and_replayed() {
        let response = Response::builder()
            .status(201)
            .header(CONTENT_TYPE, "application/json")
            .header(LOCATION, "/payments/pay_1")
            .header(ETAG, "\"v1\"")
            .header(SET_COOKIE, "session=secret")
            .header("x-request-id", "abc")
            .body(())
            .expect("response");
        let (parts, ()) = response.into_parts();
        let stored = to_stored(&parts, Bytes::from_static(b"{}"));
        assert_eq!(stored.headers.len(), 3);
        let replayed = replay(stored);
        assert_eq!(replayed.status(), StatusCode::CREATED);
        let h = replayed.headers();
        assert_eq!(h[LOCATION], "/payments/pay_1");
        assert_eq!(h[ETAG], "\"v1\"");
        assert_eq!(h[CONTENT_TYPE], "application/json");
        assert_eq!(h[REPLAYED], "true");
        assert!(h.get(SET_COOKIE).is_none());
        assert!(h.get("x-request-id").is_none());
    }

    #[test]
    fn a_stored_set_cookie_is_never_replayed() {
        let stored = StoredResponse::new(200, "x").with_header("Set-Cookie", "a=b");
        assert!(replay(stored).headers().get(SET_COOKIE).is_none());
    }
}
