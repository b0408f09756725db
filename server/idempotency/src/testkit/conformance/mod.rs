//! The backend conformance suite: the scenarios every [`IdempotencyStore`] must pass, run against
//! a store the caller opens, through the layer and directly.
//!
//! The built-in stores (the embedded engine and PostgreSQL) pass it in this crate's tests; a store
//! for another database proves the same behaviour with one call:
//!
//! ```no_run
//! use std::time::Duration;
//! use idemlog_idempotency::testkit::conformance::{self, Backend, Fixture};
//!
//! struct MyBackend;
//!
//! #[async_trait::async_trait]
//! impl Backend for MyBackend {
//!     async fn open(&self, lease: Duration) -> Fixture {
//!         // A fresh, empty store whose claims hold their key for `lease`.
//!         # let store: idemlog_idempotency::StoreHandle = unimplemented!();
//!         Fixture::wall_clock(store)
//!     }
//! }
//!
//! # async fn test() {
//! conformance::run(&MyBackend).await;
//! # }
//! ```
//!
//! Each scenario gets a fresh store from [`Backend::open`], runs, and hands the store back to
//! [`Backend::dispose`]. Time passes on the store's clock: a [`Fixture`] with a
//! [`idemlog::ManualClock`] is advanced at once; one on the wall clock (a database's `now()`)
//! sleeps, so leases and TTLs are short ([`LEASE`], [`TTL`]) and the whole suite takes seconds.
//!
//! What it checks ([`SCENARIOS`]): one handler run per `(scope, key)` under concurrency, byte for
//! byte replays, 422 for another request under a used key (with the differing fields and no
//! values), 400 without a key, scopes that never meet, 409 with `Retry-After` while the first runs,
//! a 5xx that releases the key, expiry after the TTL, takeover of a stuck claim with the old holder
//! fenced out, business records that exist exactly when their key completes, the key status read
//! that changes nothing, the per-scope quota of live keys (exact under concurrency), and
//! write-once records with their counter.
//!
//! [`IdempotencyStore`]: crate::IdempotencyStore

mod app;
mod scenarios;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;
use idemlog::ManualClock;

use crate::StoreHandle;

pub use self::app::{App, Reply, Settings};

/// The lease every scenario's store is opened with: short, so that a wall-clock store waits it out
/// quickly.
pub const LEASE: Duration = Duration::from_millis(400);
/// The TTL of every key the scenarios claim.
pub const TTL: Duration = Duration::from_millis(1500);

/// A store under test, and how time passes for it.
pub struct Fixture {
    /// The store, fresh and empty.
    pub store: StoreHandle,
    /// The store's clock when the test drives it; `None` when the store keeps its own time (a
    /// database's `now()`), and time passes by sleeping.
    pub clock: Option<ManualClock>,
}

impl Fixture {
    /// A store whose clock is `clock`, moved by [`App::pass`].
    pub fn manual_clock(store: StoreHandle, clock: ManualClock) -> Self {
        Self {
            store,
            clock: Some(clock),
        }
    }

    /// A store on the wall clock: [`App::pass`] sleeps.
    pub fn wall_clock(store: StoreHandle) -> Self {
        Self { store, clock: None }
    }
}

/// A store backend under test: opens one fresh store per scenario.
#[async_trait]
pub trait Backend: Send + Sync {
    /// A fresh, empty store whose claims hold their key for `lease`.
    async fn open(&self, lease: Duration) -> Fixture;

    /// Done with a scenario's store (closed by then): remove what [`Backend::open`] made (a
    /// schema, a directory). Does nothing by default.
    async fn dispose(&self, store: StoreHandle) {
        let _ = store;
    }
}

/// One scenario: its name and what it runs.
pub struct Scenario {
    /// The behaviour it proves, as a test name.
    pub name: &'static str,
    /// The settings of the app around the store.
    pub settings: Settings,
    run: Run,
}

/// A scenario's body.
type Run = for<'a> fn(&'a App) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Every scenario of the suite.
pub const SCENARIOS: &[Scenario] = scenarios::ALL;

/// Runs every scenario against `backend`, each on a fresh store, and panics naming the first
/// scenario that fails. Each scenario's name is printed as it starts (shown by the test runner on
/// failure).
pub async fn run<B: Backend + ?Sized>(backend: &B) {
    for scenario in SCENARIOS {
        run_one(backend, scenario).await;
    }
}

/// Runs one scenario against `backend` on a fresh store.
pub async fn run_one<B: Backend + ?Sized>(backend: &B, scenario: &Scenario) {
    eprintln!("conformance scenario: {}", scenario.name);
    let fixture = backend.open(LEASE).await;
    let app = App::new(fixture, scenario.settings);
    (scenario.run)(&app).await;
    let store = app.finish().await;
    backend.dispose(store).await;
}
