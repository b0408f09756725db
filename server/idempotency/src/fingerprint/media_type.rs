//! The request's `Content-Type` as the fingerprint and the JSON checks see it.
//!
//! [`media_type`] normalises the whole header (type, subtype and parameter names in lower case,
//! parameters sorted, quoted values unquoted, `charset` values in lower case), so that spellings of
//! one media type give one fingerprint while different media types never do. [`is_json`] decides
//! only whether a body is to be read as JSON at all.

use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderValue};

/// The request's `Content-Type` in a normal form: `Application/JSON; Charset="UTF-8"` and
/// `application/json;charset=utf-8` are the same. A value that is not visible ASCII enters as its
/// bytes, lossily decoded, so it still counts.
pub fn media_type(headers: &HeaderMap) -> Option<String> {
    media_type_of(headers.get(CONTENT_TYPE))
}

/// [`media_type`] of a `Content-Type` value already taken from the headers.
pub fn media_type_of(value: Option<&HeaderValue>) -> Option<String> {
    let value = value?;
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

/// True for `application/json` and `application/*+json`.
pub fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim().as_bytes();
    // Compared without a lower-cased copy (this runs on every request).
    let (prefix, suffix) = (b"application/".as_slice(), b"+json".as_slice());
    essence.eq_ignore_ascii_case(b"application/json")
        || (essence.len() >= prefix.len() + suffix.len()
            && essence[..prefix.len()].eq_ignore_ascii_case(prefix)
            && essence[essence.len() - suffix.len()..].eq_ignore_ascii_case(suffix))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(content_type: &[u8]) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_bytes(content_type).expect("a header value"),
        );
        h
    }

    #[test]
    fn json_and_json_suffixed_media_types_are_json_in_any_case() {
        for json in [
            "application/json",
            "Application/JSON; charset=utf-8",
            " application/json ;x=1",
            "application/problem+json",
            "APPLICATION/VND.API+JSON",
            "application/+json",
        ] {
            assert!(is_json(&with(json.as_bytes())), "{json}");
        }
        for other in [
            "text/json",
            "application/jsonx",
            "application/json-seq",
            "application+json",
            "application/x+jsonp",
            "",
        ] {
            assert!(!is_json(&with(other.as_bytes())), "{other}");
        }
        assert!(!is_json(&HeaderMap::new()));
        assert!(
            !is_json(&with(b"application/json\xff")),
            "not visible ASCII"
        );
    }
}
