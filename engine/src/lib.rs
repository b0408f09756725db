//! idemlog: an embedded store for HTTP `Idempotency-Key` records.
//!
//! An API whose `POST` must not run twice (an order, a transfer) must survive retries: the client
//! sends one key per business operation, the server atomically claims `(scope, key)`, runs the
//! handler once, stores the final response, and replays it to every retry. This crate is the storage half of that: an append-only, CRC-framed log on disk
//! plus a sharded in-memory index, giving atomic [`Store::claim`] / [`Store::complete`] /
//! [`Store::release`] with TTL expiry, leases with fencing tokens for stuck claims, group commit, and
//! crash recovery.
//!
//! ```
//! use std::time::Duration;
//! use idemlog::{ClaimOutcome, Fingerprint, Options, SideWrite, Store, StoredResponse};
//!
//! # fn main() -> Result<(), idemlog::Error> {
//! # let tmp = std::env::temp_dir().join(format!("idemlog-doc-{}", std::process::id()));
//! let store = Store::open(&tmp, Options::default())?;
//! let fp = Fingerprint([7; 32]); // SHA-256 of the request, computed by the caller
//! let ttl = Duration::from_secs(24 * 3600);
//!
//! // First request: we own the key, run the handler, store its response with the business record.
//! let ClaimOutcome::Acquired(token) = store.claim(b"acct_1", b"order-42", &fp, ttl)? else {
//!     unreachable!("a fresh key is always acquired");
//! };
//! let response = StoredResponse::new(201, r#"{"id":"ord_1"}"#).with_header("Location", "/orders/ord_1");
//! store.complete(&token, &response, &[SideWrite::put("orders", "ord_1", r#"{"qty":1}"#)])?;
//!
//! // A retry of the same request gets the stored response back, byte for byte.
//! match store.claim(b"acct_1", b"order-42", &fp, ttl)? {
//!     ClaimOutcome::Completed(replayed) => assert_eq!(replayed, response),
//!     other => panic!("expected a replay, got {other:?}"),
//! }
//! // The same key with a different request is refused.
//! assert_eq!(store.claim(b"acct_1", b"order-42", &Fingerprint([8; 32]), ttl)?, ClaimOutcome::Mismatch);
//! # drop(store);
//! # std::fs::remove_dir_all(&tmp).ok();
//! # Ok(())
//! # }
//! ```
//!
//! Durability modes and what each survives are described on [`Durability`]; the on-disk format and the
//! argument why every crash leaves a recoverable log are in `FORMAT.md`, and which writes wait for
//! the disk in `DURABILITY.md`, both shipped with the crate's source.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod claim;
mod clock;
mod codec;
mod compaction;
mod dir_lock;
mod error;
mod index;
mod limits;
mod log;
mod maintenance;
mod manifest;
mod metrics;
mod options;
mod pending;
mod quota;
mod read_only;
mod record;
mod recovery;
mod response;
mod side;
pub mod storage;
mod store;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
mod verify;

pub use claim::{ClaimOptions, ClaimOutcome, ClaimToken, Fingerprint, RequestDigest, Takeover};
pub use clock::{Clock, ManualClock, SystemClock};
pub use compaction::CompactionReport;
pub use dir_lock::LOCK_FILE;
pub use error::{Corruption, Error, Result};
pub use limits::{
    MAX_HEADER_NAME, MAX_HEADER_VALUE, MAX_HEADERS, MAX_KEY, MAX_NAMESPACE, MAX_REQUEST_DIGEST,
    MAX_SCOPE, MAX_SIDE_KEY, MAX_VALUE,
};
pub use log::group_commit::GroupCommit;
pub use metrics::HistogramSnapshot;
pub use options::{CompactionPolicy, Durability, Options, RecoveredClaims};
pub use pending::{Deferred, Durable, Pending};
pub use read_only::ReadOnlyStore;
pub use record::{Record, RecordState};
pub use recovery::{RecoveryReport, TornTail};
pub use response::StoredResponse;
pub use side::SideWrite;
pub use store::{Stats, Store, StoreMetrics};
pub use verify::{VerifyReport, verify};
