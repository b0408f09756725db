//! Implementations of [`crate::idempotency::IdempotencyStore`]: the embedded engine (the default,
//! one process) and PostgreSQL (shared by any number of server instances).

pub mod embedded;
pub mod postgres;
