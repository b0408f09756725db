//! The PostgreSQL backend: one database shared by any number of server instances.
//!
//! [`PostgresBackend::connect`] opens a bounded pool ([`PgConfig`]), creates or migrates the schema
//! ([`schema`]), and starts two background tasks: the cleanup of expired rows ([`cleanup`]) and,
//! while the database is unreachable, a probe that lets [`IdempotencyStore::health`] recover by
//! itself.
//!
//! Every call is one statement in its own implicit transaction (see [`sql`]): claim, complete,
//! release, extend, insert_once and write_records each take one round trip when nothing races, so
//! no row is ever locked across a round trip, and return `Ok` only after the server has
//! committed. (A complete or write_records that also removes records adds a `DELETE` and runs both
//! in one explicit transaction: CockroachDB refuses two modifications of one table in one
//! statement.) `claim` and `insert_once` commit without waiting for their WAL flush; `complete` and
//! `release` wait, and WAL is flushed in order, so a request's answer is sent only once all it
//! wrote is durable (the argument, and what a crash between them can expose, is next to the SQL in
//! [`sql`]). Serialization failures and deadlocks (SQLSTATE 40001, 40P01) are retried a bounded
//! number of times with jittered backoff; connection failures become [`StoreError::Unavailable`]
//! and mark the store unhealthy until a probe or a call succeeds; other database errors are
//! [`StoreError::Internal`]. All times are the database's `now()`. Statements are sent as cached
//! named statements, or unnamed through a pooler in transaction mode ([`statement`]).
//!
//! Files: [`connect`] (pool and start-up), [`store`] (the calls), [`codec`] (rows and input
//! checks), [`error`] (classification and the retry loop), [`health`] (the readiness probe), [`state`] (up/down),
//! [`cleanup`], [`schema`] (migrations), [`sql`] (the statements), [`statement`] (how they are
//! sent), [`config`], [`url`] (redaction), [`tls`] (libpq's `sslmode`/`sslrootcert` and the rustls
//! connector), [`ssl_params`] (taking those two out of the connection string, which tokio-postgres
//! would reject).

mod cleanup;
mod codec;
mod config;
mod connect;
mod error;
mod health;
mod latency;
mod schema;
mod sql;
mod ssl_params;
mod state;
mod statement;
mod store;
mod tls;
mod url;

pub use cleanup::CleanupReport;
pub use config::{CertProblem, PgConfig, PgError};
pub use connect::STARTUP_DEADLINE;
pub use schema::SCHEMA_VERSION;
pub use statement::Pooling;
pub use store::PostgresBackend;
pub use url::redacted_url;
