//! How engine calls run from async code.
//!
//! Engine calls are blocking functions. Under `Durability::Sync` a write waits for an fdatasync
//! (milliseconds); on a tokio worker that would stall every other connection of that worker, so
//! those calls go to tokio's blocking pool. Under `Durability::None` the engine never waits for the
//! disk on a caller's behalf: a call takes a shard lock, copies a frame into the log buffer and
//! returns in a microsecond or two. Under `Periodic` a write waits only for a `pwrite` into the page
//! cache (the flusher's fdatasync runs apart from the writes). Sending such a call to the blocking
//! pool would cost more than the call (a futex wake and two context switches per round trip, most
//! of the HTTP layer's overhead in a profile), so it runs inline. The exceptions are bounded and
//! rare: a `write` of 256 KiB of buffered frames, and the fdatasync that seals a full segment.
//!
//! The engine's *deferred* calls (`claim_deferred`, `complete_deferred`, …) never wait for the
//! disk, in any mode: they append and return a `Pending`, and the embedded backend runs them on the
//! calling task in every mode. Under `Sync` it then awaits `Store::durable`, a future the engine's
//! committer thread resolves, so a thousand requests waiting for one fdatasync hold no thread.
//! Under `Periodic` it writes the frames to the OS itself (a `pwrite`, or a wait for the one in
//! progress): the engine runs the flusher's fdatasync apart from the writes, so nothing there waits
//! for the disk either.

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
            Durability::None | Durability::Periodic(_) => StoreCalls::Inline,
            Durability::Sync => StoreCalls::BlockingPool,
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
    use idemlog::testkit::FaultyStorage;

    use super::*;

    fn store_with(durability: Durability) -> Store {
        let options = Options::default()
            .storage(Arc::new(FaultyStorage::new()))
            .durability(durability);
        Store::open("/data", options).expect("open store")
    }

    #[test]
    fn only_a_store_whose_writes_wait_for_an_fdatasync_uses_the_blocking_pool() {
        let none = store_with(Durability::None);
        let sync = store_with(Durability::Sync);
        let periodic = store_with(Durability::Periodic(Duration::from_millis(50)));
        assert_eq!(StoreCalls::for_store(&none), StoreCalls::Inline);
        assert_eq!(StoreCalls::for_store(&sync), StoreCalls::BlockingPool);
        assert_eq!(StoreCalls::for_store(&periodic), StoreCalls::Inline);
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
