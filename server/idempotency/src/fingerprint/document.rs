//! Reading a JSON body once: the document with every number kept as its exact text, and the first
//! member name it repeats in one object, from the same pass.
//!
//! A scanner of our own rather than `serde_json::Value`: `Value` keeps a number's text only with
//! serde_json's `arbitrary_precision` feature, and Cargo would turn that feature on for every crate
//! of an application that depends on this one, which breaks `#[serde(untagged)]` and
//! `#[serde(flatten)]` over numbers in the application's own types. A library must not change how
//! its user's JSON deserialises, so the fingerprint reads numbers itself.
//!
//! Invariant: a body is a document here exactly when `serde_json::from_slice::<Value>` accepts it
//! (RFC 8259 with serde_json's limits: 127 levels of nesting, strings of valid UTF-8 whose `\u`
//! escapes pair their surrogates), except that a number too large for an `f64` (`1e400`) is
//! accepted here, as serde_json accepts it with `arbitrary_precision`. Objects keep the last copy
//! of a repeated member, as serde_json does, and iterate in the order of serde_json's map (member
//! names as bytes), so fingerprints and request digests are what they were. Property tests compare
//! both with serde_json on generated documents.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;

/// Deepest nesting of arrays and objects accepted: serde_json's recursion limit (128, counted so
/// that the 128th level is refused).
const MAX_DEPTH: usize = 127;

/// A JSON value whose numbers keep their text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Json {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A number as written, with the exponent marker in lower case and its sign always written
    /// (`1E2` is kept as `1e+2`), the form serde_json gives a number's text.
    Number(String),
    /// A string, escapes decoded.
    String(String),
    /// An array.
    Array(Vec<Json>),
    /// An object: the last copy of a repeated member, in member-name order.
    Object(BTreeMap<String, Json>),
}

/// A body read as one JSON document, with the first member name repeated in one object (depth
/// first: a member's own name before anything repeated inside its value), if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Document {
    pub(crate) value: Json,
    pub(crate) repeated: Option<String>,
}

/// Reads `body` as one JSON document (whitespace around it allowed); `None` when it is not one.
pub(crate) fn parse(body: &[u8]) -> Option<Document> {
    let mut scanner = Scanner {
        bytes: body,
        at: 0,
        repeated: None,
    };
    let value = scanner.value(0)?;
    scanner.skip_whitespace();
    if scanner.at != body.len() {
        return None;
    }
    Some(Document {
        value,
        repeated: scanner.repeated,
    })
}

struct Scanner<'a> {
    bytes: &'a [u8],
    at: usize,
    repeated: Option<String>,
}

impl Scanner<'_> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.at += 1;
        Some(b)
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    fn expect(&mut self, word: &[u8]) -> Option<()> {
        let end = self.at.checked_add(word.len())?;
        (self.bytes.get(self.at..end)? == word).then(|| self.at = end)
    }

    /// One value after optional whitespace, inside `depth` open arrays and objects.
    fn value(&mut self, depth: usize) -> Option<Json> {
        self.skip_whitespace();
        match self.peek()? {
            b'n' => self.expect(b"null").map(|()| Json::Null),
            b't' => self.expect(b"true").map(|()| Json::Bool(true)),
            b'f' => self.expect(b"false").map(|()| Json::Bool(false)),
            b'"' => self.string().map(Json::String),
            b'[' if depth < MAX_DEPTH => self.array(depth + 1),
            b'{' if depth < MAX_DEPTH => self.object(depth + 1),
            b'-' | b'0'..=b'9' => self.number().map(Json::Number),
            _ => None,
        }
    }

    fn array(&mut self, depth: usize) -> Option<Json> {
        self.at += 1;
        let mut items = Vec::new();
        self.skip_whitespace();
        if self.peek()? == b']' {
            self.at += 1;
            return Some(Json::Array(items));
        }
        loop {
            items.push(self.value(depth)?);
            self.skip_whitespace();
            match self.next()? {
                b',' => {}
                b']' => return Some(Json::Array(items)),
                _ => return None,
            }
        }
    }

    fn object(&mut self, depth: usize) -> Option<Json> {
        self.at += 1;
        let mut members = BTreeMap::new();
        self.skip_whitespace();
        if self.peek()? == b'}' {
            self.at += 1;
            return Some(Json::Object(members));
        }
        loop {
            self.skip_whitespace();
            if self.peek()? != b'"' {
                return None;
            }
            let name = self.string()?;
            self.skip_whitespace();
            if self.next()? != b':' {
                return None;
            }
            let found_before = self.repeated.is_some();
            let value = self.value(depth)?;
            match members.entry(name) {
                Entry::Vacant(member) => {
                    member.insert(value);
                }
                Entry::Occupied(mut member) => {
                    // The last copy wins, as in serde_json's map. Reported depth first: a member's
                    // own name before anything repeated inside its value, nothing after the first.
                    if !found_before {
                        self.repeated = Some(member.key().clone());
                    }
                    member.insert(value);
                }
            }
            self.skip_whitespace();
            match self.next()? {
                b',' => {}
                b'}' => return Some(Json::Object(members)),
                _ => return None,
            }
        }
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`, kept as serde_json keeps its text.
    fn number(&mut self) -> Option<String> {
        let mut text = String::new();
        if self.peek() == Some(b'-') {
            self.at += 1;
            text.push('-');
        }
        match self.next()? {
            b'0' => {
                text.push('0');
                if self.peek().is_some_and(|b| b.is_ascii_digit()) {
                    return None;
                }
            }
            b @ b'1'..=b'9' => {
                text.push(char::from(b));
                self.digits(&mut text);
            }
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            text.push('.');
            if self.digits(&mut text) == 0 {
                return None;
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            text.push('e');
            match self.peek() {
                Some(b'-') => {
                    self.at += 1;
                    text.push('-');
                }
                Some(b'+') => {
                    self.at += 1;
                    text.push('+');
                }
                _ => text.push('+'),
            }
            if self.digits(&mut text) == 0 {
                return None;
            }
        }
        Some(text)
    }

    /// Appends the ASCII digits that follow; how many there were.
    fn digits(&mut self, text: &mut String) -> usize {
        let start = self.at;
        while let Some(b @ b'0'..=b'9') = self.peek() {
            self.at += 1;
            text.push(char::from(b));
        }
        self.at - start
    }

    /// A string starting at its opening quote: valid UTF-8, no raw control characters, escapes
    /// decoded, `\u` surrogates in pairs.
    fn string(&mut self) -> Option<String> {
        self.at += 1;
        let mut out = Vec::new();
        loop {
            let start = self.at;
            while let Some(b) = self.peek() {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.at += 1;
            }
            out.extend_from_slice(&self.bytes[start..self.at]);
            match self.next()? {
                b'"' => return String::from_utf8(out).ok(),
                b'\\' => self.escape(&mut out)?,
                _ => return None,
            }
        }
    }

    fn escape(&mut self, out: &mut Vec<u8>) -> Option<()> {
        let decoded = match self.next()? {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let first = self.hex4()?;
                let code = match first {
                    0xD800..=0xDBFF => {
                        self.expect(b"\\u")?;
                        let second = self.hex4()?;
                        if !(0xDC00..=0xDFFF).contains(&second) {
                            return None;
                        }
                        0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00)
                    }
                    0xDC00..=0xDFFF => return None,
                    other => other,
                };
                char::from_u32(code)?
            }
            _ => return None,
        };
        let mut buf = [0; 4];
        out.extend_from_slice(decoded.encode_utf8(&mut buf).as_bytes());
        Some(())
    }

    fn hex4(&mut self) -> Option<u32> {
        let mut n = 0;
        for _ in 0..4 {
            let digit = char::from(self.next()?).to_digit(16)?;
            n = n * 16 + digit;
        }
        Some(n)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
    use serde_json::Value;

    use super::*;

    /// `value` as serde_json's `Value` holds it: numbers through serde_json's own reading of
    /// their text (an `f64` or an integer), so the structure can be compared with serde_json's.
    fn as_serde(value: &Json) -> Value {
        match value {
            Json::Null => Value::Null,
            Json::Bool(b) => Value::Bool(*b),
            Json::Number(text) => serde_json::from_str(text).expect("a number serde_json reads"),
            Json::String(s) => Value::String(s.clone()),
            Json::Array(items) => Value::Array(items.iter().map(as_serde).collect()),
            Json::Object(members) => Value::Object(
                members
                    .iter()
                    .map(|(name, v)| (name.clone(), as_serde(v)))
                    .collect(),
            ),
        }
    }

    /// The first repeated member name as a serde walk finds it: the reference this scanner's
    /// report is held to.
    fn repeated_by_serde(body: &[u8]) -> Option<String> {
        struct Walk(Option<String>);
        struct WalkVisitor;
        impl<'de> Deserialize<'de> for Walk {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_any(WalkVisitor)
            }
        }
        impl<'de> Visitor<'de> for WalkVisitor {
            type Value = Walk;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("JSON")
            }
            fn visit_bool<E>(self, _: bool) -> Result<Walk, E> {
                Ok(Walk(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Walk, E> {
                Ok(Walk(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Walk, E> {
                Ok(Walk(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Walk, E> {
                Ok(Walk(None))
            }
            fn visit_str<E>(self, _: &str) -> Result<Walk, E> {
                Ok(Walk(None))
            }
            fn visit_unit<E>(self) -> Result<Walk, E> {
                Ok(Walk(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Walk, A::Error> {
                let mut found = None;
                while let Some(Walk(inner)) = seq.next_element()? {
                    found = found.or(inner);
                }
                Ok(Walk(found))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Walk, A::Error> {
                let mut seen = std::collections::HashSet::new();
                let mut found = None;
                while let Some(name) = map.next_key::<String>()? {
                    let Walk(inner) = map.next_value()?;
                    if !seen.insert(name.clone()) && found.is_none() {
                        found = Some(name);
                    }
                    found = found.or(inner);
                }
                Ok(Walk(found))
            }
        }
        serde_json::from_slice::<Walk>(body).ok().and_then(|w| w.0)
    }

    fn assert_as_serde_json(body: &[u8]) {
        let read = serde_json::from_slice::<Value>(body);
        // serde_json stops at a number too large for an `f64`, which this scanner reads by design
        // (see the module docs and `a_number_beyond_an_f64_is_read_from_its_text`); it then says
        // nothing about the rest of the body, so there is nothing to compare.
        if read
            .as_ref()
            .is_err_and(|e| e.to_string().starts_with("number out of range"))
        {
            return;
        }
        let expected = read.ok();
        match parse(body) {
            Some(doc) => {
                assert_eq!(Some(as_serde(&doc.value)), expected, "value of {body:?}");
                assert_eq!(doc.repeated, repeated_by_serde(body), "repeat in {body:?}");
            }
            None => assert_eq!(expected, None, "{body:?} is JSON for serde_json"),
        }
    }

    /// JSON text with repeats likely (few names), numbers whose text matters and strings with
    /// escapes.
    fn document() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just("0".to_owned()),
            Just("-0".to_owned()),
            Just("100.00".to_owned()),
            Just("1e2".to_owned()),
            Just("1E-2".to_owned()),
            Just("-1.5e+7".to_owned()),
            Just("123456789012345678901234567890".to_owned()),
            Just("true".to_owned()),
            Just("false".to_owned()),
            Just("null".to_owned()),
            Just(r#""5""#.to_owned()),
            Just(r#""a\"b\\u00e9\n\/\ud83d\ude00""#.to_owned()),
            Just("\"é\u{10000}\"".to_owned()),
        ];
        let name = prop_oneof![Just("a"), Just("b"), Just("c"), Just("é"), Just("a\\u0062")];
        leaf.prop_recursive(4, 32, 4, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4)
                    .prop_map(|items| format!("[ {}]", items.join(" ,"))),
                prop::collection::vec((name.clone(), inner), 0..5).prop_map(|members| {
                    let members: Vec<String> = members
                        .into_iter()
                        .map(|(n, v)| format!("\"{n}\"\t: {v}"))
                        .collect();
                    format!("{{{}}}\n", members.join(",\r\n"))
                }),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn documents_read_as_serde_json_reads_them(doc in document()) {
            assert_as_serde_json(doc.as_bytes());
        }

        #[test]
        fn a_cut_or_damaged_document_fails_where_serde_json_fails(
            doc in document(),
            cut in 0usize..64,
            at in 0usize..64,
            byte in any::<u8>(),
        ) {
            let mut bytes = doc.into_bytes();
            bytes.truncate(cut.max(1).min(bytes.len()));
            assert_as_serde_json(&bytes);
            if let Some(b) = bytes.get_mut(at) {
                *b = byte;
            }
            assert_as_serde_json(&bytes);
        }
    }

    #[test]
    fn numbers_keep_their_text_in_serde_jsons_form() {
        let doc = parse(b"[100.00, 1e2, 1E-2, -0, 0.5e+1]").expect("JSON");
        let Json::Array(items) = doc.value else {
            panic!("an array")
        };
        let texts: Vec<&str> = items
            .iter()
            .map(|n| match n {
                Json::Number(text) => text.as_str(),
                other => panic!("{other:?} is not a number"),
            })
            .collect();
        assert_eq!(texts, ["100.00", "1e+2", "1e-2", "-0", "0.5e+1"]);
    }

    #[test]
    fn a_number_beyond_an_f64_is_read_from_its_text() {
        assert_eq!(
            parse(b"1E400").map(|d| d.value),
            Some(Json::Number("1e+400".to_owned()))
        );
        assert_eq!(
            parse(b"[ 1E3456789012345678901234567890]").map(|d| d.value),
            Some(Json::Array(vec![Json::Number(
                "1e+3456789012345678901234567890".to_owned()
            )]))
        );
    }

    #[test]
    fn malformed_numbers_are_not_json() {
        for text in [
            "01", "-", "1.", ".5", "1e", "1e+", "+1", "--1", "1.e2", "0x10", "1_0",
        ] {
            assert_eq!(parse(text.as_bytes()), None, "{text}");
            assert_as_serde_json(text.as_bytes());
        }
    }

    #[test]
    fn strings_follow_serde_jsons_rules() {
        for text in [
            r#""\ud800""#,
            r#""\udc00""#,
            r#""\ud800\u0041""#,
            r#""\ud800x""#,
            r#""\x""#,
            r#""\u12""#,
            "\"\u{1}\"",
            "\"\t\"",
            r#""\u00E9\uD83D\uDE00""#,
        ] {
            assert_as_serde_json(text.as_bytes());
        }
        assert_as_serde_json(b"\"\xff\"");
        assert_as_serde_json(b"\"\xc3\"");
    }

    #[test]
    fn a_member_repeated_in_the_same_object_is_named_and_the_last_copy_wins() {
        let doc = parse(br#"{"amount":1,"amount":2}"#).expect("JSON");
        assert_eq!(doc.repeated.as_deref(), Some("amount"));
        assert_eq!(as_serde(&doc.value), serde_json::json!({"amount": 2}));
    }

    #[test]
    fn a_member_repeated_around_a_repeat_inside_it_is_named_first() {
        for (doc, name) in [
            (r#"{"a":1,"a":{"b":1,"b":2}}"#, "a"),
            (r#"{"a":{"b":1,"b":2},"a":3}"#, "b"),
            (r#"{"x":[{"c":1,"c":1}],"x":1}"#, "c"),
            (r#"[{"a":1},{"a":2,"a":3}]"#, "a"),
            (r#"{"a":{"b":1,"b":2},"c":1,"c":2}"#, "b"),
        ] {
            assert_eq!(
                parse(doc.as_bytes()).and_then(|d| d.repeated).as_deref(),
                Some(name),
                "{doc}"
            );
            assert_as_serde_json(doc.as_bytes());
        }
    }

    #[test]
    fn nesting_stops_where_serde_json_stops_without_overflowing_the_stack() {
        for levels in [126, 127, 128, 129] {
            let nested = format!("{}{}", "[".repeat(levels), "]".repeat(levels));
            assert_as_serde_json(nested.as_bytes());
        }
        assert!(parse(&"[".repeat(127).into_bytes()).is_none());
        let deep = vec![b'['; 64 << 10];
        assert!(parse(&deep).is_none());
    }

    #[test]
    fn whitespace_around_the_document_is_allowed_and_anything_else_is_not() {
        assert!(parse(b" \n{\"a\":1}\r\n\t").is_some());
        for text in [
            r#"{"a":1} x"#,
            "",
            " ",
            "[1,]",
            r#"{"a":1,}"#,
            "{1:2}",
            "nul",
        ] {
            assert_as_serde_json(text.as_bytes());
            assert!(parse(text.as_bytes()).is_none(), "{text}");
        }
    }
}
