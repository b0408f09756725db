//! The built-in stores through the public conformance suite (`testkit::conformance`), as a store
//! for another database would be: the embedded engine (in memory, on a manual clock) and
//! PostgreSQL (a fresh schema per scenario, the database's clock; needs `DATABASE_URL`, see
//! `common`).

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use idemlog::testkit::FaultyStorage;
use idemlog::{ManualClock, Options};
use idemlog_idempotency::backends::embedded::EmbeddedBackend;
use idemlog_idempotency::store::{
    Claim, ClaimExtras, Fingerprint, Gauge, Health, HeldClaim, IdempotencyStore, InsertOnce,
    KeyRecord, RecordWrite, StoreError, StoredResponse,
};
use idemlog_idempotency::testkit::conformance::{self, Backend, Fixture};

/// The embedded engine on an in-memory file system, its clock moved by the scenarios.
struct Embedded;

#[async_trait]
impl Backend for Embedded {
    async fn open(&self, lease: Duration) -> Fixture {
        let clock = ManualClock::new(1_700_000_000_000);
        let options = Options::default()
            .storage(Arc::new(FaultyStorage::new()))
            .clock(Arc::new(clock.clone()))
            .lease(lease)
            .max_value_bytes(64 * 1024);
        let store = EmbeddedBackend::open("/data", options).expect("open the embedded store");
        Fixture::manual_clock(Arc::new(store), clock)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_store_passes_the_conformance_suite() {
    conformance::run(&Embedded).await;
}

/// A store that forgets the business records of a completion: the suite must refuse it.
struct ForgetsRecords(EmbeddedBackend);

#[async_trait]
impl IdempotencyStore for ForgetsRecords {
    async fn claim_with(
        &self,
        scope: &str,
        key: &str,
        fingerprint: &Fingerprint,
        ttl: Duration,
        extras: &ClaimExtras<'_>,
    ) -> Result<Claim, StoreError> {
        self.0
            .claim_with(scope, key, fingerprint, ttl, extras)
            .await
    }
    async fn complete(
        &self,
        token: &HeldClaim,
        response: &StoredResponse,
        _records: &[RecordWrite],
    ) -> Result<(), StoreError> {
        self.0.complete(token, response, &[]).await
    }
    async fn release(&self, token: &HeldClaim) -> Result<(), StoreError> {
        self.0.release(token).await
    }
    async fn extend(&self, token: &HeldClaim) -> Result<Duration, StoreError> {
        self.0.extend(token).await
    }
    async fn get(&self, scope: &str, key: &str) -> Result<Option<KeyRecord>, StoreError> {
        self.0.get(scope, key).await
    }
    async fn record(&self, namespace: &str, key: &str) -> Result<Option<Bytes>, StoreError> {
        self.0.record(namespace, key).await
    }
    async fn write_records(&self, writes: &[RecordWrite]) -> Result<(), StoreError> {
        self.0.write_records(writes).await
    }
    async fn insert_once(
        &self,
        write: &RecordWrite,
        counter: &'static str,
    ) -> Result<InsertOnce, StoreError> {
        self.0.insert_once(write, counter).await
    }
    async fn counter(&self, name: &'static str) -> Result<u64, StoreError> {
        self.0.counter(name).await
    }
    fn health(&self) -> Health {
        self.0.health()
    }
    async fn gauges(&self) -> Vec<Gauge> {
        self.0.gauges().await
    }
    fn kind(&self) -> &'static str {
        "forgets-records"
    }
    async fn close(&self) -> Result<(), StoreError> {
        self.0.close().await
    }
}

struct Forgetful;

#[async_trait]
impl Backend for Forgetful {
    async fn open(&self, lease: Duration) -> Fixture {
        let clock = ManualClock::new(1_700_000_000_000);
        let options = Options::default()
            .storage(Arc::new(FaultyStorage::new()))
            .clock(Arc::new(clock.clone()))
            .lease(lease);
        let store = EmbeddedBackend::open("/data", options).expect("open the embedded store");
        Fixture::manual_clock(Arc::new(ForgetsRecords(store)), clock)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_forgets_business_records_fails_the_suite() {
    let scenario = conformance::SCENARIOS
        .iter()
        .find(|s| s.name == "a_business_record_exists_exactly_when_its_key_completes")
        .expect("the scenario exists");
    let outcome =
        tokio::spawn(async move { conformance::run_one(&Forgetful, scenario).await }).await;
    assert!(
        outcome.is_err_and(|e| e.is_panic()),
        "the suite passed a store that loses business records"
    );
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use idemlog_idempotency::StoreHandle;
    use idemlog_idempotency::backends::postgres::{PgConfig, PostgresBackend};
    use parking_lot::Mutex;

    /// PostgreSQL, one fresh schema per scenario, dropped afterwards.
    struct Postgres {
        url: String,
        schemas: Mutex<Vec<String>>,
    }

    fn unique_schema() -> String {
        use std::hash::{BuildHasher, Hasher};
        let n = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        format!("conformance_{n:016x}")
    }

    #[async_trait]
    impl Backend for Postgres {
        async fn open(&self, lease: Duration) -> Fixture {
            let schema = unique_schema();
            self.schemas.lock().push(schema.clone());
            let config = PgConfig::new(self.url.clone()).schema(schema).lease(lease);
            let store = PostgresBackend::connect(config)
                .await
                .expect("connect to PostgreSQL");
            Fixture::wall_clock(Arc::new(store))
        }

        async fn dispose(&self, _store: StoreHandle) {
            let schemas = std::mem::take(&mut *self.schemas.lock());
            let Ok((client, connection)) =
                tokio_postgres::connect(&self.url, tokio_postgres::NoTls).await
            else {
                return;
            };
            tokio::spawn(connection);
            for schema in schemas {
                let _ = client
                    .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                    .await;
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_postgres_store_passes_the_conformance_suite() {
        let Some(url) = common::database_url() else {
            return;
        };
        let backend = Postgres {
            url,
            schemas: Mutex::new(Vec::new()),
        };
        conformance::run(&backend).await;
    }
}
