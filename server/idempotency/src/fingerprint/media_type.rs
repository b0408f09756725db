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
    let essence = value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}
