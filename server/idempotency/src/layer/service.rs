//! The layer, the service it wraps around a route, and the request flow through it.
//!
//! [`handle`] does the checks that need no claim (scope, key, body, repeated JSON members) and the
//! fingerprint, then runs [`run`] inside [`FinishOnDrop`], so a client that disconnects cannot stop
//! a claim, a handler or a completion halfway; [`run`] claims and answers every claim outcome;
//! [`execute`] runs the handler under an acquired claim and completes or releases it. A request
//! counts as in flight from before the claim until its outcome is recorded.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::{OriginalUri, Request};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use tower::{Layer, Service, ServiceExt};
use tracing::field::Value;
use tracing::{Instrument, Span, debug, error, info, info_span, warn};

use crate::digest;
use crate::fingerprint::{self, JsonBody};
use crate::key::{self, IdempotencyKey};
use crate::layer::body::{BodyError, read_body};
use crate::layer::catch_panic::{self as panics, CatchPanic};
use crate::layer::config::IdempotencyConfig;
use crate::layer::fenced::{fenced, release};
use crate::layer::finish_on_drop::FinishOnDrop;
use crate::layer::in_flight::InFlight;
use crate::layer::renewal::with_renewal;
use crate::layer::response_body::{Collected, collect_bounded};
use crate::layer::responses::{in_progress, retry_after_hint, store_failure, with_member};
use crate::layer::unrecorded::{UnrecordedResponse, send_and_hold, unreadable_and_held};
use crate::outcome::{Outcome, OutcomeCounts};
use crate::problem::Problem;
use crate::replay;
use crate::side_records::SideRecords;
use crate::store::{Claim, ClaimExtras, Fingerprint, HeldClaim, StoreError, StoreHandle, Takeover};
use crate::{ClaimDirective, ClaimInfo, Scope};

/// The field of an enclosing span that the layer records the request's scope in, when that span
/// declares it (`scope = tracing::field::Empty`); see [`IdempotencyLayer`].
pub const SCOPE_FIELD: &str = "scope";
/// The field of an enclosing span that the layer records the request's `Idempotency-Key` in.
pub const KEY_FIELD: &str = "key";

/// The idempotency layer. Cheap to clone; clones share the store, counters and in-flight count.
///
/// Logging: from the claim on, every line of the request is in a span naming its scope and key.
/// An app whose request span declares both fields ([`SCOPE_FIELD`], [`KEY_FIELD`], as
/// `tracing::field::Empty`) gets them recorded there, one span per request; otherwise the layer
/// opens an `idempotency` span (INFO) of its own.
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

    /// A layer with other settings that shares this one's store, outcome counts and in-flight
    /// count: one layer per route rule of an application (a reverse proxy's routes), counted and
    /// drained at shutdown as one.
    pub fn with_config(&self, config: IdempotencyConfig) -> Self {
        Self {
            shared: Arc::new(Shared {
                store: Arc::clone(&self.shared.store),
                config,
                counts: Arc::clone(&self.shared.counts),
                in_flight: self.shared.in_flight.clone(),
            }),
        }
    }

    /// The settings this layer runs with.
    pub fn config(&self) -> &IdempotencyConfig {
        &self.shared.config
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

/// Everything before the claim: checks that need none.
async fn handle<S>(shared: Arc<Shared>, inner: S, request: Request) -> Response
where
    S: Service<Request, Error = Infallible> + Clone + Send + 'static,
    S::Response: IntoResponse + Send + 'static,
    S::Future: Send + 'static,
{
    let counts = &shared.counts;
    if !shared.config.key_required && !request.headers().contains_key(key::HEADER) {
        // An optional key left out: the request is not idempotent, and the layer keeps out of it.
        counts.record(Outcome::NoKey);
        return match inner.oneshot(request).await {
            Ok(response) => response.into_response(),
            Err(never) => match never {},
        };
    }
    let Some(scope) = request.extensions().get::<Scope>().cloned() else {
        counts.record(Outcome::Unauthenticated);
        warn!("request reached the idempotency layer without an authenticated scope");
        return Problem::unauthorized("this route needs an authenticated caller").into_response();
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
                "the request body stopped arriving; nothing was claimed and the request did \
                 not run, so it may be retried with the same Idempotency-Key",
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
                "the request body could not be read; nothing was claimed and the request did not run",
            )
            .into_response();
        }
    };
    // The body is parsed and canonicalised once, for the refusal of a repeated member, the
    // fingerprint and the digest.
    let json =
        match fingerprint::parse_body_strict(shared.config.fingerprint, &parts.headers, &bytes) {
            Ok(json) => json,
            Err(fingerprint::RepeatedMember(name)) => {
                counts.record(Outcome::RejectedBody);
                return repeated_member(&scope, &key, &name);
            }
        };
    // The full path even when this layer sits inside a `nest`ed router, which strips its prefix.
    let uri = parts
        .extensions
        .get::<OriginalUri>()
        .map_or_else(|| parts.uri.clone(), |original| original.0.clone());
    let (method, path, query) = (&parts.method, uri.path(), uri.query());
    // Normalised once, for the fingerprint now and the digest later.
    let media = fingerprint::media_type(&parts.headers);
    let fp = fingerprint::fingerprint_with_media(
        method,
        path,
        query,
        media.as_deref(),
        &bytes,
        json.as_ref(),
    );
    // The digest is computed only if the store asks for it (a claim that writes a record).
    let request_digest = DigestInput {
        method: parts.method.clone(),
        uri,
        media,
        body: bytes.clone(),
        json,
    };
    parts.extensions.insert(key.clone());
    let request = Request::from_parts(parts, Body::from(bytes));

    let span = request_span(&scope, &key);
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

/// The answer to a JSON body that repeats a member name: 400, nothing claimed.
fn repeated_member(scope: &Scope, key: &IdempotencyKey, name: &str) -> Response {
    // The name is the client's text: quoted and escaped (`?`), as Display a line break in it
    // would start a forged log line.
    info!(
        scope = scope.as_str(),
        key = key.as_str(),
        member = ?name,
        "rejected request: JSON body repeats a member name"
    );
    Problem::new(
        StatusCode::BAD_REQUEST,
        "duplicate-json-member",
        "JSON body repeats a member name",
        format!(
            "the member {name:?} appears more than once in one object; send each member once \
             (nothing was claimed: a corrected request may reuse this Idempotency-Key)"
        ),
    )
    .into_response()
}

/// The span the rest of the request runs in, naming its scope and key. When the span the request
/// is already in declares `scope` and `key` fields (the server's request span does), they are
/// recorded there; otherwise the layer opens its own `idempotency` span with them. Either way every
/// line the layer, the handler and the store write from here on names both; a second span per
/// request cost about 2 % of the server's CPU (the repository's benches/NOTEBOOK.md, "One span per request").
fn request_span(scope: &Scope, key: &IdempotencyKey) -> Span {
    let current = Span::current();
    let fields = current
        .metadata()
        .map(|meta| meta.fields())
        .and_then(|fields| Some((fields, fields.field(SCOPE_FIELD)?, fields.field(KEY_FIELD)?)));
    match fields {
        Some((fields, scope_field, key_field)) => {
            // Both in one record: each record is a trip through the subscriber's layers.
            let (scope, key) = (scope.as_str(), key.as_str());
            current.record_all(&fields.value_set(&[
                (&scope_field, Some(&scope as &dyn Value)),
                (&key_field, Some(&key as &dyn Value)),
            ]));
            current
        }
        None => info_span!("idempotency", scope = scope.as_str(), key = key.as_str()),
    }
}

/// What the request digest is made of, kept until the store asks for the digest: the method,
/// the full URI, the `Content-Type`'s normal form and the body (as read, and as parsed for the
/// fingerprint). Clones of reference-counted buffers, not copies.
struct DigestInput {
    method: Method,
    uri: Uri,
    media: Option<String>,
    body: Bytes,
    json: Option<JsonBody>,
}

impl DigestInput {
    fn digest(&self) -> Bytes {
        digest::request_digest_with_media(
            &self.method,
            self.uri.path(),
            self.uri.query(),
            self.media.as_deref(),
            &self.body,
            self.json.as_ref(),
        )
    }
}

/// Claim and act on the outcome. Runs inside [`FinishOnDrop`].
async fn run<S>(
    shared: Arc<Shared>,
    inner: S,
    scope: Scope,
    key: IdempotencyKey,
    fp: Fingerprint,
    request_digest: DigestInput,
    request: Request,
) -> Response
where
    S: Service<Request, Error = Infallible> + Clone + Send + 'static,
    S::Response: IntoResponse + Send + 'static,
    S::Future: Send + 'static,
{
    let counts = &shared.counts;
    let ttl = shared.config.key_ttl;
    let compute_digest = || request_digest.digest();
    let extras = ClaimExtras {
        request_digest: Some(&compute_digest),
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
            replay::replay_with(stored, &shared.config.stored_headers)
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
            let fields =
                stored.and_then(|s| digest::differing_fields(&s, &request_digest.digest()));
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
                "scope holds its limit of live keys: 429"
            );
            Problem::new(
                StatusCode::TOO_MANY_REQUESTS,
                "idempotency-key-quota-exceeded",
                "Too many live Idempotency-Keys for this caller",
                format!(
                    "this caller already holds its limit of live idempotency keys; a place frees \
                     up when one expires, in {seconds} s (nothing was claimed and the request did \
                     not run; replays of existing keys still work)"
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
            // The routine path logs at DEBUG: at INFO, a line per step of every request cost
            // more CPU than the rest of the layer (the repository's benches/NOTEBOOK.md). The exceptions
            // (takeovers, expiries, replays, 409, 422, 429, releases) stay at INFO or above.
            debug!(fence = token.fence, "claimed key: running the handler");
            Outcome::Executed
        }
    };

    let mut handler = std::pin::pin!(CatchPanic::new(inner.oneshot(request)));
    // A handler that finishes on its first poll needs no lease renewal: arm the timer only for one
    // that has to wait (a per-request timer is a measurable share of the layer's cost).
    let first = std::future::poll_fn(|cx| Poll::Ready(handler.as_mut().poll(cx))).await;
    let joined = match first {
        Poll::Ready(joined) => joined,
        Poll::Pending => {
            with_renewal(&*shared.store, shared.config.heartbeat, &token, handler).await
        }
    };

    let response = match joined {
        Ok(Ok(response)) => response.into_response(),
        Ok(Err(never)) => match never {},
        Err(panic) => {
            error!(
                panic = panics::message(&panic),
                "handler panicked: releasing the key"
            );
            release(&*shared.store, token).await;
            counts.record(Outcome::Released);
            return Problem::internal(
                "the handler failed; the request may be retried with the same key",
            )
            .into_response();
        }
    };

    let mut response = response;
    let directive = response.extensions_mut().remove::<ClaimDirective>();
    let status = response.status();
    match directive {
        Some(ClaimDirective::EffectUnknown) => {
            // Neither complete nor release: the token is dropped, the record stays in progress
            // and its lease (no longer renewed) runs out on its own.
            warn!(
                status = status.as_u16(),
                fence = token.fence,
                "effect unknown: key left in progress until its lease runs out (retries get 409 \
                 until then)"
            );
            counts.record(Outcome::EffectUnknown);
            response.extensions_mut().remove::<SideRecords>();
            return response;
        }
        Some(ClaimDirective::Release) => {
            info!(
                status = status.as_u16(),
                "handler said the request had no effect: releasing the key"
            );
        }
        None if shared.config.release_statuses.contains(status) => {
            info!(
                status = status.as_u16(),
                "handler answered a releasing status: releasing the key"
            );
        }
        None => return complete(shared, token, fp, outcome, response).await,
    }
    release(&*shared.store, token).await;
    counts.record(Outcome::Released);
    response.extensions_mut().remove::<SideRecords>();
    response
}

/// Stores the handler's response (or, for one too large to store, that it completed) with its
/// business records, and sends it.
async fn complete(
    shared: Arc<Shared>,
    token: HeldClaim,
    fp: Fingerprint,
    outcome: Outcome,
    response: Response,
) -> Response {
    let counts = &shared.counts;
    let config = &shared.config;
    let (mut parts, body) = response.into_parts();
    let side = parts.extensions.remove::<SideRecords>().unwrap_or_default();
    let (stored, body, body_kept) = match collect_bounded(body, config.max_response_bytes).await {
        Ok(Collected::Whole(body)) => (
            replay::to_stored_with(&parts, body.clone(), &config.stored_headers),
            Body::from(body),
            true,
        ),
        Ok(Collected::TooLarge(body)) => {
            // The handler ran: its client gets the whole response, and the key is completed
            // without the body, so that no retry ever runs the handler again.
            info!(
                status = parts.status.as_u16(),
                limit = config.max_response_bytes,
                "response body larger than the stored limit: completing the key without it"
            );
            (
                replay::body_not_kept(&parts, config.max_response_bytes, &config.stored_headers),
                body,
                false,
            )
        }
        Err(e) => {
            return match config.unrecorded_response {
                UnrecordedResponse::Retry => {
                    error!(error = %e, "response body could not be read: releasing the key");
                    release(&*shared.store, token).await;
                    counts.record(Outcome::Released);
                    Problem::internal("the response could not be recorded").into_response()
                }
                // The token is dropped unused: the key stays in progress until its lease ends.
                UnrecordedResponse::SendAndHold => unreadable_and_held(counts, token.fence, &e),
            };
        }
    };
    let status = stored.status;
    let side_records = side.0.len();
    let completed = shared.store.complete(&token, &stored, &side.0).await;
    let e = match completed {
        Ok(()) => {
            counts.record(outcome);
            debug!(status, side_records, "completed: response stored");
            return Response::from_parts(parts, body);
        }
        Err(StoreError::LeaseLost { .. }) => {
            return fenced(&*shared.store, counts, &token, fp, &config.stored_headers).await;
        }
        Err(e) => e,
    };
    match config.unrecorded_response {
        UnrecordedResponse::Retry => match e {
            StoreError::Rejected(_) => {
                error!(error = %e, "response could not be stored: releasing the key");
                release(&*shared.store, token).await;
                counts.record(Outcome::Released);
                Problem::internal("the response could not be recorded").into_response()
            }
            e => store_failure(counts, "complete", &e),
        },
        UnrecordedResponse::SendAndHold => {
            // A refused value is usually a body over the store's largest value (a layer limit
            // above the store's): completing without the body keeps any retry from running the
            // handler again, as for a body over the layer's own limit.
            let e = match e {
                StoreError::Rejected(_) if body_kept => {
                    let bodiless = replay::body_refused(&parts, &config.stored_headers);
                    match shared.store.complete(&token, &bodiless, &side.0).await {
                        Ok(()) => {
                            counts.record(outcome);
                            warn!(
                                status,
                                error = %e,
                                "the store refused the response: key completed without its body \
                                 (keep max_response_bytes at most the store's largest value)"
                            );
                            return Response::from_parts(parts, body);
                        }
                        Err(StoreError::LeaseLost { .. }) => {
                            return fenced(
                                &*shared.store,
                                counts,
                                &token,
                                fp,
                                &config.stored_headers,
                            )
                            .await;
                        }
                        Err(again) => {
                            warn!(error = %e, "the store refused the response, and also without its body");
                            again
                        }
                    }
                }
                e => e,
            };
            // The token is dropped unused: the key stays in progress until its lease ends.
            send_and_hold(counts, token.fence, &e, Response::from_parts(parts, body))
        }
    }
}
