//! Parsing a JSON body once: the document as `serde_json::Value`, and the first member name it
//! repeats in one object, from the same pass.
//!
//! Before this, a JSON body was walked twice on every request, new key or replay: once to find a
//! repeated member (`duplicates`, which `Value` cannot do: its map keeps the last copy silently),
//! then again into a `Value` for the canonical form. Here the `Value` is built by a visitor of our
//! own, and a member name seen twice shows up as the old value `Map::insert` hands back.
//!
//! Invariant: whenever this parse succeeds, its `Value` is the one `serde_json::from_slice` gives
//! for the same bytes, and its repeated name is the one `duplicates::duplicate_member` reports, so
//! fingerprints and refusals are what they were (a property test compares all three on generated
//! documents). That takes one detail of serde_json: with `arbitrary_precision` it hands each number
//! to a visitor as a one-member map under a private key, with the number's text as the value. The
//! key is learnt from serde_json itself on first use, never written here; an object a client sends
//! with that key as its first member is read as serde_json reads it (as that number).

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::map::Entry;
use serde_json::{Map, Number, Value};

/// A body parsed as JSON, with the first member name repeated in one object (depth first, the
/// order `duplicates` reports in), if any.
pub(crate) struct Parsed {
    pub(crate) value: Value,
    pub(crate) repeated: Option<String>,
}

/// Parses `body` as one JSON document; `None` when it is not one.
pub(crate) fn parse(body: &[u8]) -> Option<Parsed> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let mut repeated = None;
    let value = Strict {
        repeated: &mut repeated,
    }
    .deserialize(&mut deserializer)
    .ok()?;
    deserializer.end().ok()?;
    Some(Parsed { value, repeated })
}

/// The map key under which serde_json hands a number other than a 64-bit integer to a visitor
/// (`arbitrary_precision`), or `None` if it hands numbers over as numbers.
fn number_key() -> Option<&'static str> {
    static KEY: OnceLock<Option<String>> = OnceLock::new();
    KEY.get_or_init(|| {
        // Not an integer: serde_json hands integers that fit 64 bits over as numbers even so.
        let mut deserializer = serde_json::Deserializer::from_slice(b"0.5");
        deserializer.deserialize_any(NumberKey).ok().flatten()
    })
    .as_deref()
}

/// Learns [`number_key`]: the first key of the map a number arrives as.
struct NumberKey;

impl<'de> Visitor<'de> for NumberKey {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a number")
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let key = map.next_key::<String>()?;
        let _text: Option<de::IgnoredAny> = key.as_ref().map(|_| map.next_value()).transpose()?;
        Ok(key)
    }
}

/// Builds one value, noting in `repeated` the first member name seen twice in one object.
struct Strict<'a> {
    repeated: &'a mut Option<String>,
}

impl<'de> DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        self.deserialize(deserializer)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(item) = seq.next_element_seed(Strict {
            repeated: &mut *self.repeated,
        })? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let Some(first) = map.next_key::<String>()? else {
            return Ok(Value::Object(Map::new()));
        };
        if number_key() == Some(first.as_str()) {
            // A number (or an object whose first member has the same name, which serde_json reads
            // the same way): its text is the value.
            let text = map.next_value::<String>()?;
            return Number::from_str(&text)
                .map(Value::Number)
                .map_err(de::Error::custom);
        }
        let mut members = Map::new();
        let mut name = first;
        loop {
            let found_before = self.repeated.is_some();
            let value = map.next_value_seed(Strict {
                repeated: &mut *self.repeated,
            })?;
            match members.entry(name) {
                Entry::Vacant(member) => {
                    member.insert(value);
                }
                Entry::Occupied(mut member) => {
                    // The last copy wins, as in serde_json's own map. Reported as `duplicates`
                    // reports: a member's own name before anything repeated inside its value,
                    // and nothing after the first.
                    if !found_before {
                        *self.repeated = Some(member.key().clone());
                    }
                    member.insert(value);
                }
            }
            match map.next_key::<String>()? {
                Some(next) => name = next,
                None => break,
            }
        }
        Ok(Value::Object(members))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::fingerprint::{duplicate_member, json_headers};

    /// What the two passes this parse replaces answer for `body`: serde_json's `Value`, and the
    /// walk for repeated names (asked only where the old code asked it too: always).
    fn two_passes(body: &[u8]) -> (Option<Value>, Option<String>) {
        (
            serde_json::from_slice(body).ok(),
            duplicate_member(&json_headers(), body),
        )
    }

    fn assert_same_as_two_passes(body: &[u8]) {
        let (value, repeated) = two_passes(body);
        match parse(body) {
            Some(parsed) => {
                assert_eq!(Some(&parsed.value), value.as_ref(), "value of {body:?}");
                assert_eq!(parsed.repeated, repeated, "repeated name in {body:?}");
            }
            None => assert_eq!(value, None, "{body:?} parses for serde_json"),
        }
    }

    /// JSON text with repeats likely (few names), numbers whose text matters, and serde_json's
    /// private number key among the names.
    fn document() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just("0".to_owned()),
            Just("-0".to_owned()),
            Just("100.00".to_owned()),
            Just("1e2".to_owned()),
            Just("1E400".to_owned()),
            Just("-1.5e-7".to_owned()),
            Just("123456789012345678901234567890".to_owned()),
            Just("true".to_owned()),
            Just("null".to_owned()),
            Just(r#""5""#.to_owned()),
            Just(r#""a\"b\\u00e9\n""#.to_owned()),
        ];
        let name = prop_oneof![
            Just("a"),
            Just("b"),
            Just("c"),
            Just("é"),
            Just("$serde_json::private::Number"),
        ];
        leaf.prop_recursive(4, 32, 4, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4)
                    .prop_map(|items| format!("[{}]", items.join(","))),
                prop::collection::vec((name.clone(), inner), 0..5).prop_map(|members| {
                    let members: Vec<String> = members
                        .into_iter()
                        .map(|(n, v)| format!("{}: {v}", serde_json::json!(n)))
                        .collect();
                    format!("{{{}}}", members.join(", "))
                }),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn one_pass_gives_the_value_and_the_repeated_name_of_the_two_passes(doc in document()) {
            assert_same_as_two_passes(doc.as_bytes());
        }

        #[test]
        fn a_cut_document_fails_where_serde_json_fails(doc in document(), cut in 0usize..64) {
            let bytes = doc.as_bytes();
            assert_same_as_two_passes(&bytes[..cut.min(bytes.len())]);
        }
    }

    #[test]
    fn a_member_repeated_in_the_same_object_is_named() {
        let parsed = parse(br#"{"amount":1,"amount":2}"#).expect("JSON");
        assert_eq!(parsed.repeated.as_deref(), Some("amount"));
        assert_eq!(
            parsed.value,
            serde_json::json!({"amount": 2}),
            "last copy wins"
        );
    }

    #[test]
    fn a_member_repeated_around_a_repeat_inside_it_is_named_first() {
        for doc in [
            r#"{"a":1,"a":{"b":1,"b":2}}"#,
            r#"{"a":{"b":1,"b":2},"a":3}"#,
            r#"{"x":[{"c":1,"c":1}],"x":1}"#,
            r#"[{"a":1},{"a":2,"a":3}]"#,
        ] {
            assert_same_as_two_passes(doc.as_bytes());
        }
    }

    #[test]
    fn numbers_keep_their_text() {
        let parsed = parse(b"[100.00, 1e2, -0]").expect("JSON");
        let texts: Vec<&str> = parsed
            .value
            .as_array()
            .expect("array")
            .iter()
            .map(|n| n.as_number().expect("number").as_str())
            .collect();
        assert_eq!(texts, ["100.00", "1e+2", "-0"]);
    }

    #[test]
    fn an_object_named_like_serde_jsons_number_key_reads_as_serde_json_reads_it() {
        for doc in [
            r#"{"$serde_json::private::Number":"5"}"#,
            r#"{"$serde_json::private::Number":"x"}"#,
            r#"{"$serde_json::private::Number":5}"#,
            r#"{"$serde_json::private::Number":"5","a":1,"a":2}"#,
            r#"{"a":1,"$serde_json::private::Number":"5"}"#,
        ] {
            assert_same_as_two_passes(doc.as_bytes());
        }
    }

    #[test]
    fn nesting_past_serde_jsons_depth_limit_is_not_json_and_does_not_overflow_the_stack() {
        // 64 KiB of `[` (the body limit's worth): serde_json stops at 128 levels.
        let deep = vec![b'['; 64 << 10];
        assert!(parse(&deep).is_none());
        assert_same_as_two_passes(&deep);
        let mut nested = "[".repeat(100);
        nested.push_str(&"]".repeat(100));
        assert!(
            parse(nested.as_bytes()).is_some(),
            "100 levels are within the limit"
        );
    }

    #[test]
    fn trailing_bytes_after_the_document_are_not_json() {
        assert!(parse(br#"{"a":1} x"#).is_none());
        assert!(parse(b"{\"a\":1}\n").is_some());
    }
}
