//! The tower layer: claim, run, complete or release, replay.
//!
//! Request path, in order:
//! 1. scope from the [`Scope`] extension (none → 401), key from the header (bad → 400), body read up
//!    to the limit (over → 413): nothing has been claimed yet, nothing runs;
//! 2. fingerprint, then everything that follows runs inside [`FinishOnDrop`]: on the request's task,
//!    but moved to a task of its own if a client disconnects (axum drops the future), so that cannot
//!    cancel a claim, a handler or a completion halfway;
//! 3. claim: replay / 409 / 422 / store failure (503), or acquired;
//! 4. the inner service runs on that task, with a panic caught ([`CatchPanic`]); while it runs, the
//!    lease is renewed every `heartbeat`, so only a dead holder loses its key;
//! 5. 5xx or panic → release; otherwise the body is collected and `complete` stores the response and
//!    the handler's [`SideRecords`] in one atomic append;
//! 6. if `complete` is refused because the claim was taken over (`LeaseLost`), the client gets the
//!    winner's stored response (waiting up to 2 s for it), or a 409 — never its own, unrecorded one.
//!
//! The store is any [`IdempotencyStore`] (the embedded engine, PostgreSQL): the layer never knows
//! which. Problem bodies sent to clients name the failure class only; the details go to the log.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::OriginalUri;
use axum::extract::Request;
use axum::http::header::CONTENT_LENGTH;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tokio::time::{Instant, Interval, MissedTickBehavior};
use tower::{Layer, Service, ServiceExt};
use tracing::{Instrument, debug, error, info, info_span, warn};

mod catch_panic;
mod finish_on_drop;
mod in_flight;

use self::catch_panic::{self as panics, CatchPanic};
use self::finish_on_drop::FinishOnDrop;
pub use self::in_flight::InFlight;
use crate::digest;
use crate::fingerprint::{self, FingerprintMode};
use crate::key::{self, IdempotencyKey};
use crate::outcome::{Outcome, OutcomeCounts};
use crate::problem::Problem;
use crate::replay;
use crate::side_records::SideRecords;
use crate::store::{
    Claim, ClaimExtras, Fingerprint, HeldClaim, KeyState, StoreError, StoreHandle, Takeover,
};
use crate::{ClaimInfo, Scope};

/// Settings of an [`IdempotencyLayer`].
#[derive(Debug, Clone)]
pub struct IdempotencyConfig {
    /// How long a key (claimed or completed) is remembered.
    pub key_ttl: Duration,
    /// Largest request body read; larger → 413.
    pub max_body_bytes: usize,
    /// Largest response body stored; a larger one is not stored (the key is released and the
    /// client gets a 500) rather than truncated. Keep it at most the store's `max_value_bytes`.
    pub max_response_bytes: usize,
    /// How bodies enter the fingerprint.
    pub fingerprint: FingerprintMode,
    /// How often a running handler's lease is renewed; `None` never renews it.
    pub heartbeat: Option<Duration>,
    /// The `Retry-After` hint of a 409: a short wait, never more than the lease has left. Handlers
    /// take milliseconds; telling a client to wait out a 30 s lease would be needlessly slow.
    pub retry_after: Duration,
    /// Most live keys per scope (account): a request with a new key beyond it is a 429. `None`: no
    /// limit.
    pub max_live_keys: Option<u64>,
}

impl IdempotencyConfig {
    /// Defaults for a store with this lease: 64 KiB bodies, 4 MiB responses, canonical JSON
    /// fingerprints, the lease renewed every third of its length.
    pub fn new(key_ttl: Duration, lease: Duration) -> Self {
        Self {
            key_ttl,
            max_body_bytes: 64 * 1024,
            max_response_bytes: 4 << 20,
            fingerprint: FingerprintMode::CanonicalJson,
            heartbeat: Some((lease / 3).max(Duration::from_millis(1))),
            retry_after: Duration::from_secs(1),
            max_live_keys: None,
        }
    }
}

/// The idempotency layer. Cheap to clone; clones share the store, counters and in-flight count.
#[derive(Clone)]
pub struct IdempotencyLayer {
    shared: Arc<Shared>,
}

struct Shared {
    store: StoreHandle,
    config: IdempotencyConfig,
    counts: Arc<OutcomeCounts>,
    in_flight: InFlight,
}

impl IdempotencyLayer {
    /// A layer keeping its records in `store`.
    pub fn new(store: StoreHandle, config: IdempotencyConfig) -> Self {
        Self {
            shared: Arc::new(Shared {
                store,
                config,
                counts: Arc::default(),
                in_flight: InFlight::default(),
            }),
        }
    }

    /// Requests per outcome.
    pub fn counts(&self) -> Arc<OutcomeCounts> {
        Arc::clone(&self.shared.counts)
    }

    /// The requests still running, including those whose client left (shutdown waits for them).
    pub fn in_flight(&self) -> InFlight {
        self.shared.in_flight.clone()
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotent<S>;

    fn layer(&self, inner: S) -> Idempotent<S> {
        Idempotent {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The service an [`IdempotencyLayer`] wraps around a route.
#[derive(Clone)]
pub struct Idempotent<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> Service<Request> for Idempotent<S>
where
    S: Service<Request, Error = Infallible> + Clone + Send + 'static,
    S::Response: IntoResponse + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The inner service is cloned per request and driven to readiness by `oneshot`.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let inner = self.inner.clone();
        let shared = Arc::clone(&self.shared);
        Box::pin(async move { Ok(handle(shared, inner, request).await) })
    }
}

enum BodyError {
    TooLarge,
    /// The client stopped sending the body (the server's body-read timeout fired).
    TimedOut,
    Unreadable(String),
}

/// True if `error` or anything it wraps is the body-read timeout of `tower_http`.
fn is_body_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(e) = current {
        if e.is::<tower_http::timeout::TimeoutError>() {
            return true;
        }
        current = e.source();
    }
    false
}

async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, BodyError> {
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(BodyError::TooLarge);
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(BodyError::TooLarge),
        Err(e) if is_body_timeout(&*e) => Err(BodyError::TimedOut),
        Err(e) => Err(BodyError::Unreadable(e.to_string())),
    }
}

/// Everything before the claim: checks that need none.
async fn handle<S>(shared: Arc<Shared>, inner: S, request: Request) -> Response
where
    S: Service<Request, Error = Infallible> + Clone + Send + 'static,
    S::Response: IntoResponse + Send + 'static,
    S::Future: Send + 'static,
{
    let counts = &shared.counts;
    let Some(scope) = request.extensions().get::<Scope>().cloned() else {
        counts.record(Outcome::Unauthenticated);
        warn!("request reached the idempotency layer without an authenticated scope");
        return Problem::unauthorized("this route needs an authenticated account").into_response();
    };
    let key = match key::from_headers(request.headers()) {
        Ok(key) => key,
        Err(e) => {
            counts.record(Outcome::RejectedKey);
            info!(scope = scope.as_str(), error = %e, "rejected request: bad Idempotency-Key");
            return e.to_problem().into_response();
        }
    };
    let (mut parts, body) = request.into_parts();
    let limit = shared.config.max_body_bytes;
    let bytes = match read_body(&parts.headers, body, limit).await {
        Ok(bytes) => bytes,
        Err(BodyError::TooLarge) => {
            counts.record(Outcome::BodyTooLarge);
            info!(
                scope = scope.as_str(),
                key = key.as_str(),
                limit,
                "rejected request: body too large"
            );
            return Problem::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body-too-large",
                "Request body too large",
                format!("the request body exceeds {limit} bytes"),
            )
            .into_response();
        }
        Err(BodyError::TimedOut) => {
            counts.record(Outcome::BodyUnreadable);
            info!(
                scope = scope.as_str(),
                key = key.as_str(),
                "request body stalled past the body-read timeout: 408, nothing claimed"
            );
            return Problem::new(
                StatusCode::REQUEST_TIMEOUT,
                "body-timeout",
                "Request body not received in time",
                "the request body stopped arriving; nothing was claimed or charged, so the request \
                 may be retried with the same Idempotency-Key",
            )
            .into_response();
        }
        Err(BodyError::Unreadable(e)) => {
            counts.record(Outcome::BodyUnreadable);
            info!(scope = scope.as_str(), key = key.as_str(), error = %e, "request body could not be read");
            return Problem::new(
                StatusCode::BAD_REQUEST,
                "body-unreadable",
                "Request body could not be read",
                "the request body could not be read; nothing was claimed or charged",
            )
            .into_response();
        }
    };
    if let Some(name) = fingerprint::duplicate_member(&parts.headers, &bytes) {
        counts.record(Outcome::RejectedBody);
        info!(
            scope = scope.as_str(),
            key = key.as_str(),
            member = %name,
            "rejected request: JSON body repeats a member name"
        );
        return Problem::new(
            StatusCode::BAD_REQUEST,
            "duplicate-json-member",
            "JSON body repeats a member name",
            format!(
                "the member {name:?} appears more than once in one object; send each member once \
                 (nothing was claimed: a corrected request may reuse this Idempotency-Key)"
            ),
        )
        .into_response();
    }
    // The full path even when this layer sits inside a `nest`ed router, which strips its prefix.
    let uri = parts
        .extensions
        .get::<OriginalUri>()
        .map_or_else(|| parts.uri.clone(), |original| original.0.clone());
    // The body is parsed and canonicalised once, for both the fingerprint and the digest.
    let json = fingerprint::parse_body(shared.config.fingerprint, &parts.headers, &bytes);
    let (method, path, query) = (&parts.method, uri.path(), uri.query());
    let fp =
        fingerprint::fingerprint_of(method, path, query, &parts.headers, &bytes, json.as_ref());
    let request_digest =
        digest::request_digest_of(method, path, query, &parts.headers, &bytes, json.as_ref());
    parts.extensions.insert(key.clone());
    let request = Request::from_parts(parts, Body::from(bytes));

    let span = info_span!("idempotency", scope = scope.as_str(), key = key.as_str());
    let guard = shared.in_flight.enter();
    let work = FinishOnDrop::new(
        async move {
            let _guard = guard;
            run(shared, inner, scope, key, fp, request_digest, request).await
        }
        .instrument(span),
    );
    match work.await {
        Ok(response) => response,
        Err(panic) => {
            error!(
                panic = panics::message(&panic),
                "idempotency layer panicked"
            );
            Problem::internal("the request could not be processed").into_response()
        }
    }
}

/// Claim and act on the outcome. Runs inside [`FinishOnDrop`].
async fn run<S>(
    shared: Arc<Shared>,
    inner: S,
    scope: Scope,
    key: IdempotencyKey,
    fp: Fingerprint,
    request_digest: Bytes,
    request: Request,
) -> Response
where
    S: Service<Request, Error = Infallible> + Clone + Send + 'static,
    S::Response: IntoResponse + Send + 'static,
    S::Future: Send + 'static,
{
    let counts = &shared.counts;
    let ttl = shared.config.key_ttl;
    let extras = ClaimExtras {
        request_digest: Some(request_digest.clone()),
        max_live_keys: shared.config.max_live_keys,
    };
    let claimed = shared
        .store
        .claim_with(scope.as_str(), key.as_str(), &fp, ttl, &extras)
        .await;
    match claimed {
        Err(e) => store_failure(counts, "claim", &e),
        Ok(Claim::Completed(stored)) => {
            counts.record(Outcome::Replayed);
            info!(
                status = stored.status,
                "key already completed: replaying the stored response"
            );
            replay::replay(stored)
        }
        Ok(Claim::InProgress { lease_left }) => {
            counts.record(Outcome::Conflict);
            let hint = retry_after_hint(shared.config.retry_after, lease_left);
            info!(
                lease_left_ms = lease_left.as_millis() as u64,
                retry_after_s = hint,
                "key held by a request still running: 409"
            );
            in_progress(hint)
        }
        Ok(Claim::Mismatch {
            request_digest: stored,
        }) => {
            counts.record(Outcome::Mismatch);
            let fields = stored.and_then(|s| digest::differing_fields(&s, &request_digest));
            info!(differing_fields = ?fields, "key reused for a different request: 422");
            let problem = Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency-key-reused",
                "Idempotency-Key reused for a different request",
                "this Idempotency-Key was already used with another method, path, query, \
                 content type or body; use a new key for a new request",
            );
            match fields {
                Some(fields) => with_member(&problem, "differing_fields", fields.into()),
                None => problem.into_response(),
            }
        }
        Ok(Claim::QuotaExceeded { retry_after }) => {
            counts.record(Outcome::QuotaExceeded);
            let seconds = retry_after.as_millis().div_ceil(1000).max(1) as u64;
            info!(
                retry_after_s = seconds,
                "account holds its limit of live keys: 429"
            );
            Problem::new(
                StatusCode::TOO_MANY_REQUESTS,
                "idempotency-key-quota-exceeded",
                "Too many live Idempotency-Keys for this account",
                format!(
                    "this account already holds its limit of live idempotency keys; a place frees \
                     up when one expires, in {seconds} s (nothing was claimed or charged; \
                     replays of existing keys still work)"
                ),
            )
            .retry_after(seconds)
            .into_response()
        }
        Ok(Claim::Acquired(token)) => {
            let mut request = request;
            request.extensions_mut().insert(ClaimInfo {
                fence: token.fence,
                expires_at_ms: Some(token.expires_at_ms),
            });
            execute(shared, inner, token, fp, request).await
        }
    }
}

/// The `Retry-After` seconds of a 409: the configured hint, but never more than the lease has
/// left (rounded up to whole seconds, at least 1, as the header counts whole seconds).
pub fn retry_after_hint(hint: Duration, lease_left: Duration) -> u64 {
    let seconds = |d: Duration| d.as_millis().div_ceil(1000).max(1) as u64;
    seconds(hint).min(seconds(lease_left))
}

/// A problem response with one more member in its body (RFC 9457 extension members).
fn with_member(problem: &Problem, name: &str, value: serde_json::Value) -> Response {
    let mut body: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&problem.body()).unwrap_or_default();
    body.insert(name.to_owned(), value);
    let mut response = problem.clone().into_response();
    *response.body_mut() = Body::from(serde_json::to_vec(&body).unwrap_or_default());
    response.headers_mut().remove(CONTENT_LENGTH);
    response
}

/// The 409 for a key whose request is still running.
fn in_progress(seconds: u64) -> Response {
    Problem::new(
        StatusCode::CONFLICT,
        "request-in-progress",
        "A request with this Idempotency-Key is in progress",
        format!("the first request with this key is still running; retry in {seconds} s"),
    )
    .retry_after(seconds)
    .into_response()
}

/// A 503 that names the failure class only; the error itself goes to the log.
fn store_failure(counts: &OutcomeCounts, during: &'static str, e: &StoreError) -> Response {
    counts.record(Outcome::StoreError);
    error!(during, class = e.class(), error = %e, "idempotency store failed: 503");
    Problem::store_unavailable(format!(
        "the idempotency store could not {during} this request; retry with the same Idempotency-Key"
    ))
    .into_response()
}

/// Waits for the first interval tick, or forever when renewal is off.
async fn tick(interval: &mut Option<Interval>) {
    match interval {
        Some(interval) => {
            interval.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// Awaits a handler that did not finish on its first poll, renewing the claim's lease every
/// `heartbeat` meanwhile, so that only a holder that died loses its key.
async fn with_renewal<F: Future + Unpin>(
    shared: &Shared,
    token: &HeldClaim,
    mut handler: F,
) -> F::Output {
    let mut renew = shared.config.heartbeat.map(|period| {
        let mut interval = tokio::time::interval_at(Instant::now() + period, period);
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        interval
    });
    loop {
        let renew_failed = tokio::select! {
            joined = &mut handler => return joined,
            () = tick(&mut renew) => {
                match shared.store.extend(token).await {
                    Ok(lease) => {
                        debug!(lease_ms = lease.as_millis() as u64, "lease renewed");
                        false
                    }
                    Err(e) => {
                        warn!(error = %e, "could not renew the lease: a retry may take the key over");
                        true
                    }
                }
            }
        };
        if renew_failed {
            renew = None;
        }
    }
}

/// Runs the handler under an acquired claim and records its result.
async fn execute<S>(
    shared: Arc<Shared>,
    inner: S,
    token: HeldClaim,
    fp: Fingerprint,
    request: Request,
) -> Response
where
    S: Service<Request, Error = Infallible> + Clone + Send + 'static,
    S::Response: IntoResponse + Send + 'static,
    S::Future: Send + 'static,
{
    let counts = &shared.counts;
    let outcome = match token.takeover {
        Some(Takeover::LeaseExpired) => {
            warn!(
                fence = token.fence,
                "took over a stuck claim whose lease ran out: running the handler again"
            );
            Outcome::TakenOver
        }
        Some(Takeover::Expired) => {
            info!(
                fence = token.fence,
                "key had expired: claimed as a new operation"
            );
            Outcome::Executed
        }
        None => {
            info!(fence = token.fence, "claimed key: running the handler");
            Outcome::Executed
        }
    };

    let mut handler = CatchPanic::new(inner.oneshot(request));
    // A handler that finishes on its first poll needs no lease renewal: arm the timer only for one
    // that has to wait (a per-request timer is a measurable share of the layer's cost).
    let first = std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut handler).poll(cx))).await;
    let joined = match first {
        Poll::Ready(joined) => joined,
        Poll::Pending => with_renewal(&shared, &token, handler).await,
    };

    let response = match joined {
        Ok(Ok(response)) => response.into_response(),
        Ok(Err(never)) => match never {},
        Err(panic) => {
            error!(
                panic = panics::message(&panic),
                "handler panicked: releasing the key"
            );
            release(&shared, token).await;
            counts.record(Outcome::Released);
            return Problem::internal(
                "the handler failed; the request may be retried with the same key",
            )
            .into_response();
        }
    };

    if response.status().is_server_error() {
        info!(
            status = response.status().as_u16(),
            "handler answered a server error: releasing the key"
        );
        release(&shared, token).await;
        counts.record(Outcome::Released);
        let mut response = response;
        response.extensions_mut().remove::<SideRecords>();
        return response;
    }

    let (mut parts, body) = response.into_parts();
    let side = parts.extensions.remove::<SideRecords>().unwrap_or_default();
    let body = match axum::body::to_bytes(body, shared.config.max_response_bytes).await {
        Ok(body) => body,
        Err(e) => {
            error!(error = %e, limit = shared.config.max_response_bytes, "response body could not be stored: releasing the key");
            release(&shared, token).await;
            counts.record(Outcome::Released);
            return Problem::internal("the response could not be recorded").into_response();
        }
    };
    let stored = replay::to_stored(&parts, body.clone());
    let status = stored.status;
    let side_records = side.0.len();
    let completed = shared.store.complete(&token, &stored, &side.0).await;
    match completed {
        Ok(()) => {
            counts.record(outcome);
            info!(status, side_records, "completed: response stored");
            Response::from_parts(parts, Body::from(body))
        }
        Err(StoreError::LeaseLost { .. }) => fenced(&shared, &token, fp).await,
        Err(e @ StoreError::Rejected(_)) => {
            error!(error = %e, "response could not be stored: releasing the key");
            release(&shared, token).await;
            counts.record(Outcome::Released);
            Problem::internal("the response could not be recorded").into_response()
        }
        Err(e) => store_failure(counts, "complete", &e),
    }
}

/// How long an overtaken holder waits for the winner's response before answering 409.
const FENCED_WAIT: Duration = Duration::from_secs(2);
/// How often it looks.
const FENCED_POLL: Duration = Duration::from_millis(20);

/// Our claim was taken over while the handler ran: answer with the winner's result, never ours.
/// The winner usually finishes soon (the provider dedups its charge onto ours), so wait a little for
/// its stored response; 409 if it does not come.
async fn fenced(shared: &Shared, token: &HeldClaim, fp: Fingerprint) -> Response {
    shared.counts.record(Outcome::Fenced);
    let fence = token.fence;
    let deadline = Instant::now() + FENCED_WAIT;
    loop {
        match shared.store.get(&token.scope, &token.key).await {
            Ok(Some(record)) if record.fingerprint == fp => match record.state {
                KeyState::Completed(stored) => {
                    warn!(
                        fence,
                        winner = record.fence,
                        "claim was taken over while the handler ran: answering with the winner's stored response"
                    );
                    return replay::replay(stored);
                }
                KeyState::InProgress { .. } if Instant::now() < deadline => {
                    tokio::time::sleep(FENCED_POLL).await;
                }
                KeyState::InProgress { .. } => {
                    warn!(
                        fence,
                        winner = record.fence,
                        "claim was taken over while the handler ran and the new holder is still running: 409"
                    );
                    return in_progress(1);
                }
            },
            Ok(_) => {
                warn!(
                    fence,
                    "claim was taken over while the handler ran and no matching record remains: 409"
                );
                return in_progress(1);
            }
            Err(e) => {
                error!(error = %e, "idempotency store failed after a takeover: 503");
                return Problem::store_unavailable(
                    "the idempotency store could not be read; retry with the same Idempotency-Key",
                )
                .into_response();
            }
        }
    }
}

/// Gives the key up so a retry can run; failures only delay that until the lease runs out.
async fn release(shared: &Shared, token: HeldClaim) {
    let fence = token.fence;
    match shared.store.release(&token).await {
        Ok(()) => info!(fence, "key released: a retry will run the handler again"),
        Err(StoreError::LeaseLost { .. }) => {
            warn!(
                fence,
                "release refused: the claim had already been taken over"
            );
        }
        Err(e) => error!(
            fence,
            error = %e,
            "release failed: the key frees itself when its lease runs out"
        ),
    }
}
