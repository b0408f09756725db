//! A record as [`crate::Store::get`] shows it, for inspection and operator tools.

use crate::claim::Fingerprint;
use crate::response::StoredResponse;

/// The stored state of one (scope, key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Fingerprint of the request that claimed the key.
    pub fingerprint: Fingerprint,
    /// When the key was claimed, in ms since the Unix epoch.
    pub created_at_ms: u64,
    /// When the record stops counting, in ms since the Unix epoch.
    pub expires_at_ms: u64,
    /// The claim's fencing token.
    pub fence: u64,
    /// In progress or completed.
    pub state: RecordState,
    /// The request digest the claim stored ([`crate::ClaimOptions::request_digest`]), if any.
    pub request_digest: Option<bytes::Bytes>,
}

/// The two states a live record can be in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordState {
    /// A handler is running (or its holder died); `lease_until_ms` is the wall-clock lease end written
    /// to the log. Takeover decisions use the store's monotonic clock, not this value, and a claim
    /// recovered at open can be taken over at once whatever it says.
    InProgress {
        /// Lease expiry in ms since the Unix epoch.
        lease_until_ms: u64,
    },
    /// The handler finished; this response is replayed.
    Completed(StoredResponse),
}
