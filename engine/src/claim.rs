//! What a claim returns: the request fingerprint it checks, the outcome, and the token that lets the
//! winner complete, release or extend its claim.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;

use crate::response::StoredResponse;

/// SHA-256 (or any 32-byte digest) of the request, computed by the caller. Two requests with the same
/// key but different fingerprints are different operations.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Fingerprint(")?;
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        f.write_str("…)")
    }
}

/// How an acquired claim came to be when the key already had a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takeover {
    /// The previous record had outlived its TTL and was replaced.
    Expired,
    /// The previous claim was still in progress but its lease had run out (its holder is presumed
    /// dead); the new claim has a larger fencing token, so the old holder can no longer complete.
    LeaseExpired,
}

/// The result of [`crate::Store::claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The caller owns the key and must complete, release, or let the lease run out.
    Acquired(ClaimToken),
    /// Another claim with the same fingerprint is running; try again after `retry_after`.
    InProgress {
        /// Time left on the running claim's lease.
        retry_after: Duration,
    },
    /// The key was completed with the same fingerprint: replay this response.
    Completed(StoredResponse),
    /// The key is held or completed with a different fingerprint.
    Mismatch,
    /// The key is new and its scope already holds [`ClaimOptions::max_live_per_scope`] live
    /// records: nothing was written. A place frees up in `retry_after` (when the scope's next record
    /// stops counting).
    QuotaExceeded {
        /// Time until the scope's next live record stops counting (at least 1 ms).
        retry_after: Duration,
    },
}

/// The opaque blob a claim stores with the record it creates ([`ClaimOptions::request_digest`]).
#[derive(Clone, Copy)]
pub enum RequestDigest<'a> {
    /// These bytes; empty for none.
    Given(&'a [u8]),
    /// What this function returns, called only when the claim is about to write a record (a new
    /// key, an expired one, or a takeover): a replay, an in-progress answer or a mismatch never
    /// calls it (a new key the quota then refuses may have). Called at most once per claim and
    /// never under the store's locks, so it may be slow (a server hashes the request for it).
    Lazy(&'a (dyn Fn() -> Bytes + Sync)),
}

impl Default for RequestDigest<'_> {
    fn default() -> Self {
        RequestDigest::Given(&[])
    }
}

impl fmt::Debug for RequestDigest<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestDigest::Given(bytes) => f.debug_tuple("Given").field(&bytes.len()).finish(),
            RequestDigest::Lazy(_) => f.write_str("Lazy"),
        }
    }
}

/// Optional parts of a claim ([`crate::Store::claim_with`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct ClaimOptions<'a> {
    /// An opaque blob stored with the record (in the log, never in memory) and shown by
    /// [`crate::Store::get`] as [`crate::Record::request_digest`]; at most 8 KiB.
    pub request_digest: RequestDigest<'a>,
    /// Refuse a claim of a *new* key (no record, or an expired one) while the scope already holds
    /// this many live records ([`ClaimOutcome::QuotaExceeded`]). Replays, in-progress answers and
    /// takeovers of live records are never refused. `None`: no limit. The count is exact under
    /// concurrency; a record stops counting at most 1 s after it expires (see `quota.rs`).
    pub max_live_per_scope: Option<u64>,
}

/// Proof of an acquired claim. It names the key and carries the fencing token; the store rejects it
/// once another claim has taken the key over.
#[derive(Clone, PartialEq, Eq)]
pub struct ClaimToken {
    /// `[scope length u8][scope][key]`, the index key.
    pub(crate) id: Box<[u8]>,
    pub(crate) fence: u64,
    pub(crate) takeover: Option<Takeover>,
    /// The claim's full fingerprint and creation time, which the index does not keep in memory; the
    /// fence proves they still describe the record.
    pub(crate) fingerprint: [u8; 32],
    pub(crate) created_at: u64,
    pub(crate) expires_at: u64,
    /// The claim's request digest (empty: none), rewritten with every snapshot of the record.
    pub(crate) digest: bytes::Bytes,
}

impl ClaimToken {
    /// The scope the claim was made in.
    pub fn scope(&self) -> &[u8] {
        crate::index::split_record_key(&self.id).0
    }

    /// The idempotency key.
    pub fn key(&self) -> &[u8] {
        crate::index::split_record_key(&self.id).1
    }

    /// The fencing token: strictly larger than that of any earlier claim in this store.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// Set when this claim replaced an existing record.
    pub fn takeover(&self) -> Option<Takeover> {
        self.takeover
    }

    /// When the claimed record expires (ms since the Unix epoch): downstream keys derived from this
    /// one should live as long.
    pub fn expires_at_ms(&self) -> u64 {
        self.expires_at
    }
}

impl fmt::Debug for ClaimToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClaimToken")
            .field("scope", &String::from_utf8_lossy(self.scope()))
            .field("key", &String::from_utf8_lossy(self.key()))
            .field("fence", &self.fence)
            .field("takeover", &self.takeover)
            .finish()
    }
}
