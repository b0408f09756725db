//! `GET /idempotency-keys/{key}`: what became of a key, without re-sending its request.
//!
//! `{key}` is the key as the `Idempotency-Key` header sends it, percent-encoded, and is parsed by the
//! same function ([`crate::key::parse`]): `abc` and `"abc"` (`%22abc%22`) name the same key, and a
//! segment the header would refuse is the same 400. One rule; the OpenAPI document declares it for
//! the segment without `%` ([`crate::key::PATH_PATTERN`]), because clients disagree on whether a
//! `%` in a value needs encoding; a key holding one is still found when sent as `%25`. The scope
//! is the authenticated caller's, as for the request that claimed it. A key the scope never used,
//! one that expired and one of another scope are the same 404. Reading never claims, extends,
//! releases or changes anything: it is one [`IdempotencyStore::get`](crate::IdempotencyStore::get).

use std::time::{Duration, UNIX_EPOCH};

use axum::Json;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::http::header::LOCATION;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
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

/// State of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum KeyStateName {
    /// A request with this key is running.
    InProgress,
    /// The key's response is stored and replayed to retries.
    Completed,
}

/// The body of a `200` from `GET /idempotency-keys/{key}`: the state of one of the caller's keys.
/// Members are declared in alphabetical order, so the JSON is written in that order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct KeyStatus {
    /// When the key was first claimed (RFC 3339, UTC, milliseconds).
    #[cfg_attr(feature = "openapi", schema(format = DateTime, example = "2025-01-01T12:00:00.123Z"))]
    pub created_at: String,
    /// When the key expires and may be reused (RFC 3339, UTC, milliseconds).
    #[cfg_attr(feature = "openapi", schema(format = DateTime, example = "2025-01-02T12:00:00.123Z"))]
    pub expires_at: String,
    /// The key (the stored form: without structured-field quotes).
    #[cfg_attr(feature = "openapi", schema(example = "order-42"))]
    pub key: String,
    /// Completed with a `Location`: where the created resource is.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub location: Option<String>,
    /// Completed: the status of the stored response.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(nullable = false, minimum = 100, maximum = 599)
    )]
    pub response_status: Option<u16>,
    /// In progress: whole seconds (at least 1) before a retry may succeed, the 409's hint.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false, minimum = 1))]
    pub retry_after: Option<u64>,
    /// In progress or completed.
    pub state: KeyStateName,
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
    let key = match key::parse(raw.as_bytes()) {
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
    let mut body = KeyStatus {
        created_at: rfc3339(record.created_at_ms),
        expires_at: rfc3339(record.expires_at_ms),
        key: key.as_str().to_owned(),
        location: None,
        response_status: None,
        retry_after: None,
        state: KeyStateName::InProgress,
    };
    match &record.state {
        KeyState::InProgress { lease_left } => {
            body.retry_after = Some(retry_after_hint(state.retry_after, *lease_left));
        }
        KeyState::Completed(stored) => {
            body.state = KeyStateName::Completed;
            body.response_status = Some(stored.status);
            body.location = stored
                .headers
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case(LOCATION.as_str()))
                .and_then(|(_, value)| std::str::from_utf8(value).ok())
                .map(str::to_owned);
        }
    }
    info!(
        scope = scope.as_str(),
        key = key.as_str(),
        state = ?body.state,
        "key status read"
    );
    Json(body).into_response()
}

/// The last millisecond humantime writes (the end of year 9999); a later instant is shown as it.
const LATEST_MS: u64 = 253_402_300_800_000 - 1;

/// Milliseconds since the Unix epoch as RFC 3339 in UTC, to the millisecond
/// (`2023-11-14T22:13:20.000Z`), by humantime. Instants past year 9999 (which humantime refuses to
/// write) are shown as its last millisecond.
pub fn rfc3339(ms: u64) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(ms.min(LATEST_MS));
    humantime::format_rfc3339_millis(at).to_string()
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

    #[test]
    fn rfc3339_past_year_9999_is_its_last_millisecond_not_a_panic() {
        assert_eq!(rfc3339(LATEST_MS), "9999-12-31T23:59:59.999Z");
        assert_eq!(rfc3339(u64::MAX), "9999-12-31T23:59:59.999Z");
    }
}
