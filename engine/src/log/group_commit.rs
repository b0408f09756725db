//! When the `Sync` committer runs its next fdatasync for the tasks awaiting durability.
//!
//! Each fdatasync has a fixed cost that hardly depends on how much it covers: on the 2-core test
//! machine's virtual disk 33–51 µs of CPU for a write and its fdatasync, 1 KB and 20 KB alike
//! (BENCHMARKS.md, issue 23's eighth step). Syncing as soon as one task waits
//! ([`GroupCommit::Immediate`], the default) covers what arrived during the previous fdatasync:
//! about 5 HTTP requests at 64 connections, so that cost came to 5–9 µs per request.
//!
//! [`GroupCommit::Gather`] is PostgreSQL's `commit_delay` with `commit_siblings` in this log's
//! terms: once tasks are seen to come together (the previous fdatasync woke two or more), the
//! committer waits until `min_waiters` wait or the first of them has waited `max_wait`, whichever
//! comes first. A caller alone (the previous fdatasync woke one) is synced at once. Nothing here
//! weakens durability: a task still returns only after an fdatasync covered its frames; only
//! *when* that fdatasync starts moves, by at most `max_wait`.
//!
//! The trade-off, measured (BENCHMARKS.md): with many more callers than `min_waiters` the CPU stays
//! busy with the others while a batch gathers, so fewer fdatasyncs are pure gain; with a few
//! callers that all end up waiting, the CPU idles while they gather and throughput drops. Hence
//! off by default, and a server flag to turn it on.
//!
//! Pure logic over the times it is given, so the tests drive it without sleeping.

use std::time::{Duration, Instant};

/// When the `Sync` committer starts an fdatasync for tasks awaiting durability
/// ([`crate::Store::durable`]); blocking callers ([`crate::Store::wait`]) always lead their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GroupCommit {
    /// As soon as one task waits (the default).
    #[default]
    Immediate,
    /// When tasks come together, once `min_waiters` wait or the first has waited `max_wait` (see
    /// the module docs of `log::group_commit`).
    Gather {
        /// Waiters that start an fdatasync at once.
        min_waiters: usize,
        /// Longest the first waiter of a batch waits before its fdatasync starts.
        max_wait: Duration,
    },
}

/// What the committer does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Due {
    /// Sync now.
    Now,
    /// Wait this long (or until kicked), then ask again.
    In(Duration),
    /// Nobody waits.
    Idle,
}

/// The committer's batching state (under the writer's mutex).
#[derive(Debug)]
pub(crate) struct Batcher {
    mode: GroupCommit,
    /// When the first of the current waiters registered.
    first: Option<Instant>,
    /// Tasks the last flush woke: two or more means callers come together.
    last_woken: usize,
}

impl Batcher {
    pub(crate) fn new(mode: GroupCommit) -> Self {
        Self {
            mode,
            first: None,
            last_woken: 0,
        }
    }

    /// Waiters that make a sync due at once.
    fn target(&self) -> usize {
        match self.mode {
            GroupCommit::Gather { min_waiters, .. } if self.last_woken >= 2 => min_waiters.max(1),
            _ => 1,
        }
    }

    /// A task registered; `waiting` counts it. True if the committer must be woken: for the
    /// first waiter (so that it times `max_wait`) and when the target is reached.
    pub(crate) fn registered(&mut self, waiting: usize, now: Instant) -> bool {
        if waiting == 1 || self.first.is_none() {
            self.first = Some(now);
        }
        waiting == 1 || waiting >= self.target()
    }

    /// Whether to sync now, with `waiting` tasks registered.
    pub(crate) fn due(&self, waiting: usize, now: Instant) -> Due {
        if waiting == 0 {
            return Due::Idle;
        }
        let GroupCommit::Gather { max_wait, .. } = self.mode else {
            return Due::Now;
        };
        if waiting >= self.target() {
            return Due::Now;
        }
        let age = self
            .first
            .map_or(max_wait, |first| now.saturating_duration_since(first));
        if age >= max_wait {
            return Due::Now;
        }
        Due::In(max_wait - age)
    }

    /// A flush woke `woken` tasks and left `remaining` waiting.
    pub(crate) fn woke(&mut self, woken: usize, remaining: usize, now: Instant) {
        self.first = (remaining > 0).then_some(now);
        if woken > 0 {
            self.last_woken = woken;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_millis(1);

    fn gather() -> Batcher {
        Batcher::new(GroupCommit::Gather {
            min_waiters: 8,
            max_wait: WAIT,
        })
    }

    #[test]
    fn immediate_syncs_for_every_single_waiter() {
        let mut b = Batcher::new(GroupCommit::Immediate);
        let t = Instant::now();
        assert!(b.registered(1, t));
        assert_eq!(b.due(1, t), Due::Now);
        b.woke(5, 0, t);
        assert!(b.registered(1, t));
        assert_eq!(b.due(1, t), Due::Now);
        assert_eq!(b.due(0, t), Due::Idle);
    }

    #[test]
    fn a_caller_alone_is_synced_at_once() {
        let mut b = gather();
        let t = Instant::now();
        assert!(b.registered(1, t), "the first waiter wakes the committer");
        assert_eq!(
            b.due(1, t),
            Due::Now,
            "nothing woken yet: no sign of company"
        );
        b.woke(1, 0, t);
        assert!(b.registered(1, t));
        assert_eq!(b.due(1, t), Due::Now, "the last flush woke one");
    }

    #[test]
    fn callers_that_came_together_gather_until_min_waiters() {
        let mut b = gather();
        let t = Instant::now();
        b.woke(3, 0, t);
        assert!(
            b.registered(1, t),
            "the first waiter wakes the committer to time the wait"
        );
        assert!(!b.registered(2, t), "below min_waiters: no kick");
        assert_eq!(b.due(7, t), Due::In(WAIT));
        assert!(b.registered(8, t), "min_waiters reached: kick");
        assert_eq!(b.due(8, t), Due::Now);
    }

    #[test]
    fn the_first_waiter_never_waits_longer_than_max_wait() {
        let mut b = gather();
        let t = Instant::now();
        b.woke(3, 0, t);
        b.registered(1, t);
        assert_eq!(b.due(3, t + WAIT / 4), Due::In(WAIT - WAIT / 4));
        assert_eq!(b.due(3, t + WAIT), Due::Now);
    }

    #[test]
    fn waiters_left_after_a_flush_restart_the_clock() {
        let mut b = gather();
        let t = Instant::now();
        b.woke(3, 0, t);
        b.registered(1, t);
        let later = t + WAIT / 2;
        b.woke(3, 2, later);
        assert_eq!(
            b.due(2, later),
            Due::In(WAIT),
            "timed from the flush, not the first waiter"
        );
    }
}
