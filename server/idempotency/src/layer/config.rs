//! The layer's settings.
//!
//! Plain data, read by every request; nothing here changes after the layer is built. The defaults
//! of [`IdempotencyConfig::new`] derive the renewal period from the store's lease, so a running
//! handler's lease is renewed well before it runs out.

use std::time::Duration;

use axum::http::HeaderName;

use crate::fingerprint::FingerprintMode;
use crate::layer::release_statuses::ReleaseStatuses;
use crate::layer::unrecorded::UnrecordedResponse;
use crate::replay::STORED_HEADERS;

/// Settings of an [`IdempotencyLayer`](crate::IdempotencyLayer).
#[derive(Debug, Clone)]
pub struct IdempotencyConfig {
    /// How long a key (claimed or completed) is remembered.
    pub key_ttl: Duration,
    /// Largest request body read; larger → 413.
    pub max_body_bytes: usize,
    /// Largest response body stored. A larger one is still sent whole to the client that ran the
    /// request, and the key is completed with its status and the allow-listed headers but without
    /// the body: a replay is a problem+json with that status saying the body was not kept
    /// (`replay::body_not_kept`). The handler never runs twice for a completed key. Keep it at
    /// most the store's `max_value_bytes`.
    pub max_response_bytes: usize,
    /// How bodies enter the fingerprint.
    pub fingerprint: FingerprintMode,
    /// How often a running handler's lease is renewed; `None` never renews it.
    pub heartbeat: Option<Duration>,
    /// The `Retry-After` hint of a 409: a short wait, never more than the lease has left. Handlers
    /// take milliseconds; telling a client to wait out a 30 s lease would be needlessly slow.
    pub retry_after: Duration,
    /// Most live keys per scope: a request with a new key beyond it is a 429. `None`: no
    /// limit.
    pub max_live_keys: Option<u64>,
    /// Response headers stored and replayed (an allow-list; names compare case-insensitively).
    /// Default: `Content-Type`, `Location`, `ETag`. `Set-Cookie` is never stored unless listed
    /// here: it may carry a session meant for the first caller only.
    pub stored_headers: Vec<HeaderName>,
    /// Statuses that release the key instead of completing it. Default: every 5xx.
    pub release_statuses: ReleaseStatuses,
    /// With `false`, a request without an `Idempotency-Key` header goes to the inner service
    /// untouched (no scope needed, nothing claimed or stored); a malformed key is still a 400.
    /// Default `true`: no key → 400.
    pub key_required: bool,
    /// What happens when the inner service ran but its response could not be recorded (the store
    /// failed, or refused the value). Default [`UnrecordedResponse::Retry`]: the client is told to
    /// retry and a retry runs the inner service again, which is safe only when its effects are
    /// deduplicated downstream; [`UnrecordedResponse::SendAndHold`] sends the response and holds
    /// the key until its lease runs out.
    pub unrecorded_response: UnrecordedResponse,
}

impl IdempotencyConfig {
    /// Defaults for a store with this lease: 64 KiB bodies, 4 MiB responses, canonical JSON
    /// fingerprints, the lease renewed every third of its length.
    pub fn new(key_ttl: Duration, lease: Duration) -> Self {
        Self {
            key_ttl,
            max_body_bytes: 64 * 1024,
            max_response_bytes: 4 << 20,
            fingerprint: FingerprintMode::CanonicalJson,
            heartbeat: Some((lease / 3).max(Duration::from_millis(1))),
            retry_after: Duration::from_secs(1),
            max_live_keys: None,
            stored_headers: STORED_HEADERS.to_vec(),
            release_statuses: ReleaseStatuses::default(),
            key_required: true,
            unrecorded_response: UnrecordedResponse::default(),
        }
    }
}
