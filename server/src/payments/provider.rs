//! The fake payment provider ("gateway"): charges, deduplicated on a caller-supplied key, and a
//! charge counter that never goes down.
//!
//! Like a real provider's idempotency keys, a provider key ([`provider_key`]) returns the original
//! charge for as long as it is remembered, instead of charging again. That is what makes a retry
//! after a crash, a lost response or a takeover safe: the handler runs again, but the money moves
//! once. Charges are business records (namespace [`CHARGES_NAMESPACE`]) that expire with the
//! idempotency key they were made under, written with
//! [`IdempotencyStore::insert_once`](idemlog_idempotency::IdempotencyStore::insert_once): the
//! check-and-charge is atomic across every process sharing the store, and the all-time count
//! ([`CHARGES_COUNTER`], `gateway_charges_total`) goes up in the same atomic step, so it survives
//! restarts, counts every instance's charges and never decreases.
//!
//! Simulated faults: every call takes `latency` to answer *after* the charge is recorded (a crash in
//! that window leaves a charge whose response never arrived), and the first `fail_after_charge` new
//! charges fail as though that response was lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tracing::{debug, info, warn};

use idemlog_idempotency::{Expiry, InsertOnce, RecordWrite, StoreError, StoreHandle};

/// Namespace of charge records, keyed by provider key.
pub const CHARGES_NAMESPACE: &str = "gateway.charges";
/// The persisted counter of charges (`gateway_charges_total`).
pub const CHARGES_COUNTER: &str = "charges_total";

/// The provider key of idempotency key `key` in scope `scope`: `charge:{len(scope)}:{scope}:{key}`.
///
/// The scope's length comes first, so the split between scope and key is never ambiguous: with a
/// plain `charge:{scope}:{key}`, scope `acct_a` with key `b:k` and scope `acct_a:b` with key `k` were
/// one provider key, and the second tenant was handed the first tenant's charge. The parts stay
/// readable in logs.
pub fn provider_key(scope: &str, key: &str) -> String {
    // Joined rather than `format!`ed, which costs several times as much on every payment.
    let mut len = itoa::Buffer::new();
    ["charge:", len.format(scope.len()), ":", scope, ":", key].concat()
}

/// How the fake provider behaves.
#[derive(Clone)]
pub struct GatewayConfig {
    /// How long a provider key is remembered when the caller gives no expiry (`--key-ttl`).
    pub key_ttl: Duration,
    /// Time to answer each call, after recording the charge.
    pub latency: Duration,
    /// The first N new charges fail as though their response was lost.
    pub fail_after_charge: u64,
}

/// A charge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    /// `ch_…`.
    pub id: String,
    /// Amount in minor units.
    pub amount_minor: i64,
    /// Currency code.
    pub currency: String,
}

/// Why a charge call failed.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// Simulated: the charge was made but its response never arrived.
    #[error("the provider's response was lost after charge {charge_id} was made (simulated)")]
    ResponseLost {
        /// The charge that was made.
        charge_id: String,
    },
    /// The provider key was used before with another amount or currency.
    #[error("provider key reused with a different amount or currency (charge {charge_id})")]
    KeyReused {
        /// The existing charge.
        charge_id: String,
    },
    /// The store failed.
    #[error("provider storage failed: {0}")]
    Store(#[from] StoreError),
    /// A stored charge does not parse.
    #[error("provider record {0} is unreadable")]
    Corrupt(String),
}

/// The fake provider. Cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

struct Inner {
    store: StoreHandle,
    config: GatewayConfig,
    /// New charges made by this process, for `fail_after_charge`.
    new_charges: AtomicU64,
    /// Feeds ids.
    sequence: AtomicU64,
    seed: [u8; 16],
}

impl Gateway {
    /// The provider on `store`.
    pub fn new(store: StoreHandle, config: GatewayConfig) -> Self {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let mut seed = [0; 16];
        // Ids must not collide across processes sharing one database: the seed mixes the time,
        // the pid and the address of a fresh allocation.
        let local = Box::new(0u8);
        seed.copy_from_slice(
            &Sha256::new()
                .chain_update(now.to_be_bytes())
                .chain_update(std::process::id().to_be_bytes())
                .chain_update((std::ptr::from_ref(&*local) as usize).to_be_bytes())
                .finalize()[..16],
        );
        Self {
            inner: Arc::new(Inner {
                store,
                config,
                new_charges: AtomicU64::new(0),
                sequence: AtomicU64::new(0),
                seed,
            }),
        }
    }

    /// Every charge ever made through this store (all processes sharing it).
    pub async fn charges_total(&self) -> Result<u64, StoreError> {
        self.inner.store.counter(CHARGES_COUNTER).await
    }

    /// A fresh id with this prefix (`ch_`, `pay_`), unique across processes and restarts.
    pub fn new_id(&self, prefix: &str) -> String {
        let n = self.inner.sequence.fetch_add(1, Ordering::Relaxed);
        let digest = Sha256::new()
            .chain_update(self.inner.seed)
            .chain_update(n.to_be_bytes())
            .finalize();
        prefixed_hex(prefix, &digest[..12])
    }

    /// Charges `amount_minor` once per `provider_key`: a key seen before returns its original
    /// charge. `expires_at_ms` (the store's clock) is when the caller's own key expires; the
    /// provider remembers its key until then (or for `key_ttl` when `None`).
    pub async fn charge(
        &self,
        provider_key: String,
        amount_minor: i64,
        currency: String,
        expires_at_ms: Option<u64>,
    ) -> Result<Charge, GatewayError> {
        let inner = &self.inner;
        let charge = Charge {
            id: self.new_id("ch_"),
            amount_minor,
            currency,
        };
        let value = serde_json::to_vec(&charge)
            .map_err(|_| GatewayError::Corrupt(format!("new charge {}", charge.id)))?;
        let expiry = match expires_at_ms {
            Some(at) => Expiry::AtMs(at),
            None => Expiry::After(inner.config.key_ttl),
        };
        let write = RecordWrite::put_until(CHARGES_NAMESPACE, provider_key.clone(), value, expiry);
        let (charge, lose_response) = match inner.store.insert_once(&write, CHARGES_COUNTER).await?
        {
            InsertOnce::Existing(bytes) => {
                let existing: Charge = serde_json::from_slice(&bytes).map_err(|_| {
                    GatewayError::Corrupt(format!("{CHARGES_NAMESPACE}/{provider_key}"))
                })?;
                if existing.amount_minor != charge.amount_minor
                    || existing.currency != charge.currency
                {
                    return Err(GatewayError::KeyReused {
                        charge_id: existing.id,
                    });
                }
                info!(charge_id = %existing.id, provider_key, "gateway: provider key seen before, returning the original charge");
                (existing, false)
            }
            InsertOnce::Inserted => {
                let nth = inner.new_charges.fetch_add(1, Ordering::Relaxed) + 1;
                // DEBUG: the handler's "payment created" line (INFO) names the charge.
                debug!(charge_id = %charge.id, amount_minor, currency = %charge.currency, provider_key, "gateway: charged");
                (charge, nth <= inner.config.fail_after_charge)
            }
        };
        // Even a zero-length tokio sleep waits for the next timer tick (about 1 ms), which would
        // dominate a benchmark run with `--gateway-latency 0ms`.
        let latency = inner.config.latency;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        if lose_response {
            warn!(charge_id = %charge.id, "gateway: simulating a lost response after the charge was made");
            return Err(GatewayError::ResponseLost {
                charge_id: charge.id,
            });
        }
        Ok(charge)
    }
}

/// `prefix` followed by `bytes` in lowercase hex, in one allocation (a `format!` per byte cost two
/// dozen allocations per payment).
fn prefixed_hex(prefix: &str, bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut id = String::with_capacity(prefix.len() + 2 * bytes.len());
    id.push_str(prefix);
    for b in bytes {
        id.push(char::from(HEX[usize::from(b >> 4)]));
        id.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_the_prefix_and_lowercase_hex_of_every_byte() {
        let bytes = [0x00, 0x0f, 0xa5, 0xff, 0x10];
        let expected: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(prefixed_hex("ch_", &bytes), format!("ch_{expected}"));
        assert_eq!(prefixed_hex("pay_", &bytes), "pay_000fa5ff10");
    }

    #[test]
    fn provider_keys_of_different_scope_and_key_pairs_differ() {
        // The audit's collision: ("acct_a", "b:k") and ("acct_a:b", "k").
        assert_ne!(provider_key("acct_a", "b:k"), provider_key("acct_a:b", "k"));
        assert_eq!(provider_key("acct_a", "order-1"), "charge:6:acct_a:order-1");
    }

    proptest::proptest! {
        #[test]
        fn provider_keys_are_the_scope_length_scope_and_key(scope in "\\PC{0,40}", key in "\\PC{0,40}") {
            proptest::prop_assert_eq!(
                provider_key(&scope, &key),
                format!("charge:{}:{scope}:{key}", scope.len())
            );
        }

        #[test]
        fn provider_keys_are_injective(
            a in "[a-z:]{1,6}", b in "[a-z:]{1,6}", c in "[a-z:]{1,6}", d in "[a-z:]{1,6}"
        ) {
            if (a.as_str(), b.as_str()) != (c.as_str(), d.as_str()) {
                proptest::prop_assert_ne!(provider_key(&a, &b), provider_key(&c, &d));
            }
        }
    }
}
