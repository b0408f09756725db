//! Entry points for fuzz targets (cargo-fuzz in this repository's `fuzz/`) that attack what the
//! layer reads from the wire, and for the tests that replay a committed corpus. Not part of the
//! stable API.
//!
//! Each function takes arbitrary bytes and panics when an invariant fails; the fuzzer reports the panic
//! as a crash.

use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use idemlog::Fingerprint;

use crate::fingerprint::{
    FingerprintMode, Json, JsonBody, RepeatedMember, duplicate_member, fingerprint, parse_body,
    parse_body_strict,
};
use crate::key::{self, HEADER, KeyError};

/// Parses `bytes` as an `Idempotency-Key` header value.
///
/// Panics if an accepted key is not 1–255 visible ASCII characters; if its quoted form (`"…"` with
/// `\"` and `\\` escapes), or its bare form when it does not start with `"`, parses to another key;
/// if reading the header from a request's headers disagrees with parsing the value; or if a refusal
/// is not a 400.
pub fn idempotency_key(bytes: &[u8]) {
    let parsed = key::parse(bytes);
    if let Ok(value) = HeaderValue::from_bytes(bytes) {
        let mut headers = HeaderMap::new();
        headers.insert(HEADER, value.clone());
        assert_eq!(key::from_headers(&headers), parsed, "header map vs value");
        headers.append(HEADER, value);
        assert_eq!(key::from_headers(&headers), Err(KeyError::Repeated));
    }
    match parsed {
        Ok(k) => {
            let s = k.as_str();
            assert!((1..=key::MAX_LEN).contains(&s.len()), "length of {s:?}");
            assert!(
                s.bytes().all(|b| b.is_ascii_graphic()),
                "characters of {s:?}"
            );
            assert_eq!(key::parse(&quote(s)), Ok(k.clone()), "quoted form of {s:?}");
            if !s.starts_with('"') {
                assert_eq!(
                    key::parse(s.as_bytes()),
                    Ok(k.clone()),
                    "bare form of {s:?}"
                );
            }
        }
        Err(e) => assert_eq!(e.to_problem().status, StatusCode::BAD_REQUEST),
    }
}

/// The structured-field string form of a key.
fn quote(key: &str) -> Vec<u8> {
    let mut out = vec![b'"'];
    for b in key.bytes() {
        if matches!(b, b'"' | b'\\') {
            out.push(b'\\');
        }
        out.push(b);
    }
    out.push(b'"');
    out
}

/// The body read as JSON, or `None` if it is not JSON.
fn json(body: &[u8]) -> Option<JsonBody> {
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    parse_body(FingerprintMode::CanonicalJson, &headers, body)
}

/// The canonical form of a JSON body, or `None` if it is not JSON.
pub fn canonical(body: &[u8]) -> Option<Vec<u8>> {
    json(body).map(|json| json.canonical)
}

/// `value` written again as a client might: members in reverse order, numbers as their text,
/// strings through serde_json, and with whitespace between tokens when `spaced`.
fn reserialise(value: &Json, spaced: bool, out: &mut Vec<u8>) {
    let gap: &[u8] = if spaced { b" \n " } else { b"" };
    match value {
        Json::Null => out.extend_from_slice(b"null"),
        Json::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Json::Number(text) => out.extend_from_slice(text.as_bytes()),
        Json::String(s) => {
            out.extend_from_slice(serde_json::to_string(s).expect("a string").as_bytes())
        }
        Json::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(gap);
                reserialise(item, spaced, out);
            }
            out.extend_from_slice(gap);
            out.push(b']');
        }
        Json::Object(members) => {
            out.push(b'{');
            for (i, (name, item)) in members.iter().rev().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(gap);
                out.extend_from_slice(serde_json::to_string(name).expect("a string").as_bytes());
                out.extend_from_slice(gap);
                out.push(b':');
                reserialise(item, spaced, out);
            }
            out.extend_from_slice(gap);
            out.push(b'}');
        }
    }
}

fn fp(mode: FingerprintMode, content_type: Option<&'static str>, body: &[u8]) -> Fingerprint {
    let mut headers = HeaderMap::new();
    if let Some(content_type) = content_type {
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    }
    fingerprint(mode, &Method::POST, "/orders", None, &headers, body)
}

/// `parse_body_strict` (one pass) answers as `duplicate_member` and then `parse_body` (two) did:
/// the same refusal, or the same document and canonical form, in both modes.
fn one_pass_agrees_with_two(bytes: &[u8]) {
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    for mode in [FingerprintMode::CanonicalJson, FingerprintMode::ExactBytes] {
        let two = match duplicate_member(&headers, bytes) {
            Some(name) => Err(RepeatedMember(name)),
            None => Ok(parse_body(mode, &headers, bytes).map(|json| (json.value, json.canonical))),
        };
        let one = parse_body_strict(mode, &headers, bytes)
            .map(|json| json.map(|json| (json.value, json.canonical)));
        assert_eq!(one, two, "{mode:?}: one pass against two");
    }
}

/// Fingerprints `bytes` as a request body.
///
/// Panics unless: a body that is JSON has a canonical form that is UTF-8 JSON and its own canonical
/// form (`canonical(canonical(x)) == canonical(x)`); the body, its canonical form and its
/// re-serialisations (compact and spaced, members in another order) have one fingerprint under a JSON content type; a body
/// that is not JSON, or not sent as JSON, or any body in exact-bytes mode, is hashed byte for byte;
/// the content type always counts; and the one-pass parse agrees with the two passes it replaced.
pub fn json_fingerprint(bytes: &[u8]) {
    use FingerprintMode::{CanonicalJson, ExactBytes};
    const JSON: Option<&str> = Some("application/json");
    let exact = fp(ExactBytes, JSON, bytes);
    one_pass_agrees_with_two(bytes);
    assert_eq!(
        fp(CanonicalJson, None, bytes),
        fp(ExactBytes, None, bytes),
        "no content type"
    );
    assert_eq!(
        fp(CanonicalJson, Some("text/plain"), bytes),
        fp(ExactBytes, Some("text/plain"), bytes)
    );
    assert_ne!(
        fp(ExactBytes, Some("text/plain"), bytes),
        exact,
        "the content type is part of the fingerprint"
    );
    let Some(parsed) = json(bytes) else {
        assert_eq!(
            fp(CanonicalJson, JSON, bytes),
            exact,
            "a body that is not JSON"
        );
        return;
    };
    let canonical_form = parsed.canonical;
    let text = std::str::from_utf8(&canonical_form).expect("the canonical form is UTF-8");
    let again = canonical(&canonical_form)
        .unwrap_or_else(|| panic!("the canonical form {text} is not JSON"));
    assert_eq!(again, canonical_form, "canonical(canonical(x)) for {text}");

    let want = fp(CanonicalJson, JSON, bytes);
    assert_eq!(fp(CanonicalJson, JSON, &canonical_form), want, "{text}");
    assert_eq!(
        fp(CanonicalJson, Some("Application/JSON"), bytes),
        want,
        "the media type is compared case-insensitively"
    );
    for spaced in [false, true] {
        let mut reserialised = Vec::new();
        reserialise(&parsed.value, spaced, &mut reserialised);
        assert_eq!(
            fp(CanonicalJson, JSON, &reserialised),
            want,
            "re-serialised as {}",
            String::from_utf8_lossy(&reserialised)
        );
    }
}
