//! How a failed database call is classified, described and retried.
//!
//! One attempt of a call fails with a [`Fail`]; [`classify`] sorts database errors into retry,
//! down, busy and internal; [`retries`] says which failed attempts run again (up to
//! [`MAX_ATTEMPTS`], [`jitter`] apart); [`settle`] maps the final outcome to a [`StoreError`] and
//! marks the database down on connection failures (up on any answer).

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use deadpool_postgres::{PoolError, TimeoutType};
use tokio_postgres::error::SqlState;
use tracing::warn;

use super::state::DbState;
use crate::store::StoreError;

/// Attempts of one call when the database reports a serialization failure or deadlock, or a claim
/// finds the key changing under it.
pub(super) const MAX_ATTEMPTS: u32 = 8;

/// Why one attempt of a call failed.
pub(super) enum Fail {
    Pool(PoolError),
    Db(tokio_postgres::Error),
    /// The attempt outlived its client-side bound.
    TimedOut,
    /// The row changed between the statement's snapshot and its write: run the statement again.
    Stale,
    /// A final answer that is not a database failure (lease lost).
    Store(StoreError),
}

impl From<tokio_postgres::Error> for Fail {
    fn from(e: tokio_postgres::Error) -> Self {
        Fail::Db(e)
    }
}

/// How a database error is handled.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Class {
    /// Serialization failure or deadlock: run the call again.
    Retry,
    /// The database cannot be reached: 503 and unhealthy until it answers again.
    Down,
    /// The database answered but cannot serve this call now (timeout, lock, resources): 503.
    Busy,
    /// A fault that retrying will not fix.
    Internal,
}

pub(super) fn classify(e: &tokio_postgres::Error) -> Class {
    if let Some(code) = e.code() {
        if *code == SqlState::T_R_SERIALIZATION_FAILURE || *code == SqlState::T_R_DEADLOCK_DETECTED
        {
            return Class::Retry;
        }
        let c = code.code();
        return if c.starts_with("08") || c.starts_with("57P") || c.starts_with("28") {
            // Connection exceptions, admin/crash shutdown, cannot connect now, authentication.
            Class::Down
        } else if c == "57014" || c == "55P03" || c.starts_with("53") || c == "40003" {
            // Statement timeout, lock not available, insufficient resources, completion unknown.
            Class::Busy
        } else {
            Class::Internal
        };
    }
    let text = e.to_string();
    let internal = [
        "error serializing",
        "error deserializing",
        "invalid column",
        "query returned",
        "expected ",
        "invalid configuration",
        "invalid connection string",
    ];
    if internal.iter().any(|p| text.starts_with(p)) {
        Class::Internal
    } else {
        Class::Down
    }
}

/// A database error in one line: the server's code and message, or the driver's error and cause.
pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{} {}: {}", db.severity(), db.code().code(), db.message());
    }
    match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}

/// `base` doubled per attempt (capped at 64×), times a random factor in [0.5, 1.5).
pub(crate) fn jitter(base: Duration, attempt: u32) -> Duration {
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let factor = 0.5 + (random % 1000) as f64 / 1000.0;
    base.mul_f64(f64::from(1u32 << attempt.min(6)) * factor)
}

/// Whether a failed attempt runs again: serialization failures, deadlocks and stale reads.
pub(super) fn retries<T>(result: &Result<T, Fail>) -> bool {
    match result {
        Err(Fail::Stale) => true,
        Err(Fail::Db(e)) => classify(e) == Class::Retry,
        _ => false,
    }
}

/// The store's answer for the last attempt of call `what`, with `state` marked up or down by what
/// the attempt learnt about the database. `scrub` removes the password from error text; `pool_wait`
/// is named in the error of a call that found no free connection.
pub(super) fn settle<T>(
    what: &'static str,
    result: Result<T, Fail>,
    state: &DbState,
    pool_wait: Duration,
    scrub: impl Fn(String) -> String,
) -> Result<T, StoreError> {
    let fail = match result {
        Ok(v) => {
            state.mark_up();
            return Ok(v);
        }
        Err(f) => f,
    };
    let error = match fail {
        Fail::Store(e) => {
            state.mark_up();
            return Err(e);
        }
        Fail::Stale => StoreError::Unavailable(format!(
            "{what}: the key kept changing under concurrent calls ({MAX_ATTEMPTS} attempts)"
        )),
        Fail::TimedOut => {
            let reason = format!("{what}: no answer from the database in time");
            state.mark_down(&reason);
            StoreError::Unavailable(reason)
        }
        Fail::Pool(PoolError::Timeout(TimeoutType::Wait)) => StoreError::Unavailable(format!(
            "{what}: no database connection free within {} ms",
            pool_wait.as_millis()
        )),
        Fail::Pool(PoolError::Timeout(_)) => {
            let reason = format!("{what}: connecting to the database timed out");
            state.mark_down(&reason);
            StoreError::Unavailable(reason)
        }
        Fail::Pool(PoolError::Closed) => {
            StoreError::Unavailable(format!("{what}: the store is closed"))
        }
        Fail::Pool(PoolError::Backend(e)) | Fail::Db(e) => {
            let detail = scrub(format!("{what}: {}", describe(&e)));
            match classify(&e) {
                Class::Down => {
                    state.mark_down(&detail);
                    StoreError::Unavailable(detail)
                }
                Class::Busy | Class::Retry => {
                    state.mark_up();
                    StoreError::Unavailable(detail)
                }
                Class::Internal => {
                    state.mark_up();
                    StoreError::Internal(detail)
                }
            }
        }
        Fail::Pool(other) => StoreError::Unavailable(format!("{what}: {other}")),
    };
    warn!(error = %error, "PostgreSQL store call failed");
    Err(error)
}
