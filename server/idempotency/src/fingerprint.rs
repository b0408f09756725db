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

use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, Method};
use idemlog::Fingerprint;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use sha2::{Digest, Sha256};

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
    /// The parsed document.
    pub value: Value,
    /// Its canonical form.
    pub canonical: Vec<u8>,
}

/// The body as JSON, when `mode` compares JSON canonically, the request says it is JSON and it
/// parses; `None` means the body is compared byte for byte.
pub fn parse_body(mode: FingerprintMode, headers: &HeaderMap, body: &[u8]) -> Option<JsonBody> {
    if mode != FingerprintMode::CanonicalJson || !is_json(headers) {
        return None;
    }
    let value: Value = serde_json::from_slice(body).ok()?;
    let mut canonical = Vec::with_capacity(body.len());
    canonical_json(&value, &mut canonical);
    Some(JsonBody { value, canonical })
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
    match media_type(headers) {
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

/// The request's `Content-Type` in a normal form: `Application/JSON; Charset="UTF-8"` and
/// `application/json;charset=utf-8` are the same. A value that is not visible ASCII enters as its
/// bytes, lossily decoded, so it still counts.
pub fn media_type(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(CONTENT_TYPE)?;
    let text = String::from_utf8_lossy(value.as_bytes());
    let mut pieces = text.split(';');
    let essence = pieces.next().unwrap_or("").trim().to_ascii_lowercase();
    let mut params: Vec<(String, String)> = pieces
        .filter_map(|p| {
            let (name, value) = p.split_once('=')?;
            let name = name.trim().to_ascii_lowercase();
            let value = value.trim();
            let value = value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(value);
            let value = if name == "charset" {
                value.to_ascii_lowercase()
            } else {
                value.to_owned()
            };
            (!name.is_empty()).then_some((name, value))
        })
        .collect();
    params.sort();
    let mut out = essence;
    for (name, value) in params {
        out.push(';');
        out.push_str(&name);
        out.push('=');
        out.push_str(&value);
    }
    Some(out)
}

/// The first member name that appears twice in one object of a JSON body (at any depth), if the
/// request says it is JSON and the body parses as JSON. Such a body is refused before it is claimed.
pub fn duplicate_member(headers: &HeaderMap, body: &[u8]) -> Option<String> {
    if !is_json(headers) {
        return None;
    }
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    match DuplicateCheck::deserialize(&mut deserializer) {
        Ok(DuplicateCheck(found)) => found,
        Err(_) => None,
    }
}

/// Walks a JSON document and remembers the first repeated member name.
struct DuplicateCheck(Option<String>);

impl<'de> Deserialize<'de> for DuplicateCheck {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(DuplicateVisitor)
    }
}

struct DuplicateVisitor;

impl<'de> Visitor<'de> for DuplicateVisitor {
    type Value = DuplicateCheck;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(DuplicateCheck(None))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(DuplicateCheck(None))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(DuplicateCheck(None))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(DuplicateCheck(None))
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(DuplicateCheck(None))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(DuplicateCheck(None))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        while let Some(DuplicateCheck(inner)) = seq.next_element::<DuplicateCheck>()? {
            found = found.or(inner);
        }
        Ok(DuplicateCheck(found))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut names = std::collections::HashSet::new();
        let mut found = None;
        while let Some(name) = map.next_key::<String>()? {
            let DuplicateCheck(inner) = map.next_value::<DuplicateCheck>()?;
            if found.is_none() && !names.insert(name.clone()) {
                found = Some(name);
            }
            found = found.or(inner);
        }
        Ok(DuplicateCheck(found))
    }
}

/// True for `application/json` and `application/*+json`.
pub fn is_json(headers: &HeaderMap) -> bool {
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

/// Writes a JSON number from its exact decimal text (serde_json keeps it with
/// `arbitrary_precision`), laid out as ECMAScript's `Number::toString` lays out its digits: no
/// float ever rounds two different amounts into one.
fn write_number(n: &serde_json::Number, out: &mut Vec<u8>) {
    let text = n.as_str();
    match Decimal::parse(text) {
        Some(decimal) => decimal.write(out),
        // Not a JSON number (cannot happen for parsed input) or an exponent beyond i64: its text.
        None => out.extend_from_slice(text.as_bytes()),
    }
}

/// A decimal as significant digits and an exponent: `value = 0.digits × 10^point`.
struct Decimal {
    negative: bool,
    /// No leading or trailing zeros; empty for zero.
    digits: Vec<u8>,
    /// Where the decimal point sits relative to the first digit.
    point: i64,
}

impl Decimal {
    /// Parses JSON number text: `-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?`.
    fn parse(text: &str) -> Option<Decimal> {
        let (negative, rest) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let (mantissa, exponent) = match rest.find(['e', 'E']) {
            Some(at) => (&rest[..at], rest[at + 1..].parse::<i64>().ok()?),
            None => (rest, 0),
        };
        let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        if int.is_empty() || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
            return None;
        }
        let all: Vec<u8> = int.bytes().chain(frac.bytes()).collect();
        let leading = all.iter().take_while(|&&b| b == b'0').count();
        let digits_end = all.len() - all.iter().rev().take_while(|&&b| b == b'0').count();
        if leading >= digits_end {
            return Some(Decimal {
                negative: false,
                digits: Vec::new(),
                point: 0,
            });
        }
        let point = i64::try_from(int.len())
            .ok()?
            .checked_sub(i64::try_from(leading).ok()?)?
            .checked_add(exponent)?;
        Some(Decimal {
            negative,
            digits: all[leading..digits_end].to_vec(),
            point,
        })
    }

    /// ECMAScript's layout (ECMA-262 Number::toString, with `k` digits and point `n`).
    fn write(&self, out: &mut Vec<u8>) {
        if self.digits.is_empty() {
            out.push(b'0');
            return;
        }
        if self.negative {
            out.push(b'-');
        }
        let s = &self.digits;
        let k = s.len() as i64;
        let n = self.point;
        if k <= n && n <= 21 {
            out.extend_from_slice(s);
            out.extend(std::iter::repeat_n(b'0', (n - k) as usize));
        } else if 0 < n && n <= 21 {
            out.extend_from_slice(&s[..n as usize]);
            out.push(b'.');
            out.extend_from_slice(&s[n as usize..]);
        } else if -6 < n && n <= 0 {
            out.extend_from_slice(b"0.");
            out.extend(std::iter::repeat_n(b'0', (-n) as usize));
            out.extend_from_slice(s);
        } else {
            out.push(s[0]);
            if k > 1 {
                out.push(b'.');
                out.extend_from_slice(&s[1..]);
            }
            out.push(b'e');
            let e = n - 1;
            out.push(if e < 0 { b'-' } else { b'+' });
            out.extend_from_slice(e.unsigned_abs().to_string().as_bytes());
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
        // Found by the json_fingerprint fuzz target when numbers went through f64: canonical(x)
        // must parse back to itself, or a client echoing the canonical form gets another fingerprint.
        let once = canonical("123456789012345678903456789012345671234567890");
        assert_eq!(canonical(&once), once);
        assert_eq!(
            canonical("1.2345678901234569e+44"),
            "1.2345678901234569e+44"
        );
    }

    #[test]
    fn numbers_that_round_to_one_float_keep_different_fingerprints() {
        // Through f64 both were 0.1 and 1.0: a 422 for the over-precise amount would have been
        // replayed to the clean retry with the same key.
        assert_eq!(
            canonical("[0.1000000000000000001]"),
            "[0.1000000000000000001]"
        );
        assert_ne!(canonical("[0.1000000000000000001]"), canonical("[0.1]"));
        assert_ne!(canonical("[1.000000001]"), canonical("[1]"));
        assert_eq!(canonical("[550137998.06]"), "[550137998.06]");
        assert_eq!(
            canonical("[0.00001, 1e-7, 12e-1, 1e21]"),
            "[0.00001,1e-7,1.2,1e+21]"
        );
    }

    #[test]
    fn a_json_body_that_repeats_a_member_is_found_at_any_depth() {
        let h = json_headers();
        let dup = |body: &str| duplicate_member(&h, body.as_bytes());
        assert_eq!(dup(r#"{"amount":1,"amount":2}"#), Some("amount".into()));
        assert_eq!(dup(r#"{"a":{"b":[{"c":1,"c":1}]}}"#), Some("c".into()));
        assert_eq!(dup(r#"{"a":1,"b":{"a":2}}"#), None);
        assert_eq!(dup(r#"[{"a":1},{"a":2}]"#), None);
        assert_eq!(dup("not json"), None);
        assert_eq!(
            duplicate_member(&HeaderMap::new(), br#"{"a":1,"a":2}"#),
            None
        );
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
