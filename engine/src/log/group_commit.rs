//! When the `Sync` committer runs its next fdatasync for the tasks awaiting durability.
//!
//! Each fdatasync has a fixed cost that hardly depends on how much it covers: on the 2-core test
//! machine's virtual disk 33–51 µs of CPU for a write and its fdatasync, 1 KB and 20 KB alike (the
//! repository's benches/NOTEBOOK.md, "the fixed cost of an fdatasync", 2026-12-06). Syncing as soon
//! as one task waits ([`GroupCommit::Immediate`], the default) covers what arrived during the
//! previous fdatasync: about 5 HTTP requests at 64 connections, so at face value that cost came to
//! 5–9 µs per request (inside the server fewer fdatasyncs saved less than that: the same notebook).
//!
//! [`GroupCommit::Gather`] is PostgreSQL's `commit_delay` with `commit_siblings` in this log's
//! terms, with a target that follows the callers: once tasks are seen to come together (the
//! previous fdatasync woke two or more), the committer waits until the *target* waits or the first
//! of them has waited `max_wait`, whichever comes first. The target is three quarters of the most
//! tasks seen waiting at once in the last [`PEAK_WINDOW`] (or the current one, if more), between
//! 2 and `max_batch`: so with few callers a batch never waits for all of them (the CPU would
//! idle), and with many it waits for up to `max_batch`. The first window gathers up to
//! `max_batch`, to find out. A caller alone (the previous fdatasync woke one) is synced at once.
//! Nothing here weakens durability: a task still returns only after an fdatasync covered its
//! frames; only *when* that fdatasync starts moves, by at most `max_wait`.
//!
//! The trade-off, measured (the notebook, "Group commit that gathers, opt-in"): with many more
//! callers than the target the CPU stays busy with the others while a batch gathers, so fewer
//! fdatasyncs are a gain; with a few callers the waits cost some throughput. The gain did not hold
//! up clearly enough on this machine to make it the default: off by default, a server flag turns it
//! on.
//!
//! Pure logic over the times it is given, so the tests drive it without sleeping. The time comes
//! as a function, called only when gathering needs it: under `Immediate` (the default) nothing
//! here reads the clock on the request path.

use std::time::{Duration, Instant};

/// When the `Sync` committer starts an fdatasync for tasks awaiting durability
/// ([`crate::Store::durable`]); blocking callers ([`crate::Store::wait`]) always lead their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GroupCommit {
    /// As soon as one task waits (the default).
    #[default]
    Immediate,
    /// When tasks come together, once as many wait as the recent peak suggests (at most
    /// `max_batch`) or the first has waited `max_wait` (see the module docs of
    /// `log::group_commit`).
    Gather {
        /// Most waiters a batch waits for (the target's cap).
        max_batch: usize,
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
    /// Most tasks seen waiting at once in the current window, and in the one before.
    peak: usize,
    previous_peak: usize,
    window_start: Option<Instant>,
}

/// How long a window of the waiting-count peak lasts.
pub(crate) const PEAK_WINDOW: Duration = Duration::from_millis(100);

impl Batcher {
    pub(crate) fn new(mode: GroupCommit) -> Self {
        let cap = match mode {
            GroupCommit::Gather { max_batch, .. } => max_batch,
            GroupCommit::Immediate => 1,
        };
        Self {
            mode,
            first: None,
            last_woken: 0,
            peak: 0,
            // Optimistic start: the first window gathers up to the cap, so that the peak can show
            // how many callers there are.
            previous_peak: cap.saturating_mul(4) / 3 + 1,
            window_start: None,
        }
    }

    /// Waiters that make a sync due at once: three quarters of the most seen waiting at once
    /// lately, at most `max_batch`; 1 while callers come alone.
    fn target(&self) -> usize {
        match self.mode {
            GroupCommit::Gather { max_batch, .. } if self.last_woken >= 2 => {
                let seen = self.peak.max(self.previous_peak);
                (seen * 3 / 4).clamp(2, max_batch.max(2))
            }
            _ => 1,
        }
    }

    /// A task registered; `waiting` counts it. True if the committer must be woken: for the
    /// first waiter (so that it times `max_wait`) and when the target is reached.
    pub(crate) fn registered(&mut self, waiting: usize, now: impl FnOnce() -> Instant) -> bool {
        if self.mode == GroupCommit::Immediate {
            return true;
        }
        let now = now();
        if waiting == 1 || self.first.is_none() {
            self.first = Some(now);
        }
        match self.window_start {
            None => self.window_start = Some(now),
            Some(start) if now.saturating_duration_since(start) >= PEAK_WINDOW => {
                self.previous_peak = self.peak;
                self.peak = 0;
                self.window_start = Some(now);
            }
            Some(_) => {}
        }
        self.peak = self.peak.max(waiting);
        waiting == 1 || waiting >= self.target()
    }

    /// Whether to sync now, with `waiting` tasks registered.
    pub(crate) fn due(&self, waiting: usize, now: impl FnOnce() -> Instant) -> Due {
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
            .map_or(max_wait, |first| now().saturating_duration_since(first));
        if age >= max_wait {
            return Due::Now;
        }
        Due::In(max_wait - age)
    }

    /// A flush woke `woken` tasks and left `remaining` waiting.
    pub(crate) fn woke(&mut self, woken: usize, remaining: usize, now: impl FnOnce() -> Instant) {
        if self.mode == GroupCommit::Immediate {
            return;
        }
        self.first = (remaining > 0).then(now);
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
            max_batch: 8,
            max_wait: WAIT,
        })
    }

    #[test]
    fn immediate_syncs_for_every_single_waiter() {
        let mut b = Batcher::new(GroupCommit::Immediate);
        let t = Instant::now();
        assert!(b.registered(1, || t));
        assert_eq!(b.due(1, || t), Due::Now);
        b.woke(5, 0, || t);
        assert!(b.registered(1, || t));
        assert_eq!(b.due(1, || t), Due::Now);
        assert_eq!(b.due(0, || t), Due::Idle);
    }

    #[test]
    fn a_caller_alone_is_synced_at_once() {
        let mut b = gather();
        let t = Instant::now();
        assert!(
            b.registered(1, || t),
            "the first waiter wakes the committer"
        );
        assert_eq!(
            b.due(1, || t),
            Due::Now,
            "nothing woken yet: no sign of company"
        );
        b.woke(1, 0, || t);
        assert!(b.registered(1, || t));
        assert_eq!(b.due(1, || t), Due::Now, "the last flush woke one");
    }

    #[test]
    fn callers_that_came_together_gather_until_max_batch() {
        let mut b = gather();
        let t = Instant::now();
        b.woke(3, 0, || t);
        assert!(
            b.registered(1, || t),
            "the first waiter wakes the committer to time the wait"
        );
        assert!(!b.registered(2, || t), "below max_batch: no kick");
        assert_eq!(b.due(7, || t), Due::In(WAIT));
        assert!(b.registered(8, || t), "max_batch reached: kick");
        assert_eq!(b.due(8, || t), Due::Now);
    }

    #[test]
    fn the_target_is_three_quarters_of_the_most_seen_waiting_in_the_last_window() {
        let mut b = gather();
        let t = Instant::now();
        b.woke(3, 0, || t);
        // Window 1: at most 4 wait at once.
        for waiting in 1..=4 {
            b.registered(waiting, || t);
        }
        b.woke(4, 0, || t);
        // Window 2 starts: its peak so far is 1, the last window's 4: the target is 3.
        let later = t + PEAK_WINDOW;
        b.registered(1, || later);
        assert_eq!(b.due(2, || later), Due::In(WAIT));
        assert_eq!(b.due(3, || later), Due::Now);
    }

    #[test]
    fn the_target_never_passes_max_batch_however_many_wait() {
        let mut b = gather();
        let t = Instant::now();
        b.woke(3, 0, || t);
        for waiting in 1..=100 {
            b.registered(waiting, || t);
        }
        b.woke(100, 0, || t);
        b.registered(1, || t);
        assert_eq!(
            b.due(8, || t),
            Due::Now,
            "max_batch is the most a batch waits for"
        );
        assert_eq!(b.due(7, || t), Due::In(WAIT));
    }

    #[test]
    fn the_first_waiter_never_waits_longer_than_max_wait() {
        let mut b = gather();
        let t = Instant::now();
        b.woke(3, 0, || t);
        b.registered(1, || t);
        assert_eq!(b.due(3, || t + WAIT / 4), Due::In(WAIT - WAIT / 4));
        assert_eq!(b.due(3, || t + WAIT), Due::Now);
    }

    #[test]
    fn waiters_left_after_a_flush_restart_the_clock() {
        let mut b = gather();
        let t = Instant::now();
        b.woke(3, 0, || t);
        b.registered(1, || t);
        let later = t + WAIT / 2;
        b.woke(3, 2, || later);
        assert_eq!(
            b.due(2, || later),
            Due::In(WAIT),
            "timed from the flush, not the first waiter"
        );
    }
}
