//! The layer's and the store's numbers, for a `prometheus-client` registry.
//!
//! The crate owns these series and their names; the application that mounts the layer registers
//! them next to its own:
//! - `idempotency_requests_total{outcome}`: requests per outcome at the layer (labels in
//!   [`Outcome`]), counted since the process started;
//! - `idemlog_store_info{backend}`: 1, labelled with the store that serves (`embedded`,
//!   `postgres`: [`IdempotencyStore::kind`]);
//! - `idemlog_store_up`: 1 while the store serves ([`IdempotencyStore::health`]), 0 while it is
//!   poisoned, being reopened or unreachable;
//! - `idemlog_*`: the backend's own numbers ([`IdempotencyStore::gauges`]) and histograms
//!   ([`IdempotencyStore::histograms`]).
//!
//! A [`Snapshot`] is read once per scrape (the store's gauges may need an `await`) and registered
//! as a collector: it reads atomics and the backends' running counts, never the store's keys.
//!
//! ```
//! # async fn scrape(counts: &idemlog_idempotency::OutcomeCounts, store: &dyn idemlog_idempotency::IdempotencyStore) -> String {
//! let mut registry = prometheus_client::registry::Registry::default();
//! idemlog_idempotency::metrics::Snapshot::read(counts, store).await.register(&mut registry);
//! let mut text = String::new();
//! prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap();
//! text
//! # }
//! ```

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::outcome::{Outcome, OutcomeCounts};
use crate::store::{Gauge, Health, HistogramMetric, IdempotencyStore};

/// The layer's and the store's figures, read at one moment.
#[derive(Debug, Clone)]
pub struct Snapshot {
    outcomes: Vec<(&'static str, u64)>,
    store_up: bool,
    backend: Option<&'static str>,
    gauges: Vec<Gauge>,
    histograms: Vec<HistogramMetric>,
}

impl Snapshot {
    /// Reads the layer's outcome counters and the store's health, gauges and histograms.
    pub async fn read(counts: &OutcomeCounts, store: &dyn IdempotencyStore) -> Self {
        Self {
            outcomes: Outcome::ALL
                .iter()
                .map(|&o| (o.label(), counts.get(o)))
                .collect(),
            store_up: store.health() == Health::Ready,
            backend: Some(store.kind()),
            gauges: store.gauges().await,
            histograms: store.histograms(),
        }
    }

    /// A snapshot of given figures (tests, or a store read some other way).
    pub fn new(
        counts: &OutcomeCounts,
        store_up: bool,
        gauges: Vec<Gauge>,
        histograms: Vec<HistogramMetric>,
    ) -> Self {
        Self {
            outcomes: Outcome::ALL
                .iter()
                .map(|&o| (o.label(), counts.get(o)))
                .collect(),
            store_up,
            backend: None,
            gauges,
            histograms,
        }
    }

    /// Adds these figures to `registry`.
    pub fn register(self, registry: &mut Registry) {
        registry.register_collector(Box::new(self));
    }
}

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // Counter names are registered without `_total`: the encoder appends it.
        let mut family = encoder.encode_descriptor(
            "idempotency_requests",
            "Requests at the idempotency layer, by outcome.",
            None,
            MetricType::Counter,
        )?;
        for (outcome, count) in &self.outcomes {
            let labels = [("outcome", *outcome)];
            family
                .encode_family(&labels)?
                .encode_counter::<NoLabelSet, _, u64>(count, None)?;
        }
        let mut up = encoder.encode_descriptor(
            "idemlog_store_up",
            "1 while the idempotency store serves, 0 while it is poisoned, reopening or unreachable.",
            None,
            MetricType::Gauge,
        )?;
        up.encode_gauge(&i64::from(self.store_up))?;
        if let Some(backend) = self.backend {
            let mut info = encoder.encode_descriptor(
                "idemlog_store_info",
                "1, labelled with the idempotency store that serves (embedded or postgres).",
                None,
                MetricType::Gauge,
            )?;
            let labels = [("backend", backend)];
            info.encode_family(&labels)?.encode_gauge(&1i64)?;
        }
        for gauge in &self.gauges {
            match gauge.name.strip_suffix("_total") {
                Some(name) => encoder
                    .encode_descriptor(name, gauge.help, None, MetricType::Counter)?
                    .encode_counter::<NoLabelSet, _, u64>(&gauge.value, None)?,
                None => encoder
                    .encode_descriptor(gauge.name, gauge.help, None, MetricType::Gauge)?
                    .encode_gauge(&gauge.value)?,
            }
        }
        // Entries sharing a name (one per label value) are one family: one descriptor.
        let mut i = 0;
        while i < self.histograms.len() {
            let first = &self.histograms[i];
            let mut metric =
                encoder.encode_descriptor(first.name, first.help, None, MetricType::Histogram)?;
            while let Some(h) = self.histograms.get(i).filter(|h| h.name == first.name) {
                let buckets: Vec<(f64, u64)> = h
                    .bounds
                    .iter()
                    .copied()
                    .chain(std::iter::once(f64::INFINITY))
                    .zip(h.counts.iter().copied())
                    .collect();
                match h.label {
                    Some((key, value)) => {
                        let labels = [(key, value)];
                        metric
                            .encode_family(&labels)?
                            .encode_histogram::<NoLabelSet>(h.sum, h.count, &buckets, None)?;
                    }
                    None => {
                        metric.encode_histogram::<NoLabelSet>(h.sum, h.count, &buckets, None)?
                    }
                }
                i += 1;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(snapshot: Snapshot) -> String {
        let mut registry = Registry::default();
        snapshot.register(&mut registry);
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, &registry).expect("encode");
        out
    }

    #[test]
    fn exposition_keeps_every_series_name() {
        let counts = OutcomeCounts::default();
        counts.record(Outcome::Replayed);
        let snapshot = Snapshot::new(
            &counts,
            true,
            vec![
                Gauge {
                    name: "idemlog_records",
                    help: "Records.",
                    value: 3.0,
                },
                Gauge {
                    name: "idemlog_syncs_total",
                    help: "Syncs.",
                    value: 4.0,
                },
            ],
            vec![HistogramMetric {
                name: "idemlog_pg_statement_duration_seconds",
                help: "Statement latency.",
                label: Some(("statement", "claim")),
                bounds: vec![0.001, 0.01],
                counts: vec![1, 2, 3],
                sum: 1.5,
                count: 6,
            }],
        );
        let text = text(snapshot);
        assert!(text.contains("idempotency_requests_total{outcome=\"replayed\"} 1\n"));
        for outcome in Outcome::ALL {
            assert!(text.contains(&format!("outcome=\"{}\"", outcome.label())));
        }
        assert!(text.contains("\nidemlog_store_up 1\n"), "{text}");
        assert!(text.contains("\nidemlog_records 3"), "{text}");
        assert!(
            text.contains("# TYPE idemlog_syncs_total counter\n"),
            "{text}"
        );
        assert!(text.contains("\nidemlog_syncs_total 4"), "{text}");
        assert!(
            text.contains(
                "idemlog_pg_statement_duration_seconds_bucket{statement=\"claim\",le=\"0.01\"} 3\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "idemlog_pg_statement_duration_seconds_bucket{statement=\"claim\",le=\"+Inf\"} 6\n"
            ),
            "{text}"
        );
    }
}
