//! The canonical form of a JSON document, modelled on RFC 8785.
//!
//! Object members sorted by the UTF-16 code units of their names, no insignificant whitespace,
//! minimal string escapes, and numbers laid out as ECMAScript lays them out but computed **exactly
//! from the number's decimal text** (`100.00`, `1e2` and `100` are all `100`; `0.1` and
//! `0.1000000000000000001` stay different): a client that re-serialises the same JSON gets the same
//! bytes, while no two different amounts can meet in a rounded float. The canonical form of a
//! canonical form is itself.
//!
//! Kept rather than an RFC 8785 (JCS) crate because it is needed as it is: JCS writes every number
//! as an IEEE 754 double (ECMAScript's `Number`), so `0.1000000000000000001` and `0.1`, or two
//! amounts past 2^53, would get one canonical form and one fingerprint, and a request with a
//! different amount would be answered with another request's stored response. Here numbers keep
//! their exact decimal value; only their layout follows ECMAScript's.

use super::document::Json;

/// Writes `value` in canonical form.
pub fn canonical_json(value: &Json, out: &mut Vec<u8>) {
    match value {
        Json::Null => out.extend_from_slice(b"null"),
        Json::Bool(true) => out.extend_from_slice(b"true"),
        Json::Bool(false) => out.extend_from_slice(b"false"),
        Json::Number(text) => write_number(text, out),
        Json::String(s) => write_string(s, out),
        Json::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical_json(item, out);
            }
            out.push(b']');
        }
        Json::Object(map) => {
            let mut members: Vec<(&String, &Json)> = map.iter().collect();
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

/// Writes a JSON number from its exact decimal text (as the scanner in `document` keeps it), laid
/// out as ECMAScript's `Number::toString` lays out its digits: no float ever rounds two different
/// amounts into one.
fn write_number(text: &str, out: &mut Vec<u8>) {
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

    fn canonical(text: &str) -> String {
        let mut out = Vec::new();
        let document = super::super::document::parse(text.as_bytes()).expect("json");
        canonical_json(&document.value, &mut out);
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
}
