//! The two values the layer puts on a request: whose keys it works in ([`Scope`], set by the
//! caller's authentication) and which claim a handler runs under ([`ClaimInfo`]).

use std::sync::Arc;

/// The idempotency scope of a request: keys of different scopes never meet. Put in the request
/// extensions by the authentication layer; the layer never derives it from a client header.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Scope(Arc<str>);

impl Scope {
    /// A scope (the authenticated principal's id; 1–255 bytes, checked by the engine).
    pub fn new(id: impl Into<Arc<str>>) -> Self {
        Self(id.into())
    }

    /// The scope id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The claim a handler runs under; put in the request extensions by the layer before the inner
/// service is called. A handler that calls a downstream service with its own idempotency keys uses
/// `expires_at_ms` to make the downstream key live exactly as long as ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimInfo {
    /// The claim's fencing token.
    pub fence: u64,
    /// When the key expires, in the store clock's milliseconds, if the store still reported it.
    pub expires_at_ms: Option<u64>,
}
