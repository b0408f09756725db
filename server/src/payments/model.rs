//! Payment request and record shapes, and the validation of amounts and currencies.
//!
//! Amounts are decimal JSON numbers in major units (`100.00` BRL); internally they are integer minor
//! units (cents) so that no float arithmetic touches money after parsing.

use serde::{Deserialize, Serialize};
use serde_json::Number;
use serde_json::value::RawValue;

/// Largest amount accepted, in minor units (just under ten billion in major units).
pub const MAX_AMOUNT_MINOR: i64 = 999_999_999_999;

/// The body of `POST /payments`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreatePayment {
    /// Amount in major units, at most two decimal places.
    pub amount: Number,
    /// ISO 4217-style code: three upper-case letters.
    pub currency: String,
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

/// Converts a JSON amount in major units to minor units.
pub fn amount_to_minor(amount: &Number) -> Result<i64, String> {
    let minor = if let Some(units) = amount.as_i64() {
        units.checked_mul(100)
    } else if amount.as_u64().is_some() {
        None
    } else {
        let value = amount.as_f64().unwrap_or(f64::NAN);
        if !value.is_finite() {
            return Err("amount must be a finite number".into());
        }
        let scaled = value * 100.0;
        let rounded = scaled.round();
        if (scaled - rounded).abs() > 1e-6 {
            return Err(format!("amount {amount} has more than two decimal places"));
        }
        if rounded.abs() > MAX_AMOUNT_MINOR as f64 {
            None
        } else {
            Some(rounded as i64)
        }
    };
    match minor {
        Some(m) if m <= 0 => Err("amount must be greater than zero".into()),
        Some(m) if m <= MAX_AMOUNT_MINOR => Ok(m),
        _ => Err(format!("amount {amount} is too large")),
    }
}

/// Minor units written as a decimal with two places: `10000` → `100.00`.
pub fn format_minor(minor: i64) -> String {
    let sign = if minor < 0 { "-" } else { "" };
    let abs = minor.unsigned_abs();
    format!("{sign}{}.{:02}", abs / 100, abs % 100)
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

#[derive(Serialize)]
struct PublicPayment<'a> {
    id: &'a str,
    amount: Box<RawValue>,
    currency: &'a str,
    status: &'a str,
    charge_id: &'a str,
}

impl PaymentRecord {
    /// The API representation: `{"id","amount","currency","status","charge_id"}` with the amount as
    /// a decimal number (`100.00`).
    pub fn to_public_json(&self) -> Result<Vec<u8>, serde_json::Error> {
        let amount = RawValue::from_string(format_minor(self.amount_minor))?;
        serde_json::to_vec(&PublicPayment {
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
    fn amounts_convert_to_minor_units() {
        assert_eq!(minor("100.00"), Ok(10_000));
        assert_eq!(minor("100"), Ok(10_000));
        assert_eq!(minor("19.99"), Ok(1_999));
        assert_eq!(minor("0.01"), Ok(1));
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
    fn currency_must_be_three_upper_case_letters() {
        let p = |c: &str| CreatePayment {
            amount: Number::from(1),
            currency: c.into(),
        };
        assert!(p("BRL").validate().is_ok());
        assert!(p("brl").validate().is_err());
        assert!(p("BRLX").validate().is_err());
        assert!(p("").validate().is_err());
    }
}
