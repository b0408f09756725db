//! Side records: plain (namespace, key) → bytes entries that commit in the same atomic append as a
//! completion, so that a business write (the order a request created) and the idempotency record
//! are never apart.

use std::time::Duration;

use bytes::Bytes;

/// One change to a side record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SideWrite {
    /// Creates or replaces a value, optionally expiring after `ttl`.
    Put {
        /// Namespace, 1–255 bytes.
        namespace: Bytes,
        /// Key inside the namespace, 1–1024 bytes.
        key: Bytes,
        /// The value.
        value: Bytes,
        /// Lifetime from now; `None` keeps it until removed.
        ttl: Option<Duration>,
    },
    /// Removes a value if present.
    Remove {
        /// Namespace.
        namespace: Bytes,
        /// Key.
        key: Bytes,
    },
}

impl SideWrite {
    /// A put that never expires.
    pub fn put(
        namespace: impl Into<Bytes>,
        key: impl Into<Bytes>,
        value: impl Into<Bytes>,
    ) -> Self {
        SideWrite::Put {
            namespace: namespace.into(),
            key: key.into(),
            value: value.into(),
            ttl: None,
        }
    }

    /// A put that expires after `ttl`.
    pub fn put_with_ttl(
        namespace: impl Into<Bytes>,
        key: impl Into<Bytes>,
        value: impl Into<Bytes>,
        ttl: Duration,
    ) -> Self {
        SideWrite::Put {
            namespace: namespace.into(),
            key: key.into(),
            value: value.into(),
            ttl: Some(ttl),
        }
    }

    /// A removal.
    pub fn remove(namespace: impl Into<Bytes>, key: impl Into<Bytes>) -> Self {
        SideWrite::Remove {
            namespace: namespace.into(),
            key: key.into(),
        }
    }

    pub(crate) fn namespace_and_key(&self) -> (&[u8], &[u8]) {
        match self {
            SideWrite::Put { namespace, key, .. } | SideWrite::Remove { namespace, key } => {
                (namespace, key)
            }
        }
    }
}
