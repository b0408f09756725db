//! What an inner service can tell the layer about its own response, beyond its status.
//!
//! Normally the status decides: a status in
//! [`IdempotencyConfig::release_statuses`](crate::IdempotencyConfig::release_statuses) releases
//! the key, anything else completes it. A service that knows more puts a [`ClaimDirective`] in the
//! response's extensions; the layer takes it off before the response leaves.

/// A response extension that overrides how the layer settles the claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimDirective {
    /// Release the key whatever the status: the request certainly had no effect (a reverse proxy
    /// that could not connect to its upstream), so a retry may run it again at once.
    Release,
    /// The effect is unknown (a reverse proxy's upstream timed out, or the connection was lost,
    /// after the request was sent): neither complete nor release. The key stays in progress until
    /// its lease runs out, so a retry gets 409 while the first attempt may still be running
    /// upstream, and only then takes the key over (with a larger fencing token). The lease is no
    /// longer renewed: renewal runs only while the inner service's future does, and it has
    /// returned. The response is sent to this client and never stored.
    EffectUnknown,
}
