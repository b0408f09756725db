//! The request fingerprint: SHA-256 over method, path, query, content type and body.
//!
//! Two requests under one key are "the same request" exactly when their fingerprints are equal. In
//! [`FingerprintMode::CanonicalJson`] (the default) a body whose `Content-Type` is JSON and that
//! parses as JSON is hashed in a canonical form modelled on RFC 8785: object members sorted by their
//! UTF-16 code units, no insignificant whitespace, minimal string escapes, and numbers written the
//! in ECMAScript's layout but computed **exactly from the number's decimal text** (`100.00`, `1e2` and
//! `100` are all `100`; `0.1` and `0.1000000000000000001` stay different), so a client that
//! re-serialises the same JSON on retry is recognised while no two different amounts can meet in
//! a rounded float. Non-JSON bodies, bodies that do not parse, and every body in
//! [`FingerprintMode::ExactBytes`] are hashed byte for byte.
//!
//! The `Content-Type` enters as a normalised media type (type, subtype and parameter names in lower
//! case, parameters sorted, quoted values unquoted, `charset` values in lower case), so the same body
//! sent as JSON and as text are different requests.
//!
//! A JSON body that repeats a member name in one object is refused before it is fingerprinted
//! ([`duplicate_member`]): parsers disagree on which copy wins, so such a body has no single meaning.
//!
//! Every part is length-prefixed and the body part is tagged with how it was hashed, so no two
//! different (method, path, query, content type, body) tuples can produce the same input to the
//! hash.
//!
//! This module owns the hash; the parts it hashes live apart: [`media_type()`] (the normalised
//! `Content-Type`), `document` (reading a JSON body with its numbers' exact text, without
//! serde_json's `arbitrary_precision`), `canonical_json` (the canonical form) and `duplicates` (the
//! refusal of repeated member names).

mod canonical_json;
mod document;
mod duplicates;
mod media_type;

use axum::http::{HeaderMap, Method};
use idemlog::Fingerprint;
use sha2::{Digest, Sha256};

pub use self::canonical_json::canonical_json;
pub use self::document::Json;
pub use self::duplicates::duplicate_member;
pub use self::media_type::{is_json, media_type, media_type_of};

/// How a body enters the fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FingerprintMode {
    /// JSON bodies in canonical form; anything else as exact bytes.
    #[default]
    CanonicalJson,
    /// Every body as its exact bytes.
    ExactBytes,
}

const DOMAIN: &[u8] = b"idemlog-fingerprint-v2";

/// A body that entered as JSON: parsed once, canonicalised once, and shared by the fingerprint and
/// the request digest ([`crate::digest`]).
pub struct JsonBody {
    /// The parsed document, numbers as their exact text.
    pub value: Json,
    /// Its canonical form.
    pub canonical: Vec<u8>,
}

/// The body as JSON, when `mode` compares JSON canonically, the request says it is JSON and it
/// parses; `None` means the body is compared byte for byte.
pub fn parse_body(mode: FingerprintMode, headers: &HeaderMap, body: &[u8]) -> Option<JsonBody> {
    if mode != FingerprintMode::CanonicalJson || !is_json(headers) {
        return None;
    }
    let value = document::parse(body)?.value;
    let mut canonical = Vec::with_capacity(body.len());
    canonical_json(&value, &mut canonical);
    Some(JsonBody { value, canonical })
}

/// A JSON body that repeats a member name in one object: the first such name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepeatedMember(pub String);

/// [`parse_body`] and [`duplicate_member`] in one pass over the body where the mode parses it:
/// the body as JSON (`Ok(Some)`), as bytes (`Ok(None)`), or refused because a JSON body repeats a
/// member name (`Err`, in `ExactBytes` mode too). The same answers as the two functions, from one
/// parse instead of two on the usual request.
pub fn parse_body_strict(
    mode: FingerprintMode,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Option<JsonBody>, RepeatedMember> {
    if !is_json(headers) {
        return Ok(None);
    }
    let Some(parsed) = document::parse(body) else {
        return Ok(None);
    };
    if let Some(name) = parsed.repeated {
        return Err(RepeatedMember(name));
    }
    if mode != FingerprintMode::CanonicalJson {
        return Ok(None);
    }
    let mut canonical = Vec::with_capacity(body.len());
    canonical_json(&parsed.value, &mut canonical);
    Ok(Some(JsonBody {
        value: parsed.value,
        canonical,
    }))
}

/// Fingerprint of a request.
pub fn fingerprint(
    mode: FingerprintMode,
    method: &Method,
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: &[u8],
) -> Fingerprint {
    let json = parse_body(mode, headers, body);
    fingerprint_of(method, path, query, headers, body, json.as_ref())
}

/// [`fingerprint`] of a body already parsed with [`parse_body`].
pub fn fingerprint_of(
    method: &Method,
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: &[u8],
    json: Option<&JsonBody>,
) -> Fingerprint {
    let media = media_type(headers);
    fingerprint_with_media(method, path, query, media.as_deref(), body, json)
}

/// [`fingerprint_of`] with the `Content-Type`'s normal form already taken ([`media_type()`]), for
/// a caller that needs it again (the layer's request digest).
pub(crate) fn fingerprint_with_media(
    method: &Method,
    path: &str,
    query: Option<&str>,
    media: Option<&str>,
    body: &[u8],
    json: Option<&JsonBody>,
) -> Fingerprint {
    let mut hash = Sha256::new();
    hash.update(DOMAIN);
    part(&mut hash, method.as_str().as_bytes());
    part(&mut hash, path.as_bytes());
    match query {
        Some(q) => {
            hash.update([1]);
            part(&mut hash, q.as_bytes());
        }
        None => hash.update([0]),
    }
    match media {
        Some(media_type) => {
            hash.update([1]);
            part(&mut hash, media_type.as_bytes());
        }
        None => hash.update([0]),
    }
    match json {
        Some(json) => {
            hash.update(b"J");
            part(&mut hash, &json.canonical);
        }
        None => {
            hash.update(b"B");
            part(&mut hash, body);
        }
    }
    Fingerprint(hash.finalize().into())
}

fn part(hash: &mut Sha256, bytes: &[u8]) {
    hash.update((bytes.len() as u64).to_be_bytes());
    hash.update(bytes);
}

/// Headers of a request sent as JSON, for the tests of this module and its parts.
#[cfg(test)]
pub(crate) fn json_headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use axum::http::header::CONTENT_TYPE;

    fn fp(mode: FingerprintMode, headers: &HeaderMap, body: &str) -> Fingerprint {
        fingerprint(
            mode,
            &Method::POST,
            "/payments",
            None,
            headers,
            body.as_bytes(),
        )
    }

    #[test]
    fn the_one_pass_parse_answers_as_parse_body_and_duplicate_member_did() {
        let text = {
            let mut h = HeaderMap::new();
            h.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
            h
        };
        for headers in [json_headers(), text, HeaderMap::new()] {
            for mode in [FingerprintMode::CanonicalJson, FingerprintMode::ExactBytes] {
                for body in [
                    r#"{"amount":"1.00","currency":"BRL"}"#,
                    r#"{"amount":1,"amount":2}"#,
                    r#"{"a":[{"b":1,"b":2}]}"#,
                    r#"{"a":1,"a":2"#,
                    "not json",
                    "",
                ] {
                    let body = body.as_bytes();
                    let expected = match duplicate_member(&headers, body) {
                        Some(name) => Err(RepeatedMember(name)),
                        None => Ok(parse_body(mode, &headers, body).map(|json| json.canonical)),
                    };
                    let got = parse_body_strict(mode, &headers, body)
                        .map(|json| json.map(|j| j.canonical));
                    assert_eq!(got, expected, "{mode:?} {headers:?} {body:?}");
                }
            }
        }
    }

    #[test]
    fn the_content_type_is_part_of_the_fingerprint() {
        let body = r#"{"amount":100,"currency":"BRL"}"#;
        let mode = FingerprintMode::ExactBytes;
        let with = |ct: &str| {
            let mut h = HeaderMap::new();
            h.insert(CONTENT_TYPE, HeaderValue::from_str(ct).expect("header"));
            fp(mode, &h, body)
        };
        assert_ne!(with("application/json"), with("text/plain"));
        assert_ne!(with("application/json"), fp(mode, &HeaderMap::new(), body));
        assert_eq!(
            with("application/json; charset=utf-8"),
            with("Application/JSON;Charset=\"UTF-8\"")
        );
        assert_eq!(with("text/plain; b=2; a=1"), with("text/plain;a=1;b=2"));
        assert_ne!(with("text/plain; a=X"), with("text/plain; a=x"));
    }

    #[test]
    fn reserialised_json_has_the_same_fingerprint() {
        let h = json_headers();
        let a = fp(
            FingerprintMode::CanonicalJson,
            &h,
            r#"{"amount":100.00,"currency":"BRL"}"#,
        );
        let b = fp(
            FingerprintMode::CanonicalJson,
            &h,
            "{\n  \"currency\": \"BRL\",\n  \"amount\": 100\n}",
        );
        assert_eq!(a, b);
    }

    #[test]
    fn exact_bytes_mode_tells_reserialised_json_apart() {
        let h = json_headers();
        let a = fp(
            FingerprintMode::ExactBytes,
            &h,
            r#"{"amount":100,"currency":"BRL"}"#,
        );
        let b = fp(
            FingerprintMode::ExactBytes,
            &h,
            r#"{"currency":"BRL","amount":100}"#,
        );
        assert_ne!(a, b);
    }

    #[test]
    fn non_json_content_type_is_hashed_exactly() {
        let h = HeaderMap::new();
        let a = fp(FingerprintMode::CanonicalJson, &h, r#"{"a":1,"b":2}"#);
        let b = fp(FingerprintMode::CanonicalJson, &h, r#"{"b":2,"a":1}"#);
        assert_ne!(a, b);
    }

    #[test]
    fn different_values_method_path_or_query_differ() {
        let h = json_headers();
        let body = br#"{"amount":100,"currency":"BRL"}"#;
        let mode = FingerprintMode::CanonicalJson;
        let base = fingerprint(mode, &Method::POST, "/payments", None, &h, body);
        assert_ne!(
            base,
            fingerprint(mode, &Method::PUT, "/payments", None, &h, body)
        );
        assert_ne!(
            base,
            fingerprint(mode, &Method::POST, "/refunds", None, &h, body)
        );
        assert_ne!(
            base,
            fingerprint(mode, &Method::POST, "/payments", Some(""), &h, body)
        );
        assert_ne!(
            base,
            fingerprint(mode, &Method::POST, "/payments", Some("x=1"), &h, body)
        );
        assert_ne!(
            base,
            fingerprint(
                mode,
                &Method::POST,
                "/payments",
                None,
                &h,
                br#"{"amount":101,"currency":"BRL"}"#
            )
        );
    }
}
