//! Payment request and record shapes, and the validation of amounts and currencies.
//!
//! Amounts are decimal JSON numbers in major units (`100.00` BRL), parsed exactly from their text
//! (no float ever holds money); internally they are integer minor units (cents). The text is taken
//! as serde_json's `RawValue`, not through serde_json's `arbitrary_precision` feature: Cargo would
//! turn that feature on for every crate built with this one, where it breaks `#[serde(untagged)]`
//! and `#[serde(flatten)]` over numbers.

use std::fmt;

use rust_decimal::Decimal;
use rust_decimal::prelude::ToPrimitive;
use serde::de::{self, Unexpected};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

/// Largest amount accepted, in minor units (just under ten billion in major units).
pub const MAX_AMOUNT_MINOR: i64 = 999_999_999_999;

/// The body of `POST /payments` (the OpenAPI document's `PaymentRequest`, generated from this type).
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = PaymentRequest)]
pub struct CreatePayment {
    /// Amount in major units: a JSON number greater than zero with at most two decimal places
    /// (`100.00`), at most 9 999 999 999.99. Its text is parsed exactly; it is never rounded, and
    /// a sub-cent amount (`1.001`) is a 422.
    #[schema(value_type = f64, exclusive_minimum = 0, maximum = 9999999999.99, multiple_of = 0.01, example = 100.00)]
    pub amount: Amount,
    /// ISO 4217-style code: three upper-case letters.
    #[schema(pattern = "^[A-Z]{3}$", example = "BRL")]
    pub currency: String,
}

/// A JSON number as the client wrote it: its text, never a float.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Amount(String);

impl Amount {
    /// The number's text as it was in the request (`100.00`, `1e2`).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for Amount {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(deserializer)?;
        let text = raw.get();
        // A raw value is whole JSON: it is a number exactly when it starts as one.
        if text.starts_with(|c: char| c == '-' || c.is_ascii_digit()) {
            return Ok(Amount(text.to_owned()));
        }
        // Refused as serde_json refuses a non-number where it expects a `Number`.
        let value: Value = serde_json::from_str(text).map_err(de::Error::custom)?;
        let unexpected = match &value {
            Value::Null => Unexpected::Other("null"),
            Value::Bool(b) => Unexpected::Bool(*b),
            Value::String(s) => Unexpected::Str(s),
            Value::Array(_) => Unexpected::Seq,
            Value::Object(_) | Value::Number(_) => Unexpected::Map,
        };
        Err(de::Error::invalid_type(unexpected, &ExpectedNumber))
    }
}

/// What an amount must be, for the refusal's text.
struct ExpectedNumber;

impl de::Expected for ExpectedNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON number")
    }
}

/// A validated payment request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidPayment {
    /// Amount in minor units, > 0.
    pub amount_minor: i64,
    /// Currency code.
    pub currency: String,
}

impl CreatePayment {
    /// Checks amount and currency.
    pub fn validate(&self) -> Result<ValidPayment, String> {
        let amount_minor = amount_to_minor(&self.amount)?;
        let currency = &self.currency;
        if currency.len() != 3 || !currency.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(format!(
                "currency {currency:?} must be three upper-case letters, such as \"BRL\""
            ));
        }
        Ok(ValidPayment {
            amount_minor,
            currency: currency.clone(),
        })
    }
}

/// Converts a JSON amount in major units to minor units, exactly.
///
/// The number's own decimal text ([`Amount`]) is parsed into a [`Decimal`], never into a float: every amount with at most two decimal places up to
/// [`MAX_AMOUNT_MINOR`] is accepted as written, and anything more precise is refused, never
/// rounded. Trailing zeros do not count as precision (`1.500` is `1.50`).
pub fn amount_to_minor(amount: &Amount) -> Result<i64, String> {
    let text = amount.as_str();
    // The number is echoed in the error; a 60 KB run of digits is shortened, not sent back whole.
    let shown = match text.char_indices().nth(40) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    };
    let parsed = if text.contains(['e', 'E']) {
        Decimal::from_scientific(text)
    } else {
        Decimal::from_str_exact(text)
    };
    let Ok(value) = parsed else {
        return Err(format!(
            "amount {shown} is out of range or has more than two decimal places"
        ));
    };
    let value = value.normalize();
    if value.scale() > 2 {
        return Err(format!("amount {shown} has more than two decimal places"));
    }
    if value <= Decimal::ZERO {
        return Err("amount must be greater than zero".into());
    }
    let minor = value
        .checked_mul(Decimal::ONE_HUNDRED)
        .and_then(|m| m.to_i64())
        .filter(|m| *m <= MAX_AMOUNT_MINOR);
    minor.ok_or_else(|| {
        format!(
            "amount {shown} is too large: the largest is {}",
            format_minor(MAX_AMOUNT_MINOR)
        )
    })
}

/// Minor units written as a decimal with two places: `10000` → `100.00`.
pub fn format_minor(minor: i64) -> String {
    // Built by hand rather than with `format!`: this runs for every payment answered.
    let abs = minor.unsigned_abs();
    let mut units = itoa::Buffer::new();
    let units = units.format(abs / 100);
    let cents = abs % 100;
    let mut out = String::with_capacity(units.len() + 4);
    if minor < 0 {
        out.push('-');
    }
    out.push_str(units);
    out.push('.');
    out.push(char::from(b'0' + (cents / 10) as u8));
    out.push(char::from(b'0' + (cents % 10) as u8));
    out
}

/// A payment as stored (side record `payments/{id}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentRecord {
    /// `pay_…`.
    pub id: String,
    /// Owner: only this account may read it.
    pub account: String,
    /// Amount in minor units.
    pub amount_minor: i64,
    /// Currency code.
    pub currency: String,
    /// `succeeded`.
    pub status: String,
    /// The provider's charge.
    pub charge_id: String,
}

/// A payment as the API shows it (the OpenAPI document's `Payment`, generated from this type).
#[derive(Serialize, utoipa::ToSchema)]
pub struct Payment<'a> {
    /// `pay_…`.
    #[schema(example = "pay_09e311744afe7372032f6819")]
    pub id: &'a str,
    /// Amount in major units, written with two decimal places (`100.00`).
    #[schema(value_type = f64, exclusive_minimum = 0, maximum = 9999999999.99, multiple_of = 0.01, example = 100.00)]
    pub amount: Box<RawValue>,
    /// Currency code.
    #[schema(pattern = "^[A-Z]{3}$", example = "BRL")]
    pub currency: &'a str,
    /// `succeeded`.
    #[schema(example = "succeeded")]
    pub status: &'a str,
    /// The provider's charge.
    #[schema(example = "ch_0a063dd302ee4ce977ff8c6d")]
    pub charge_id: &'a str,
}

impl PaymentRecord {
    /// The API representation: `{"id","amount","currency","status","charge_id"}` with the amount as
    /// a decimal number (`100.00`).
    pub fn to_public_json(&self) -> Result<Vec<u8>, serde_json::Error> {
        let amount = RawValue::from_string(format_minor(self.amount_minor))?;
        serde_json::to_vec(&Payment {
            id: &self.id,
            amount,
            currency: &self.currency,
            status: &self.status,
            charge_id: &self.charge_id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minor(json: &str) -> Result<i64, String> {
        amount_to_minor(&serde_json::from_str(json).expect("number"))
    }

    #[test]
    fn minor_units_are_written_with_two_decimal_places_and_their_sign() {
        assert_eq!(format_minor(10_000), "100.00");
        assert_eq!(format_minor(1), "0.01");
        assert_eq!(format_minor(0), "0.00");
        assert_eq!(format_minor(-1_999), "-19.99");
        assert_eq!(format_minor(i64::MIN), "-92233720368547758.08");
        assert_eq!(format_minor(i64::MAX), "92233720368547758.07");
    }

    #[test]
    fn amounts_convert_to_minor_units() {
        assert_eq!(minor("100.00"), Ok(10_000));
        assert_eq!(minor("100"), Ok(10_000));
        assert_eq!(minor("19.99"), Ok(1_999));
        assert_eq!(minor("0.01"), Ok(1));
    }

    #[test]
    fn amounts_that_floats_mangled_are_exact() {
        // 550137998.06 × 100 in f64 is 55013799805.99999…: it was refused as over-precise.
        assert_eq!(minor("550137998.06"), Ok(55_013_799_806));
        assert_eq!(minor("9999999999.99"), Ok(MAX_AMOUNT_MINOR));
        assert_eq!(minor("1.500"), Ok(150));
        assert_eq!(minor("1e2"), Ok(10_000));
        assert_eq!(minor("12.5E-1"), Ok(125));
    }

    #[test]
    fn sub_cent_precision_is_refused_not_rounded() {
        // Through f64 this was 1.00 and was charged as such.
        for bad in [
            "1.000000001",
            "0.009",
            "100.0000000000000000000000000001",
            "0.1000000000000000001",
            "1e-3",
        ] {
            let err = minor(bad).expect_err(bad);
            assert!(err.contains("decimal places"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_huge_amount_is_not_echoed_whole() {
        let huge = format!("1.{}", "1".repeat(60_000));
        let err = minor(&huge).expect_err("refused");
        assert!(err.len() < 200, "{} bytes", err.len());
    }

    #[test]
    fn amounts_over_the_maximum_are_refused() {
        for bad in [
            "10000000000",
            "10000000000.00",
            "1e11",
            "99999999999999999999999999999999",
        ] {
            assert!(minor(bad).is_err(), "{bad} should be refused");
        }
    }

    proptest::proptest! {
        #[test]
        fn every_two_decimal_amount_round_trips_exactly(minor_units in 1i64..=MAX_AMOUNT_MINOR) {
            let text = format_minor(minor_units);
            proptest::prop_assert_eq!(minor(&text), Ok(minor_units));
            let record = PaymentRecord {
                id: "pay_1".into(),
                account: "acct".into(),
                amount_minor: minor_units,
                currency: "BRL".into(),
                status: "succeeded".into(),
                charge_id: "ch_1".into(),
            };
            let stored = serde_json::to_vec(&record).expect("stored");
            let back: PaymentRecord = serde_json::from_slice(&stored).expect("parse");
            let public = back.to_public_json().expect("public");
            #[derive(Deserialize)]
            struct Echoed {
                amount: Amount,
            }
            let echoed: Echoed = serde_json::from_slice(&public).expect("json");
            proptest::prop_assert_eq!(echoed.amount.as_str(), text.as_str());
        }
    }

    #[test]
    fn zero_negative_fractional_cents_and_huge_amounts_are_refused() {
        for bad in [
            "0",
            "0.0",
            "-1",
            "-0.5",
            "0.001",
            "1.005",
            "1e20",
            "18446744073709551615",
        ] {
            assert!(minor(bad).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn public_json_writes_amount_with_two_decimals() {
        let record = PaymentRecord {
            id: "pay_1".into(),
            account: "acct".into(),
            amount_minor: 10_000,
            currency: "BRL".into(),
            status: "succeeded".into(),
            charge_id: "ch_1".into(),
        };
        let json = String::from_utf8(record.to_public_json().expect("json")).expect("utf8");
        assert_eq!(
            json,
            r#"{"id":"pay_1","amount":100.00,"currency":"BRL","status":"succeeded","charge_id":"ch_1"}"#
        );
    }

    #[test]
    fn an_amount_that_is_not_a_json_number_is_refused_as_serde_json_refuses_it() {
        for (json, kind) in [
            (r#""1.00""#, r#"string "1.00""#),
            ("null", "null"),
            ("true", "boolean `true`"),
            ("[1]", "sequence"),
            (r#"{"a":1}"#, "map"),
        ] {
            let err = serde_json::from_str::<Amount>(json).expect_err(json);
            let want = format!("invalid type: {kind}, expected a JSON number");
            assert!(err.to_string().starts_with(&want), "{json}: {err}");
        }
        let parsed: CreatePayment =
            serde_json::from_str(r#"{ "amount" : 12.50 , "currency":"BRL"}"#).expect("payment");
        assert_eq!(parsed.amount.as_str(), "12.50");
    }

    #[test]
    fn currency_must_be_three_upper_case_letters() {
        let p = |c: &str| CreatePayment {
            amount: Amount("1".to_owned()),
            currency: c.into(),
        };
        assert!(p("BRL").validate().is_ok());
        assert!(p("brl").validate().is_err());
        assert!(p("BRLX").validate().is_err());
        assert!(p("").validate().is_err());
    }
}
