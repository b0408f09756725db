//! RFC 9457 problem details: the one shape of every error response the layer writes, and of every
//! other one an application routes through [`ProblemJsonLayer`].
//!
//! A [`Problem`] carries the four members clients rely on (`type`, `title`, `status`, `detail`) and
//! renders as `application/problem+json`. [`ProblemJsonLayer`] is a last-line middleware that turns
//! any other error response (axum's own 404/405/413 rejections, a bare status from a handler) into one,
//! so clients can rely on the media type for every 4xx and 5xx.
//!
//! Every body built while a request is served carries that request's id as the extension member
//! `request_id` ([`crate::request_id`]). It is added when the body is built, so a 4xx that the
//! idempotency layer stores and replays keeps the id of the request that produced it.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use axum::body::Body;
use axum::http::header::{CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use pin_project_lite::pin_project;
use serde::Serialize;
use tower::{Layer, Service};

/// Media type of every error body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Prefix of every problem `type`: a URN, so no host is implied and the value stays stable.
const TYPE_PREFIX: &str = "urn:idemlog:problem:";

/// One problem-details response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// HTTP status.
    pub status: StatusCode,
    /// Short machine-friendly slug; the `type` member is `urn:idemlog:problem:{slug}`.
    pub slug: &'static str,
    /// Human summary that does not change from occurrence to occurrence.
    pub title: &'static str,
    /// Explanation of this occurrence.
    pub detail: String,
    /// Seconds for a `Retry-After` header (409 in progress, 503).
    pub retry_after: Option<u64>,
    /// Adds `WWW-Authenticate: Bearer` (401).
    pub bearer_challenge: bool,
}

/// The JSON body of every problem, as serialised: the OpenAPI document's schema of every 4xx and
/// 5xx is generated from this type, so the two cannot drift apart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProblemDetails {
    /// `urn:idemlog:problem:{slug}`.
    #[serde(rename = "type")]
    #[cfg_attr(
        feature = "openapi",
        schema(example = "urn:idemlog:problem:request-in-progress")
    )]
    pub kind: String,
    /// Summary that does not change from occurrence to occurrence.
    pub title: String,
    /// The HTTP status.
    #[cfg_attr(feature = "openapi", schema(minimum = 400, maximum = 599))]
    pub status: u16,
    /// This occurrence.
    pub detail: String,
    /// The id of the request that produced this body (its `X-Request-Id`). On a replayed response
    /// it is the id of the original request, not of the replaying one.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub request_id: Option<String>,
    /// For a 422 mismatch: sorted JSON Pointers (RFC 6901) of the body members that differ from
    /// the request the key was first used with, plus `method`, `path`, `query`, `content-type`
    /// when those differ, and `""` when the bodies cannot be compared member by member. Never
    /// values. Absent when the first request's members were not kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub differing_fields: Option<Vec<String>>,
}

impl Problem {
    /// A problem with this status, slug, title and detail.
    pub fn new(
        status: StatusCode,
        slug: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            status,
            slug,
            title,
            detail: detail.into(),
            retry_after: None,
            bearer_challenge: false,
        }
    }

    /// Adds a `Retry-After` of `seconds`.
    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// 401: missing or unknown credentials.
    pub fn unauthorized(detail: impl Into<String>) -> Self {
        let mut p = Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "Missing or invalid credentials",
            detail,
        );
        p.bearer_challenge = true;
        p
    }

    /// 503: the idempotency store cannot be used (poisoned, full disk, closed, database down). The
    /// detail must say what the client can do, never what failed inside (paths, hosts, OS errors):
    /// those go to the log.
    pub fn store_unavailable(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store-unavailable",
            "Idempotency store unavailable",
            detail,
        )
        .retry_after(1)
    }

    /// 500: an internal failure (a panic, a response that could not be recorded).
    pub fn internal(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "Internal server error",
            detail,
        )
    }

    /// A generic problem for a status that has no more specific one.
    pub fn from_status(status: StatusCode, detail: impl Into<String>) -> Self {
        let title = status.canonical_reason().unwrap_or("Error");
        let slug = match status {
            StatusCode::NOT_FOUND => "not-found",
            StatusCode::METHOD_NOT_ALLOWED => "method-not-allowed",
            StatusCode::PAYLOAD_TOO_LARGE => "body-too-large",
            StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported-media-type",
            StatusCode::BAD_REQUEST => "bad-request",
            StatusCode::UNPROCESSABLE_ENTITY => "unprocessable",
            s if s.is_server_error() => "internal",
            _ => "http-error",
        };
        Self::new(status, slug, title, detail)
    }

    /// The `type` URI.
    pub fn type_uri(&self) -> String {
        format!("{TYPE_PREFIX}{}", self.slug)
    }

    /// The JSON body, with the current request's id ([`crate::request_id::current`]) when there
    /// is one.
    pub fn body(&self) -> Vec<u8> {
        let body = ProblemDetails {
            kind: self.type_uri(),
            title: self.title.to_owned(),
            status: self.status.as_u16(),
            detail: self.detail.clone(),
            request_id: crate::request_id::current(),
            differing_fields: None,
        };
        // Serialising a struct of strings and an integer cannot fail; fall back to a minimal body
        // rather than panic if it ever did.
        serde_json::to_vec(&body).unwrap_or_else(|_| b"{}".to_vec())
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let mut response = Response::new(Body::from(self.body()));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(seconds) = self.retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
        }
        if self.bearer_challenge {
            headers.insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// True if the response already carries a problem+json body.
fn is_problem(response: &Response) -> bool {
    response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with(PROBLEM_JSON))
}

/// True for a 4xx/5xx that is not problem+json yet.
fn needs_rewrite(response: &Response) -> bool {
    let status = response.status();
    (status.is_client_error() || status.is_server_error()) && !is_problem(response)
}

/// Most bytes of a non-problem error body kept as the problem's detail.
const MAX_DETAIL: usize = 1024;

/// Rewrites a 4xx/5xx that is not yet problem+json into one, keeping a short plain-text body as
/// the detail (what [`ProblemJsonLayer`] does to every response that needs it).
pub async fn ensure_problem_json(response: Response) -> Response {
    if !needs_rewrite(&response) {
        return response;
    }
    let status = response.status();
    let (parts, body) = response.into_parts();
    let detail = match axum::body::to_bytes(body, MAX_DETAIL).await {
        Ok(bytes) if !bytes.is_empty() => String::from_utf8_lossy(&bytes).into_owned(),
        _ => status
            .canonical_reason()
            .unwrap_or("request failed")
            .to_owned(),
    };
    let mut problem = Problem::from_status(status, detail);
    if let Some(seconds) = parts
        .headers
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
    {
        problem = problem.retry_after(seconds);
    }
    let mut rebuilt = problem.into_response();
    // Keep headers such as `Allow` on a 405.
    for (name, value) in &parts.headers {
        if name != CONTENT_TYPE && name != axum::http::header::CONTENT_LENGTH {
            rebuilt.headers_mut().insert(name, value.clone());
        }
    }
    rebuilt
}

/// The last-line middleware that makes every 4xx and 5xx problem+json ([`ensure_problem_json`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct ProblemJsonLayer;

impl<S> Layer<S> for ProblemJsonLayer {
    type Service = ProblemJson<S>;

    fn layer(&self, inner: S) -> ProblemJson<S> {
        ProblemJson { inner }
    }
}

/// The service of [`ProblemJsonLayer`]. A response that needs no rewrite (every success, every
/// problem already) passes through its future without an allocation; only a rewrite, which reads
/// the body, runs in a boxed future. (`axum::middleware::map_response` boxes a future for every
/// response: the repository's benches/NOTEBOOK.md, "no `from_fn` on the request path".)
#[derive(Debug, Clone)]
pub struct ProblemJson<S> {
    inner: S,
}

impl<S, R> Service<R> for ProblemJson<S>
where
    S: Service<R, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = ProblemJsonFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        ProblemJsonFuture {
            state: State::Inner {
                inner: self.inner.call(request),
            },
        }
    }
}

type Rewrite = Pin<Box<dyn Future<Output = Response> + Send>>;

pin_project! {
    /// The future of [`ProblemJson`].
    pub struct ProblemJsonFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        // The inner service's response, not there yet.
        Inner { #[pin] inner: F },
        // An error response being rewritten.
        Rewriting { rewrite: Rewrite },
    }
}

impl<F, E> Future for ProblemJsonFuture<F>
where
    F: Future<Output = Result<Response, E>>,
{
    type Output = Result<Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Inner { inner } => {
                    let response = ready!(inner.poll(cx))?;
                    if !needs_rewrite(&response) {
                        return Poll::Ready(Ok(response));
                    }
                    let rewrite = Box::pin(ensure_problem_json(response));
                    state.set(State::Rewriting { rewrite });
                }
                StateProj::Rewriting { rewrite } => {
                    return Poll::Ready(Ok(ready!(rewrite.as_mut().poll(cx))));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problem_body_has_the_four_rfc9457_members() {
        let p = Problem::new(StatusCode::CONFLICT, "in-progress", "Busy", "try later");
        let v: serde_json::Value = serde_json::from_slice(&p.body()).expect("json");
        assert_eq!(v["type"], "urn:idemlog:problem:in-progress");
        assert_eq!(v["title"], "Busy");
        assert_eq!(v["status"], 409);
        assert_eq!(v["detail"], "try later");
    }

    #[tokio::test]
    async fn plain_error_responses_are_rewritten_as_problems() {
        let plain = (StatusCode::METHOD_NOT_ALLOWED, "nope").into_response();
        let rewritten = ensure_problem_json(plain).await;
        assert_eq!(rewritten.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(rewritten.headers()[CONTENT_TYPE], PROBLEM_JSON);
    }
}
