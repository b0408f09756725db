//! The fake payment provider ("gateway"): charges, deduplicated on a caller-supplied key, and a
//! charge counter that never goes down.
//!
//! Like a real provider's idempotency keys, a provider key (`charge:{scope}:{key}`) returns the
//! original charge for as long as it is remembered, instead of charging again. That is what makes a
//! retry after a crash, a lost response or a takeover safe: the handler runs again, but the money
//! moves once. Charges are kept in the engine as side records (namespace `gateway.charges`) that
//! expire with the idempotency key they were made under; the all-time count is kept in
//! [`COUNTER_SHARDS`] counter records (namespace `gateway.counters`) written in the same atomic
//! append as the charge, so `gateway_charges_total` survives restarts and never decreases.
//!
//! Simulated faults: every call takes `latency` to answer *after* the charge is recorded (a crash in
//! that window leaves a charge whose response never arrived), and the first `fail_after_charge` new
//! charges fail as though that response was lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use idemlog::{Clock, SideWrite, Store};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use crate::store_calls::StoreCalls;

/// Namespace of charge records, keyed by provider key.
pub const CHARGES_NAMESPACE: &str = "gateway.charges";
/// Namespace of the charge counter records.
pub const COUNTERS_NAMESPACE: &str = "gateway.counters";
/// Counter records; charges are spread over them by provider key so that charges for different keys
/// do not queue behind one counter.
pub const COUNTER_SHARDS: usize = 16;

/// How the fake provider behaves.
#[derive(Clone)]
pub struct GatewayConfig {
    /// How long a provider key is remembered when the caller gives no expiry (`--key-ttl`).
    pub key_ttl: Duration,
    /// Time to answer each call, after recording the charge.
    pub latency: Duration,
    /// The first N new charges fail as though their response was lost.
    pub fail_after_charge: u64,
    /// The store's clock, to turn an absolute expiry into a TTL.
    pub clock: Arc<dyn Clock>,
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
    Store(#[from] idemlog::Error),
    /// A stored charge or counter does not parse.
    #[error("provider record {0} is unreadable")]
    Corrupt(String),
    /// The blocking task failed.
    #[error("provider task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// The fake provider. Cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    config: GatewayConfig,
    /// Each shard's persisted count; the lock also serialises check-and-charge for its keys.
    shards: Vec<Mutex<u64>>,
    /// New charges made by this process, for `fail_after_charge`.
    new_charges: AtomicU64,
    /// Feeds charge ids.
    sequence: AtomicU64,
    seed: [u8; 16],
}

fn counter_key(shard: usize) -> String {
    format!("charges_total/{shard:02}")
}

fn shard_of(provider_key: &str) -> usize {
    let digest = Sha256::digest(provider_key.as_bytes());
    usize::from(digest[0]) % COUNTER_SHARDS
}

impl Gateway {
    /// Opens the provider on `store`, loading its counters.
    pub fn open(store: Store, config: GatewayConfig) -> Result<Self, GatewayError> {
        let mut shards = Vec::with_capacity(COUNTER_SHARDS);
        for shard in 0..COUNTER_SHARDS {
            let key = counter_key(shard);
            let count = match store.side_get(COUNTERS_NAMESPACE.as_bytes(), key.as_bytes())? {
                None => 0,
                Some(bytes) => std::str::from_utf8(&bytes)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| GatewayError::Corrupt(format!("{COUNTERS_NAMESPACE}/{key}")))?,
            };
            shards.push(Mutex::new(count));
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let mut seed = [0; 16];
        seed.copy_from_slice(
            &Sha256::new()
                .chain_update(now.to_be_bytes())
                .chain_update(std::process::id().to_be_bytes())
                .chain_update(store.dir().as_os_str().as_encoded_bytes())
                .finalize()[..16],
        );
        Ok(Self {
            inner: Arc::new(Inner {
                store,
                config,
                shards,
                new_charges: AtomicU64::new(0),
                sequence: AtomicU64::new(0),
                seed,
            }),
        })
    }

    /// Every charge ever made through this data directory.
    pub fn charges_total(&self) -> u64 {
        self.inner.shards.iter().map(|s| *s.lock()).sum()
    }

    /// A fresh id with this prefix (`ch_`, `pay_`), unique across processes and restarts.
    pub fn new_id(&self, prefix: &str) -> String {
        self.inner.new_id(prefix)
    }

    /// Charges `amount_minor` once per `provider_key`: a key seen before returns its original
    /// charge. `expires_at_ms` (store clock) is when the caller's own key expires; the provider
    /// remembers its key until then (or for `key_ttl` when `None`).
    pub async fn charge(
        &self,
        provider_key: String,
        amount_minor: i64,
        currency: String,
        expires_at_ms: Option<u64>,
    ) -> Result<Charge, GatewayError> {
        let inner = Arc::clone(&self.inner);
        let span = tracing::Span::current();
        let calls = StoreCalls::for_store(&inner.store);
        let (charge, lose_response) = calls
            .run(move || {
                let _span = span.enter();
                inner.charge_blocking(&provider_key, amount_minor, &currency, expires_at_ms)
            })
            .await??;
        // Even a zero-length tokio sleep waits for the next timer tick (about 1 ms), which would
        // dominate a benchmark run with `--gateway-latency 0ms`.
        let latency = self.inner.config.latency;
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

impl Inner {
    fn new_id(&self, prefix: &str) -> String {
        let n = self.sequence.fetch_add(1, Ordering::Relaxed);
        let digest = Sha256::new()
            .chain_update(self.seed)
            .chain_update(n.to_be_bytes())
            .finalize();
        let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
        format!("{prefix}{hex}")
    }

    /// Check-and-charge under the key's shard lock. Returns the charge and whether to simulate a
    /// lost response.
    fn charge_blocking(
        &self,
        provider_key: &str,
        amount_minor: i64,
        currency: &str,
        expires_at_ms: Option<u64>,
    ) -> Result<(Charge, bool), GatewayError> {
        let shard = shard_of(provider_key);
        let mut count = self.shards[shard].lock();
        let ns = CHARGES_NAMESPACE.as_bytes();
        if let Some(bytes) = self.store.side_get(ns, provider_key.as_bytes())? {
            let existing: Charge = serde_json::from_slice(&bytes).map_err(|_| {
                GatewayError::Corrupt(format!("{CHARGES_NAMESPACE}/{provider_key}"))
            })?;
            if existing.amount_minor != amount_minor || existing.currency != currency {
                return Err(GatewayError::KeyReused {
                    charge_id: existing.id,
                });
            }
            info!(charge_id = %existing.id, "gateway: provider key seen before, returning the original charge");
            return Ok((existing, false));
        }
        let charge = Charge {
            id: self.new_id("ch_"),
            amount_minor,
            currency: currency.to_owned(),
        };
        let ttl = match expires_at_ms {
            Some(at) => Duration::from_millis(at.saturating_sub(self.config.clock.now_ms()).max(1)),
            None => self.config.key_ttl,
        };
        let value = serde_json::to_vec(&charge)
            .map_err(|_| GatewayError::Corrupt(format!("new charge {}", charge.id)))?;
        let next = *count + 1;
        self.store.side_write(&[
            SideWrite::put_with_ttl(
                CHARGES_NAMESPACE,
                Bytes::copy_from_slice(provider_key.as_bytes()),
                value,
                ttl,
            ),
            SideWrite::put(COUNTERS_NAMESPACE, counter_key(shard), next.to_string()),
        ])?;
        *count = next;
        let nth = self.new_charges.fetch_add(1, Ordering::Relaxed) + 1;
        info!(charge_id = %charge.id, amount_minor, currency, "gateway: charged");
        Ok((charge, nth <= self.config.fail_after_charge))
    }
}
