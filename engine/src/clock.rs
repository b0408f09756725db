//! Time as the engine sees it, from an injectable clock: wall-clock milliseconds since the Unix epoch
//! for what is persisted (creation times, TTL expiry), and a monotonic reading for lease decisions.
//!
//! Invariants: TTL expiry reads [`Clock::now_ms`]; whether a lease is still running is decided on
//! [`Clock::monotonic_ms`] only, so an NTP step of the wall clock neither expires a live claim (a
//! forward step) nor stretches a dead holder's lease (a backward step). Monotonic readings mean nothing
//! across processes and are never persisted. Tests drive both with a [`ManualClock`] instead of
//! sleeping, and can move them independently.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of time: the wall clock, and a monotonic clock for leases.
pub trait Clock: Send + Sync + 'static {
    /// The current wall-clock time, in milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;

    /// Milliseconds on a clock that never goes back and is not stepped by NTP, from an arbitrary
    /// origin within this process. The default reads the process's [`Instant`] clock; override it
    /// together with [`Clock::now_ms`] when injecting time.
    fn monotonic_ms(&self) -> u64 {
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        duration_ms(ORIGIN.get_or_init(Instant::now).elapsed())
    }
}

/// The operating system's wall clock, and its monotonic clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        // A clock set before 1970 reads as the epoch rather than failing every operation.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }
}

/// A clock that only moves when told to. Clones share the same time.
///
/// It has a wall reading and a monotonic reading, both starting at `start_ms`. [`ManualClock::advance`]
/// moves both (time passing); [`ManualClock::set`], [`ManualClock::step_wall_forward`] and
/// [`ManualClock::step_wall_back`] move only the wall reading (an NTP step);
/// [`ManualClock::advance_monotonic`] moves only the monotonic one.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
    monotonic: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock reading `start_ms` on both its wall and monotonic readings.
    pub fn new(start_ms: u64) -> Self {
        Self {
            now: Arc::new(AtomicU64::new(start_ms)),
            monotonic: Arc::new(AtomicU64::new(start_ms)),
        }
    }

    /// Lets time pass: moves the wall and the monotonic readings forward.
    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(duration_ms(by), Ordering::SeqCst);
        self.monotonic.fetch_add(duration_ms(by), Ordering::SeqCst);
    }

    /// Sets the wall clock to an absolute time (an NTP step); the monotonic reading does not move.
    pub fn set(&self, now_ms: u64) {
        self.now.store(now_ms, Ordering::SeqCst);
    }

    /// Steps the wall clock forward without time passing.
    pub fn step_wall_forward(&self, by: Duration) {
        self.now.fetch_add(duration_ms(by), Ordering::SeqCst);
    }

    /// Steps the wall clock back (saturating at the epoch) without time passing.
    pub fn step_wall_back(&self, by: Duration) {
        let by = duration_ms(by);
        let _ = self
            .now
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_sub(by))
            });
    }

    /// Moves only the monotonic reading forward (time passed while the wall clock was stepped back).
    pub fn advance_monotonic(&self, by: Duration) {
        self.monotonic.fetch_add(duration_ms(by), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }

    fn monotonic_ms(&self) -> u64 {
        self.monotonic.load(Ordering::SeqCst)
    }
}

/// Whole milliseconds of a duration, saturating.
pub(crate) fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
