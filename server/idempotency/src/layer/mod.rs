//! The tower layer: claim, run, complete or release, replay.
//!
//! Request path, in order:
//! 1. scope from the [`Scope`](crate::Scope) extension (none → 401), key from the header (bad →
//!    400), body read up to the limit (over → 413): nothing has been claimed yet, nothing runs;
//! 2. fingerprint, then everything that follows runs in a span naming the scope and key (the
//!    enclosing span's `scope` and `key` fields when it declares them, else an `idempotency` span of
//!    its own) and inside `FinishOnDrop`: on the request's task, but moved to a task of
//!    its own if a client disconnects (axum drops the future), so that cannot cancel a claim, a
//!    handler or a completion halfway;
//! 3. claim: replay / 409 / 422 / store failure (503), or acquired;
//! 4. the inner service runs on that task, with a panic caught
//!    (`CatchPanic`); while it runs, the lease is renewed every
//!    `heartbeat`, so only a dead holder loses its key;
//! 5. 5xx or panic → release; otherwise the body is collected and `complete` stores the response and
//!    the handler's [`SideRecords`](crate::SideRecords) in one atomic append;
//! 6. if `complete` is refused because the claim was taken over (`LeaseLost`), the client gets the
//!    winner's stored response (waiting up to 2 s for it), or a 409 — never its own, unrecorded one;
//!    if it fails otherwise (the store is down, or refuses the value), the setting
//!    [`UnrecordedResponse`] decides: a 503 (or a release and 500) that lets a retry run the handler
//!    again, or the handler's own response sent unrecorded with the key held until its lease ends.
//!
//! The store is any [`IdempotencyStore`](crate::IdempotencyStore) (the embedded engine,
//! PostgreSQL): the layer never knows which. Problem bodies sent to clients name the failure class
//! only; the details go to the log.
//!
//! Where each part lives: `config` (the settings), `service` (the layer, its service and the request
//! flow above), `body` (step 1's body read), `responses` (problem responses used by several steps),
//! `renewal` (step 4's lease renewal), `release_statuses` (step 5's choice), `fenced` (step 5's release and step 6's wait for the winner),
//! `unrecorded` (step 6's other failures),
//! and the futures the flow runs in: `finish_on_drop`, `catch_panic`, `in_flight`.

mod body;
pub(crate) mod catch_panic;
mod config;
mod fenced;
mod finish_on_drop;
mod in_flight;
mod release_statuses;
mod renewal;
mod response_body;
mod responses;
mod service;
mod unrecorded;

pub use self::config::IdempotencyConfig;
pub use self::in_flight::InFlight;
pub use self::release_statuses::ReleaseStatuses;
pub use self::response_body::{Collected, collect_bounded};
pub use self::responses::retry_after_hint;
pub use self::service::{IdempotencyLayer, Idempotent, KEY_FIELD, SCOPE_FIELD};
pub use self::unrecorded::UnrecordedResponse;
