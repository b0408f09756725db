//! The request fingerprint: SHA-256 over method, path, query and body.
//!
//! Two requests under one key are "the same request" exactly when their fingerprints are equal. In
//! [`FingerprintMode::CanonicalJson`] (the default) a body whose `Content-Type` is JSON and that
//! parses as JSON is hashed in a canonical form modelled on RFC 8785: object members sorted by their
//! UTF-16 code units, no insignificant whitespace, minimal string escapes, and numbers written the
//! way ECMAScript prints them when they are integral (`100.00`, `1e2` and `100` are all `100`), so a
//! client that re-serialises the same JSON on retry is recognised. Non-JSON bodies, bodies that do
//! not parse, and every body in [`FingerprintMode::ExactBytes`] are hashed byte for byte.
//!
//! Every part is length-prefixed and the body part is tagged with how it was hashed, so no two
//! different (method, path, query, body) tuples can produce the same input to the hash.

use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, Method};
use clap::ValueEnum;
use idemlog::Fingerprint;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// How a body enters the fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum FingerprintMode {
    /// JSON bodies in canonical form; anything else as exact bytes.
    #[default]
    CanonicalJson,
    /// Every body as its exact bytes.
    ExactBytes,
}

const DOMAIN: &[u8] = b"idemlog-fingerprint-v1";

/// Fingerprint of a request.
pub fn fingerprint(
    mode: FingerprintMode,
    method: &Method,
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: &[u8],
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
    let canonical = match mode {
        FingerprintMode::CanonicalJson if is_json(headers) => canonical_body(body),
        _ => None,
    };
    match canonical {
        Some(canonical) => {
            hash.update(b"J");
            part(&mut hash, &canonical);
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

/// True for `application/json` and `application/*+json`.
fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

fn canonical_body(body: &[u8]) -> Option<Vec<u8>> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let mut out = Vec::with_capacity(body.len());
    canonical_json(&value, &mut out);
    Some(out)
}

/// Writes `value` in canonical form.
pub fn canonical_json(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => write_number(n, out),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical_json(item, out);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            let mut members: Vec<(&String, &Value)> = map.iter().collect();
            // RFC 8785 orders members by the UTF-16 code units of their names.
            members.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            out.push(b'{');
            for (i, (name, item)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(name, out);
                out.push(b':');
                canonical_json(item, out);
            }
            out.push(b'}');
        }
    }
}

fn write_number(n: &serde_json::Number, out: &mut Vec<u8>) {
    if let Some(i) = n.as_i64() {
        out.extend_from_slice(i.to_string().as_bytes());
    } else if let Some(u) = n.as_u64() {
        out.extend_from_slice(u.to_string().as_bytes());
    } else if let Some(f) = n.as_f64() {
        // Integral values below 1e21 print without fraction or exponent, as ECMAScript does.
        if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e21 {
            out.extend_from_slice(format!("{}", f as i128).as_bytes());
        } else {
            // Shortest round-trip form (serde_json uses ryu).
            out.extend_from_slice(n.to_string().as_bytes());
        }
    }
}

fn write_string(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    for c in s.chars() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\u{8}' => out.extend_from_slice(b"\\b"),
            '\t' => out.extend_from_slice(b"\\t"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\u{c}' => out.extend_from_slice(b"\\f"),
            '\r' => out.extend_from_slice(b"\\r"),
            c if (c as u32) < 0x20 => {
                out.extend_from_slice(format!("\\u{:04x}", c as u32).as_bytes());
            }
            c => {
                let mut buf = [0; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn json_headers() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        h
    }

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

    fn canonical(text: &str) -> String {
        let mut out = Vec::new();
        canonical_json(&serde_json::from_str(text).expect("json"), &mut out);
        String::from_utf8(out).expect("utf8")
    }

    #[test]
    fn canonical_form_sorts_keys_and_drops_whitespace() {
        assert_eq!(
            canonical(
                r#"{ "currency" : "BRL", "amount": 100.00 , "meta": {"b":[1, 2], "a":null}}"#
            ),
            r#"{"amount":100,"currency":"BRL","meta":{"a":null,"b":[1,2]}}"#
        );
    }

    #[test]
    fn canonical_numbers_print_integral_values_as_integers() {
        assert_eq!(
            canonical("[100, 100.0, 1e2, -0.0, 0.5, 1e300]"),
            "[100,100,100,0,0.5,1e+300]"
        );
    }

    #[test]
    fn canonical_numbers_are_their_own_canonical_form() {
        // Found by the json_fingerprint fuzz target: without serde_json's `float_roundtrip`, parsing
        // the shortest form of a float could give a neighbouring float, so canonical(canonical(x))
        // differed from canonical(x) and a client echoing the canonical form got another fingerprint.
        let once = canonical("123456789012345678903456789012345671234567890");
        assert_eq!(canonical(&once), once);
        assert_eq!(
            canonical("1.2345678901234569e+44"),
            "1.2345678901234569e+44"
        );
    }

    #[test]
    fn canonical_strings_use_minimal_escapes() {
        assert_eq!(canonical(r#""a\u0041\n\u0001\/é""#), "\"aA\\n\\u0001/é\"");
    }

    #[test]
    fn canonical_order_is_by_utf16_code_units() {
        // U+10000 is D800 DC00 in UTF-16 and sorts before U+FFFD, unlike in UTF-8 byte order.
        assert_eq!(
            canonical("{\"\u{fffd}\":1,\"\u{10000}\":2}"),
            "{\"\u{10000}\":2,\"\u{fffd}\":1}"
        );
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
