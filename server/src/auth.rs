//! Bearer API keys → accounts. The account is the only source of an idempotency scope.
//!
//! Keys are kept as SHA-256 digests, so the table never holds a usable secret and the lookup compares
//! digests rather than the caller's bytes. A request whose credentials do not authenticate gets a 401
//! problem here, before the idempotency layer or a handler sees it; every client-sent account header
//! (`X-Account-Id` or any other) is ignored.

use std::collections::HashMap;
use std::future::{Ready, ready};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::Request;
use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use axum::response::{IntoResponse, Response};
use futures_util::future::Either;
use sha2::{Digest, Sha256};
use tower::{Layer, Service};

use idemlog_idempotency::Scope;
use idemlog_idempotency::problem::Problem;

/// The demo API key used when no key is configured. Documented in the README; logged loudly.
pub const DEMO_API_KEY: &str = "demo-key";
/// The account the demo key authenticates.
pub const DEMO_ACCOUNT: &str = "acct_demo";

/// An authenticated account, put in the request extensions by [`RequireAccount`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Account(pub Arc<str>);

impl Account {
    /// The account id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Errors building the key table.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ApiKeyError {
    /// The same key was given twice.
    #[error("API key given more than once (for accounts {first} and {second})")]
    Duplicate {
        /// The first account named for it.
        first: String,
        /// The second.
        second: String,
    },
}

/// The configured API keys.
#[derive(Debug, Clone, Default)]
pub struct ApiKeys {
    by_digest: HashMap<[u8; 32], Account>,
    demo: bool,
}

fn digest(key: &[u8]) -> [u8; 32] {
    Sha256::digest(key).into()
}

impl ApiKeys {
    /// A table from `(key, account)` pairs, or the demo key alone if there are none.
    pub fn new(pairs: &[(String, String)]) -> Result<Self, ApiKeyError> {
        if pairs.is_empty() {
            return Ok(Self::demo());
        }
        let mut by_digest = HashMap::new();
        for (key, account) in pairs {
            let account = Account(Arc::from(account.as_str()));
            if let Some(first) = by_digest.insert(digest(key.as_bytes()), account.clone()) {
                return Err(ApiKeyError::Duplicate {
                    first: first.0.to_string(),
                    second: account.0.to_string(),
                });
            }
        }
        Ok(Self {
            by_digest,
            demo: false,
        })
    }

    /// Only the demo key, for [`DEMO_ACCOUNT`].
    pub fn demo() -> Self {
        let mut by_digest = HashMap::new();
        by_digest.insert(
            digest(DEMO_API_KEY.as_bytes()),
            Account(Arc::from(DEMO_ACCOUNT)),
        );
        Self {
            by_digest,
            demo: true,
        }
    }

    /// True when only the demo key is configured.
    pub fn is_demo(&self) -> bool {
        self.demo
    }

    /// Number of configured keys.
    pub fn len(&self) -> usize {
        self.by_digest.len()
    }

    /// True when no key is configured (never the case for a table from [`ApiKeys::new`]).
    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }

    /// The account for `Authorization: Bearer <key>`, or the 401 problem to answer.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Account, Problem> {
        let mut values = headers.get_all(AUTHORIZATION).iter();
        let value = values
            .next()
            .ok_or_else(|| Problem::unauthorized("send Authorization: Bearer <api key>"))?;
        if values.next().is_some() {
            return Err(Problem::unauthorized(
                "send exactly one Authorization header",
            ));
        }
        let value = value.as_bytes();
        let scheme_len = "bearer ".len();
        if value.len() <= scheme_len || !value[..scheme_len].eq_ignore_ascii_case(b"bearer ") {
            return Err(Problem::unauthorized(
                "the Authorization scheme must be Bearer",
            ));
        }
        let key = value[scheme_len..].trim_ascii();
        self.by_digest
            .get(&digest(key))
            .cloned()
            .ok_or_else(|| Problem::unauthorized("unknown API key"))
    }
}

/// The authentication middleware ([`RequireAccount`]) over `keys`.
#[derive(Clone)]
pub struct RequireAccountLayer {
    keys: Arc<ApiKeys>,
}

impl RequireAccountLayer {
    /// A layer authenticating against `keys`.
    pub fn new(keys: Arc<ApiKeys>) -> Self {
        Self { keys }
    }
}

impl<S> Layer<S> for RequireAccountLayer {
    type Service = RequireAccount<S>;

    fn layer(&self, inner: S) -> RequireAccount<S> {
        RequireAccount {
            inner,
            keys: Arc::clone(&self.keys),
        }
    }
}

/// Middleware: authenticates the request, or answers 401 without calling the service it wraps. On
/// success the request carries the [`Account`] and the idempotency [`Scope`] derived from it.
///
/// A service of its own rather than `axum::middleware::from_fn`, which clones the whole service
/// below it and boxes two futures on every request (benches/NOTEBOOK.md, issue 23's eleventh step).
#[derive(Clone)]
pub struct RequireAccount<S> {
    inner: S,
    keys: Arc<ApiKeys>,
}

impl<S> Service<Request> for RequireAccount<S>
where
    S: Service<Request, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Either<Ready<Result<Response, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request) -> Self::Future {
        match self.keys.authenticate(request.headers()) {
            Ok(account) => {
                request
                    .extensions_mut()
                    .insert(Scope::new(account.as_str()));
                request.extensions_mut().insert(account);
                Either::Right(self.inner.call(request))
            }
            Err(problem) => Either::Left(ready(Ok(problem.into_response()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(auth: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, HeaderValue::from_str(auth).expect("header"));
        h
    }

    fn keys() -> ApiKeys {
        ApiKeys::new(&[
            ("k1".into(), "acct_a".into()),
            ("k2".into(), "acct_b".into()),
        ])
        .expect("keys")
    }

    #[test]
    fn bearer_key_maps_to_its_account() {
        let account = keys().authenticate(&headers("Bearer k2")).expect("auth");
        assert_eq!(account.as_str(), "acct_b");
        let lower = keys().authenticate(&headers("bearer k1")).expect("auth");
        assert_eq!(lower.as_str(), "acct_a");
    }

    #[test]
    fn missing_unknown_or_non_bearer_credentials_are_refused() {
        let k = keys();
        assert!(k.authenticate(&HeaderMap::new()).is_err());
        assert!(k.authenticate(&headers("Bearer nope")).is_err());
        assert!(k.authenticate(&headers("Basic k1")).is_err());
        assert!(k.authenticate(&headers("Bearer ")).is_err());
    }

    #[test]
    fn no_configured_key_means_the_demo_key() {
        let k = ApiKeys::new(&[]).expect("keys");
        assert!(k.is_demo());
        let account = k
            .authenticate(&headers(&format!("Bearer {DEMO_API_KEY}")))
            .expect("auth");
        assert_eq!(account.as_str(), DEMO_ACCOUNT);
        assert!(keys().authenticate(&headers("Bearer demo-key")).is_err());
    }

    #[test]
    fn a_key_given_twice_is_refused() {
        let err = ApiKeys::new(&[("k".into(), "a".into()), ("k".into(), "b".into())]);
        assert!(err.is_err());
    }
}
