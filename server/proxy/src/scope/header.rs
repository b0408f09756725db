//! The scope from a header set by a trusted gateway.
//!
//! The header is believed only when the TCP peer is inside one of the trusted networks: anyone
//! else could set it to any tenant. A request that carries it from another peer is refused (401),
//! not merely stripped, so a misrouted client learns at once that it bypassed the gateway.

use std::net::IpAddr;

use axum::http::{HeaderMap, HeaderName};
use idemlog_idempotency::Scope;
use ipnet::IpNet;

use super::{ScopeConfigError, ScopeError, check_scope};

/// A header name and the networks allowed to set it.
#[derive(Debug, Clone)]
pub struct HeaderScope {
    name: HeaderName,
    trusted: Vec<IpNet>,
}

impl HeaderScope {
    /// `name` believed from `trusted` peers.
    pub fn new(name: &str, trusted: Vec<IpNet>) -> Result<Self, ScopeConfigError> {
        let name = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| {
            ScopeConfigError::Invalid(format!(
                "--scope-header {name:?} is not a valid header name"
            ))
        })?;
        Ok(Self { name, trusted })
    }

    /// The header's name.
    pub fn name(&self) -> &HeaderName {
        &self.name
    }

    /// How many networks are trusted.
    pub fn trusted_count(&self) -> usize {
        self.trusted.len()
    }

    fn is_trusted(&self, peer: IpAddr) -> bool {
        // An IPv4 client on a dual-stack socket shows as ::ffff:a.b.c.d.
        let peer = match peer {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(peer, IpAddr::V4),
            v4 => v4,
        };
        self.trusted.iter().any(|net| net.contains(&peer))
    }

    /// Err if the header is present and the peer is not trusted.
    pub fn check_peer(&self, headers: &HeaderMap, peer: IpAddr) -> Result<(), ScopeError> {
        if headers.contains_key(&self.name) && !self.is_trusted(peer) {
            return Err(ScopeError::UntrustedPeer(peer));
        }
        Ok(())
    }

    /// The scope: the header's one value, from a trusted peer.
    pub fn scope_of(&self, headers: &HeaderMap, peer: IpAddr) -> Result<Scope, ScopeError> {
        let mut values = headers.get_all(&self.name).iter();
        let Some(value) = values.next() else {
            return Err(ScopeError::Missing("scope header"));
        };
        if !self.is_trusted(peer) {
            return Err(ScopeError::UntrustedPeer(peer));
        }
        if values.next().is_some() {
            return Err(ScopeError::Invalid(
                "the scope header appears more than once".into(),
            ));
        }
        let text = value
            .to_str()
            .map_err(|_| ScopeError::Invalid("the scope header is not visible ASCII".into()))?
            .trim();
        check_scope(text).map_err(ScopeError::Invalid)?;
        Ok(Scope::new(text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source() -> HeaderScope {
        HeaderScope::new("X-Tenant-Id", vec!["10.0.0.0/8".parse().expect("net")]).expect("name")
    }

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append("x-tenant-id", v.parse().expect("value"));
        }
        h
    }

    #[test]
    fn the_header_is_believed_from_a_trusted_peer() {
        let s = source();
        let scope = s
            .scope_of(&headers(&["acme"]), "10.1.2.3".parse().expect("ip"))
            .expect("scope");
        assert_eq!(scope.as_str(), "acme");
        let mapped: IpAddr = "::ffff:10.1.2.3".parse().expect("ip");
        assert!(s.scope_of(&headers(&["acme"]), mapped).is_ok());
    }

    #[test]
    fn the_header_from_an_untrusted_peer_is_refused() {
        let s = source();
        let peer: IpAddr = "192.168.1.1".parse().expect("ip");
        assert_eq!(
            s.scope_of(&headers(&["acme"]), peer),
            Err(ScopeError::UntrustedPeer(peer))
        );
        assert!(s.check_peer(&headers(&["acme"]), peer).is_err());
        assert!(s.check_peer(&headers(&[]), peer).is_ok());
    }

    #[test]
    fn a_missing_repeated_or_empty_header_is_no_scope() {
        let s = source();
        let peer: IpAddr = "10.0.0.1".parse().expect("ip");
        assert!(matches!(
            s.scope_of(&headers(&[]), peer),
            Err(ScopeError::Missing(_))
        ));
        assert!(matches!(
            s.scope_of(&headers(&["a", "b"]), peer),
            Err(ScopeError::Invalid(_))
        ));
        assert!(matches!(
            s.scope_of(&headers(&[""]), peer),
            Err(ScopeError::Invalid(_))
        ));
    }
}
