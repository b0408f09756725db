//! A reusable `Idempotency-Key` layer for axum/tower services, and the stores it runs on.
//!
//! Any route can opt in with [`IdempotencyLayer`]; routes without it pay nothing. What a route
//! gets:
//! - the key is parsed from `Idempotency-Key` ([`key`]): 400 before anything runs if it is missing or
//!   malformed;
//! - the scope comes only from the request's [`Scope`] extension, which the caller's authentication
//!   layer puts there; no scope → 401;
//! - the request is fingerprinted ([`fingerprint`]); the same key with another fingerprint → 422;
//! - the same key while the first request runs → 409 with `Retry-After`;
//! - a completed key → the stored response replayed ([`replay`]);
//! - 2xx/4xx are stored, a 5xx or a panic releases the key (the releasing statuses and the stored
//!   headers are settings of [`IdempotencyConfig`]); a client disconnect cannot stop the handler
//!   or the completion halfway: what is left moves to a task of its own ([`layer`]);
//! - a handler that knows more than its status says so with a [`ClaimDirective`] response
//!   extension: `Release` (it certainly had no effect) or `EffectUnknown` (the key stays in
//!   progress until its lease runs out, as a reverse proxy needs after an upstream timeout);
//! - a response larger than `max_response_bytes` is still sent whole; the key is completed without
//!   its body, and a replay says so ([`replay::body_not_kept`]);
//! - a response the store cannot record after the handler ran (the store is down, or refuses the
//!   value) is a 503 asking for a retry by default; an inner service whose effects nothing
//!   downstream deduplicates (a reverse proxy's upstream) sets [`UnrecordedResponse::SendAndHold`]
//!   instead: its client gets its own response and the key stays in progress until its lease runs
//!   out.
//!
//! Handlers hand business records to the layer as a [`SideRecords`] response extension: the layer
//! takes them off the response and writes them in the same atomic store call as the completion, so
//! the business record exists exactly when the key is completed.
//!
//! # Putting the layer on a route
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use axum::{Router, routing::post, middleware::{self, Next}, extract::Request, response::Response};
//! use idemlog_idempotency::backends::embedded::EmbeddedBackend;
//! use idemlog_idempotency::{IdempotencyConfig, IdempotencyLayer, Scope, StoreHandle};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! // The store: the embedded engine in a directory (or `backends::postgres`, feature `postgres`).
//! let store: StoreHandle = Arc::new(EmbeddedBackend::open("./orders-data", idemlog::Options::default())?);
//! // Keys live 24 h; a claim holds its key for 30 s unless the handler is still running.
//! let layer = IdempotencyLayer::new(store, IdempotencyConfig::new(Duration::from_secs(86_400), Duration::from_secs(30)));
//!
//! // Your authentication decides the scope: keys of different scopes never meet.
//! async fn authenticate(mut request: Request, next: Next) -> Response {
//!     request.extensions_mut().insert(Scope::new("tenant-1"));
//!     next.run(request).await
//! }
//!
//! let app: Router = Router::new()
//!     .route("/orders", post(|| async { "created" }).route_layer(layer))
//!     .layer(middleware::from_fn(authenticate));
//! # let _ = app; Ok(()) }
//! ```
//!
//! A complete program is `examples/orders.rs` (run by this crate's tests).
//!
//! # Implementing the store for another database
//!
//! Implement [`IdempotencyStore`]; its module docs ([`store`]) list what every implementation must
//! guarantee (an atomic claim per `(scope, key)`, fencing tokens, a completion that stores the
//! response and the business records in one step, durability before `Ok`). The conformance suite
//! (feature `testkit`: `testkit::conformance::run`) runs the scenarios the built-in stores pass
//! against yours, in one call. `backends::postgres` (feature `postgres`) is a worked example of a
//! SQL implementation.
//!
//! # Cargo features
//!
//! None is on by default; each ties an application to a third-party crate:
//! - `postgres`: `backends::postgres`, the store in PostgreSQL, shared by any number of instances;
//! - `openapi`: utoipa's `ToSchema` for the bodies the layer writes (`problem::ProblemDetails`,
//!   `status::KeyStatus`);
//! - `metrics`: `metrics::Snapshot` adds the layer's outcome counters and the store's own numbers
//!   to a `prometheus-client` registry under names this crate owns (`idempotency_requests_total`,
//!   `idemlog_*`); the caller keeps its own metrics;
//! - `testkit`: the backend conformance suite and the fuzz entry points (not a stable API).

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backends;
pub mod digest;
mod directive;
pub mod fingerprint;
pub mod key;
pub mod layer;
#[cfg(feature = "metrics")]
pub mod metrics;
mod outcome;
pub mod problem;
pub mod replay;
pub mod request_id;
mod scope;
mod side_records;
pub mod status;
pub mod store;
#[cfg(feature = "testkit")]
pub mod testkit;

pub use directive::ClaimDirective;
pub use fingerprint::FingerprintMode;
pub use key::{IdempotencyKey, KeyError};
pub use layer::{
    IdempotencyConfig, IdempotencyLayer, Idempotent, InFlight, KEY_FIELD, ReleaseStatuses,
    SCOPE_FIELD, UnrecordedResponse,
};
pub use outcome::{Outcome, OutcomeCounts};
pub use problem::Problem;
pub use scope::{ClaimInfo, Scope};
pub use side_records::{SideRecords, persist_side_records};
pub use store::{
    Claim, ClaimExtras, Expiry, Gauge, Health, HeldClaim, HistogramMetric, IdempotencyStore,
    InsertOnce, KeyRecord, KeyState, RecordWrite, StoreError, StoreHandle,
};
