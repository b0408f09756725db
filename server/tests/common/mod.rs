//! Shared fixture: the real router (`idemlog_server::router::router`) on an in-memory, fault-injecting store
//! with a manual clock, driven with `tower::ServiceExt::oneshot`.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use idemlog::testkit::FaultyStorage;
use idemlog::{Durability, ManualClock, Options};
use idemlog_idempotency::backends::embedded::EmbeddedBackend;
use idemlog_idempotency::{FingerprintMode, Outcome};
use idemlog_server::auth::ApiKeys;
use idemlog_server::router::{RouterConfig, Services, router};
use tower::ServiceExt;

pub const KEY_A: &str = "key_a";
pub const KEY_B: &str = "key_b";
pub const ACCOUNT_A: &str = "acct_a";
pub const ACCOUNT_B: &str = "acct_b";
pub const LEASE: Duration = Duration::from_secs(30);
pub const TTL: Duration = Duration::from_secs(24 * 3600);
pub const BODY: &str = r#"{"amount": 100.00, "currency": "BRL"}"#;

pub struct Settings {
    pub latency: Duration,
    pub fail_after_charge: u64,
    pub max_body_bytes: usize,
    pub idempotency: bool,
    pub fingerprint: FingerprintMode,
    /// `None` makes the server call the store inline instead of on the blocking pool.
    pub durability: Durability,
    /// `Retry-After` hint of a 409.
    pub retry_after: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            latency: Duration::ZERO,
            fail_after_charge: 0,
            max_body_bytes: 64 * 1024,
            idempotency: true,
            fingerprint: FingerprintMode::CanonicalJson,
            durability: Durability::Sync,
            retry_after: Duration::from_secs(1),
        }
    }
}

pub struct TestApp {
    pub fs: FaultyStorage,
    pub clock: ManualClock,
    pub dir: PathBuf,
    pub settings: Settings,
    pub keys: Vec<(String, String)>,
    pub store: EmbeddedBackend,
    pub services: Services,
    pub router: Router,
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("JSON body")
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }
}

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {:?} {}",
            self.status,
            self.headers,
            String::from_utf8_lossy(&self.body)
        )
    }
}

impl TestApp {
    pub fn new() -> Self {
        Self::with(Settings::default())
    }

    pub fn with(settings: Settings) -> Self {
        Self::build(settings, default_keys())
    }

    /// An app whose API keys authenticate these accounts.
    pub fn with_keys(keys: &[(&str, &str)]) -> Self {
        let keys = keys
            .iter()
            .map(|(k, a)| ((*k).to_owned(), (*a).to_owned()))
            .collect();
        Self::build(Settings::default(), keys)
    }

    fn build(settings: Settings, keys: Vec<(String, String)>) -> Self {
        let fs = FaultyStorage::new();
        let clock = ManualClock::new(1_700_000_000_000);
        let dir = PathBuf::from("/data");
        let (store, services, router) = build(&fs, &clock, &dir, &settings, &keys);
        Self {
            fs,
            clock,
            dir,
            settings,
            keys,
            store,
            services,
            router,
        }
    }

    /// Simulates a process crash (every handle of the old process dies; writes survive) and starts
    /// a new process on the same data directory.
    pub fn crash_and_restart(&mut self) {
        self.fs.crash(idemlog::testkit::CrashMode::ProcessOnly);
        self.reopen();
    }

    /// Clean shutdown (close flushes and syncs) and a new process on the same data directory.
    pub fn restart(&mut self) {
        self.store
            .engine()
            .expect("store open")
            .close()
            .expect("close");
        self.fs.crash(idemlog::testkit::CrashMode::DropUnsynced);
        self.reopen();
    }

    fn reopen(&mut self) {
        let (store, services, router) =
            build(&self.fs, &self.clock, &self.dir, &self.settings, &self.keys);
        self.store = store;
        self.services = services;
        self.router = router;
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

    /// Waits (bounded) until the layer's spawned tasks are done.
    pub async fn idle(&self) {
        if let Some(layer) = &self.services.idempotency {
            tokio::time::timeout(Duration::from_secs(10), layer.in_flight().wait_idle())
                .await
                .expect("in-flight requests finish");
        }
    }
}

fn build(
    fs: &FaultyStorage,
    clock: &ManualClock,
    dir: &PathBuf,
    settings: &Settings,
    keys: &[(String, String)],
) -> (EmbeddedBackend, Services, Router) {
    let options = Options::default()
        .storage(Arc::new(fs.clone()))
        .clock(Arc::new(clock.clone()))
        .lease(LEASE)
        .durability(settings.durability)
        .max_value_bytes(64 * 1024);
    let store = EmbeddedBackend::open(dir, options).expect("open store");
    let keys = ApiKeys::new(keys).expect("keys");
    let config = RouterConfig {
        key_ttl: TTL,
        lease: LEASE,
        max_body_bytes: settings.max_body_bytes,
        max_response_bytes: 64 * 1024,
        fingerprint: settings.fingerprint,
        gateway_latency: settings.latency,
        gateway_fail_after_charge: settings.fail_after_charge,
        idempotency: settings.idempotency,
        retry_after: settings.retry_after,
        max_live_keys_per_account: 0,
    };
    let services = Services::new(Arc::new(store.clone()), keys, &config);
    let router = router(&services);
    (store, services, router)
}

fn default_keys() -> Vec<(String, String)> {
    vec![
        (KEY_A.into(), ACCOUNT_A.into()),
        (KEY_B.into(), ACCOUNT_B.into()),
    ]
}

pub fn payment(api_key: &str, idempotency_key: Option<&str>, body: &str) -> Request<Body> {
    let mut builder = Request::post("/payments")
        .header("authorization", format!("Bearer {api_key}"))
        .header("content-type", "application/json");
    if let Some(key) = idempotency_key {
        builder = builder.header("idempotency-key", key);
    }
    builder.body(Body::from(body.to_owned())).expect("request")
}

pub async fn send(router: &Router, request: Request<Body>) -> Reply {
    let response = router.clone().oneshot(request).await.expect("infallible");
    let status = response.status();
    let headers = response.headers().clone();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("body")
        .to_vec();
    Reply {
        status,
        headers,
        body,
    }
}

// One definition of where PostgreSQL tests find their database (and when a missing one fails
// rather than skips), shared with the layer crate's tests.
#[path = "../../idempotency/tests/common/mod.rs"]
mod postgres_url;
#[allow(unused_imports)] // not every test file that includes this fixture uses PostgreSQL
pub use postgres_url::database_url;
