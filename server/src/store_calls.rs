//! How engine calls run from async code.
//!
//! Engine calls are blocking functions. Under `Durability::Sync` a write waits for an fdatasync
//! (milliseconds), and under `Periodic` it may wait behind the flusher's; on a tokio worker that would
//! stall every other connection of that worker, so those calls go to tokio's blocking pool. Under
//! `Durability::None` the engine never waits for the disk on a caller's behalf: a call takes a shard
//! lock, copies a frame into the log buffer and returns in a microsecond or two. Sending it to the
//! blocking pool would cost more than the call (a futex wake and two context switches per round trip,
//! most of the HTTP layer's overhead in a profile), so it runs inline. The exceptions are bounded and
//! rare: a `write` of 256 KiB of buffered frames, and the fdatasync that seals a full segment.
//!
//! The engine's *deferred* calls (`claim_deferred`, `complete_deferred`, …) never wait for the
//! disk either, in any mode: they append and return a `Pending`, and under `Sync` the caller awaits
//! `Store::durable`, a future the engine's committer thread resolves. So under `Sync` too they run
//! inline, and a thousand requests waiting for one fdatasync hold no thread
//! ([`StoreCalls::for_deferred`]). Under `Periodic`, making a write visible may wait behind the
//! flusher's fdatasync, so they stay on the blocking pool there.

use idemlog::{Durability, Store};
use tokio::task::JoinError;

/// Where engine calls run (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreCalls {
    /// On the calling task: for stores that never wait for the disk.
    Inline,
    /// On tokio's blocking pool.
    BlockingPool,
}

impl StoreCalls {
    /// The right choice for `store`'s durability mode.
    pub fn for_store(store: &Store) -> Self {
        match store.durability() {
            Durability::None => StoreCalls::Inline,
            Durability::Sync | Durability::Periodic(_) => StoreCalls::BlockingPool,
        }
    }

    /// Where deferred engine calls (which return a `Pending` instead of waiting) run for `store`.
    pub fn for_deferred(store: &Store) -> Self {
        match store.durability() {
            Durability::None | Durability::Sync => StoreCalls::Inline,
            Durability::Periodic(_) => StoreCalls::BlockingPool,
        }
    }

    /// Runs `call`. The error is the blocking-pool task's failure (a panic, or a runtime shutting
    /// down); a panic inline unwinds into the caller instead, as any other panic would.
    pub async fn run<T: Send + 'static>(
        self,
        call: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, JoinError> {
        match self {
            StoreCalls::Inline => Ok(call()),
            StoreCalls::BlockingPool => tokio::task::spawn_blocking(call).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use idemlog::Options;
    use idemlog::storage::FaultyStorage;

    use super::*;

    fn store_with(durability: Durability) -> Store {
        let options = Options::default()
            .storage(Arc::new(FaultyStorage::new()))
            .durability(durability);
        Store::open("/data", options).expect("open store")
    }

    #[test]
    fn only_a_store_that_never_waits_for_the_disk_is_called_inline() {
        let none = store_with(Durability::None);
        let sync = store_with(Durability::Sync);
        let periodic = store_with(Durability::Periodic(Duration::from_millis(50)));
        assert_eq!(StoreCalls::for_store(&none), StoreCalls::Inline);
        assert_eq!(StoreCalls::for_store(&sync), StoreCalls::BlockingPool);
        assert_eq!(StoreCalls::for_store(&periodic), StoreCalls::BlockingPool);
    }

    #[test]
    fn deferred_calls_run_inline_unless_a_write_may_wait_behind_the_flusher() {
        let none = store_with(Durability::None);
        let sync = store_with(Durability::Sync);
        let periodic = store_with(Durability::Periodic(Duration::from_millis(50)));
        assert_eq!(StoreCalls::for_deferred(&none), StoreCalls::Inline);
        assert_eq!(StoreCalls::for_deferred(&sync), StoreCalls::Inline);
        assert_eq!(
            StoreCalls::for_deferred(&periodic),
            StoreCalls::BlockingPool
        );
    }

    #[tokio::test]
    async fn a_blocking_pool_call_runs_off_the_calling_thread() {
        let caller = std::thread::current().id();
        let ran_on = StoreCalls::BlockingPool
            .run(|| std::thread::current().id())
            .await
            .expect("task");
        assert_ne!(ran_on, caller);
    }

    #[tokio::test]
    async fn an_inline_call_runs_on_the_calling_thread() {
        let caller = std::thread::current().id();
        let ran_on = StoreCalls::Inline
            .run(|| std::thread::current().id())
            .await
            .expect("inline");
        assert_eq!(ran_on, caller);
    }
}
