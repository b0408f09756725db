//! The PostgreSQL backend ([`PostgresBackend`]) against a real server, through [`IdempotencyStore`].
//!
//! The server comes from `DATABASE_URL` (start a throwaway one with `scripts/pg-test-cluster run --
//! cargo test -p idemlog-server --test postgres_store`). Without it the tests print a skip line and
//! pass, unless `CI` is set or `IDEMLOG_REQUIRE_POSTGRES=1`: then they fail. Each test works in a
//! fresh schema `t_<random>`, dropped at its end.
//!
//! With `IDEMLOG_TEST_STORE_VIA_PGBOUNCER=1` the stores under test go through the PgBouncer in
//! transaction mode that `scripts/pg-test-cluster` starts (`IDEMLOG_TEST_PGBOUNCER_URL`), with
//! [`Pooling::Transaction`]; the raw connections that look behind their back stay direct. CI runs
//! the suite both ways.

mod common;

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::database_url;
use idemlog_idempotency::backends::postgres::{
    PgConfig, PgError, Pooling, PostgresBackend, redacted_url,
};
use idemlog_idempotency::store::{
    Claim, Expiry, Fingerprint, Health, HeldClaim, IdempotencyStore, InsertOnce, KeyState,
    RecordWrite, StoreError, StoredResponse, Takeover,
};
use tokio::sync::Barrier;
use tokio_postgres::NoTls;

const LEASE: Duration = Duration::from_millis(200);
const PAST_LEASE: Duration = Duration::from_millis(300);
const TTL: Duration = Duration::from_secs(60);

fn random() -> u64 {
    RandomState::new().build_hasher().finish()
}

fn fp(n: u8) -> Fingerprint {
    Fingerprint([n; 32])
}

/// One test's database: a fresh schema and a raw connection for looking behind the store's back.
struct Db {
    url: String,
    schema: String,
    raw: tokio_postgres::Client,
    /// Where the stores connect, and how: the database itself, or PgBouncer in transaction mode.
    store_url: String,
    pooling: Pooling,
}

/// The PgBouncer URL when this run goes through it (see the module docs).
fn via_pgbouncer() -> Option<String> {
    if std::env::var("IDEMLOG_TEST_STORE_VIA_PGBOUNCER").as_deref() != Ok("1") {
        return None;
    }
    match std::env::var("IDEMLOG_TEST_PGBOUNCER_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => panic!(
            "IDEMLOG_TEST_STORE_VIA_PGBOUNCER=1 but IDEMLOG_TEST_PGBOUNCER_URL is not set \
             (install pgbouncer; scripts/pg-test-cluster starts it)"
        ),
    }
}

impl Db {
    async fn new() -> Option<Db> {
        let url = database_url()?;
        let schema = format!("t_{:016x}", random());
        let (raw, conn) = tokio_postgres::connect(&url, NoTls)
            .await
            .expect("raw connection to DATABASE_URL");
        tokio::spawn(conn);
        let (store_url, pooling) = match via_pgbouncer() {
            Some(pooler) => (pooler, Pooling::Transaction),
            None => (url.clone(), Pooling::None),
        };
        Some(Db {
            url,
            schema,
            raw,
            store_url,
            pooling,
        })
    }

    fn config(&self) -> PgConfig {
        let mut c = PgConfig::new(self.store_url.clone())
            .schema(self.schema.clone())
            .lease(LEASE)
            .pool_size(8)
            .pooling(self.pooling);
        c.cleanup_interval = None;
        c
    }

    async fn store(&self) -> PostgresBackend {
        PostgresBackend::connect(self.config())
            .await
            .expect("connect")
    }

    /// `host:port` of the database.
    fn target(&self) -> String {
        let cfg: tokio_postgres::Config = self.url.parse().unwrap();
        let port = cfg.get_ports().first().copied().unwrap_or(5432);
        format!("127.0.0.1:{port}")
    }

    /// The database's URL with 127.0.0.1:`port` (a proxy) as its address.
    fn url_via(&self, port: u16) -> String {
        let cfg: tokio_postgres::Config = self.url.parse().unwrap();
        let password = cfg
            .get_password()
            .map(|p| String::from_utf8_lossy(p).into_owned());
        format!(
            "postgres://{}{}@127.0.0.1:{port}/{}",
            cfg.get_user().unwrap_or("postgres"),
            password.map(|p| format!(":{p}")).unwrap_or_default(),
            cfg.get_dbname().unwrap_or("postgres"),
        )
    }

    async fn count(&self, table: &str) -> i64 {
        self.raw
            .query_one(
                &format!("SELECT count(*) FROM \"{}\".{table}", self.schema),
                &[],
            )
            .await
            .unwrap()
            .get(0)
    }

    /// `scope_counts.live` of every scope, in scope order.
    async fn scope_counts(&self) -> Vec<(String, i64)> {
        self.raw
            .query(
                &format!(
                    "SELECT scope, live FROM \"{}\".scope_counts ORDER BY scope",
                    self.schema
                ),
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    }

    /// Scopes whose `scope_counts.live` is not their number of `keys` rows.
    async fn miscounted_scopes(&self) -> Vec<String> {
        self.raw
            .query(
                &format!(
                    "SELECT q.scope FROM \"{s}\".scope_counts q
                     WHERE q.live <> (SELECT count(*) FROM \"{s}\".keys k WHERE k.scope = q.scope)",
                    s = self.schema
                ),
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    async fn drop_schema(self) {
        self.raw
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS \"{}\" CASCADE",
                self.schema
            ))
            .await
            .unwrap();
    }
}

async fn acquire(
    store: &PostgresBackend,
    scope: &str,
    key: &str,
    f: u8,
    ttl: Duration,
) -> HeldClaim {
    match store.claim(scope, key, &fp(f), ttl).await.unwrap() {
        Claim::Acquired(t) => t,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

fn response() -> StoredResponse {
    StoredResponse::new(
        201,
        Bytes::from_static(b"{\"id\":\"pay_1\"}\x00\xff\xfe binary"),
    )
    .with_header("content-type", Bytes::from_static(b"application/json"))
    .with_header("location", Bytes::from_static(b"/payments/pay_1"))
    .with_header("x-raw", Bytes::from_static(b"\x01\x02\xff"))
    .with_header("location", Bytes::from_static(b"second"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_claim_acquires() {
    let Some(db) = Db::new().await else { return };
    let store = db.store().await;
    let db_now: i64 = db
        .raw
        .query_one(
            "SELECT floor(extract(epoch FROM now()) * 1000)::bigint",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let t = acquire(&store, "acct_1", "k1", 1, TTL).await;
    assert_eq!(t.takeover, None);
    assert!(t.fence > 0);
    let expected = db_now as u64 + TTL.as_millis() as u64;
    assert!(
        t.expires_at_ms.abs_diff(expected) < 5_000,
        "{t:?} vs {expected}"
    );
    let rec = store
        .get("acct_1", "k1")
        .await
        .unwrap()
        .expect("live record");
    assert_eq!(rec.fence, t.fence);
    assert_eq!(rec.fingerprint, fp(1));
    assert_eq!(rec.expires_at_ms, t.expires_at_ms);
    assert!(matches!(rec.state, KeyState::InProgress { lease_left } if lease_left <= LEASE));
    // Scope and key are a pair: the same key in another scope is another key.
    let other = acquire(&store, "acct_2", "k1", 2, TTL).await;
    assert!(other.fence > t.fence);
    assert!(store.get("acct_1k", "1").await.unwrap().is_none());
    assert_eq!(store.kind(), "postgres");
    assert_eq!(store.health(), Health::Ready);
    store.close().await.unwrap();
    db.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_of_one_key_acquire_exactly_once() {
    let Some(db) = Db::new().await else { return };
    // Two "instances", each with its own pool, and a lease no claim outlives even on a loaded
    // machine: this test is about concurrent claims, not takeovers.
    let mut config = db.config();
    config.lease = TTL;
    let stores = [
        PostgresBackend::connect(config.clone())
            .await
            .expect("connect"),
        PostgresBackend::connect(config).await.expect("connect"),
    ];
    let barrier = Arc::new(Barrier::new(32));
    let mut tasks = Vec::new();
    for i in 0..32 {
        let store = stores[i % 2].clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            store.claim("acct", "hot", &fp(7), TTL).await.unwrap()
        }));
    }
    let mut acquired = 0;
    let mut in_progress = 0;
    for t in tasks {
        match t.await.unwrap() {
            Claim::Acquired(_) => acquired += 1,
            Claim::InProgress { .. } => in_progress += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((acquired, in_progress), (1, 31));
    assert_eq!(db.count("keys").await, 1);
    for s in &stores {
        s.close().await.unwrap();
    }
    db.drop_schema().await;
}

/// Racing first claims of the same new keys: every loser's statement saw no row, counted the key,
/// then met the winner's insert. The count must still equal the rows (the claim's guard rolls the
/// loser's count back), or the quota would drift with every race.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_first_claims_keep_the_scopes_key_count_exact() {
    let Some(db) = Db::new().await else { return };
    let mut config = db.config();
    config.lease = TTL;
    let stores = [
        PostgresBackend::connect(config.clone())
            .await
            .expect("connect"),
        PostgresBackend::connect(config).await.expect("connect"),
    ];
    for round in 0..8 {
        let barrier = Arc::new(Barrier::new(16));
        let mut tasks = Vec::new();
        for i in 0..16 {
            let store = stores[i % 2].clone();
            let barrier = barrier.clone();
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let key = format!("race-{round}-{}", i % 4);
                store.claim("acct", &key, &fp(7), TTL).await.unwrap()
            }));
        }
        let mut acquired = 0;
        for t in tasks {
            if let Claim::Acquired(_) = t.await.unwrap() {
                acquired += 1;
            }
        }
        assert_eq!(acquired, 4, "round {round}: one claim per key");
    }
    let live: i64 = db
        .raw
        .query_one(
            &format!(
                "SELECT live FROM \"{}\".scope_counts WHERE scope = 'acct'",
                db.schema
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(live, db.count("keys").await);
    assert_eq!(live, 32);
    for s in &stores {
        s.close().await.unwrap();
    }
    db.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_key_replays_the_stored_response_byte_for_byte() {
    let Some(db) = Db::new().await else { return };
    let store = db.store().await;
    let t = acquire(&store, "acct", "pay", 3, TTL).await;
    store.complete(&t, &response(), &[]).await.unwrap();
    match store.claim("acct", "pay", &fp(3), TTL).await.unwrap() {
        Claim::Completed(r) => assert_eq!(r, response()),
        other => panic!("expected Completed, got {other:?}"),
    }
    // From another instance too.
    let other = db.store().await;
    match other.claim("acct", "pay", &fp(3), TTL).await.unwrap() {
        Claim::Completed(r) => assert_eq!(r, response()),
        other => panic!("expected Completed, got {other:?}"),
    }
    let rec = store.get("acct", "pay").await.unwrap().unwrap();
    assert_eq!(rec.state, KeyState::Completed(response()));
    // A completed key can be completed, released or extended no more.
    assert!(matches!(
        store.complete(&t, &response(), &[]).await,
        Err(StoreError::LeaseLost { .. })
    ));
    assert!(matches!(
        store.release(&t).await,
        Err(StoreError::LeaseLost { .. })
    ));
    assert!(matches!(
        store.extend(&t).await,
        Err(StoreError::LeaseLost { .. })
    ));
    store.close().await.unwrap();
    other.close().await.unwrap();
    db.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_fingerprint_is_a_mismatch_in_progress_and_completed() {
    let Some(db) = Db::new().await else { return };
    let store = db.store().await;
    let t = acquire(&store, "acct", "k", 1, TTL).await;
    assert!(matches!(
        store.claim("acct", "k", &fp(2), TTL).await.unwrap(),
        Claim::Mismatch { .. }
    ));
    // Even once the lease has run out: a lease takeover needs the same fingerprint.
    tokio::time::sleep(PAST_LEASE).await;
    assert!(matches!(
        store.claim("acct", "k", &fp(2), TTL).await.unwrap(),
        Claim::Mismatch { .. }
    ));
    store.complete(&t, &response(), &[]).await.unwrap();
    assert!(matches!(
        store.claim("acct", "k", &fp(2), TTL).await.unwrap(),
        Claim::Mismatch { .. }
    ));
    store.close().await.unwrap();
    db.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_record_is_taken_over_with_a_larger_fence() {
    let Some(db) = Db::new().await else { return };
    let store = db.store().await;
    let short = Duration::from_millis(200);
    let done = acquire(&store, "acct", "done", 1, short).await;
    store.complete(&done, &response(), &[]).await.unwrap();
    let held = acquire(&store, "acct", "held", 1, short).await;
    tokio::time::sleep(PAST_LEASE).await;
    assert!(
        store.get("acct", "done").await.unwrap().is_none(),
        "expired records are not live"
    );
    // Whatever the fingerprint.
    let again = acquire(&store, "acct", "done", 9, TTL).await;
    assert_eq!(again.takeover, Some(Takeover::Expired));
    assert!(again.fence > done.fence);
    let again = acquire(&store, "acct", "held", 1, TTL).await;
    assert_eq!(again.takeover, Some(Takeover::Expired));
    assert!(again.fence > held.fence);
    assert!(matches!(
        store.complete(&held, &response(), &[]).await,
        Err(StoreError::LeaseLost { .. })
    ));
    store.close().await.unwrap();
    db.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_expired_claim_is_taken_over_and_the_zombie_writes_nothing() {
    let Some(db) = Db::new().await else { return };
    let store = db.store().await;
    let zombie = acquire(&store, "acct", "k", 4, TTL).await;
    match store.claim("acct", "k", &fp(4), TTL).await.unwrap() {
        Claim::InProgress { lease_left } => {
            assert!(lease_left > Duration::ZERO && lease_left <= LEASE)
        }
        other => panic!("expected InProgress, got {other:?}"),
    }
    tokio::time::sleep(PAST_LEASE).await;
    let heir = acquire(&store, "acct", "k", 4, TTL).await;
    assert_eq!(heir.takeover, Some(Takeover::LeaseExpired));
    assert!(heir.fence > zombie.fence);
    let writes = [RecordWrite::put(
        "payments",
        "pay_zombie",
        Bytes::from_static(b"zombie"),
    )];
    let err = store
        .complete(&zombie, &response(), &writes)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::LeaseLost { fence, .. } if fence == zombie.fence));
    assert_eq!(store.record("payments", "pay_zombie").await.unwrap(), None);
    assert_eq!(db.count("records").await, 0);
    assert!(matches!(
        store.release(&zombie).await,
        Err(StoreError::LeaseLost { .. })
    ));
    store.complete(&heir, &response(), &[]).await.unwrap();
    store.close().await.unwrap();
    db.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_then_reclaim_acquires() {
    let Some(db) = Db::new().await else { return };
    let store = db.store().await;
    let first = acquire(&store, "acct", "k", 1, TTL).await;
    store.release(&first).await.unwrap();
    assert!(store.get("acct", "k").await.unwrap().is_none());
    let second = acquire(&store, "acct", "k", 1, TTL).await;
    assert!(second.fence > first.fence);
    assert!(matches!(
        store.release(&first).await,
        Err(StoreError::LeaseLost { .. })
    ));
    assert!(
        store.get("acct", "k").await.unwrap().is_some(),
        "a stale release removed nothing"
    );
    store.close().await.unwrap();
    db.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_renews_the_lease_and_is_refused_for_a_stale_token() {
    let Some(db) = Db::new().await else { return };
    let store = db.store().await;
    let t = acquire(&store, "acct", "long", 1, TTL).await;
    for _ in 0..3 {
        tokio::time::sleep(LEASE / 2).await;
        assert_eq!(store.extend(&t).await.unwrap(), LEASE);
    }
    // 300 ms after the claim, more than one lease, yet still held.
    assert!(matches!(
        store.claim("acct", "long", &fp(1), TTL).await.unwrap(),
        Claim::InProgress { .. }
    ));
    let stale = acquire(&store, "acct", "k", 1, TTL).await;
    tokio::time::sleep(PAST_LEASE).await;
    let heir = acquire(&store, "acct", "k", 1, TTL).await;
    assert!(matches!(
        store.extend(&stale).await,
        Err(StoreError::LeaseLost { .. })
    ));
    assert_eq!(store.extend(&heir).await.unwrap(), LEASE);
    store.close().await.unwrap();
    db.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_writes_the_response_and_records_atomically() {
    let Some(db) = Db::new().await else { return };
    let store = db.store().await;
    store
        .write_records(&[RecordWrite::put(
            "payments",
            "old",
            Bytes::from_static(b"old"),
        )])
        .await
        .unwrap();
    let t = acquire(&store, "acct", "k", 1, TTL).await;
    assert_eq!(store.record("payments", "pay_1").await.unwrap(), None);
    let writes = [
        RecordWrite::put("payments", "pay_1", Bytes::from_static(b"{\"amount\":100}")),
        RecordWrite::put_until(
            "gateway.charges",
            "charge:acct:k",
            Bytes::from_static(b"ch_1"),
            Expiry::AtMs(t.expires_at_ms),
        ),
        RecordWrite {
            namespace: "payments",
            key: "old".into(),
            value: None,
            expiry: Expiry::Never,
        },
    ];
    store.complete(&t, &response(), &writes).await.unwrap();
    assert_eq!(
        store.record("payments", "pay_1").await.unwrap().as_deref(),
        Some(&b"{\"amount\":100}"[..])
    );
    assert_eq!(
        store
            .record("gateway.charges", "charge:acct:k")
            .await
            .unwrap()
            .as_deref(),
        Some(&b"ch_1"[..])
    );
    assert_eq!(store.record("payments", "old").await.unwrap(), None);
    let expires_ms: i64 = db
        .raw
        .query_one(
            &format!(
                "SELECT floor(extract(epoch FROM expires_at) * 1000)::bigint FROM \"{}\".records \
                 WHERE namespace = 'gateway.charges'",
                db.schema
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(expires_ms as u64, t.expires_at_ms);

    // Puts and removals together, outside a claim.
    store
        .write_records(&[
            RecordWrite::put("payments", "a", Bytes::from_static(b"1")),
            RecordWrite::put("payments", "a", Bytes::from_static(b"2")),
            RecordWrite {
                namespace: "payments",
                key: "pay_1".into(),
                value: None,
                expiry: Expiry::Never,
            },
        ])
        .await
        .unwrap();
    assert_eq!(
        store.record("payments", "a").await.unwrap().as_deref(),
        Some(&b"2"[..])
    );
    assert_eq!(store.record("payments", "pay_1").await.unwrap(), None);

    // A complete whose records cannot be written writes nothing at all: the key stays in progress.
    let t2 = acquire(&store, "acct", "k2", 1, TTL).await;
    let bad = [
        RecordWrite::put("payments", "pay_2", Bytes::from_static(b"x")),
        RecordWrite::put_until(
            "payments",
            "pay_3",
            Bytes::from_static(b"y"),
            Expiry::AtMs(u64::MAX),
        ),
    ];
    assert!(store.complete(&t2, &response(), &bad).await.is_err());
    assert!(matches!(
        store.get("acct", "k2").await.unwrap().unwrap().state,
        KeyState::InProgress { .. }
    ));
    assert_eq!(store.record("payments", "pay_2").await.unwrap(), None);
    store.complete(&t2, &response(), &bad[..1]).await.unwrap();
    assert!(store.record("payments", "pay_2").await.unwrap().is_some());
    store.close().await.unwrap();
    db.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insert_once_dedups_and_counts_once_under_concurrency() {
    let Some(db) = Db::new().await else { return };
    let stores = [db.store().await, db.store().await];
    assert_eq!(stores[0].counter("charges_total").await.unwrap(), 0);
    let barrier = Arc::new(Barrier::new(16));
    let mut tasks = Vec::new();
    for i in 0..16u8 {
        let store = stores[usize::from(i) % 2].clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let w = RecordWrite::put("gateway.charges", "charge:acct:k", Bytes::from(vec![i]));
            (i, store.insert_once(&w, "charges_total").await.unwrap())
        }));
    }
    let mut winner = None;
    let mut existing = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            (i, InsertOnce::Inserted) => {
                assert!(winner.replace(i).is_none(), "two inserts");
            }
            (_, InsertOnce::Existing(v)) => existing.push(v),
        }
    }
    let winner = winner.expect("one insert");
    assert_eq!(existing.len(), 15);
    assert!(existing.iter().all(|v| v[..] == [winner]));
    assert_eq!(stores[1].counter("charges_total").await.unwrap(), 1);

    // An expired record is replaced, and counted again.
    let w = RecordWrite::put_until(
        "gateway.charges",
        "short",
        Bytes::from_static(b"a"),
        Expiry::After(Duration::from_millis(200)),
    );
    assert_eq!(
        stores[0].insert_once(&w, "charges_total").await.unwrap(),
        InsertOnce::Inserted
    );
    assert_eq!(
        stores[0].insert_once(&w, "charges_total").await.unwrap(),
        InsertOnce::Existing(Bytes::from_static(b"a"))
    );
    tokio::time::sleep(PAST_LEASE).await;
    assert_eq!(
        stores[1].insert_once(&w, "charges_total").await.unwrap(),
        InsertOnce::Inserted
    );
    assert_eq!(stores[0].counter("charges_total").await.unwrap(), 3);

    // The counter never goes down while others insert.
    let writer = {
        let store = stores[1].clone();
        tokio::spawn(async move {
            for i in 0..40 {
                let w = RecordWrite::put(
                    "gateway.charges",
                    format!("many{i}"),
                    Bytes::from_static(b"v"),
                );
                store.insert_once(&w, "charges_total").await.unwrap();
            }
        })
    };
    let mut last = 0;
    while !writer.is_finished() {
        let now = stores[0].counter("charges_total").await.unwrap();
        assert!(now >= last, "counter went from {last} to {now}");
        last = now;
    }
    writer.await.unwrap();
    assert_eq!(stores[0].counter("charges_total").await.unwrap(), 43);
    for s in &stores {
        s.close().await.unwrap();
    }
    db.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_deletes_expired_keys_of_every_scope_in_batches_and_lowers_each_count_by_its_own() {
    let Some(db) = Db::new().await else { return };
    let store = db.store().await;
    let short = Duration::from_millis(150);
    // Expired keys in two scopes (10 and 15), none in a third; one live key in each.
    for (scope, old) in [("acct_a", 10), ("acct_b", 15), ("acct_c", 0)] {
        for i in 0..old {
            acquire(&store, scope, &format!("old{i}"), 1, short).await;
        }
        acquire(&store, scope, "live", 1, TTL).await;
    }
    let mut writes: Vec<RecordWrite> = (0..12)
        .map(|i| {
            RecordWrite::put_until(
                "payments",
                format!("old{i}"),
                Bytes::from_static(b"x"),
                Expiry::After(short),
            )
        })
        .collect();
    writes.push(RecordWrite::put(
        "payments",
        "forever",
        Bytes::from_static(b"y"),
    ));
    store.write_records(&writes).await.unwrap();
    let scope = |name: &str, live: i64| (name.to_string(), live);
    assert_eq!(
        db.scope_counts().await,
        [scope("acct_a", 11), scope("acct_b", 16), scope("acct_c", 1)]
    );
    tokio::time::sleep(PAST_LEASE).await;
    let report = store.cleanup_once(10).await.unwrap();
    assert_eq!((report.keys, report.records), (25, 12));
    // At most 10 rows per statement: keys 10 + 10 + 5 (the last one finds the walk's end),
    // records 10 + 2.
    assert_eq!(report.batches, 3 + 2, "{report:?}");
    assert_eq!(db.count("keys").await, 3);
    assert_eq!(db.count("records").await, 1);
    // Each scope's count went down by the keys deleted in it: 10, 15 and 0.
    assert_eq!(
        db.scope_counts().await,
        [scope("acct_a", 1), scope("acct_b", 1), scope("acct_c", 1)]
    );
    for s in ["acct_a", "acct_b", "acct_c"] {
        assert!(store.get(s, "live").await.unwrap().is_some(), "{s}");
    }
    // The background task does the same on its own, on every instance at once.
    let other = db.store().await;
    for i in 0..5 {
        acquire(&store, "acct_a", &format!("later{i}"), 1, short).await;
        acquire(&other, "acct_b", &format!("later{i}"), 1, short).await;
    }
    store.spawn_cleanup(Duration::from_millis(50), 2);
    other.spawn_cleanup(Duration::from_millis(50), 2);
    let deadline = Instant::now() + Duration::from_secs(5);
    while db.count("keys").await > 3 {
        assert!(
            Instant::now() < deadline,
            "background cleanup did not delete the expired keys"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    store.close().await.unwrap();
    other.close().await.unwrap();
    assert_eq!(db.miscounted_scopes().await, Vec::<String>::new());
    assert_eq!(
        db.scope_counts().await,
        [scope("acct_a", 1), scope("acct_b", 1), scope("acct_c", 1)]
    );
    db.drop_schema().await;
}

/// One cleanup statement visits a bounded number of scopes; a pass goes on from scope to scope
/// until it has visited them all, so an expired key in the last of many scopes is deleted too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_reaches_expired_keys_in_more_scopes_than_one_statement_visits() {
    let Some(db) = Db::new().await else { return };
    let store = db.store().await;
    // 2 500 scopes (more than two statements' worth), each with one expired and one live key,
    // written behind the store's back with their counts.
    db.raw
        .batch_execute(&format!(
            "INSERT INTO \"{s}\".keys (scope, key, fingerprint, fence, state, expires_at, created_at)
             SELECT 'acct_' || lpad(n::text, 5, '0'), k, decode(repeat('00', 32), 'hex'), n, 1,
                    CASE k WHEN 'old' THEN now() - interval '1 minute'
                           ELSE now() + interval '1 hour' END, now()
             FROM generate_series(1, 2500) n, (VALUES ('old'), ('live')) v(k);
             INSERT INTO \"{s}\".scope_counts (scope, live)
             SELECT 'acct_' || lpad(n::text, 5, '0'), 2 FROM generate_series(1, 2500) n;",
            s = db.schema
        ))
        .await
        .unwrap();
    let report = store.cleanup_once(500).await.unwrap();
    assert_eq!(report.keys, 2_500, "{report:?}");
    assert_eq!(db.count("keys").await, 2_500);
    assert_eq!(db.miscounted_scopes().await, Vec::<String>::new());
    let last: Vec<String> = db
        .raw
        .query(
            &format!(
                "SELECT key FROM \"{}\".keys WHERE scope = 'acct_02500'",
                db.schema
            ),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        last,
        ["live"],
        "the last scope's expired key is gone, its live one kept"
    );
    // Nothing is left: the next pass walks every scope again and deletes nothing.
    assert_eq!(store.cleanup_once(500).await.unwrap().keys, 0);
    store.close().await.unwrap();
    db.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_migration_run_concurrently_by_four_connects_is_safe() {
    let Some(db) = Db::new().await else { return };
    let connects: Vec<_> = (0..4)
        .map(|_| {
            let config = db.config();
            tokio::spawn(async move { PostgresBackend::connect(config).await })
        })
        .collect();
    let mut stores = Vec::new();
    for c in connects {
        stores.push(c.await.unwrap().expect("every concurrent connect succeeds"));
    }
    assert_eq!(
        db.count("schema_migrations").await,
        i64::from(idemlog_idempotency::backends::postgres::SCHEMA_VERSION)
    );
    let t = acquire(&stores[3], "acct", "k", 1, TTL).await;
    stores[0].complete(&t, &response(), &[]).await.unwrap();
    // Connecting again to a migrated schema changes nothing.
    stores.push(db.store().await);
    assert_eq!(
        db.count("schema_migrations").await,
        i64::from(idemlog_idempotency::backends::postgres::SCHEMA_VERSION)
    );
    for s in &stores {
        s.close().await.unwrap();
    }
    db.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_newer_than_this_build_is_refused_at_connect_naming_both_versions() {
    let Some(db) = Db::new().await else { return };
    db.store().await.close().await.unwrap();
    let newer = idemlog_idempotency::backends::postgres::SCHEMA_VERSION + 1;
    db.raw
        .execute(
            &format!(
                "INSERT INTO \"{}\".schema_migrations (version) VALUES ($1)",
                db.schema
            ),
            &[&newer],
        )
        .await
        .unwrap();
    let err = match PostgresBackend::connect(db.config()).await {
        Ok(_) => panic!("a build older than the schema connected"),
        Err(e) => e,
    };
    assert!(
        matches!(err, PgError::SchemaTooNew { found, known, .. }
            if found == newer && known == newer - 1),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&format!("version {newer}"))
            && text.contains(&format!("version {}", newer - 1)),
        "{text}"
    );
    // Nothing was migrated or recorded by the refused build.
    assert_eq!(db.count("schema_migrations").await, i64::from(newer));
    db.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_exhaustion_returns_unavailable_within_the_wait_timeout() {
    let Some(mut db) = Db::new().await else {
        return;
    };
    let mut config = db.config();
    config.pool_size = 1;
    config.pool_wait_timeout = Duration::from_millis(200);
    let store = PostgresBackend::connect(config).await.unwrap();
    // Block the pool's only connection behind a table lock held by another session.
    let tx = db.raw.transaction().await.unwrap();
    tx.batch_execute(&format!(
        "LOCK TABLE \"{}\".keys IN ACCESS EXCLUSIVE MODE",
        db.schema
    ))
    .await
    .unwrap();
    let blocked = {
        let store = store.clone();
        tokio::spawn(async move { store.claim("acct", "a", &fp(1), TTL).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let err = store.claim("acct", "b", &fp(1), TTL).await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    assert_eq!(err.class(), "unavailable");
    assert!(
        took >= Duration::from_millis(150) && took < Duration::from_secs(2),
        "{took:?}"
    );
    // A saturated pool is not a dead database.
    assert_eq!(store.health(), Health::Ready);
    tx.rollback().await.unwrap();
    assert!(matches!(
        blocked.await.unwrap().unwrap(),
        Claim::Acquired(_)
    ));
    store.close().await.unwrap();
    db.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_failure_names_the_database_without_the_password_and_is_bounded() {
    let Some(db) = Db::new().await else { return };
    let cfg: tokio_postgres::Config = db.url.parse().unwrap();
    let port = cfg.get_ports().first().copied().unwrap_or(5432);
    let user = cfg.get_user().unwrap_or("postgres").to_string();
    let dbname = cfg.get_dbname().unwrap_or("postgres").to_string();
    // The wrong password: refused at once, not retried.
    let wrong = format!("postgres://{user}:Wrong-Secret-42@127.0.0.1:{port}/{dbname}");
    let started = Instant::now();
    let err = PostgresBackend::connect(PgConfig::new(wrong).schema(db.schema.clone()))
        .await
        .err()
        .unwrap();
    let msg = err.to_string();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(msg.contains(&dbname) && msg.contains("127.0.0.1"), "{msg}");
    assert!(!msg.contains("Wrong-Secret-42"), "{msg}");
    // Nothing listening: bounded attempts.
    let mut config = PgConfig::new(format!(
        "postgres://{user}:Hidden-Pw-77@127.0.0.1:1/{dbname}"
    ));
    config.connect_attempts = 2;
    config.connect_timeout = Duration::from_secs(1);
    let started = Instant::now();
    let msg = PostgresBackend::connect(config)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(
        msg.contains(&dbname) && !msg.contains("Hidden-Pw-77"),
        "{msg}"
    );
    db.drop_schema().await;
}

#[test]
fn redacted_url_hides_the_password() {
    let shown = redacted_url("postgres://app:s3cr3t@db:5432/payments?sslmode=disable");
    assert_eq!(shown, "postgres://app:***@db:5432/payments?sslmode=disable");
    assert!(!redacted_url("host=db password=s3cr3t dbname=x").contains("s3cr3t"));
}

/// A TCP proxy in front of the database that the test can cut and restore.
struct Proxy {
    port: u16,
    up: Arc<AtomicBool>,
    conns: Arc<parking_lot::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Proxy {
    async fn start(target: String) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let up = Arc::new(AtomicBool::new(true));
        let conns = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let (up2, conns2) = (up.clone(), conns.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                if !up2.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let target = target.clone();
                conns2.lock().push(tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                }));
            }
        });
        Proxy { port, up, conns }
    }

    fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        for c in self.conns.lock().drain(..) {
            c.abort();
        }
    }

    fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_store_is_unready_within_3s_of_an_outage_and_ready_within_3s_of_its_return() {
    let Some(db) = Db::new().await else { return };
    let proxy = Proxy::start(db.target()).await;
    let mut config = db.config();
    config.url = db.url_via(proxy.port);
    config.connect_timeout = Duration::from_secs(1);
    let store = PostgresBackend::connect(config).await.unwrap();
    acquire(&store, "acct", "before", 1, TTL).await;
    assert_eq!(store.health(), Health::Ready);
    // Idle from here on: no call tells the store what happened.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    proxy.cut();
    let cut = Instant::now();
    while store.health() == Health::Ready {
        assert!(
            cut.elapsed() < Duration::from_secs(3),
            "still ready {:?} after the outage",
            cut.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Liveness does not follow the shared database.
    assert_eq!(store.liveness(), Health::Ready);
    let up = |gauges: Vec<idemlog_idempotency::store::Gauge>| {
        gauges
            .iter()
            .find(|g| g.name == "idemlog_pg_up")
            .map(|g| g.value)
    };
    assert_eq!(up(store.gauges().await), Some(0.0));

    proxy.restore();
    let restored = Instant::now();
    while store.health() != Health::Ready {
        assert!(
            restored.elapsed() < Duration::from_secs(3),
            "not ready {:?} after the database returned: {:?}",
            restored.elapsed(),
            store.health()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(up(store.gauges().await), Some(1.0));
    store.close().await.unwrap();
    db.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_outage_fails_fast_and_recovers_without_restart() {
    let Some(db) = Db::new().await else { return };
    let cfg: tokio_postgres::Config = db.url.parse().unwrap();
    let port = cfg.get_ports().first().copied().unwrap_or(5432);
    let proxy = Proxy::start(format!("127.0.0.1:{port}")).await;
    let password = cfg
        .get_password()
        .map(|p| String::from_utf8_lossy(p).into_owned());
    let url = format!(
        "postgres://{}{}@127.0.0.1:{}/{}",
        cfg.get_user().unwrap_or("postgres"),
        password.map(|p| format!(":{p}")).unwrap_or_default(),
        proxy.port,
        cfg.get_dbname().unwrap_or("postgres"),
    );
    let mut config = db.config();
    config.url = url;
    config.connect_timeout = Duration::from_secs(1);
    config.pool_wait_timeout = Duration::from_millis(500);
    let store = PostgresBackend::connect(config).await.unwrap();
    acquire(&store, "acct", "before", 1, TTL).await;
    assert_eq!(store.health(), Health::Ready);

    proxy.cut();
    let started = Instant::now();
    let err = store
        .claim("acct", "during", &fp(1), TTL)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(store.health(), Health::Unavailable(_)));

    proxy.restore();
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.health() != Health::Ready {
        assert!(
            Instant::now() < deadline,
            "health did not recover: {:?}",
            store.health()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    acquire(&store, "acct", "after", 1, TTL).await;
    let gauges = store.gauges().await;
    assert!(
        gauges
            .iter()
            .any(|g| g.name == "idemlog_pg_up" && g.value == 1.0)
    );
    store.close().await.unwrap();
    db.drop_schema().await;
}
