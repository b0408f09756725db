//! Parsing the `Idempotency-Key` header.
//!
//! The IETF draft makes the value a structured-field string (`"…"`); many clients send a bare UUID,
//! so an unquoted value is taken as it is, and `"abc"` and `abc` are the same key. After unquoting
//! the key must be 1–255 visible ASCII characters (0x21–0x7E). Anything else is a 400 before the
//! request runs.
//!
//! RFC 8941 allows spaces inside an sf-string (`"a b"`); this parser refuses them on purpose. The
//! key is also the `{key}` path segment of `GET /idempotency-keys/{key}`, a log field and a
//! database column; visible ASCII keeps it one unambiguous token everywhere, and the draft lets a
//! resource define its key format. Every key any client could use before stays valid. [`PATTERN`]
//! is this rule as a regular expression, for the OpenAPI document.

use axum::http::HeaderMap;

use crate::problem::Problem;
use axum::http::StatusCode;

/// Header name.
pub const HEADER: &str = "idempotency-key";

/// Longest key, in characters (the draft's and the engine's limit).
pub const MAX_LEN: usize = idemlog::MAX_KEY;

/// The rule [`parse`] enforces on a header value, as a regular expression (ECMA-262, as an OpenAPI
/// `pattern`): a structured-field string of 1 to [`MAX_LEN`] characters after unescaping, each
/// visible ASCII other than `"` and `\` or one of the escapes `\"` and `\\`; or a bare value of 1 to
/// [`MAX_LEN`] visible ASCII characters that does not start with `"` (that is the quoted form).
/// RFC 8941 also allows spaces inside an sf-string; keys with a space are refused (see the module
/// docs), so the pattern leaves them out. The OpenAPI document declares this pattern on the
/// `Idempotency-Key` header, and [`PATH_PATTERN`] (the same without `%`) on the `{key}` of
/// `GET /idempotency-keys/{key}`, which parses its decoded segment with the same function; a test
/// checks pattern and parser agree.
pub const PATTERN: &str =
    r#"^(?:"(?:[\x21\x23-\x5B\x5D-\x7E]|\\["\\]){1,255}"|[\x21\x23-\x7E][\x21-\x7E]{0,254})$"#;

/// [`PATTERN`] without `%`: the pattern the OpenAPI document declares on the `{key}` path segment
/// of `GET /idempotency-keys/{key}`. The segment is percent-decoded before it is parsed, and
/// clients disagree on whether a `%` already in a value is data or the start of an escape (a
/// generated client that leaves `%EF` alone sends a key that decodes to non-ASCII and gets a 400).
/// So the document promises only keys without `%` there; a key holding `%` still works in the path
/// when the client encodes it as `%25`. A test checks this is exactly [`PATTERN`] minus `%`.
pub const PATH_PATTERN: &str = r#"^(?:"(?:[\x21\x23\x24\x26-\x5B\x5D-\x7E]|\\["\\]){1,255}"|[\x21\x23\x24\x26-\x7E][\x21-\x24\x26-\x7E]{0,254})$"#;

/// A validated key; also put in the request extensions for the handler.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The key.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Why a header value is not a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// No `Idempotency-Key` header.
    #[error("the Idempotency-Key header is required")]
    Missing,
    /// More than one `Idempotency-Key` header.
    #[error("send exactly one Idempotency-Key header")]
    Repeated,
    /// The key is empty.
    #[error("the Idempotency-Key must not be empty")]
    Empty,
    /// The key is longer than 255 characters.
    #[error("the Idempotency-Key is {0} characters; at most {MAX_LEN} are allowed")]
    TooLong(usize),
    /// A byte outside visible ASCII.
    #[error("the Idempotency-Key may hold only visible ASCII characters (0x21-0x7E)")]
    InvalidCharacter,
    /// A value starting with `"` that is not a well-formed structured-field string.
    #[error("the Idempotency-Key is not a well-formed quoted string")]
    BadQuoting,
}

impl KeyError {
    /// The 400 problem for this error.
    pub fn to_problem(&self) -> Problem {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "invalid-idempotency-key",
            "Invalid Idempotency-Key",
            self.to_string(),
        )
    }
}

/// The key of a request.
pub fn from_headers(headers: &HeaderMap) -> Result<IdempotencyKey, KeyError> {
    let mut values = headers.get_all(HEADER).iter();
    let value = values.next().ok_or(KeyError::Missing)?;
    if values.next().is_some() {
        return Err(KeyError::Repeated);
    }
    parse(value.as_bytes())
}

/// Parses one header value.
pub fn parse(raw: &[u8]) -> Result<IdempotencyKey, KeyError> {
    let key = match raw.first() {
        Some(b'"') => unquote(raw)?,
        _ => raw.to_vec(),
    };
    validate(key)
}

/// A key already unquoted: non-empty, visible ASCII, at most [`MAX_LEN`] bytes.
fn validate(key: Vec<u8>) -> Result<IdempotencyKey, KeyError> {
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if !key.iter().all(u8::is_ascii_graphic) {
        return Err(KeyError::InvalidCharacter);
    }
    if key.len() > MAX_LEN {
        return Err(KeyError::TooLong(key.len()));
    }
    // All bytes are ASCII, so this cannot fail; map rather than unwrap all the same.
    String::from_utf8(key)
        .map(IdempotencyKey)
        .map_err(|_| KeyError::InvalidCharacter)
}

/// RFC 8941 sf-string: `"` *( unescaped / `\"` / `\\` ) `"`.
fn unquote(raw: &[u8]) -> Result<Vec<u8>, KeyError> {
    let inner = raw
        .strip_prefix(b"\"")
        .and_then(|r| r.strip_suffix(b"\""))
        .ok_or(KeyError::BadQuoting)?;
    let mut out = Vec::with_capacity(inner.len());
    let mut bytes = inner.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'\\' => match bytes.next() {
                Some(&e @ (b'"' | b'\\')) => out.push(e),
                _ => return Err(KeyError::BadQuoting),
            },
            b'"' => return Err(KeyError::BadQuoting),
            _ => out.push(b),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(raw: &str) -> String {
        parse(raw.as_bytes()).expect(raw).as_str().to_owned()
    }

    #[test]
    fn quoted_and_bare_forms_are_the_same_key() {
        assert_eq!(ok("\"abc\""), "abc");
        assert_eq!(ok("abc"), "abc");
        assert_eq!(
            ok("8e03978e-40d5-43e8-bc93-6894a57f9324"),
            "8e03978e-40d5-43e8-bc93-6894a57f9324"
        );
    }

    #[test]
    fn escapes_inside_quotes_are_decoded() {
        assert_eq!(ok(r#""a\"b""#), "a\"b");
        assert_eq!(ok(r#""a\\b""#), "a\\b");
    }

    #[test]
    fn empty_long_and_non_visible_keys_are_refused() {
        assert_eq!(parse(b""), Err(KeyError::Empty));
        assert_eq!(parse(b"\"\""), Err(KeyError::Empty));
        assert_eq!(parse(&[b'a'; 256]), Err(KeyError::TooLong(256)));
        assert!(parse(&[b'a'; 255]).is_ok());
        assert_eq!(parse(b"a b"), Err(KeyError::InvalidCharacter));
        assert_eq!(parse(b"\"a b\""), Err(KeyError::InvalidCharacter));
        assert_eq!(
            parse("caf\u{e9}".as_bytes()),
            Err(KeyError::InvalidCharacter)
        );
        assert_eq!(parse(b"a\tb"), Err(KeyError::InvalidCharacter));
    }

    #[test]
    fn malformed_quoting_is_refused() {
        assert_eq!(parse(b"\"abc"), Err(KeyError::BadQuoting));
        assert_eq!(parse(b"\"a\"b\""), Err(KeyError::BadQuoting));
        assert_eq!(parse(br#""a\x""#), Err(KeyError::BadQuoting));
        assert_eq!(parse(b"\""), Err(KeyError::BadQuoting));
    }

    fn pattern() -> regex::Regex {
        regex::Regex::new(PATTERN).expect("the pattern compiles")
    }

    #[test]
    fn the_pattern_accepts_exactly_what_the_parser_accepts_at_the_edges() {
        let long = |n: usize| "a".repeat(n);
        let cases = [
            "abc".to_owned(),
            "\"abc\"".to_owned(),
            r#""a\"b""#.to_owned(),
            r#""a\\b""#.to_owned(),
            r#"a"b"#.to_owned(),
            "\"a b\"".to_owned(),
            "a b".to_owned(),
            "\"abc".to_owned(),
            "\"\"".to_owned(),
            r#""a\x""#.to_owned(),
            "caf\u{e9}".to_owned(),
            long(255),
            long(256),
            format!("\"{}\"", long(255)),
            format!("\"{}\"", long(256)),
            format!("\"{}\"", r#"\""#.repeat(255)),
        ];
        for case in cases {
            assert_eq!(
                pattern().is_match(&case),
                parse(case.as_bytes()).is_ok(),
                "{case:?}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn the_pattern_and_the_parser_agree(raw in r#"[ -~\u{e9}]{0,260}|"[ -~]{0,258}"?"#) {
            proptest::prop_assert_eq!(
                pattern().is_match(&raw),
                parse(raw.as_bytes()).is_ok(),
                "{:?}", raw
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn the_path_pattern_is_the_pattern_without_percent(raw in r#"[ -~]{0,260}|"[ -~]{0,258}"?"#) {
            let path = regex::Regex::new(PATH_PATTERN).expect("the path pattern compiles");
            proptest::prop_assert_eq!(
                path.is_match(&raw),
                pattern().is_match(&raw) && !raw.contains('%'),
                "{:?}", raw
            );
        }
    }

    #[test]
    fn the_path_pattern_refuses_a_percent_the_header_pattern_accepts() {
        let path = regex::Regex::new(PATH_PATTERN).expect("the path pattern compiles");
        for key in ["a%EFb", "%", "\"%41\""] {
            assert!(pattern().is_match(key), "{key:?}");
            assert!(!path.is_match(key), "{key:?}");
        }
        assert!(path.is_match("order-7") && path.is_match("\"a$&b\""));
    }

    #[test]
    fn missing_or_repeated_header_is_refused() {
        let mut headers = HeaderMap::new();
        assert_eq!(from_headers(&headers), Err(KeyError::Missing));
        headers.append(HEADER, "a".parse().expect("value"));
        headers.append(HEADER, "b".parse().expect("value"));
        assert_eq!(from_headers(&headers), Err(KeyError::Repeated));
    }
}
