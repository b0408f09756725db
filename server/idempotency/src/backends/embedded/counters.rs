//! Persisted counters, and the striped locks of `insert_once`.
//!
//! A counter is [`COUNTER_STRIPES`] side records in [`COUNTERS_NAMESPACE`] (`{name}/{stripe:02}`),
//! so inserts of keys in different stripes neither queue behind one lock nor rewrite one record.
//! Invariants: a stripe's in-memory copy is loaded from the log on first use and changes only
//! under its lock, together with the append that persists it; a stripe record that does not parse
//! is an error, never zero, so a counter cannot go down. The names are on disk: changing them
//! loses existing counts.

use std::sync::Arc;

use idemlog::Store;
use parking_lot::Mutex;
use sha2::{Digest, Sha256};

/// Namespace of counter records. The name predates the store interface (the provider's charge
/// counter lived here first) and is kept so existing data directories keep their counts.
pub const COUNTERS_NAMESPACE: &str = "gateway.counters";
/// Records per counter, and lock stripes of `insert_once`: inserts of keys in different stripes
/// do not queue behind one lock or one counter record.
pub const COUNTER_STRIPES: usize = 16;

/// In-memory copies of the persisted counters, loaded on first use from the store they belong to.
#[derive(Default)]
pub(super) struct Counters {
    by_name: Mutex<Vec<(&'static str, Stripes)>>,
}

/// One counter's persisted stripes; each lock also serialises `insert_once` for its keys.
pub(super) type Stripes = Arc<[Mutex<u64>]>;

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

/// One stripe of a persisted counter as the log holds it. Blocking: a stripe whose latest record is
/// not durable yet is waited for, so a value read here survives a crash.
pub(super) fn read_stripe(store: &Store, name: &str, stripe: usize) -> idemlog::Result<u64> {
    let key = counter_key(name, stripe);
    match store.side_get(COUNTERS_NAMESPACE.as_bytes(), key.as_bytes())? {
        None => Ok(0),
        // A counter record that does not parse is corrupt data; counting from zero would make the
        // counter go down, so refuse.
        Some(bytes) => std::str::from_utf8(&bytes)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or(idemlog::Error::InvalidArgument(
                "a counter record does not hold a number",
            )),
    }
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
