//! Persisted counters, and the striped locks of `insert_once`.
//!
//! A counter is [`COUNTER_STRIPES`] side records in [`COUNTERS_NAMESPACE`] (`{name}/{stripe:02}`),
//! so inserts of keys in different stripes neither queue behind one lock nor rewrite one record.
//! Invariants: a stripe's in-memory copy is loaded from the log on first use and changes only
//! under its lock, together with the append that persists it; a stripe record that does not parse
//! is an error, never zero, so a counter cannot go down.
//!
//! Migration: data directories written before 0.1.0's release kept counters in the namespace
//! [`LEGACY_COUNTERS_NAMESPACE`]. A stripe with no record in [`COUNTERS_NAMESPACE`] is read from
//! there, and the first increment of such a stripe writes its total under the new name and removes
//! the old record in the same atomic append. Counter names are the application's, so the old
//! records cannot be listed at open; read-through keeps every count exact whenever it moves.

use std::sync::Arc;

use idemlog::Store;
use parking_lot::Mutex;
use sha2::{Digest, Sha256};

/// Namespace of counter records (reserved: applications should not write records in it).
pub const COUNTERS_NAMESPACE: &str = "idemlog.counters";
/// Where data directories written before 0.1.0's release keep their counters (see the module docs).
pub const LEGACY_COUNTERS_NAMESPACE: &str = "gateway.counters";
/// Records per counter, and lock stripes of `insert_once`: inserts of keys in different stripes
/// do not queue behind one lock or one counter record.
pub const COUNTER_STRIPES: usize = 16;

/// In-memory copies of the persisted counters, loaded on first use from the store they belong to.
#[derive(Default)]
pub(super) struct Counters {
    by_name: Mutex<Vec<(&'static str, Stripes)>>,
}

/// One counter's persisted stripes; each lock also serialises `insert_once` for its keys.
pub(super) type Stripes = Arc<[Mutex<Stripe>]>;

/// One stripe's value, and whether it still lives under [`LEGACY_COUNTERS_NAMESPACE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stripe {
    pub(super) value: u64,
    pub(super) legacy: bool,
}

impl Counters {
    pub(super) fn stripes(&self, store: &Store, name: &'static str) -> idemlog::Result<Stripes> {
        let mut by_name = self.by_name.lock();
        if let Some((_, stripes)) = by_name.iter().find(|(n, _)| *n == name) {
            return Ok(Arc::clone(stripes));
        }
        let mut loaded = Vec::with_capacity(COUNTER_STRIPES);
        for stripe in 0..COUNTER_STRIPES {
            loaded.push(Mutex::new(read_stripe(store, name, stripe)?));
        }
        let stripes: Stripes = loaded.into();
        by_name.push((name, Arc::clone(&stripes)));
        Ok(stripes)
    }
}

/// One stripe of a persisted counter as the log holds it, under its current namespace or else the
/// legacy one. Blocking: a stripe whose latest record is not durable yet is waited for, so a value
/// read here survives a crash.
pub(super) fn read_stripe(store: &Store, name: &str, stripe: usize) -> idemlog::Result<Stripe> {
    let key = counter_key(name, stripe);
    let (bytes, legacy) = match store.side_get(COUNTERS_NAMESPACE.as_bytes(), key.as_bytes())? {
        Some(bytes) => (bytes, false),
        None => match store.side_get(LEGACY_COUNTERS_NAMESPACE.as_bytes(), key.as_bytes())? {
            Some(bytes) => (bytes, true),
            None => {
                return Ok(Stripe {
                    value: 0,
                    legacy: false,
                });
            }
        },
    };
    // A counter record that does not parse is corrupt data; counting from zero would make the
    // counter go down, so refuse.
    let value = std::str::from_utf8(&bytes)
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or(idemlog::Error::InvalidArgument(
            "a counter record does not hold a number",
        ))?;
    Ok(Stripe { value, legacy })
}

pub(super) fn counter_key(name: &str, stripe: usize) -> String {
    format!("{name}/{stripe:02}")
}

/// The stripe of a record key: namespace and key are length-prefixed so that no two different pairs
/// hash the same input.
pub(super) fn stripe_of(namespace: &str, key: &str) -> usize {
    let digest = Sha256::new()
        .chain_update((namespace.len() as u64).to_le_bytes())
        .chain_update(namespace.as_bytes())
        .chain_update(key.as_bytes())
        .finalize();
    usize::from(digest[0]) % COUNTER_STRIPES
}
