//! Conversions between the engine's types and the store interface's.
//!
//! Record writes become engine side writes (an absolute expiry turned into a TTL on the engine's
//! clock), and a claim the engine granted becomes a [`HeldClaim`] carrying the engine's token, which
//! comes back out only for this backend's own claims.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idemlog::SideWrite;

use crate::store::{Expiry, HeldClaim, RecordWrite, StoreError};

/// A record write as the engine takes it; an absolute expiry becomes a TTL on the engine's clock.
pub(super) fn side_write(write: &RecordWrite, now_ms: u64) -> SideWrite {
    let (ns, key) = (
        write.namespace,
        Bytes::copy_from_slice(write.key.as_bytes()),
    );
    match (&write.value, write.expiry) {
        (None, _) => SideWrite::remove(ns, key),
        (Some(value), Expiry::Never) => SideWrite::put(ns, key, value.clone()),
        (Some(value), Expiry::After(ttl)) => {
            SideWrite::put_with_ttl(ns, key, value.clone(), ttl.max(Duration::from_millis(1)))
        }
        (Some(value), Expiry::AtMs(at)) => SideWrite::put_with_ttl(
            ns,
            key,
            value.clone(),
            Duration::from_millis(at.saturating_sub(now_ms).max(1)),
        ),
    }
}

/// [`side_write`] of each write, in order.
pub(super) fn side_writes(writes: &[RecordWrite], now_ms: u64) -> Vec<SideWrite> {
    writes.iter().map(|w| side_write(w, now_ms)).collect()
}

/// Our claim for a token the engine granted; the engine's token rides inside it as its handle.
pub(super) fn held_claim(token: idemlog::ClaimToken) -> HeldClaim {
    HeldClaim {
        scope: lossy(token.scope()),
        key: lossy(token.key()),
        fence: token.fence(),
        takeover: token.takeover(),
        expires_at_ms: token.expires_at_ms(),
        handle: Some(Arc::new(token)),
    }
}

/// The engine's token inside ours.
pub(super) fn engine_token(token: &HeldClaim) -> Result<&idemlog::ClaimToken, StoreError> {
    token
        .handle
        .as_ref()
        .and_then(|h| h.downcast_ref::<idemlog::ClaimToken>())
        .ok_or_else(|| StoreError::Internal("a claim token from another backend".to_owned()))
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
