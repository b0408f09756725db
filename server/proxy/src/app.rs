//! The proxy's request path: scope check, route choice, and the idempotency layer in front of the
//! forwarder.
//!
//! For every request, in order:
//! 1. with `--scope-header`, a request carrying that header from an untrusted peer is a 401,
//!    whatever it is for;
//! 2. a request whose method some rule names must have a path in normal form
//!    ([`crate::normal_path`]), else 400 problem+json and nothing is forwarded, so that no
//!    spelling of a path evades the rule meant for it;
//! 3. the first route rule whose methods and path match gives the settings; with none, `POST` and
//!    `PATCH` get the command line's defaults, and every other request passes through;
//! 4. a protected request without `Idempotency-Key` passes through (key optional) or is a 400
//!    (key required);
//! 5. the scope is taken from the configured source (none or invalid → 401);
//! 6. the route's [`IdempotencyLayer`] claims the key, runs [`Forward`] and completes, releases or
//!    leaves the key as the outcome says (see `forward`). A response the store cannot record after
//!    the upstream answered (the store's disk is full, PostgreSQL is down) is sent to the client
//!    as the upstream gave it, and the key stays in progress until its lease runs out
//!    ([`UnrecordedResponse::SendAndHold`], outcome `unrecorded`): the upstream has acted, so the
//!    client must not be told to retry.
//!
//! Every route's layer is built with [`IdempotencyLayer::with_config`] from one base layer, so they
//! share the store, the outcome counts and the in-flight count.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, Response, StatusCode};
use axum::response::IntoResponse;
use idemlog_idempotency::{
    IdempotencyConfig, IdempotencyLayer, Idempotent, Problem, ReleaseStatuses, StoreHandle,
    UnrecordedResponse,
};
use tower::{Layer, ServiceExt};
use tracing::info;

use crate::config::{DEFAULT_METHODS, KeyRequirement, RouteRule, RouteSettings, StatusSpec};
use crate::forward::{Forward, Peer, Upstream};
use crate::normal_path::{self, NotNormal};
use crate::routes::first_match;
use crate::scope::{ScopeError, ScopeSource};

/// One protected route: its settings, its layer and the layered forwarder.
#[derive(Clone)]
struct Protected {
    key: KeyRequirement,
    layer: IdempotencyLayer,
    max_stored: usize,
    service: Idempotent<Forward>,
}

impl Protected {
    fn new(
        key: KeyRequirement,
        layer: IdempotencyLayer,
        max_stored: usize,
        upstream: &Arc<Upstream>,
    ) -> Self {
        let service = layer.layer(Forward::protected(Arc::clone(upstream), max_stored));
        Self {
            key,
            layer,
            max_stored,
            service,
        }
    }

    /// The same route forwarding to `upstream`.
    fn with_upstream(&self, upstream: &Arc<Upstream>) -> Self {
        Self::new(self.key, self.layer.clone(), self.max_stored, upstream)
    }
}

/// Everything a request needs; cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct App {
    inner: Arc<Inner>,
}

struct Inner {
    rules: Vec<(crate::routes::Matcher, Protected)>,
    /// Every method some rule names: their paths must be in normal form (step 2).
    ruled_methods: Vec<Method>,
    default: Protected,
    pass_through: Forward,
    scope: ScopeSource,
    base: IdempotencyLayer,
}

/// The layer settings for a route's settings.
pub fn layer_config(settings: &RouteSettings) -> IdempotencyConfig {
    let mut config = IdempotencyConfig::new(settings.key_ttl, settings.lease);
    config.max_body_bytes = settings.max_body_bytes;
    config.max_response_bytes = settings.max_stored_response_bytes;
    config.stored_headers = settings.stored_headers.clone();
    config.release_statuses =
        settings
            .release_statuses
            .iter()
            .fold(ReleaseStatuses::none(), |set, spec| match *spec {
                StatusSpec::Class(class) => set.with_class(class),
                StatusSpec::Code(code) => set.with_code(code),
            });
    // The proxy sends a keyless request around the layer itself (step 4), so the layer, if it
    // ever saw one, would refuse it.
    config.key_required = true;
    // Nothing downstream of the proxy is known to dedup: by the time a completion fails, the
    // upstream has acted, and the default's "503, retry with the same key" would have a retry run
    // it again. Its answer goes to the client and the key is held until its lease ends instead.
    config.unrecorded_response = UnrecordedResponse::SendAndHold;
    config
}

impl App {
    /// The app for these rules and defaults, on `store`, forwarding to `upstream`.
    pub fn new(
        store: StoreHandle,
        upstream: Arc<Upstream>,
        scope: ScopeSource,
        defaults: &RouteSettings,
        rules: Vec<RouteRule>,
    ) -> Self {
        let base = IdempotencyLayer::new(store, layer_config(defaults));
        let protect = |settings: &RouteSettings| {
            Protected::new(
                settings.key,
                base.with_config(layer_config(settings)),
                settings.max_stored_response_bytes,
                &upstream,
            )
        };
        let default = protect(defaults);
        let mut ruled_methods: Vec<Method> = Vec::new();
        for rule in &rules {
            for method in &rule.matcher.methods {
                if !ruled_methods.contains(method) {
                    ruled_methods.push(method.clone());
                }
            }
        }
        let rules = rules
            .iter()
            .map(|rule| (rule.matcher.clone(), protect(&rule.settings)))
            .collect();
        Self {
            inner: Arc::new(Inner {
                rules,
                ruled_methods,
                default,
                pass_through: Forward::pass_through(Arc::clone(&upstream)),
                scope,
                base,
            }),
        }
    }

    /// The base layer (outcome counts and in-flight count shared by every route).
    pub fn layer(&self) -> &IdempotencyLayer {
        &self.inner.base
    }

    /// The same app (rules, layers, store, counts) forwarding through another upstream client:
    /// one per worker thread, so that a pooled upstream connection is driven by the thread that
    /// uses it (see `main.rs`).
    pub fn with_upstream(&self, upstream: Arc<Upstream>) -> Self {
        let inner = &*self.inner;
        Self {
            inner: Arc::new(Inner {
                rules: inner
                    .rules
                    .iter()
                    .map(|(matcher, route)| (matcher.clone(), route.with_upstream(&upstream)))
                    .collect(),
                ruled_methods: inner.ruled_methods.clone(),
                default: inner.default.with_upstream(&upstream),
                pass_through: Forward::pass_through(Arc::clone(&upstream)),
                scope: inner.scope.clone(),
                base: inner.base.clone(),
            }),
        }
    }

    /// Serves one request from `peer`.
    pub async fn handle(&self, mut request: Request<Body>, peer: Peer) -> Response<Body> {
        let inner = &*self.inner;
        let ip = peer.0.ip();
        request.extensions_mut().insert(peer);
        if let Err(e) = inner.scope.check_peer(request.headers(), ip) {
            return unauthorized(&e);
        }
        let (method, path) = (request.method(), request.uri().path());
        if inner.ruled_methods.contains(method)
            && let Err(e) = normal_path::check(path)
        {
            return not_normal(path, &e);
        }
        let route = match first_match(inner.rules.iter().map(|(m, _)| m), method, path) {
            Some(i) => Some(&inner.rules[i].1),
            None if DEFAULT_METHODS.contains(method) => Some(&inner.default),
            None => None,
        };
        let Some(route) = route else {
            return pass(&inner.pass_through, request).await;
        };
        if !request
            .headers()
            .contains_key(idemlog_idempotency::key::HEADER)
        {
            return match route.key {
                KeyRequirement::Optional => pass(&inner.pass_through, request).await,
                KeyRequirement::Required => Problem::new(
                    StatusCode::BAD_REQUEST,
                    "idempotency-key-missing",
                    "Idempotency-Key required",
                    "this route needs an Idempotency-Key header (a unique value per operation, \
                     reused only to retry that operation)",
                )
                .into_response(),
            };
        }
        match inner.scope.scope_of(request.headers(), ip) {
            Ok(scope) => {
                request.extensions_mut().insert(scope);
            }
            Err(e) => return unauthorized(&e),
        }
        match route.service.clone().oneshot(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        }
    }
}

async fn pass(forward: &Forward, request: Request<Body>) -> Response<Body> {
    match forward.clone().oneshot(request).await {
        Ok(response) => response,
        Err(e) => match e {},
    }
}

fn not_normal(path: &str, e: &NotNormal) -> Response<Body> {
    // The path is the client's text: quoted and escaped (`?`), so it cannot forge a log line.
    info!(path = ?path, reason = %e, "refused: path not in normal form (400)");
    Problem::new(
        StatusCode::BAD_REQUEST,
        "path-not-normal",
        "Request path not in normal form",
        format!(
            "{e}; send the path as the upstream reads it: no '.' or '..' segments, no '//', \
             unreserved characters (letters, digits, '-', '.', '_', '~') not percent-encoded, no \
             '%2F', '%5C' or '\\' (nothing was forwarded)"
        ),
    )
    .into_response()
}

fn unauthorized(e: &ScopeError) -> Response<Body> {
    info!(reason = %e, "refused: no valid scope (401)");
    let detail = match e {
        ScopeError::UntrustedPeer(_) => {
            "the scope header is accepted only from the trusted gateway in front of this proxy"
        }
        ScopeError::Missing(_) => "this request needs credentials that name its caller",
        ScopeError::Invalid(_) => "the credentials of this request are not valid",
    };
    Problem::unauthorized(detail).into_response()
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("rules", &self.inner.rules.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::Cli;
    use crate::config::parse_rules;

    #[test]
    fn every_route_sends_an_unrecorded_upstream_answer_and_holds_its_key() {
        let cli = Cli::try_parse_from([
            "idemlog-proxy",
            "--upstream",
            "http://127.0.0.1:3000",
            "--static-scope",
            "shop",
        ])
        .expect("flags");
        let defaults = RouteSettings::defaults(&cli);
        let rules = parse_rules(
            r#"
            [[route]]
            path = "/orders/*"
            key = "required"
            release_statuses = ["5xx"]
            "#,
            "rules.toml",
            &defaults,
        )
        .expect("rules");
        let settings = std::iter::once(&defaults).chain(rules.iter().map(|r| &r.settings));
        for settings in settings {
            assert_eq!(
                layer_config(settings).unrecorded_response,
                UnrecordedResponse::SendAndHold
            );
        }
    }
}
