//! The in-memory index: (scope, key) → record state and the location of its latest operation.
//!
//! The index never holds a response body, only where it is in the log, so memory per key stays small
//! (the key bytes plus an 80-byte entry). It is sharded by a randomly seeded hash so that two cores can
//! claim in parallel, and each shard is a `HashMap` with std's randomly keyed SipHash, so clients that
//! choose keys cannot force collisions (hash flooding).
//!
//! The state machine lives here, in [`apply_record`] and [`apply_side`]: recovery replays the log
//! through them, and the store applies every operation it appends through them too, so the state after
//! a restart is the state before it by construction.
//!
//! Lock order: a record shard, then the side map, then the log writer.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::num::NonZeroU64;

use parking_lot::Mutex;

use crate::log::op::Op;
use crate::log::segment::Loc;

/// State of one idempotency record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) fingerprint: [u8; 32],
    pub(crate) fence: u64,
    pub(crate) created_at: u64,
    pub(crate) expires_at: u64,
    /// `Some` while in progress; `None` once completed.
    pub(crate) lease_until: Option<NonZeroU64>,
    /// The operation holding the current snapshot of this record.
    pub(crate) loc: Loc,
}

impl Entry {
    pub(crate) fn is_live(&self, now: u64) -> bool {
        self.expires_at > now
    }
}

/// State of one side record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SideEntry {
    pub(crate) expires_at: u64,
    pub(crate) loc: Loc,
}

impl SideEntry {
    pub(crate) fn is_live(&self, now: u64) -> bool {
        self.expires_at > now
    }
}

/// One shard's map.
pub(crate) type Shard<V> = HashMap<Box<[u8]>, V>;

/// A map split into independently locked shards.
pub(crate) struct Sharded<V> {
    shards: Box<[Mutex<Shard<V>>]>,
    hasher: RandomState,
}

impl<V> Sharded<V> {
    /// `count` must be a power of two.
    pub(crate) fn new(count: usize) -> Self {
        assert!(count.is_power_of_two());
        Self {
            shards: (0..count).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
        }
    }

    pub(crate) fn shard(&self, key: &[u8]) -> &Mutex<Shard<V>> {
        let hash = self.hasher.hash_one(key);
        // High bits: the shard maps use their own hasher, so any bits would do; these avoid reusing the
        // low bits a power-of-two table would look at if the maps shared the seed.
        let index = (hash >> 32) as usize & (self.shards.len() - 1);
        &self.shards[index]
    }

    pub(crate) fn shards(&self) -> &[Mutex<Shard<V>>] {
        &self.shards
    }
}

/// Longest record key: scope length byte, scope, key.
const RECORD_KEY_MAX: usize = 1 + crate::limits::MAX_SCOPE + crate::limits::MAX_KEY;
/// Longest side key: namespace length byte, namespace, key.
const SIDE_KEY_MAX: usize = 1 + crate::limits::MAX_NAMESPACE + crate::limits::MAX_SIDE_KEY;

/// An index key built on the stack: `[prefix length u8][prefix][rest]`. Lookups need no allocation;
/// only an insert turns it into a `Box<[u8]>`.
pub(crate) struct KeyBuf<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> KeyBuf<N> {
    fn new(prefix: &[u8], rest: &[u8]) -> Self {
        let prefix_len = u8::try_from(prefix.len()).expect("limits bound the prefix");
        let len = 1 + prefix.len() + rest.len();
        assert!(len <= N, "limits bound the key");
        let mut buf = [0u8; N];
        buf[0] = prefix_len;
        buf[1..1 + prefix.len()].copy_from_slice(prefix);
        buf[1 + prefix.len()..len].copy_from_slice(rest);
        Self { buf, len }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// A record key: scope and key must have passed `limits`.
pub(crate) type RecordKey = KeyBuf<RECORD_KEY_MAX>;
/// A side key: namespace and key must have passed `limits`.
pub(crate) type SideKey = KeyBuf<SIDE_KEY_MAX>;

pub(crate) fn record_key(scope: &[u8], key: &[u8]) -> RecordKey {
    KeyBuf::new(scope, key)
}

pub(crate) fn side_key(namespace: &[u8], key: &[u8]) -> SideKey {
    KeyBuf::new(namespace, key)
}

/// Splits `[prefix length][prefix][rest]` back into its parts.
pub(crate) fn split_record_key(id: &[u8]) -> (&[u8], &[u8]) {
    let prefix_len = usize::from(id[0]);
    (&id[1..1 + prefix_len], &id[1 + prefix_len..])
}

fn upsert<V>(map: &mut Shard<V>, key: &[u8], value: V) {
    match map.get_mut(key) {
        Some(slot) => *slot = value,
        None => {
            map.insert(key.into(), value);
        }
    }
}

/// Applies a record operation found at `loc` to the shard holding its key. Side and fence operations
/// are ignored here.
pub(crate) fn apply_record(map: &mut Shard<Entry>, op: &Op<'_>, loc: Loc) {
    match op {
        Op::InProgress { head, .. } | Op::Completed { head, .. } => {
            let lease_until = match op {
                // A zero lease is never written (leases end at least 1 ms after a non-negative
                // clock); reading one back as "expired long ago" is the safe interpretation.
                Op::InProgress { lease_until, .. } => {
                    Some(NonZeroU64::new(*lease_until).unwrap_or(NonZeroU64::MIN))
                }
                _ => None,
            };
            let entry = Entry {
                fingerprint: head.fingerprint,
                fence: head.fence,
                created_at: head.created_at,
                expires_at: head.expires_at,
                lease_until,
                loc,
            };
            upsert(map, record_key(head.scope, head.key).as_bytes(), entry);
        }
        Op::Released { scope, key, fence } => {
            let id = record_key(scope, key);
            if map.get(id.as_bytes()).is_some_and(|e| e.fence == *fence) {
                map.remove(id.as_bytes());
            }
        }
        Op::SidePut { .. } | Op::SideRemove { .. } | Op::FenceFloor { .. } => {}
    }
}

/// Applies a side operation found at `loc`. Record and fence operations are ignored here.
pub(crate) fn apply_side(map: &mut Shard<SideEntry>, op: &Op<'_>, loc: Loc) {
    match op {
        Op::SidePut {
            namespace,
            key,
            expires_at,
            ..
        } => upsert(
            map,
            side_key(namespace, key).as_bytes(),
            SideEntry {
                expires_at: *expires_at,
                loc,
            },
        ),
        Op::SideRemove { namespace, key } => {
            map.remove(side_key(namespace, key).as_bytes());
        }
        _ => {}
    }
}

/// The shard key an operation belongs to, if it is a record operation.
pub(crate) fn record_key_of(op: &Op<'_>) -> Option<RecordKey> {
    match op {
        Op::InProgress { head, .. } | Op::Completed { head, .. } => {
            Some(record_key(head.scope, head.key))
        }
        Op::Released { scope, key, .. } => Some(record_key(scope, key)),
        _ => None,
    }
}
