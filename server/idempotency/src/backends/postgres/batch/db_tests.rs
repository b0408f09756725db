//! Batches composed by hand and run against a real PostgreSQL (`DATABASE_URL`; skipped without
//! one, required under CI): what one statement does with many calls, which the store's public
//! tests cannot pin down because the lanes decide what goes together.

use std::time::Duration;

use bytes::Bytes;
use tokio_postgres::NoTls;

use super::claims::{ClaimJob, Claims};
use super::finish::{Finish, FinishJob, Finishes, Put};
use super::inserts::{InsertJob, Inserts};
use super::run_batch;
use crate::backends::postgres::{PgConfig, PostgresBackend};
use crate::store::{Claim, Fingerprint, IdempotencyStore, InsertOnce, KeyState, StoreError};

const TTL: Duration = Duration::from_secs(60);

fn database_url() -> Option<String> {
    match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            let required = std::env::var_os("CI").is_some()
                || std::env::var("IDEMLOG_REQUIRE_POSTGRES").as_deref() == Ok("1");
            assert!(
                !required,
                "DATABASE_URL is not set but the PostgreSQL tests are required here"
            );
            eprintln!(
                "SKIPPED on PostgreSQL: DATABASE_URL is not set (see scripts/pg-test-cluster)"
            );
            None
        }
    }
}

/// A store on a fresh schema, and a raw connection to look behind its back.
struct Db {
    store: PostgresBackend,
    raw: tokio_postgres::Client,
    schema: String,
}

impl Db {
    async fn new() -> Option<Db> {
        let url = database_url()?;
        let schema = format!(
            "b_{:016x}",
            std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), 1)
        );
        let mut config = PgConfig::new(url.clone())
            .schema(schema.clone())
            .lease(Duration::from_secs(30));
        config.cleanup_interval = None;
        let store = PostgresBackend::connect(config).await.expect("connect");
        let (raw, conn) = tokio_postgres::connect(&url, NoTls).await.expect("raw");
        tokio::spawn(conn);
        Some(Db { store, raw, schema })
    }

    async fn scalar(&self, sql: &str) -> i64 {
        let sql = sql.replace("{s}", &format!("\"{}\"", self.schema));
        self.raw.query_one(&sql, &[]).await.unwrap().get(0)
    }

    async fn drop(self) {
        self.store.close().await.unwrap();
        self.raw
            .batch_execute(&format!("DROP SCHEMA \"{}\" CASCADE", self.schema))
            .await
            .unwrap();
    }
}

fn claim(scope: &str, key: &str, fp: u8) -> ClaimJob {
    claim_limited(scope, key, fp, 0)
}

fn claim_limited(scope: &str, key: &str, fp: u8, max_live: i64) -> ClaimJob {
    ClaimJob::new(
        scope.into(),
        key.into(),
        [fp; 32],
        TTL.as_millis() as i64,
        Some(Bytes::from(vec![fp; 4])),
        max_live,
    )
}

fn complete(scope: &str, key: &str, fence: u64, record: &str) -> FinishJob {
    FinishJob {
        scope: scope.into(),
        key: key.into(),
        fence: fence as i64,
        finish: Finish::Complete {
            status: 201,
            headers: crate::backends::postgres::codec::encode_headers(&[]),
            body: Bytes::from(format!("body of {key}")),
            puts: vec![Put {
                namespace: "orders",
                key: record.into(),
                value: Bytes::from(format!("record of {key}")),
                after_ms: None,
                at_ms: None,
            }],
            removals: Vec::new(),
        },
    }
}

fn fence(answer: &Result<Claim, StoreError>) -> u64 {
    match answer {
        Ok(Claim::Acquired(held)) => held.fence,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_completion_in_a_batch_writes_nothing_and_its_neighbours_apply() {
    let Some(db) = Db::new().await else { return };
    let inner = &*db.store.inner;
    let claimed = run_batch::<Claims>(
        inner,
        &[
            claim("acct", "k1", 1),
            claim("acct", "k2", 1),
            claim("acct", "k3", 1),
        ],
    )
    .await;
    let fences: Vec<u64> = claimed.iter().map(fence).collect();
    let before = inner.batch_sizes.snapshot();
    // k2's completion carries a fence that does not hold the key (a zombie's).
    let answers = run_batch::<Finishes>(
        inner,
        &[
            complete("acct", "k1", fences[0], "r1"),
            complete("acct", "k2", fences[1] + 1000, "r2"),
            complete("acct", "k3", fences[2], "r3"),
        ],
    )
    .await;
    assert!(answers[0].is_ok(), "{:?}", answers[0]);
    assert!(
        matches!(&answers[1], Err(StoreError::LeaseLost { key, fence, .. }) if key == "k2" && *fence == fences[1] + 1000),
        "{:?}",
        answers[1]
    );
    assert!(answers[2].is_ok(), "{:?}", answers[2]);
    // All three were one statement.
    let after = inner.batch_sizes.snapshot();
    let complete_stats = |all: &[crate::HistogramMetric]| {
        let h = all
            .iter()
            .find(|h| h.label == Some(("statement", "complete")))
            .unwrap();
        (h.count, h.sum)
    };
    let (c0, s0) = complete_stats(&before);
    let (c1, s1) = complete_stats(&after);
    assert_eq!(
        (c1 - c0, s1 - s0),
        (1, 3.0),
        "one statement carried the three"
    );
    for (key, done) in [("k1", true), ("k2", false), ("k3", true)] {
        let record = db.store.get("acct", key).await.unwrap().unwrap();
        assert_eq!(
            matches!(record.state, KeyState::Completed(_)),
            done,
            "{key}: {record:?}"
        );
    }
    assert!(db.store.record("orders", "r1").await.unwrap().is_some());
    assert!(
        db.store.record("orders", "r2").await.unwrap().is_none(),
        "the fenced completion's record must not be written"
    );
    assert!(db.store.record("orders", "r3").await.unwrap().is_some());
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_of_one_key_in_one_batch_are_settled_as_if_they_came_one_after_the_other() {
    let Some(db) = Db::new().await else { return };
    let inner = &*db.store.inner;
    let answers = run_batch::<Claims>(
        inner,
        &[
            claim("acct", "dup", 1),
            claim("acct", "other", 1),
            claim("acct", "dup", 1),
            claim("acct", "dup", 2),
        ],
    )
    .await;
    let first = fence(&answers[0]);
    fence(&answers[1]);
    assert!(
        matches!(&answers[2], Ok(Claim::InProgress { lease_left }) if *lease_left > Duration::from_secs(25)),
        "{:?}",
        answers[2]
    );
    match &answers[3] {
        Ok(Claim::Mismatch { request_digest }) => assert_eq!(
            request_digest.as_deref(),
            Some(&[1u8; 4][..]),
            "the mismatch names the first claim's digest"
        ),
        other => panic!("expected Mismatch, got {other:?}"),
    }
    assert_eq!(
        db.scalar("SELECT live FROM {s}.scope_counts WHERE scope = 'acct'")
            .await,
        2,
        "the copies add nothing to the count"
    );
    // A write-once record and a copy of its key in one batch of inserts: the first
    // inserts, the copy sees the first's record; the counter counts one.
    let insert = |value: &str| InsertJob {
        namespace: "charges",
        key: "c-1".into(),
        value: Bytes::from(value.to_owned()),
        after_ms: None,
        at_ms: None,
        counter: "charges_total",
        general: Default::default(),
    };
    let inserted = run_batch::<Inserts>(inner, &[insert("first"), insert("second")]).await;
    assert!(
        matches!(inserted[0], Ok(InsertOnce::Inserted)),
        "{:?}",
        inserted[0]
    );
    assert!(
        matches!(&inserted[1], Ok(InsertOnce::Existing(v)) if v == "first"),
        "{:?}",
        inserted[1]
    );
    assert_eq!(db.store.counter("charges_total").await.unwrap(), 1);
    // The same completion twice in one batch: the first applies, the copy finds the key
    // completed and is refused.
    let answers = run_batch::<Finishes>(
        inner,
        &[
            complete("acct", "dup", first, "rd"),
            complete("acct", "dup", first, "rd"),
        ],
    )
    .await;
    assert!(answers[0].is_ok(), "{:?}", answers[0]);
    assert!(
        matches!(answers[1], Err(StoreError::LeaseLost { .. })),
        "{:?}",
        answers[1]
    );
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_call_the_database_refuses_fails_alone_and_its_neighbours_are_answered() {
    let Some(db) = Db::new().await else { return };
    let inner = &*db.store.inner;
    // A NUL byte passes no store's validation; made by hand, it is what the database refuses
    // in a text parameter (SQLSTATE 22021), failing the whole statement.
    let jobs: Vec<ClaimJob> = (0..7)
        .map(|i| {
            let key = if i == 4 {
                "bad\0key".to_owned()
            } else {
                format!("good-{i}")
            };
            claim("acct", &key, 1)
        })
        .collect();
    let answers = run_batch::<Claims>(inner, &jobs).await;
    for (i, answer) in answers.iter().enumerate() {
        if i == 4 {
            assert!(
                matches!(answer, Err(StoreError::Internal(m)) if m.contains("22021")),
                "{answer:?}"
            );
        } else {
            fence(answer);
        }
    }
    assert_eq!(
        db.scalar("SELECT count(*) FROM {s}.keys").await,
        6,
        "the six good claims are in, the bad one is not"
    );
    assert_eq!(
        db.scalar("SELECT live FROM {s}.scope_counts WHERE scope = 'acct'")
            .await,
        6
    );
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_past_the_protocols_parameter_limit_is_one_statement_of_arrays() {
    let Some(db) = Db::new().await else { return };
    let inner = &*db.store.inner;
    // More calls than the 65 535 parameters one statement may have: with a parameter per value
    // this could not be sent at all; as arrays it is eight parameters.
    let n = 70_000;
    let jobs: Vec<ClaimJob> = (0..n)
        .map(|i| claim(if i % 2 == 0 { "a" } else { "b" }, &format!("k{i}"), 1))
        .collect();
    let answers = run_batch::<Claims>(inner, &jobs).await;
    assert_eq!(
        answers
            .iter()
            .filter(|a| matches!(a, Ok(Claim::Acquired(_))))
            .count(),
        n
    );
    assert_eq!(db.scalar("SELECT count(*) FROM {s}.keys").await, n as i64);
    assert_eq!(
        db.scalar("SELECT sum(live)::bigint FROM {s}.scope_counts")
            .await,
        n as i64
    );
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_admits_new_keys_up_to_the_scopes_quota_in_arrival_order() {
    let Some(db) = Db::new().await else { return };
    let inner = &*db.store.inner;
    let quota = |scope: &str, key: &str| claim_limited(scope, key, 1, 3);
    let first = run_batch::<Claims>(inner, &[quota("q", "a")]).await;
    fence(&first[0]);
    let answers = run_batch::<Claims>(
        inner,
        &[
            quota("q", "b"),
            quota("other", "x"),
            quota("q", "c"),
            quota("q", "d"),
            quota("q", "a"),
        ],
    )
    .await;
    fence(&answers[0]);
    fence(&answers[1]);
    fence(&answers[2]);
    assert!(
        matches!(answers[3], Ok(Claim::QuotaExceeded { .. })),
        "the fourth live key of q is refused: {:?}",
        answers[3]
    );
    assert!(
        matches!(answers[4], Ok(Claim::InProgress { .. })),
        "an existing key is no new key: {:?}",
        answers[4]
    );
    assert_eq!(
        db.scalar("SELECT live FROM {s}.scope_counts WHERE scope = 'q'")
            .await,
        3
    );
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_split_concurrent_calls_past_their_bounds_and_answer_every_one() {
    let Some(db) = Db::new().await else { return };
    let store = std::sync::Arc::new(db.store.clone());
    // More concurrent claims than one batch may carry, and completions whose bodies together
    // pass one batch's byte bound.
    let claims: Vec<_> = (0..1500)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .claim("acct", &format!("k{i}"), &Fingerprint([1; 32]), TTL)
                    .await
            })
        })
        .collect();
    let mut held = Vec::new();
    for task in claims {
        match task.await.unwrap().unwrap() {
            Claim::Acquired(h) => held.push(h),
            other => panic!("{other:?}"),
        }
    }
    let big = Bytes::from(vec![b'x'; 3 << 20]);
    let completes: Vec<_> = held
        .iter()
        .take(12)
        .cloned()
        .map(|h| {
            let (store, big) = (store.clone(), big.clone());
            tokio::spawn(async move {
                let response = crate::store::StoredResponse::new(200, big);
                store.complete(&h, &response, &[]).await
            })
        })
        .collect();
    for task in completes {
        task.await.unwrap().unwrap();
    }
    let sizes = db.store.inner.batch_sizes.snapshot();
    for h in &sizes {
        // The last bucket counts batches above the largest bound, MAX_BATCH_CALLS.
        assert_eq!(
            h.bounds.last().copied(),
            Some(super::super::lanes::MAX_BATCH_CALLS as f64)
        );
        assert_eq!(h.counts.last().copied(), Some(0), "{h:?}");
    }
    let claim = sizes
        .iter()
        .find(|h| h.label == Some(("statement", "claim")))
        .unwrap();
    assert!(claim.sum >= 1500.0, "{claim:?}");
    let complete = sizes
        .iter()
        .find(|h| h.label == Some(("statement", "complete")))
        .unwrap();
    assert!(
        complete.count >= 6,
        "12 bodies of 3 MiB go at most two to a batch under 8 MiB: {complete:?}"
    );
    assert_eq!(db.scalar("SELECT count(*) FROM {s}.keys").await, 1500);
    assert_eq!(
        db.scalar("SELECT count(*) FROM {s}.keys WHERE state = 1")
            .await,
        12
    );
    db.drop().await;
}

/// The WAL positions `(inserted up to, flushed up to)` as the database reports them.
async fn wal_positions(db: &Db) -> (i64, i64) {
    let row = db
        .raw
        .query_one(
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint,
                    pg_wal_lsn_diff(pg_current_wal_flush_lsn(), '0/0')::bigint",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_shows_a_claim_in_progress_waits_until_that_claim_is_durable() {
    let Some(db) = Db::new().await else { return };
    let inner = &*db.store.inner;
    // Claims commit without waiting for their flush; a later claim that answers "in progress"
    // (or "mismatch") must not return before the shown claim is flushed. Checked 20 times: the
    // WAL writer flushes on its own every 200 ms, so without the forced flush most rounds fail.
    for round in 0..20 {
        let key = format!("shown-{round}");
        fence(&run_batch::<Claims>(inner, &[claim("acct", &key, 1)]).await[0]);
        let (inserted, _) = wal_positions(&db).await;
        let shown = run_batch::<Claims>(
            inner,
            &[
                claim("acct", &key, 1),
                claim("acct", &format!("new-{round}"), 1),
            ],
        )
        .await;
        assert!(
            matches!(shown[0], Ok(Claim::InProgress { .. })),
            "{:?}",
            shown[0]
        );
        let (_, flushed) = wal_positions(&db).await;
        assert!(
            flushed >= inserted,
            "round {round}: answered 409 with the claim not flushed ({flushed} < {inserted})"
        );
    }
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_write_once_record_or_a_claim_read_back_is_shown_only_once_durable() {
    let Some(db) = Db::new().await else { return };
    let inner = &*db.store.inner;
    let insert = |key: &str| InsertJob {
        namespace: "charges",
        key: key.into(),
        value: Bytes::from_static(b"{}"),
        after_ms: None,
        at_ms: None,
        counter: "charges_total",
        general: Default::default(),
    };
    for round in 0..20 {
        // The insert commits without its flush; the same record again answers "existing".
        let key = format!("c-{round}");
        assert!(matches!(
            run_batch::<Inserts>(inner, &[insert(&key)]).await[0],
            Ok(InsertOnce::Inserted)
        ));
        let (inserted, _) = wal_positions(&db).await;
        assert!(matches!(
            run_batch::<Inserts>(inner, &[insert(&key)]).await[0],
            Ok(InsertOnce::Existing(_))
        ));
        let (_, flushed) = wal_positions(&db).await;
        assert!(
            flushed >= inserted,
            "round {round}: showed an existing record not flushed ({flushed} < {inserted})"
        );
        // A claim read back in progress (`get`, as a fenced holder does).
        let claim_key = format!("g-{round}");
        fence(&run_batch::<Claims>(inner, &[claim("acct", &claim_key, 1)]).await[0]);
        let (inserted, _) = wal_positions(&db).await;
        let record = db.store.get("acct", &claim_key).await.unwrap().unwrap();
        assert!(matches!(record.state, KeyState::InProgress { .. }));
        let (_, flushed) = wal_positions(&db).await;
        assert!(
            flushed >= inserted,
            "round {round}: read back a claim not flushed ({flushed} < {inserted})"
        );
    }
    db.drop().await;
}

/// Keys written behind the store's back, with their scopes' counts: `(scope, expired, live)`.
async fn keys_in_scopes(db: &Db, scopes: &[(&str, i32, i32)]) {
    for (scope, expired, live) in scopes {
        db.raw
            .execute(
                &format!(
                    "INSERT INTO \"{s}\".keys (scope, key, fingerprint, fence, state, expires_at,
                                               created_at)
                     SELECT $1, 'k' || n, '\\x00', n, 1,
                            CASE WHEN n <= $2::int4 THEN now() - interval '1 minute'
                                 ELSE now() + interval '1 hour' END, now()
                     FROM generate_series(1, $2::int4 + $3::int4) n",
                    s = db.schema
                ),
                &[scope, expired, live],
            )
            .await
            .unwrap();
        db.raw
            .execute(
                &format!(
                    "INSERT INTO \"{}\".scope_counts (scope, live) VALUES ($1, $2)",
                    db.schema
                ),
                &[scope, &i64::from(expired + live)],
            )
            .await
            .unwrap();
    }
}

/// One run of the key cleanup statement: rows deleted, and the scope the walk goes on from.
async fn cleanup_keys(db: &Db, batch: i64, from: &str, scopes: i64) -> (i64, Option<String>) {
    let inner = &*db.store.inner;
    let c = inner.pool.get().await.unwrap();
    let rows = inner
        .sql
        .cleanup_keys
        .query(&c, inner.pooling, &[&batch, &from, &scopes])
        .await
        .unwrap();
    (rows[0].get("deleted"), rows[0].get("next_scope"))
}

/// `(keys rows, scope_counts.live)` of a scope.
async fn rows_and_count(db: &Db, scope: &str) -> (i64, i64) {
    let row = db
        .raw
        .query_one(
            &format!(
                "SELECT (SELECT count(*) FROM \"{s}\".keys WHERE scope = $1),
                        (SELECT live FROM \"{s}\".scope_counts WHERE scope = $1)",
                s = db.schema
            ),
            &[&scope],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_cleanup_deletes_at_most_its_batch_from_at_most_its_scopes_and_names_the_next() {
    let Some(db) = Db::new().await else { return };
    keys_in_scopes(
        &db,
        &[("s1", 3, 1), ("s2", 4, 0), ("s3", 2, 2), ("s4", 5, 1)],
    )
    .await;
    // Three scopes per statement, five rows: s1..s3 hold 9 expired keys, s4 is not visited.
    assert_eq!(cleanup_keys(&db, 5, "", 3).await, (5, Some("s4".into())));
    assert_eq!(rows_and_count(&db, "s4").await, (6, 6));
    let left: i64 = db
        .scalar("SELECT count(*) FROM {s}.keys WHERE expires_at <= now() AND scope < 's4'")
        .await;
    assert_eq!(left, 4);
    // A batch that filled up runs again from the same scope; this one empties s1..s3.
    assert_eq!(cleanup_keys(&db, 5, "", 3).await, (4, Some("s4".into())));
    assert_eq!(cleanup_keys(&db, 5, "s4", 3).await, (5, None));
    assert_eq!(cleanup_keys(&db, 5, "s4", 3).await, (0, None));
    // Live keys stay, and every count went down by exactly the rows deleted in its scope.
    for (scope, live) in [("s1", 1), ("s2", 0), ("s3", 2), ("s4", 1)] {
        assert_eq!(rows_and_count(&db, scope).await, (live, live), "{scope}");
    }
    db.drop().await;
}

/// Several instances clean at once: a row another transaction holds is skipped, not waited for,
/// and stays counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_cleanup_skips_a_row_another_transaction_holds_and_keeps_it_counted() {
    let Some(db) = Db::new().await else { return };
    keys_in_scopes(&db, &[("a", 3, 0), ("b", 2, 1)]).await;
    let url = database_url().unwrap();
    let (mut other, conn) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    tokio::spawn(conn);
    let holder = other.transaction().await.unwrap();
    holder
        .execute(
            &format!(
                "SELECT 1 FROM \"{}\".keys WHERE scope = 'a' AND key = 'k1' FOR UPDATE",
                db.schema
            ),
            &[],
        )
        .await
        .unwrap();
    let run = tokio::time::timeout(Duration::from_secs(5), cleanup_keys(&db, 100, "", 1000));
    assert_eq!(
        run.await.expect("the cleanup waited for a held row"),
        (4, None)
    );
    holder.rollback().await.unwrap();
    assert_eq!(rows_and_count(&db, "a").await, (1, 1));
    assert_eq!(rows_and_count(&db, "b").await, (1, 1));
    db.drop().await;
}
