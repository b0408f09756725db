//! The reusable `Idempotency-Key` layer: any axum/tower route can opt in with
//! [`IdempotencyLayer`]; routes without it pay nothing.
//!
//! What a route gets (the contract in issue 3):
//! - the key is parsed from `Idempotency-Key` ([`key`]): 400 before anything runs if it is missing or
//!   malformed;
//! - the scope comes only from the request's [`Scope`] extension, which an authentication layer
//!   puts there (here: [`crate::auth::require_account`]); no scope → 401;
//! - the request is fingerprinted ([`fingerprint`]); the same key with another fingerprint → 422;
//! - the same key while the first request runs → 409 with `Retry-After`;
//! - a completed key → the stored response replayed ([`replay`]);
//! - 2xx/4xx are stored, a 5xx or a panic releases the key; a client disconnect cannot stop the
//!   handler or the completion halfway: what is left moves to a task of its own ([`layer`]).
//!
//! Handlers hand business records to the layer as a [`SideRecords`] response extension: the layer
//! takes them off the response and writes them in the same atomic engine append as the completion, so
//! the business record exists exactly when the key is completed.

mod catch_panic;
pub mod digest;
pub mod fingerprint;
mod finish_on_drop;
mod in_flight;
pub mod key;
mod layer;
mod outcome;
pub mod replay;
mod side_records;
pub mod status;
pub mod store;

pub use fingerprint::FingerprintMode;
pub use in_flight::InFlight;
pub use key::{IdempotencyKey, KeyError};
pub use layer::{IdempotencyConfig, IdempotencyLayer, Idempotent};
pub use outcome::{Outcome, OutcomeCounts};
pub use side_records::{SideRecords, persist_side_records};
pub use store::HistogramMetric;
pub use store::{
    ClaimExtras, ClaimOutcome, ClaimToken, Expiry, Gauge, Health, IdempotencyStore, InsertOnce,
    KeyRecord, KeyState, RecordWrite, SharedStore, StoreError,
};

use std::sync::Arc;

/// The idempotency scope of a request: keys of different scopes never meet. Put in the request
/// extensions by the authentication layer; the layer never derives it from a client header.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Scope(Arc<str>);

impl Scope {
    /// A scope (the authenticated principal's id; 1–255 bytes, checked by the engine).
    pub fn new(id: impl Into<Arc<str>>) -> Self {
        Self(id.into())
    }

    /// The scope id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The claim a handler runs under; put in the request extensions by the layer before the inner
/// service is called. A handler that calls a downstream service with its own idempotency keys uses
/// `expires_at_ms` to make the downstream key live exactly as long as ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimInfo {
    /// The claim's fencing token.
    pub fence: u64,
    /// When the key expires, in the store clock's milliseconds, if the store still reported it.
    pub expires_at_ms: Option<u64>,
}
