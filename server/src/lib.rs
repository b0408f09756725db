//! idemlog-server: a payments API behind the reusable `Idempotency-Key` layer of
//! [`idemlog_idempotency`], on the idemlog engine or PostgreSQL.
//!
//! The library holds everything but process set-up, so that tests drive the same router the binary
//! serves ([`router::router`]).
//!
//! - [`config`]: flags and `IDEMLOG_*` variables;
//! - [`auth`]: Bearer API key → account → idempotency scope;
//! - [`payments`]: the handlers and the fake provider;
//! - [`routes`]: every route, the one list the router, metrics and OpenAPI agree on;
//! - [`router`]: the router and the services it shares;
//! - [`metrics`]: `GET /metrics`; [`telemetry`]: request spans; [`openapi`]: `GET /openapi.json`;
//! - [`serve`]: HTTP/1.1 serving with header, body and idle timeouts, a connection cap and a bounded
//!   graceful shutdown.

pub mod auth;
pub mod config;
pub mod log_buffer;
pub mod log_line;
pub mod metrics;
pub mod openapi;
pub mod payments;
pub mod router;
pub mod routes;
pub mod serve;
pub mod telemetry;
