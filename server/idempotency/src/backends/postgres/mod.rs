//! The PostgreSQL backend: one database shared by any number of server instances.
//!
//! [`PostgresBackend::connect`] opens a bounded pool ([`PgConfig`]), creates or migrates the schema
//! (`schema`), and starts two background tasks: the cleanup of expired rows (`cleanup`) and,
//! while the database is unreachable, a probe that lets [`IdempotencyStore::health`](crate::IdempotencyStore::health) recover by
//! itself.
//!
//! Claims, completions, releases and write-once inserts are **batched** (`lanes`, `batch`):
//! a call queues on one of a few lanes chosen by a hash of its key, and each lane sends
//! everything queued while its previous statement was in flight as one statement of arrays
//! (`INSERT … SELECT … FROM unnest(…)`, `UPDATE … FROM unnest(…)`), in its own implicit
//! transaction. No timer: alone, a call is a batch of one and waits for nothing; under load, many
//! requests share one statement and one commit, the way the embedded engine makes them share one
//! fdatasync. Every call still gets exactly the answer it would get alone (acquired, replay, 409,
//! 422, 429, lease lost), and no row is locked across a round trip. The other calls (get, record,
//! extend, write_records, counter) are one statement each on a pooled connection. Claims and
//! inserts commit without waiting for their WAL flush; completions and releases wait, and WAL is
//! flushed in order, so a request's answer is sent only once all it wrote is durable (the
//! argument, and what a crash between them can expose, is next to the SQL in `sql`).
//! Serialization failures, deadlocks and rows that change under a statement are retried a bounded
//! number of times with jittered backoff; connection failures become [`StoreError::Unavailable`](crate::StoreError::Unavailable)
//! and mark the store unhealthy until a probe or a call succeeds; other database errors are
//! [`StoreError::Internal`](crate::StoreError::Internal) (in a batch, only for the call that caused them: `batch`). All
//! times are the database's `now()`. Statements are sent as cached named statements, or unnamed
//! through a pooler in transaction mode (`statement`).
//!
//! Files: `connect` (pool and start-up), `store` (the calls), `lanes` (queues and batch
//! forming), `batch` (running a batch: rounds, retries, splitting; one file per batched
//! statement), `batch_sizes` (calls per statement, for `/metrics`), `codec` (rows and input
//! checks), `error` (classification and the retry loop), `health` (the readiness probe), `state` (up/down),
//! `cleanup`, `schema` (migrations), `sql` (the statements), `statement` (how they are
//! sent), `config`, `url` (redaction), `tls` (libpq's `sslmode`/`sslrootcert` and the rustls
//! connector), `ssl_params` (taking those two out of the connection string, which tokio-postgres
//! would reject).

mod batch;
mod batch_sizes;
mod cleanup;
mod codec;
mod config;
mod connect;
mod error;
mod health;
mod lanes;
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
