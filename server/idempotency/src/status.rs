//! `GET /idempotency-keys/{key}`: what became of a key, without re-sending its request.
//!
//! `{key}` is the stored key, percent-encoded: for a structured-field string (`"abc"`) the content
//! between the quotes (unescaped), for a bare key the key itself ([`crate::key`] maps both header
//! forms to that one stored key). The scope is the authenticated caller's, as for the request that
//! claimed it. A key the scope never used, one that expired and one of another scope are the
//! same 404. Reading never claims, extends, releases or changes anything: it is one
//! [`IdempotencyStore::get`](crate::IdempotencyStore::get).

use std::time::Duration;

use axum::Json;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::http::header::LOCATION;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};
use tracing::{error, info};

use crate::layer::retry_after_hint;
use crate::problem::Problem;
use crate::{KeyState, Scope, StoreHandle, key};

/// What the status route needs.
#[derive(Clone)]
pub struct KeyStatusState {
    /// The store (any backend).
    pub store: StoreHandle,
    /// The `Retry-After` hint of a 409, which `retry_after` of an in-progress key repeats.
    pub retry_after: Duration,
}

/// The handler of a key-status route such as `GET /idempotency-keys/{key}`, behind the caller's
/// authentication (which puts the [`Scope`] in the request).
pub async fn key_status(
    State(state): State<KeyStatusState>,
    scope: Option<Extension<Scope>>,
    Path(raw): Path<String>,
) -> Response {
    let Some(Extension(scope)) = scope else {
        return Problem::unauthorized("this route needs an authenticated caller").into_response();
    };
    let key = match key::validate(raw.into_bytes()) {
        Ok(key) => key,
        Err(e) => return e.to_problem().into_response(),
    };
    let record = match state.store.get(scope.as_str(), key.as_str()).await {
        Ok(Some(record)) => record,
        Ok(None) => {
            return Problem::from_status(
                StatusCode::NOT_FOUND,
                "this caller holds no live record of that Idempotency-Key",
            )
            .into_response();
        }
        Err(e) => {
            error!(class = e.class(), error = %e, "key status: the store failed");
            return Problem::store_unavailable("the idempotency store could not be read; retry")
                .into_response();
        }
    };
    let mut body = Map::new();
    body.insert("key".into(), key.as_str().into());
    match &record.state {
        KeyState::InProgress { lease_left } => {
            body.insert("state".into(), "in_progress".into());
            body.insert(
                "retry_after".into(),
                retry_after_hint(state.retry_after, *lease_left).into(),
            );
        }
        KeyState::Completed(stored) => {
            body.insert("state".into(), "completed".into());
            body.insert("response_status".into(), stored.status.into());
            let location = stored
                .headers
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case(LOCATION.as_str()))
                .and_then(|(_, value)| std::str::from_utf8(value).ok());
            if let Some(location) = location {
                body.insert("location".into(), location.into());
            }
        }
    }
    body.insert("created_at".into(), rfc3339(record.created_at_ms).into());
    body.insert("expires_at".into(), rfc3339(record.expires_at_ms).into());
    info!(
        scope = scope.as_str(),
        key = key.as_str(),
        state = body["state"].as_str(),
        "key status read"
    );
    Json(Value::Object(body)).into_response()
}

/// Milliseconds since the Unix epoch as RFC 3339 in UTC, to the millisecond
/// (`2023-11-14T22:13:20.000Z`).
pub fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_of_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(4_107_542_399_999), "2100-02-28T23:59:59.999Z");
    }
}
