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
}

/// The two states a live record can be in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordState {
    /// A handler is running; its lease runs until `lease_until_ms`.
    InProgress {
        /// Lease expiry in ms since the Unix epoch.
        lease_until_ms: u64,
    },
    /// The handler finished; this response is replayed.
    Completed(StoredResponse),
}
