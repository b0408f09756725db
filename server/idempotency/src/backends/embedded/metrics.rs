//! The engine's numbers as the store interface exports them.
//!
//! Running counts and histograms of the open engine store, under the `idemlog_*` names this crate
//! owns. They are O(1) to read, whatever the number of keys.

use idemlog::StoreMetrics;

use crate::store::{Gauge, HistogramMetric};

/// The gauges of one metrics snapshot.
pub(super) fn gauges(m: &StoreMetrics) -> Vec<Gauge> {
    let g = |name, help, value: u64| Gauge {
        name,
        help,
        value: value as f64,
    };
    vec![
        g(
            "idemlog_records",
            "Idempotency records held (expired ones count until the next sweep).",
            m.records,
        ),
        g(
            "idemlog_records_in_progress",
            "Claims still in progress.",
            m.in_progress,
        ),
        g(
            "idemlog_side_records",
            "Side records held (expired ones count until the next sweep).",
            m.side_records,
        ),
        g(
            "idemlog_disk_bytes",
            "Bytes of all log segments.",
            m.disk_bytes,
        ),
        g(
            "idemlog_live_bytes",
            "Bytes of the log operations the held records point at.",
            m.live_bytes,
        ),
        g("idemlog_segments", "Log segment files.", m.segments),
        g(
            "idemlog_frames_appended_total",
            "Frames appended since open.",
            m.frames_appended,
        ),
        g(
            "idemlog_bytes_appended_total",
            "Bytes appended to the log since open.",
            m.bytes_appended,
        ),
        g(
            "idemlog_syncs_total",
            "fdatasync calls since open.",
            m.syncs,
        ),
        g(
            "idemlog_compactions_total",
            "Compactions since open.",
            m.compactions,
        ),
        g(
            "idemlog_compaction_failures_total",
            "Compactions that failed since open.",
            m.compaction_failures,
        ),
        g(
            "idemlog_compaction_reclaimed_bytes_total",
            "Segment bytes compactions deleted, less the bytes they wrote, since open.",
            m.compaction_reclaimed_bytes,
        ),
    ]
}

/// The histograms of one metrics snapshot.
pub(super) fn histograms(m: StoreMetrics) -> Vec<HistogramMetric> {
    vec![
        HistogramMetric::from_engine(
            "idemlog_fdatasync_duration_seconds",
            "Duration of each fdatasync of the log, since open.",
            m.fdatasync_seconds,
        ),
        HistogramMetric::from_engine(
            "idemlog_commit_batch_operations",
            "Operations made durable by one fdatasync (the group-commit batch), since open.",
            m.commit_batch_operations,
        ),
    ]
}
