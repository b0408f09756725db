//! Implementations of [`crate::IdempotencyStore`]: the embedded engine (the default, one process)
//! and PostgreSQL (feature `postgres`; shared by any number of instances).

pub mod embedded;
#[cfg(feature = "postgres")]
pub mod postgres;
