//! What the layer does when the inner service ran but its response could not be recorded.
//!
//! By the time the layer completes a claim, the inner service has run: whatever it does outside
//! the process (a charge, a call to an upstream) has happened. If the store then cannot record the
//! response (a full disk, a poisoned embedded store, PostgreSQL down: [`StoreError::Unavailable`]
//! or [`StoreError::Internal`]; or it refuses the value, [`StoreError::Rejected`], e.g. a body over
//! the store's largest value), the layer must choose between telling the client to retry and
//! telling it what happened. Which is safe depends on where the inner service's effects are
//! deduplicated, so it is a setting ([`IdempotencyConfig::unrecorded_response`]).
//!
//! A response body that fails while it is read (the stream ends in an error) is the same case: the
//! service ran, and nothing can be recorded.
//!
//! [`IdempotencyConfig::unrecorded_response`]: crate::IdempotencyConfig::unrecorded_response

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tracing::error;

use crate::outcome::{Outcome, OutcomeCounts};
use crate::problem::Problem;
use crate::store::StoreError;

/// What the layer does when the inner service ran but its response could not be recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnrecordedResponse {
    /// Let a retry run the inner service again (the default). A store failure is a 503
    /// problem+json asking the client to retry with the same key (outcome `store_error`); the key
    /// stays in progress, so that retry runs the inner service again once its lease runs out (or
    /// at once if the embedded store treats claims it recovers on reopening as abandoned, its
    /// default). A value the store refuses, or a body that fails while it is read, releases the key
    /// and answers 500 (outcome `released`): a retry runs it again at once.
    ///
    /// Safe only when the inner service's effects are deduplicated downstream, so that running it
    /// twice for one key acts once: a payment provider that dedups on a key derived from ours (the
    /// payments server), or a handler whose only effect is the business records it hands the layer
    /// ([`SideRecords`](crate::SideRecords)), which the failed completion did not write either.
    #[default]
    Retry,
    /// Send the inner service's own response and hold the key: its response is the truth (the
    /// effect happened), so its client gets it, status and body, unrecorded. The key is neither
    /// completed nor released, as after [`ClaimDirective::EffectUnknown`]: it stays in progress,
    /// unrenewed, until its lease runs out, so retries get 409 (or 503 while the store is out of
    /// service) and do not run the inner service again meanwhile. The failure is logged at ERROR
    /// with the store's error, and counted as outcome `unrecorded`.
    ///
    /// A value the store refuses is usually one too large for it: the key is first completed
    /// without the body, as for a response over `max_response_bytes` (a replay is the
    /// `response-body-not-kept` problem with the original status), so the inner service never runs
    /// again for it; only if that is refused too is the response sent unrecorded. A body that fails
    /// while it is read cannot be sent: its client gets a 500 problem+json, and the key is held
    /// all the same.
    ///
    /// The risk that remains: once the lease runs out, a retry takes the key over and runs the
    /// inner service a second time. A client that got the response does not retry, so this matters
    /// for one whose response was lost on the way; keep the lease longer than such a retry takes
    /// to come, and let the service behind refuse a lower fencing token if it must never happen.
    /// With the embedded store, the hold survives the store's self-healing reopen only if it was
    /// opened with `RecoveredClaims::HeldUntilLeaseEnd` (with the default, `Abandoned`, the
    /// reopened store lets the first retry take the key over at once); PostgreSQL keeps the lease
    /// in the database.
    ///
    /// For inner services whose effects nothing downstream deduplicates: a reverse proxy's
    /// upstream, where a retry told to come back would act twice.
    ///
    /// [`ClaimDirective::EffectUnknown`]: crate::ClaimDirective::EffectUnknown
    SendAndHold,
}

/// Counts and logs a response sent unrecorded with its key held ([`UnrecordedResponse::SendAndHold`]),
/// and returns it.
pub(crate) fn send_and_hold(
    counts: &OutcomeCounts,
    fence: u64,
    e: &StoreError,
    response: Response,
) -> Response {
    counts.record(Outcome::Unrecorded);
    error!(
        fence,
        status = response.status().as_u16(),
        class = e.class(),
        error = %e,
        "idempotency store could not record the response after the handler ran: sending it \
         unrecorded; key left in progress until its lease runs out (retries get 409 until then)"
    );
    response
}

/// The answer to a response whose body failed while it was read, under
/// [`UnrecordedResponse::SendAndHold`]: nothing can be sent but a 500, and the key is held.
pub(crate) fn unreadable_and_held(counts: &OutcomeCounts, fence: u64, e: &axum::Error) -> Response {
    counts.record(Outcome::Unrecorded);
    error!(
        fence,
        error = %e,
        "response body could not be read after the handler ran: key left in progress until its \
         lease runs out (retries get 409 until then)"
    );
    Problem::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "response-unreadable",
        "Response could not be read",
        "the request ran but its response could not be read, so it may have taken effect; this \
         Idempotency-Key stays in progress until its lease runs out (a retry with it gets 409 \
         until then, and runs the request again only after)",
    )
    .into_response()
}
