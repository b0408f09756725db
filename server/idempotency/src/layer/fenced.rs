//! Giving up a claim the handler's result will not complete.
//!
//! Two ways a claim ends without our response being stored: the layer releases it (a 5xx, a panic,
//! a response that cannot be stored), so a retry runs the handler again; or the store refuses the
//! completion because the claim was taken over while the handler ran (`LeaseLost`). Then the client
//! gets the winner's stored response (waiting up to [`FENCED_WAIT`] for it) or a 409, never its own
//! unrecorded one: only the fenced winner's result is the key's result.

use std::time::Duration;

use axum::http::HeaderName;
use axum::response::{IntoResponse, Response};
use tokio::time::Instant;
use tracing::{error, info, warn};

use crate::layer::responses::in_progress;
use crate::outcome::{Outcome, OutcomeCounts};
use crate::problem::Problem;
use crate::replay;
use crate::store::{Fingerprint, HeldClaim, IdempotencyStore, KeyState, StoreError};

/// How long an overtaken holder waits for the winner's response before answering 409.
const FENCED_WAIT: Duration = Duration::from_secs(2);
/// How often it looks.
const FENCED_POLL: Duration = Duration::from_millis(20);

/// Our claim was taken over while the handler ran: answer with the winner's result, never ours.
/// The winner usually finishes soon (a downstream system that dedups on a key derived from ours
/// answers it at once), so wait a little for its stored response; 409 if it does not come.
pub(crate) async fn fenced(
    store: &dyn IdempotencyStore,
    counts: &OutcomeCounts,
    token: &HeldClaim,
    fp: Fingerprint,
    stored_headers: &[HeaderName],
) -> Response {
    counts.record(Outcome::Fenced);
    let fence = token.fence;
    let deadline = Instant::now() + FENCED_WAIT;
    loop {
        match store.get(&token.scope, &token.key).await {
            Ok(Some(record)) if record.fingerprint == fp => match record.state {
                KeyState::Completed(stored) => {
                    warn!(
                        fence,
                        winner = record.fence,
                        "claim was taken over while the handler ran: answering with the winner's stored response"
                    );
                    return replay::replay_with(stored, stored_headers);
                }
                KeyState::InProgress { .. } if Instant::now() < deadline => {
                    tokio::time::sleep(FENCED_POLL).await;
                }
                KeyState::InProgress { .. } => {
                    warn!(
                        fence,
                        winner = record.fence,
                        "claim was taken over while the handler ran and the new holder is still running: 409"
                    );
                    return in_progress(1);
                }
            },
            Ok(_) => {
                warn!(
                    fence,
                    "claim was taken over while the handler ran and no matching record remains: 409"
                );
                return in_progress(1);
            }
            Err(e) => {
                error!(error = %e, "idempotency store failed after a takeover: 503");
                return Problem::store_unavailable(
                    "the idempotency store could not be read; retry with the same Idempotency-Key",
                )
                .into_response();
            }
        }
    }
}

/// Gives the key up so a retry can run; failures only delay that until the lease runs out.
pub(crate) async fn release(store: &dyn IdempotencyStore, token: HeldClaim) {
    let fence = token.fence;
    match store.release(&token).await {
        Ok(()) => info!(fence, "key released: a retry will run the handler again"),
        Err(StoreError::LeaseLost { .. }) => {
            warn!(
                fence,
                "release refused: the claim had already been taken over"
            );
        }
        Err(e) => error!(
            fence,
            error = %e,
            "release failed: the key frees itself when its lease runs out"
        ),
    }
}
