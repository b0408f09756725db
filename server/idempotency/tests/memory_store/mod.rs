//! The store of the layer's own tests: the embedded engine on the in-memory fault-injecting storage,
//! with a manual clock, so they need no disk and no real time.

use std::sync::Arc;

use idemlog::testkit::FaultyStorage;
use idemlog::{Durability, ManualClock, Options};
use idemlog_idempotency::backends::embedded::EmbeddedBackend;

/// A fresh, empty store with `durability`.
pub fn open(durability: Durability) -> EmbeddedBackend {
    EmbeddedBackend::open(
        "/data",
        Options::default()
            .storage(Arc::new(FaultyStorage::new()))
            .clock(Arc::new(ManualClock::new(1_700_000_000_000)))
            .durability(durability),
    )
    .expect("store")
}
