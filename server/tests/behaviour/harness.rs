//! One harness, two backends: the real router on the embedded engine (in memory) or on PostgreSQL
//! (a fresh schema per test).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use idemlog::testkit::FaultyStorage;
use idemlog::{ManualClock, Options};
use idemlog_idempotency::backends::embedded::EmbeddedBackend;
use idemlog_idempotency::backends::postgres::{PgConfig, PostgresBackend};
use idemlog_idempotency::{FingerprintMode, Outcome, StoreHandle};
use idemlog_server::auth::ApiKeys;
use idemlog_server::router::{RouterConfig, Services, router};

pub use crate::common::{BODY, KEY_A, KEY_B, Reply, database_url, payment, send};
/// Short enough for PostgreSQL tests to wait out.
pub const LEASE: Duration = Duration::from_millis(400);
pub const TTL: Duration = Duration::from_millis(1500);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Embedded,
    Postgres,
}

pub struct Settings {
    pub latency: Duration,
    pub fail_after_charge: u64,
    /// `--max-live-keys-per-account` (0: no limit).
    pub max_live_keys: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            latency: Duration::ZERO,
            fail_after_charge: 0,
            max_live_keys: 0,
        }
    }
}

pub struct Harness {
    pub store: StoreHandle,
    pub services: Services,
    pub router: Router,
    drop_schema: Option<(String, String)>,
}

fn unique_schema() -> String {
    use std::hash::{BuildHasher, Hasher};
    let n = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    format!("b_{n:016x}")
}

impl Harness {
    /// The app on `backend`, or `None` when that backend is not available here (PostgreSQL without
    /// `DATABASE_URL` on a developer machine).
    pub async fn start(backend: Backend, settings: Settings) -> Option<Harness> {
        let (store, drop_schema): (StoreHandle, _) = match backend {
            Backend::Embedded => {
                let clock = ManualClock::new(1_700_000_000_000);
                let options = Options::default()
                    .storage(Arc::new(FaultyStorage::new()))
                    .clock(Arc::new(clock.clone()))
                    .lease(LEASE)
                    .max_value_bytes(64 * 1024);
                let store = EmbeddedBackend::open("/data", options).expect("open store");
                (Arc::new(store), None)
            }
            Backend::Postgres => {
                let url = database_url()?;
                let schema = unique_schema();
                let config = PgConfig::new(url.clone())
                    .schema(schema.clone())
                    .lease(LEASE);
                let store = PostgresBackend::connect(config)
                    .await
                    .expect("connect to PostgreSQL");
                (Arc::new(store), Some((url, schema)))
            }
        };
        let keys = ApiKeys::new(&[
            (KEY_A.to_owned(), "acct_a".to_owned()),
            (KEY_B.to_owned(), "acct_b".to_owned()),
        ])
        .expect("keys");
        let config = RouterConfig {
            key_ttl: TTL,
            lease: LEASE,
            retry_after: Duration::from_secs(1),
            max_body_bytes: 64 * 1024,
            max_response_bytes: 64 * 1024,
            fingerprint: FingerprintMode::CanonicalJson,
            gateway_latency: settings.latency,
            gateway_fail_after_charge: settings.fail_after_charge,
            idempotency: true,
            max_live_keys_per_account: settings.max_live_keys,
        };
        let services = Services::new(Arc::clone(&store), keys, &config);
        let router = router(&services);
        Some(Harness {
            store,
            services,
            router,
            drop_schema,
        })
    }

    pub async fn charges(&self) -> u64 {
        self.services
            .gateway
            .charges_total()
            .await
            .expect("charge counter")
    }

    pub fn outcome(&self, outcome: Outcome) -> u64 {
        self.services
            .idempotency
            .as_ref()
            .map_or(0, |layer| layer.counts().get(outcome))
    }

    pub async fn send(&self, request: Request<Body>) -> Reply {
        send(&self.router, request).await
    }

    pub async fn pay(&self, api_key: &str, idempotency_key: &str, body: &str) -> Reply {
        self.send(payment(api_key, Some(idempotency_key), body))
            .await
    }

    pub async fn get(&self, api_key: &str, path: &str) -> Reply {
        let request = Request::get(path)
            .header("authorization", format!("Bearer {api_key}"))
            .body(Body::empty())
            .expect("request");
        self.send(request).await
    }

    /// Closes the store and drops the test's schema.
    pub async fn finish(self) {
        let _ = self.store.close().await;
        let Some((url, schema)) = self.drop_schema else {
            return;
        };
        if let Ok((client, connection)) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await
        {
            tokio::spawn(connection);
            let _ = client
                .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                .await;
        }
    }
}
