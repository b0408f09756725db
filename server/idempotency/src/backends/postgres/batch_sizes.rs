//! How many calls each batch statement carried (`idemlog_pg_batch_calls{statement}`), so an
//! operator sees batching work: the histogram's `_count` is the statements sent and its `_sum`
//! the calls they carried, so `_sum / _count` is calls per statement, and its inverse statements
//! per call. Relaxed atomic adds, no lock on a scrape.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::HistogramMetric;

/// The batched statements, as the `statement` label names them.
pub(crate) const BATCHED: [&str; 3] = ["claim", "complete", "insert_once"];

/// Bucket bounds: powers of two up to the largest batch (`lanes::MAX_BATCH_CALLS`).
const BOUNDS: [u64; 10] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512];

#[derive(Default)]
struct One {
    buckets: [AtomicU64; BOUNDS.len() + 1],
    sum: AtomicU64,
}

/// One histogram per batched statement.
#[derive(Default)]
pub(crate) struct BatchSizes {
    by_statement: [One; BATCHED.len()],
}

impl BatchSizes {
    /// Records one statement attempt of `statement` carrying `calls` calls.
    pub(crate) fn observe(&self, statement: &str, calls: usize) {
        let Some(i) = BATCHED.iter().position(|s| *s == statement) else {
            return;
        };
        let calls = calls as u64;
        let one = &self.by_statement[i];
        one.buckets[BOUNDS.partition_point(|&b| b < calls)].fetch_add(1, Ordering::Relaxed);
        one.sum.fetch_add(calls, Ordering::Relaxed);
    }

    /// Every batched statement's histogram (those never run too, at zero).
    pub(crate) fn snapshot(&self) -> Vec<HistogramMetric> {
        BATCHED
            .iter()
            .zip(&self.by_statement)
            .map(|(statement, one)| {
                let counts: Vec<u64> = one
                    .buckets
                    .iter()
                    .map(|b| b.load(Ordering::Relaxed))
                    .collect();
                HistogramMetric {
                    name: "idemlog_pg_batch_calls",
                    help: "Calls carried by each batch statement attempt, by statement \
                           (_sum / _count: calls per statement).",
                    label: Some(("statement", statement)),
                    bounds: BOUNDS.iter().map(|&b| b as f64).collect(),
                    count: counts.iter().sum(),
                    counts,
                    sum: one.sum.load(Ordering::Relaxed) as f64,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_sizes_are_counted_per_statement_with_their_sum() {
        let sizes = BatchSizes::default();
        sizes.observe("claim", 1);
        sizes.observe("claim", 20);
        sizes.observe("claim", 512);
        sizes.observe("nonesuch", 3);
        let all = sizes.snapshot();
        let claim = all
            .iter()
            .find(|h| h.label == Some(("statement", "claim")))
            .unwrap();
        assert_eq!(claim.count, 3);
        assert_eq!(claim.sum, 533.0);
        assert_eq!(claim.counts[0], 1, "1 falls in the first bucket (<= 1)");
        assert_eq!(claim.counts[5], 1, "20 falls in (16, 32]");
        assert_eq!(claim.counts[9], 1, "512 falls in (256, 512]");
        assert_eq!(all.iter().map(|h| h.count).sum::<u64>(), 3);
    }
}
