//! Turning a handler's response into a stored one, and a stored one back into a replay.
//!
//! Only an allow-list of headers is stored and replayed: by default `Content-Type`, `Location` and
//! `ETag` ([`STORED_HEADERS`]; `IdempotencyConfig::stored_headers` changes it). Everything else
//! (notably `Set-Cookie`, which may carry a session for the first caller only) is left out unless
//! listed. Status and body bytes are stored exactly; a replay adds `Idempotent-Replayed: true`.
//! `Content-Encoding` ([`BODY_HEADERS`]) is stored and replayed with every stored body whatever the
//! allow-list: it says what the bytes are (gzip bytes without it would be read as the content type),
//! so it belongs to the body, not to the headers one may choose.
//!
//! A response whose body is larger than what is stored is recorded by [`body_not_kept`]: its
//! status and allow-listed headers, with a problem+json body saying the request completed with that
//! status and its body was not kept (with no `Content-Encoding`: that body is plain JSON).
//! Replaying it needs nothing special.

use axum::body::Body;
use axum::http::header::{CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, ETAG, LOCATION};
use axum::http::response::Parts;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use idemlog::StoredResponse;

use crate::problem::{PROBLEM_JSON, Problem};

/// Header added to every replayed response.
pub const REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Headers that are stored and replayed.
pub const STORED_HEADERS: [HeaderName; 3] = [CONTENT_TYPE, LOCATION, ETAG];

/// Headers that describe the stored body bytes themselves: stored and replayed with a body whatever
/// the allow-list.
pub const BODY_HEADERS: [HeaderName; 1] = [CONTENT_ENCODING];

/// The stored form of a response, with the default allow-list.
pub fn to_stored(parts: &Parts, body: Bytes) -> StoredResponse {
    to_stored_with(parts, body, &STORED_HEADERS)
}

/// The stored form of a response, keeping the headers named in `allowed` and [`BODY_HEADERS`].
pub fn to_stored_with(parts: &Parts, body: Bytes, allowed: &[HeaderName]) -> StoredResponse {
    let mut stored = StoredResponse::new(parts.status.as_u16(), body);
    let body_headers = BODY_HEADERS.iter().filter(|name| !allowed.contains(name));
    for name in allowed.iter().chain(body_headers) {
        for value in parts.headers.get_all(name) {
            stored = stored.with_header(name.as_str(), Bytes::copy_from_slice(value.as_bytes()));
        }
    }
    stored
}

/// The `type` slug of the body stored in place of one too large to keep.
pub const BODY_NOT_KEPT: &str = "response-body-not-kept";

/// What is stored for a response whose body exceeded `limit` bytes: its status and its
/// allow-listed headers (but `Content-Type`, `Content-Length`, `Content-Encoding`: they described
/// the body that was not kept), with a problem+json body that says
/// the request completed with this status and its body was not kept. Its replay therefore tells
/// a retrying client the truth (it ran, with this status, and `Location` still points to what it
/// made) without running the request again.
pub fn body_not_kept(parts: &Parts, limit: usize, allowed: &[HeaderName]) -> StoredResponse {
    let status = parts.status.as_u16();
    not_kept(
        parts,
        format!(
            "the request with this Idempotency-Key completed with status {status}, but its \
             response body was larger than the {limit} bytes kept for replay, so it cannot be \
             shown again; the request was not run again"
        ),
        allowed,
    )
}

/// As [`body_not_kept`], for a body the store refused although it was within the layer's limit
/// (the store's own largest value is smaller). The layer cannot tell the store's limit, so the
/// detail names none.
pub(crate) fn body_refused(parts: &Parts, allowed: &[HeaderName]) -> StoredResponse {
    let status = parts.status.as_u16();
    not_kept(
        parts,
        format!(
            "the request with this Idempotency-Key completed with status {status}, but its \
             response body could not be kept for replay, so it cannot be shown again; the \
             request was not run again"
        ),
        allowed,
    )
}

/// The stored form of a response whose body was not kept, with `detail` saying why.
fn not_kept(parts: &Parts, detail: String, allowed: &[HeaderName]) -> StoredResponse {
    let status = parts.status.as_u16();
    let problem = Problem::new(
        parts.status,
        BODY_NOT_KEPT,
        "Request completed; response body not kept",
        detail,
    );
    let mut stored = StoredResponse::new(status, Bytes::from(problem.body())).with_header(
        CONTENT_TYPE.as_str(),
        Bytes::from_static(PROBLEM_JSON.as_bytes()),
    );
    for name in allowed {
        if name == CONTENT_TYPE || name == CONTENT_LENGTH || name == CONTENT_ENCODING {
            continue;
        }
        for value in parts.headers.get_all(name) {
            stored = stored.with_header(name.as_str(), Bytes::copy_from_slice(value.as_bytes()));
        }
    }
    stored
}

/// The replay of a stored response, with the default allow-list.
pub fn replay(stored: StoredResponse) -> Response {
    replay_with(stored, &STORED_HEADERS)
}

/// The replay of a stored response. Headers are checked against `allowed` again (plus
/// `Content-Type`, which [`body_not_kept`] always writes, and [`BODY_HEADERS`]), so nothing outside
/// the allow-list can ever be replayed.
pub fn replay_with(stored: StoredResponse, allowed: &[HeaderName]) -> Response {
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
        let Some(name) = allowed
            .iter()
            .chain(std::iter::once(&CONTENT_TYPE))
            .chain(BODY_HEADERS.iter())
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
    fn a_configured_allow_list_replaces_the_default() {
        let response = Response::builder()
            .status(200)
            .header(CONTENT_TYPE, "text/plain")
            .header(SET_COOKIE, "a=b")
            .header("x-custom", "1")
            .header(ETAG, "\"e\"")
            .body(())
            .expect("response");
        let (parts, ()) = response.into_parts();
        let allowed = [SET_COOKIE, HeaderName::from_static("x-custom")];
        let stored = to_stored_with(&parts, Bytes::from_static(b"x"), &allowed);
        assert_eq!(stored.headers.len(), 2);
        let replayed = replay_with(stored, &allowed);
        assert_eq!(replayed.headers()[SET_COOKIE], "a=b");
        assert_eq!(replayed.headers()["x-custom"], "1");
        assert!(replayed.headers().get(ETAG).is_none());
        // A stored header outside the replaying allow-list is dropped.
        let stored = StoredResponse::new(200, "x").with_header("x-custom", "1");
        assert!(replay(stored).headers().get("x-custom").is_none());
    }

    #[tokio::test]
    async fn a_body_not_kept_replays_its_status_headers_and_a_problem() {
        let response = Response::builder()
            .status(201)
            .header(CONTENT_TYPE, "application/octet-stream")
            .header(CONTENT_LENGTH, "5000000")
            .header(LOCATION, "/files/1")
            .body(())
            .expect("response");
        let (parts, ()) = response.into_parts();
        let stored = body_not_kept(&parts, 1024, &STORED_HEADERS);
        let replayed = replay(stored);
        assert_eq!(replayed.status(), StatusCode::CREATED);
        assert_eq!(replayed.headers()[CONTENT_TYPE], PROBLEM_JSON);
        assert_eq!(replayed.headers()[LOCATION], "/files/1");
        assert_eq!(replayed.headers()[REPLAYED], "true");
        let body = axum::body::to_bytes(replayed.into_body(), 1 << 20)
            .await
            .expect("body");
        let json: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(json["status"], 201);
        assert_eq!(json["type"], "urn:idemlog:problem:response-body-not-kept");
        let detail = json["detail"].as_str().expect("detail");
        assert!(detail.contains("completed with status 201"), "{detail}");
        assert!(detail.contains("not run again"), "{detail}");
    }

    #[test]
    fn content_encoding_is_stored_and_replayed_with_the_body_whatever_the_allow_list() {
        let response = Response::builder()
            .status(201)
            .header(CONTENT_TYPE, "application/json")
            .header(CONTENT_ENCODING, "gzip")
            .body(())
            .expect("response");
        let (parts, ()) = response.into_parts();
        let gzip = Bytes::from_static(&[0x1f, 0x8b, 8, 0]);
        for allowed in [
            &STORED_HEADERS[..],
            &[LOCATION][..],
            &[CONTENT_ENCODING][..],
        ] {
            let stored = to_stored_with(&parts, gzip.clone(), allowed);
            let encodings = stored
                .headers
                .iter()
                .filter(|(name, _)| name.eq_ignore_ascii_case("content-encoding"))
                .count();
            assert_eq!(encodings, 1, "{allowed:?}");
            let replayed = replay_with(stored, allowed);
            assert_eq!(replayed.headers()[CONTENT_ENCODING], "gzip", "{allowed:?}");
        }
    }

    #[test]
    fn a_body_not_kept_drops_the_encoding_of_the_body_it_replaces() {
        let response = Response::builder()
            .status(201)
            .header(CONTENT_TYPE, "application/json")
            .header(CONTENT_ENCODING, "gzip")
            .header(LOCATION, "/files/1")
            .body(())
            .expect("response");
        let (parts, ()) = response.into_parts();
        let allowed = [CONTENT_ENCODING, LOCATION];
        let replayed = replay_with(body_not_kept(&parts, 1024, &allowed), &allowed);
        assert!(replayed.headers().get(CONTENT_ENCODING).is_none());
        assert_eq!(replayed.headers()[CONTENT_TYPE], PROBLEM_JSON);
        assert_eq!(replayed.headers()[LOCATION], "/files/1");
    }

    #[test]
    fn a_stored_set_cookie_is_never_replayed() {
        let stored = StoredResponse::new(200, "x").with_header("Set-Cookie", "a=b");
        assert!(replay(stored).headers().get(SET_COOKIE).is_none());
    }
}
