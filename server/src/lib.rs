//! idemlog-server: a payments API behind a reusable `Idempotency-Key` layer on the idemlog engine.
//!
//! The library holds everything but process set-up, so that tests drive the same router the binary
//! serves ([`app::app`]) and other axum/tower services can reuse the layer ([`idempotency`]).
//!
//! - [`config`]: flags and `IDEMLOG_*` variables;
//! - [`auth`]: Bearer API key → account → idempotency scope;
//! - [`idempotency`]: the layer (key, fingerprint, claim/complete/release, replay) and the store
//!   interface it owns ([`idempotency::IdempotencyStore`]);
//! - [`backends`]: the embedded and PostgreSQL implementations of that interface;
//! - [`payments`]: the handlers and the fake provider;
//! - [`metrics`]: Prometheus text; [`problem`]: RFC 9457 errors; [`app`]: the router;
//! - [`store_calls`]: whether engine calls run inline or on the blocking pool;
//! - [`serve`]: HTTP/1.1 serving with header, body and idle timeouts, a connection cap and a bounded
//!   graceful shutdown.

#![warn(missing_docs)]

pub mod app;
pub mod auth;
pub mod backends;
pub mod config;
#[doc(hidden)]
pub mod fuzzing;
pub mod idempotency;
pub mod metrics;
pub mod openapi;
pub mod payments;
pub mod problem;
pub mod request_id;
pub mod serve;
pub mod store_calls;

pub use app::{App, AppConfig, app};
