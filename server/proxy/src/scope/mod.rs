//! Where a protected request's idempotency scope comes from: exactly one source, chosen at
//! start-up, and the proxy does not start without one (failing closed).
//!
//! - `header`: a header set by an authenticating gateway in front, believed only from trusted
//!   peer addresses; a request carrying it from anyone else is refused with 401, whatever route;
//! - `jwt`: a bearer JWT the proxy verifies itself (HS256 secret, or RS256/ES256 keys of a JWKS
//!   file), with issuer and audience checked; the scope is one claim (`sub` by default);
//! - `static`: one scope for every request, for a single-tenant service.
//!
//! Never the client IP, never a hash of a raw token: two callers must never share a scope by
//! accident, and one caller must not get two.

mod header;
mod jwt;

use std::net::IpAddr;

use axum::http::HeaderMap;
use idemlog_idempotency::Scope;

pub use self::header::HeaderScope;
pub use self::jwt::{JwtKeys, JwtScope};

use crate::cli::Cli;

/// Why a request has no scope (each is a 401 to the client; the detail goes to the log).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScopeError {
    /// No credential where one was expected.
    #[error("missing {0}")]
    Missing(&'static str),
    /// The scope header came from a peer outside the trusted networks.
    #[error("scope header from untrusted peer {0}")]
    UntrustedPeer(IpAddr),
    /// The credential was present but not valid.
    #[error("invalid credential: {0}")]
    Invalid(String),
}

/// The configured scope source.
#[derive(Debug, Clone)]
pub enum ScopeSource {
    /// From a trusted header.
    Header(HeaderScope),
    /// From a verified bearer JWT.
    Jwt(JwtScope),
    /// The same scope for every request.
    Static(Scope),
}

/// Why the scope flags were refused (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum ScopeConfigError {
    /// No source given.
    #[error(
        "no scope source: the proxy refuses to start without one, so that tenants never share \
         keys. Choose one of --scope-header NAME with --trusted-peer CIDR, \
         --jwt-hs256-secret-file FILE, --jwt-jwks-file FILE, or --static-scope NAME"
    )]
    None,
    /// Several sources given.
    #[error("several scope sources given ({0}): choose exactly one")]
    Several(String),
    /// `--scope-header` without `--trusted-peer`.
    #[error(
        "--scope-header needs at least one --trusted-peer CIDR: the header is believed only from \
         the gateway that sets it"
    )]
    NoTrustedPeer,
    /// `--trusted-peer` without `--scope-header`.
    #[error("--trusted-peer is only used with --scope-header")]
    TrustedPeerAlone,
    /// A value is invalid (header name, scope, key file).
    #[error("{0}")]
    Invalid(String),
}

impl ScopeSource {
    /// The source the flags choose.
    pub fn from_cli(cli: &Cli) -> Result<Self, ScopeConfigError> {
        let mut given = Vec::new();
        if cli.scope_header.is_some() {
            given.push("--scope-header");
        }
        if cli.jwt_hs256_secret_file.is_some() {
            given.push("--jwt-hs256-secret-file");
        }
        if cli.jwt_jwks_file.is_some() {
            given.push("--jwt-jwks-file");
        }
        if cli.static_scope.is_some() {
            given.push("--static-scope");
        }
        match given.len() {
            0 => {
                return Err(if cli.trusted_peer.is_empty() {
                    ScopeConfigError::None
                } else {
                    ScopeConfigError::TrustedPeerAlone
                });
            }
            1 => {}
            _ => return Err(ScopeConfigError::Several(given.join(", "))),
        }
        if cli.scope_header.is_none() && !cli.trusted_peer.is_empty() {
            return Err(ScopeConfigError::TrustedPeerAlone);
        }
        if let Some(name) = &cli.scope_header {
            if cli.trusted_peer.is_empty() {
                return Err(ScopeConfigError::NoTrustedPeer);
            }
            return HeaderScope::new(name, cli.trusted_peer.clone()).map(Self::Header);
        }
        if let Some(name) = &cli.static_scope {
            check_scope(name).map_err(ScopeConfigError::Invalid)?;
            return Ok(Self::Static(Scope::new(name.as_str())));
        }
        let keys = if let Some(file) = &cli.jwt_hs256_secret_file {
            JwtKeys::hs256_from_file(file)
        } else if let Some(file) = &cli.jwt_jwks_file {
            JwtKeys::jwks_from_file(file)
        } else {
            return Err(ScopeConfigError::None);
        }
        .map_err(ScopeConfigError::Invalid)?;
        Ok(Self::Jwt(JwtScope::new(
            keys,
            cli.jwt_claim.clone(),
            cli.jwt_issuer.clone(),
            cli.jwt_audience.clone(),
        )))
    }

    /// A short description for the start-up log.
    pub fn describe(&self) -> String {
        match self {
            Self::Header(h) => format!(
                "header {} from {} trusted network(s)",
                h.name(),
                h.trusted_count()
            ),
            Self::Jwt(j) => j.describe(),
            Self::Static(s) => format!("static scope {:?} (single tenant)", s.as_str()),
        }
    }

    /// Refuses a request that carries the scope header from an untrusted peer, whatever it is
    /// for (so that nothing behind the proxy ever sees a forged scope header).
    pub fn check_peer(&self, headers: &HeaderMap, peer: IpAddr) -> Result<(), ScopeError> {
        match self {
            Self::Header(h) => h.check_peer(headers, peer),
            _ => Ok(()),
        }
    }

    /// The scope of a protected request.
    pub fn scope_of(&self, headers: &HeaderMap, peer: IpAddr) -> Result<Scope, ScopeError> {
        match self {
            Self::Header(h) => h.scope_of(headers, peer),
            Self::Jwt(j) => j.scope_of(headers),
            Self::Static(s) => Ok(s.clone()),
        }
    }
}

/// A scope is 1 to 255 bytes of printable text (no control characters).
pub fn check_scope(scope: &str) -> Result<(), String> {
    if scope.is_empty() {
        return Err("the scope is empty".to_owned());
    }
    if scope.len() > idemlog::MAX_SCOPE {
        return Err(format!(
            "the scope is {} bytes, more than {}",
            scope.len(),
            idemlog::MAX_SCOPE
        ));
    }
    if scope.chars().any(char::is_control) {
        return Err("the scope contains control characters".to_owned());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn source(extra: &[&str]) -> Result<ScopeSource, ScopeConfigError> {
        let mut args = vec!["idemlog-proxy", "--upstream", "http://127.0.0.1:1"];
        args.extend_from_slice(extra);
        ScopeSource::from_cli(&Cli::try_parse_from(args).expect("flags parse"))
    }

    #[test]
    fn without_a_scope_source_the_proxy_refuses_to_start() {
        assert!(matches!(source(&[]), Err(ScopeConfigError::None)));
    }

    #[test]
    fn a_scope_header_needs_a_trusted_peer_and_the_reverse() {
        assert!(matches!(
            source(&["--scope-header", "X-Tenant"]),
            Err(ScopeConfigError::NoTrustedPeer)
        ));
        assert!(matches!(
            source(&["--trusted-peer", "10.0.0.0/8"]),
            Err(ScopeConfigError::TrustedPeerAlone)
        ));
        assert!(matches!(
            source(&["--scope-header", "X-Tenant", "--trusted-peer", "10.0.0.0/8"]),
            Ok(ScopeSource::Header(_))
        ));
    }

    #[test]
    fn two_scope_sources_are_refused() {
        let both = source(&[
            "--static-scope",
            "a",
            "--scope-header",
            "X-Tenant",
            "--trusted-peer",
            "127.0.0.1",
        ]);
        assert!(
            matches!(both, Err(ScopeConfigError::Several(_))),
            "{both:?}"
        );
    }

    #[test]
    fn a_static_scope_is_checked() {
        assert!(matches!(
            source(&["--static-scope", "shop"]),
            Ok(ScopeSource::Static(_))
        ));
        let long = "x".repeat(300);
        assert!(matches!(
            source(&["--static-scope", &long]),
            Err(ScopeConfigError::Invalid(_))
        ));
    }
}
