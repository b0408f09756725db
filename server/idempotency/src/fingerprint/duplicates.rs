//! Refusing JSON bodies that repeat a member name in one object.
//!
//! Parsers disagree on which copy of a repeated member wins, so such a body has no single meaning:
//! it is refused before it is claimed or fingerprinted. The check is the scanner's (`document`),
//! which notes a repeated name as it reads; `serde_json::Value` would keep one copy silently.

use axum::http::HeaderMap;

use crate::fingerprint::document;
use crate::fingerprint::media_type::is_json;

/// The first member name that appears twice in one object of a JSON body (at any depth), if the
/// request says it is JSON and the body parses as JSON. Such a body is refused before it is claimed.
pub fn duplicate_member(headers: &HeaderMap, body: &[u8]) -> Option<String> {
    if !is_json(headers) {
        return None;
    }
    document::parse(body)?.repeated
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::json_headers;

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
}
