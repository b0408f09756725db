//! Statement latency of the PostgreSQL backend: one histogram per statement
//! (`idemlog_pg_statement_duration_seconds{statement}`), kept with relaxed atomic adds so that
//! recording costs a few nanoseconds and a scrape takes no lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::HistogramMetric;

/// The calls timed, as the `statement` label names them. A batch statement counts once per
/// attempt, whatever the calls it carries: `claim` (both claim statements), `complete`
/// (completions and releases, sent together), `insert_once` (both insert statements).
pub(crate) const STATEMENTS: [&str; 9] = [
    "claim",
    "complete",
    "extend",
    "get",
    "record",
    "write_records",
    "insert_once",
    "counter",
    "cleanup",
];

/// Bucket bounds in microseconds: 100 µs (a loopback round trip) to 5 s (the statement timeout's
/// order).
const BOUNDS_US: [u64; 15] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000,
];

#[derive(Default)]
struct One {
    buckets: [AtomicU64; BOUNDS_US.len() + 1],
    sum_us: AtomicU64,
}

/// Histograms of every statement.
#[derive(Default)]
pub(crate) struct StatementLatency {
    by_statement: [One; STATEMENTS.len()],
}

impl StatementLatency {
    /// Records one attempt of `statement` (from a pooled connection in hand to its result).
    pub(crate) fn observe(&self, statement: &str, took: Duration) {
        let Some(i) = STATEMENTS.iter().position(|s| *s == statement) else {
            return;
        };
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        let one = &self.by_statement[i];
        one.buckets[BOUNDS_US.partition_point(|&b| b < us)].fetch_add(1, Ordering::Relaxed);
        one.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// Every statement's histogram (those never run too, at zero).
    pub(crate) fn snapshot(&self) -> Vec<HistogramMetric> {
        STATEMENTS
            .iter()
            .zip(&self.by_statement)
            .map(|(statement, one)| {
                let counts: Vec<u64> = one
                    .buckets
                    .iter()
                    .map(|b| b.load(Ordering::Relaxed))
                    .collect();
                HistogramMetric {
                    name: "idemlog_pg_statement_duration_seconds",
                    help: "Duration of each PostgreSQL store call attempt, with a pooled connection in hand, by statement.",
                    label: Some(("statement", statement)),
                    bounds: BOUNDS_US.iter().map(|&b| b as f64 / 1e6).collect(),
                    count: counts.iter().sum(),
                    counts,
                    sum: one.sum_us.load(Ordering::Relaxed) as f64 / 1e6,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_are_counted_per_statement() {
        let latency = StatementLatency::default();
        latency.observe("claim", Duration::from_micros(300));
        latency.observe("claim", Duration::from_secs(10));
        latency.observe("nonesuch", Duration::from_micros(1));
        let all = latency.snapshot();
        let claim = all
            .iter()
            .find(|h| h.label == Some(("statement", "claim")))
            .unwrap();
        assert_eq!(claim.count, 2);
        assert_eq!(claim.counts[2], 1, "300 µs falls in (250 µs, 500 µs]");
        assert_eq!(
            *claim.counts.last().unwrap(),
            1,
            "10 s is above the last bound"
        );
        assert_eq!(all.iter().map(|h| h.count).sum::<u64>(), 2);
    }
}
