//! Refusing JSON bodies that repeat a member name in one object.
//!
//! Parsers disagree on which copy of a repeated member wins, so such a body has no single meaning:
//! it is refused before it is claimed or fingerprinted. The check walks the document with a
//! visitor of its own rather than through `serde_json::Value`, which would keep one copy silently.

use axum::http::HeaderMap;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::fingerprint::media_type::is_json;

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
