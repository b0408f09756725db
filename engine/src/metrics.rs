//! Figures for monitoring that cost nothing to read: counters and histograms kept with atomics as
//! the store works, so a scrape (`Store::metrics`) is O(1) in the number of keys and takes no lock
//! that a request could wait on.
//!
//! The engine has no metrics dependency: it exposes plain numbers and [`HistogramSnapshot`]s, and
//! the embedding application translates them into its exposition format.

use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds of the fdatasync duration buckets, in nanoseconds: 25 µs to 2.5 s (an NVMe flush
/// takes tens to hundreds of microseconds, a stalled or network disk seconds).
pub(crate) const FDATASYNC_BOUNDS_NS: &[u64] = &[
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
];

/// Upper bounds of the group-commit batch buckets, in operations per fdatasync.
pub(crate) const BATCH_BOUNDS: &[u64] = &[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096];

/// A histogram of `u64` observations in fixed buckets, updated with relaxed atomic adds.
pub(crate) struct AtomicHistogram {
    bounds: &'static [u64],
    /// One counter per bound, and one more for observations above the last bound.
    buckets: Box<[AtomicU64]>,
    sum: AtomicU64,
    /// Divides raw values (and the sum) for the snapshot: 1e9 turns nanoseconds into seconds.
    scale: f64,
}

impl AtomicHistogram {
    pub(crate) fn new(bounds: &'static [u64], scale: f64) -> Self {
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]), "bounds ascend");
        Self {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
            scale,
        }
    }

    /// Records one observation.
    pub(crate) fn observe(&self, value: u64) {
        let bucket = self.bounds.partition_point(|&b| b < value);
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(value, Ordering::Relaxed);
    }

    /// The current counts. Each bucket is read once; under concurrent observations the figures are
    /// from moments microseconds apart, never torn.
    pub(crate) fn snapshot(&self) -> HistogramSnapshot {
        let counts: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        HistogramSnapshot {
            bounds: self.bounds.iter().map(|&b| b as f64 / self.scale).collect(),
            count: counts.iter().sum(),
            counts,
            sum: self.sum.load(Ordering::Relaxed) as f64 / self.scale,
        }
    }
}

/// A histogram as read at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistogramSnapshot {
    /// Inclusive upper bound of each bucket (seconds for durations), ascending.
    pub bounds: Vec<f64>,
    /// Observations per bucket, not cumulative: `counts[i]` fell in `(bounds[i-1], bounds[i]]`, and
    /// the one extra last element counts those above the last bound.
    pub counts: Vec<u64>,
    /// Sum of all observations (seconds for durations).
    pub sum: f64,
    /// Number of observations (the sum of `counts`).
    pub count: u64,
}

/// The engine's own histograms, shared by the writer and the store.
pub(crate) struct EngineHistograms {
    /// Duration of each fdatasync of a log segment, in nanoseconds.
    pub(crate) fdatasync: AtomicHistogram,
    /// Operations made durable by each fdatasync (the group-commit batch).
    pub(crate) commit_batch: AtomicHistogram,
}

impl Default for EngineHistograms {
    fn default() -> Self {
        Self {
            fdatasync: AtomicHistogram::new(FDATASYNC_BOUNDS_NS, 1e9),
            commit_batch: AtomicHistogram::new(BATCH_BOUNDS, 1.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_whose_bound_they_do_not_exceed() {
        let h = AtomicHistogram::new(&[1, 2, 4], 1.0);
        for v in [0, 1, 2, 3, 4, 5, 100] {
            h.observe(v);
        }
        let s = h.snapshot();
        assert_eq!(s.bounds, vec![1.0, 2.0, 4.0]);
        assert_eq!(s.counts, vec![2, 1, 2, 2]);
        assert_eq!(s.count, 7);
        assert_eq!(s.sum, 115.0);
    }

    #[test]
    fn nanoseconds_are_reported_in_seconds() {
        let h = AtomicHistogram::new(FDATASYNC_BOUNDS_NS, 1e9);
        h.observe(30_000);
        let s = h.snapshot();
        assert_eq!(s.bounds[0], 25e-6);
        assert_eq!(s.counts[1], 1);
        assert!((s.sum - 30e-6).abs() < 1e-12);
    }
}
