//! Live records per scope: an exact count for per-account quotas, without a scan per claim.
//!
//! Each scope with live records has a count and a map from *expiry second* to how many of its
//! records expire then (a record expiring at `t` ms sits in bucket `ceil(t / 1000) * 1000`). A claim
//! first drops the buckets that have passed (`prune`), so the count follows expiry without any
//! sweep, and the earliest bucket says when the scope's next record stops counting (the
//! `Retry-After` of a refused claim). Memory is per scope and per distinct expiry second, never per
//! key: a scope's buckets are at most its TTL in seconds, and a scope whose records have all expired
//! is removed.
//!
//! A record stops counting at the first whole second after its expiry, so at most 1 s late: the
//! quota errs towards refusing, never towards admitting one record too many.
//!
//! Exactness: the check and the update happen under the scope's lock, taken while the claiming key's
//! record shard is held (lock order: record shard, then scope shard), so of any number of concurrent
//! claims of new keys in one scope exactly as many as the quota allows succeed.
//!
//! `pruned_through` is the latest time a scope was pruned at: a record whose bucket is at or before
//! it is no longer counted, whichever way the wall clock moved since, so an entry is only ever
//! subtracted if it was added and not yet pruned.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, RandomState};

use parking_lot::Mutex;

use crate::index::{Entry, Sharded, split_record_key};

const SHARDS: usize = 16;

/// The bucket of a record expiring at `expires_at` ms: the next whole second.
fn bucket(expires_at: u64) -> u64 {
    expires_at.div_ceil(1000).saturating_mul(1000)
}

#[derive(Debug, Default)]
struct ScopeLive {
    live: u64,
    buckets: BTreeMap<u64, u32>,
    pruned_through: u64,
}

impl ScopeLive {
    fn prune(&mut self, now: u64) {
        while let Some((&at, &n)) = self.buckets.first_key_value() {
            if at > now {
                break;
            }
            self.buckets.pop_first();
            self.live -= u64::from(n);
        }
        self.pruned_through = self.pruned_through.max(now);
    }

    fn counted(&self, expires_at: u64) -> bool {
        bucket(expires_at) > self.pruned_through
    }

    fn add(&mut self, expires_at: u64) {
        if self.counted(expires_at) {
            *self.buckets.entry(bucket(expires_at)).or_default() += 1;
            self.live += 1;
        }
    }

    fn remove(&mut self, expires_at: u64) {
        if !self.counted(expires_at) {
            return;
        }
        let at = bucket(expires_at);
        if let Some(n) = self.buckets.get_mut(&at) {
            *n -= 1;
            if *n == 0 {
                self.buckets.remove(&at);
            }
            self.live -= 1;
        }
    }
}

/// What a claim does to its scope's count.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Admit {
    /// The expiry of the record the claim replaces (live or expired), if there is one in memory.
    pub(crate) replaces: Option<u64>,
    /// Whether the key is new for the quota: no record, or only an expired one.
    pub(crate) new_key: bool,
    /// The new record's expiry.
    pub(crate) expires_at: u64,
}

/// One lock's share of the scopes.
type Shard = Mutex<HashMap<Box<[u8]>, ScopeLive>>;

/// Live-record counts of every scope.
pub(crate) struct ScopeCounts {
    shards: Box<[Shard]>,
    hasher: RandomState,
}

impl ScopeCounts {
    pub(crate) fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
        }
    }

    fn shard(&self, scope: &[u8]) -> &Shard {
        &self.shards[self.hasher.hash_one(scope) as usize % SHARDS]
    }

    /// Counts every live record of `records` (at open, after replay and sweep).
    pub(crate) fn rebuild(records: &Sharded<Entry>, now: u64) -> Self {
        let counts = Self::new();
        for shard in records.shards() {
            let table = shard.lock();
            for (id, entry) in table.iter() {
                if entry.is_live(now) {
                    let (scope, _) = split_record_key(id);
                    let mut map = counts.shard(scope).lock();
                    let live = map.entry(scope.into()).or_insert_with(|| ScopeLive {
                        pruned_through: now,
                        ..ScopeLive::default()
                    });
                    live.add(entry.expires_at);
                }
            }
        }
        counts
    }

    /// Applies a claim to its scope's count, unless it is a new key and the scope already has
    /// `max_live` live records: then nothing changes and the result is the time (ms) until the
    /// scope's next record stops counting.
    pub(crate) fn admit(
        &self,
        scope: &[u8],
        now: u64,
        admit: Admit,
        max_live: Option<u64>,
    ) -> Result<(), u64> {
        let mut map = self.shard(scope).lock();
        let live = match map.get_mut(scope) {
            Some(live) => live,
            None => map.entry(scope.into()).or_insert_with(|| ScopeLive {
                pruned_through: now,
                ..ScopeLive::default()
            }),
        };
        live.prune(now);
        if let (true, Some(max)) = (admit.new_key, max_live) {
            let freed = admit.replaces.is_some_and(|e| live.counted(e));
            if live.live - u64::from(freed) >= max {
                let next = live
                    .buckets
                    .first_key_value()
                    .map_or(now + 1000, |(at, _)| *at);
                let wait = next.saturating_sub(now).max(1);
                if live.live == 0 {
                    map.remove(scope);
                }
                return Err(wait);
            }
        }
        if let Some(old) = admit.replaces {
            live.remove(old);
        }
        live.add(admit.expires_at);
        if live.live == 0 {
            map.remove(scope);
        }
        Ok(())
    }

    /// Undoes [`ScopeCounts::admit`] after the claim's append failed.
    pub(crate) fn undo(&self, scope: &[u8], admit: Admit) {
        let mut map = self.shard(scope).lock();
        if let Some(live) = map.get_mut(scope) {
            live.remove(admit.expires_at);
            if let Some(old) = admit.replaces {
                live.add(old);
            }
        }
    }

    /// A record expiring at `expires_at` stopped counting (released).
    pub(crate) fn remove(&self, scope: &[u8], expires_at: u64) {
        let mut map = self.shard(scope).lock();
        if let Some(live) = map.get_mut(scope) {
            live.remove(expires_at);
            if live.live == 0 {
                map.remove(scope);
            }
        }
    }

    /// Drops passed buckets of every scope, and scopes with nothing live (the periodic sweep).
    pub(crate) fn prune_all(&self, now: u64) {
        for shard in self.shards.iter() {
            shard.lock().retain(|_, live| {
                live.prune(now);
                live.live > 0
            });
        }
    }

    /// Live records of `scope` now (rounded as the module docs say).
    pub(crate) fn live(&self, scope: &[u8], now: u64) -> u64 {
        let mut map = self.shard(scope).lock();
        map.get_mut(scope).map_or(0, |live| {
            live.prune(now);
            live.live
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new_key(expires_at: u64) -> Admit {
        Admit {
            replaces: None,
            new_key: true,
            expires_at,
        }
    }

    #[test]
    fn a_full_scope_refuses_new_keys_until_its_first_record_expires() {
        let counts = ScopeCounts::new();
        assert_eq!(counts.admit(b"a", 1_000, new_key(5_500), Some(2)), Ok(()));
        assert_eq!(counts.admit(b"a", 1_000, new_key(9_000), Some(2)), Ok(()));
        assert_eq!(
            counts.admit(b"a", 2_000, new_key(9_000), Some(2)),
            Err(4_000),
            "bucket of 5 500 is 6 000"
        );
        assert_eq!(counts.admit(b"b", 2_000, new_key(9_000), Some(2)), Ok(()));
        assert_eq!(counts.live(b"a", 5_999), 2);
        assert_eq!(counts.admit(b"a", 6_000, new_key(9_000), Some(2)), Ok(()));
        assert_eq!(counts.live(b"a", 6_000), 2);
    }

    #[test]
    fn replacing_a_live_record_keeps_the_count_and_release_frees_a_place() {
        let counts = ScopeCounts::new();
        counts.admit(b"a", 0, new_key(5_000), Some(1)).unwrap();
        let takeover = Admit {
            replaces: Some(5_000),
            new_key: false,
            expires_at: 7_000,
        };
        assert_eq!(counts.admit(b"a", 1_000, takeover, Some(1)), Ok(()));
        assert_eq!(counts.live(b"a", 1_000), 1);
        assert_eq!(
            counts.admit(b"a", 1_000, new_key(8_000), Some(1)),
            Err(6_000)
        );
        counts.remove(b"a", 7_000);
        assert_eq!(counts.live(b"a", 1_000), 0);
        assert_eq!(counts.admit(b"a", 1_000, new_key(8_000), Some(1)), Ok(()));
    }

    #[test]
    fn a_wall_clock_step_back_never_subtracts_what_was_not_counted() {
        let counts = ScopeCounts::new();
        counts.admit(b"a", 0, new_key(2_000), None).unwrap();
        counts.admit(b"a", 0, new_key(9_000), None).unwrap();
        assert_eq!(counts.live(b"a", 3_000), 1);
        // The clock steps back: the record expiring at 2 000 looks live again, but was pruned.
        counts.remove(b"a", 2_000);
        assert_eq!(counts.live(b"a", 1_000), 1);
        counts.prune_all(10_000);
        assert_eq!(counts.live(b"a", 10_000), 0);
        assert!(counts.shards.iter().all(|s| s.lock().is_empty()));
    }
}
