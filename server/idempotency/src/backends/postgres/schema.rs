//! Creating and migrating the schema at start-up, safely when several instances start at once.
//!
//! `CREATE SCHEMA IF NOT EXISTS`, then one transaction that creates `schema_migrations` if missing,
//! reads the applied versions (the schema's version is the newest of them) and applies the missing
//! migrations in order (each `IF NOT EXISTS`), recording them. A schema newer than this build
//! ([`SCHEMA_VERSION`]) is refused: an older binary must not serve tables it does not know. On PostgreSQL the transaction first takes a transaction-scoped advisory lock, so concurrent
//! start-ups queue; on databases without advisory locks (CockroachDB, YugabyteDB) concurrent runs
//! conflict instead, and the loser retries: serialization failures, deadlocks and the
//! unique/duplicate-object violations that racing `IF NOT EXISTS` statements raise are retried a
//! bounded number of times.

use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, GenericClient, SimpleQueryMessage};
use tracing::{info, warn};

/// One migration: its version and the statements it runs (with `{s}` for the quoted schema).
struct Migration {
    version: i32,
    sql: &'static str,
}

const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        sql: "
        CREATE TABLE IF NOT EXISTS {s}.keys (
            scope       text        NOT NULL,
            key         text        NOT NULL,
            fingerprint bytea       NOT NULL,
            fence       bigint      NOT NULL,
            state       smallint    NOT NULL,
            takeover    smallint    NOT NULL DEFAULT 0,
            lease_until timestamptz,
            expires_at  timestamptz NOT NULL,
            created_at  timestamptz NOT NULL,
            status      integer,
            headers     bytea,
            body        bytea,
            PRIMARY KEY (scope, key)
        );
        CREATE INDEX IF NOT EXISTS keys_expires_at ON {s}.keys (expires_at);
        CREATE TABLE IF NOT EXISTS {s}.records (
            namespace  text        NOT NULL,
            key        text        NOT NULL,
            value      bytea       NOT NULL,
            expires_at timestamptz,
            PRIMARY KEY (namespace, key)
        );
        CREATE INDEX IF NOT EXISTS records_expires_at ON {s}.records (expires_at)
            WHERE expires_at IS NOT NULL;
        CREATE TABLE IF NOT EXISTS {s}.counters (
            name  text   PRIMARY KEY,
            value bigint NOT NULL
        );
        CREATE SEQUENCE IF NOT EXISTS {s}.fence_seq;
    ",
    },
    // Version 2: the request digest of a key (to name the fields a reused key differs in), and the
    // per-scope row count behind `--max-live-keys-per-account`. `scope_counts.live` is the number
    // of `keys` rows of the scope, live or expired-but-not-yet-deleted; claim, release, cleanup
    // and the quota's purge keep it so in the statements that insert or delete those rows.
    Migration {
        version: 2,
        sql: "
        ALTER TABLE {s}.keys ADD COLUMN IF NOT EXISTS request_digest bytea;
        CREATE INDEX IF NOT EXISTS keys_scope_expires_at ON {s}.keys (scope, expires_at);
        CREATE TABLE IF NOT EXISTS {s}.scope_counts (
            scope text   PRIMARY KEY,
            live  bigint NOT NULL
        );
        INSERT INTO {s}.scope_counts (scope, live)
            SELECT scope, count(*) FROM {s}.keys GROUP BY scope
            ON CONFLICT (scope) DO UPDATE SET live = EXCLUDED.live;
    ",
    },
    // Version 3: counters spread over stripes (`sql::COUNTER_STRIPES` rows per name, summed on
    // read), so concurrent increments do not all update one row. The existing row becomes stripe 0.
    Migration {
        version: 3,
        sql: "
        ALTER TABLE {s}.counters ADD COLUMN IF NOT EXISTS stripe smallint NOT NULL DEFAULT 0;
        ALTER TABLE {s}.counters DROP CONSTRAINT IF EXISTS counters_pkey;
        ALTER TABLE {s}.counters ADD CONSTRAINT counters_pkey PRIMARY KEY (name, stripe);
    ",
    },
    // Version 4: room for HOT updates of `keys`, and one index fewer on it. A completion (and a
    // lease renewal) updates a key's row in place: `state`, `lease_until`, `status`, `headers`
    // and `body`, none of them in an index. PostgreSQL then writes the new row version as a HOT
    // update (a heap-only tuple, no new entry in any index) if the row's page has room for it;
    // otherwise the new version goes to another page and gets an entry in every index of `keys`.
    // With pages filled to the brim by the claims' inserts, about half the completions found no
    // room (benches/NOTEBOOK.md, "Measured, not done: the rows themselves"). `fillfactor = 50`
    // makes inserts leave half of each page free (a bigger table for fewer index writes); it
    // applies to pages filled from now on, so an existing table turns over as its expired rows are
    // deleted and vacuumed, without a rewrite. A claim that takes over an expired or abandoned
    // key sets a new `expires_at`, which `keys_scope_expires_at` indexes: that update is never
    // HOT, whatever the free space.
    //
    // `keys_expires_at (expires_at)` served only the cleanup's search for expired keys across
    // all scopes. The cleanup now finds them scope by scope through `keys_scope_expires_at
    // (scope, expires_at)` (`sql::cleanup_keys`), and every insert and every non-HOT update
    // costs one index entry fewer. A fresh schema gets the index from version 1 and loses it
    // here: the migrations are steps, and every schema ends in the same shape.
    Migration {
        version: 4,
        sql: "
        ALTER TABLE {s}.keys SET (fillfactor = 50);
        DROP INDEX IF EXISTS {s}.keys_expires_at;
    ",
    },
    // Version 5: the text columns that key a row (scope, key, namespace, counter name) compare
    // as bytes (`COLLATE "C"`) instead of by the database's default collation. Two reasons:
    // - Safety: an index ordered by a collation of the operating system's C library is only
    //   valid while that library sorts the same way; an upgrade that changes its collation
    //   (glibc 2.28 did, for most locales) silently corrupts the index, and a unique index that
    //   cannot find an existing `(scope, key)` lets a second claim of one key in. Byte order never
    //   changes.
    // - Cost: every descent of a primary key (a request makes about nine: claim, completion,
    //   the payment's record, the provider's charge) compares text; by bytes that is one
    //   `memcmp`, by a libc collation a copy and a `strcoll` per comparison (about 6 % of the
    //   database's CPU per request in a profile on a `C.UTF-8` cluster).
    // Keys are opaque: nothing sorts them for a reader. The heap is not rewritten (text to text
    // is binary-compatible); the indexes on these columns are rebuilt under an exclusive lock,
    // about 1.3 s per million rows on the test machine.
    Migration {
        version: 5,
        sql: "
        ALTER TABLE {s}.keys ALTER COLUMN scope TYPE text COLLATE \"C\",
                             ALTER COLUMN key TYPE text COLLATE \"C\";
        ALTER TABLE {s}.records ALTER COLUMN namespace TYPE text COLLATE \"C\",
                                ALTER COLUMN key TYPE text COLLATE \"C\";
        ALTER TABLE {s}.scope_counts ALTER COLUMN scope TYPE text COLLATE \"C\";
        ALTER TABLE {s}.counters ALTER COLUMN name TYPE text COLLATE \"C\";
    ",
    },
];

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i32 = 5;

const ATTEMPTS: u32 = 8;

/// Errors a concurrent migration may hit and that a retry resolves.
fn retryable(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| {
        [
            SqlState::T_R_SERIALIZATION_FAILURE,
            SqlState::T_R_DEADLOCK_DETECTED,
            SqlState::UNIQUE_VIOLATION,
            SqlState::DUPLICATE_TABLE,
            SqlState::DUPLICATE_SCHEMA,
            SqlState::DUPLICATE_OBJECT,
            SqlState::LOCK_NOT_AVAILABLE,
        ]
        .contains(c)
    })
}

/// Why a migration did not complete.
#[derive(Debug)]
pub(crate) enum MigrateError {
    /// The database refused or failed a statement (described in one line).
    Db(String),
    /// The schema is at `found`, newer than the `known` version of this build.
    TooNew {
        /// The schema's version (the newest applied migration).
        found: i32,
        /// [`SCHEMA_VERSION`].
        known: i32,
    },
}

/// Creates `schema` if needed and applies the missing migrations.
pub(crate) async fn migrate(client: &mut Client, schema: &str) -> Result<(), MigrateError> {
    migrate_to(client, schema, SCHEMA_VERSION).await
}

/// Creates `schema` if needed and applies the missing migrations up to version `target`.
pub(crate) async fn migrate_to(
    client: &mut Client,
    schema: &str,
    target: i32,
) -> Result<(), MigrateError> {
    let mut attempt = 0;
    loop {
        match migrate_once(client, schema, target).await {
            Err(Step::Db(e)) if retryable(&e) && attempt + 1 < ATTEMPTS => {
                attempt += 1;
                warn!(schema, attempt, error = %super::error::describe(&e), "schema migration raced another instance; retrying");
                tokio::time::sleep(super::error::jitter(Duration::from_millis(20), attempt)).await;
            }
            Ok(()) => return Ok(()),
            Err(Step::Db(e)) => return Err(MigrateError::Db(super::error::describe(&e))),
            Err(Step::TooNew(found)) => {
                return Err(MigrateError::TooNew {
                    found,
                    known: SCHEMA_VERSION,
                });
            }
        }
    }
}

/// How one run of the migration transaction failed.
enum Step {
    Db(tokio_postgres::Error),
    TooNew(i32),
}

impl From<tokio_postgres::Error> for Step {
    fn from(e: tokio_postgres::Error) -> Self {
        Step::Db(e)
    }
}

async fn migrate_once(client: &mut Client, schema: &str, target: i32) -> Result<(), Step> {
    let s = format!("\"{schema}\"");
    // Only the simple query protocol here: no named statement that a pooler in transaction mode
    // could strand on another server connection (see `super::statement`).
    let version = simple_column(client, "SELECT version()")
        .await?
        .into_iter()
        .next()
        .unwrap_or_default();
    let advisory = version.starts_with("PostgreSQL") && !version.contains("-YB-");
    client
        .batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {s}"))
        .await?;
    let tx = client.transaction().await?;
    if advisory {
        tx.batch_execute(&format!(
            "SELECT pg_advisory_xact_lock({})",
            lock_key(schema)
        ))
        .await?;
    }
    tx.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {s}.schema_migrations (
             version    integer     PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now()
         )"
    ))
    .await?;
    let applied: Vec<i32> =
        simple_column(&tx, &format!("SELECT version FROM {s}.schema_migrations"))
            .await?
            .iter()
            .filter_map(|v| v.parse().ok())
            .collect();
    if let Some(&newest) = applied.iter().max().filter(|v| **v > SCHEMA_VERSION) {
        tx.rollback().await?;
        return Err(Step::TooNew(newest));
    }
    let mut ran = Vec::new();
    for m in MIGRATIONS
        .iter()
        .filter(|m| m.version <= target && !applied.contains(&m.version))
    {
        tx.batch_execute(&m.sql.replace("{s}", &s)).await?;
        tx.batch_execute(&format!(
            "INSERT INTO {s}.schema_migrations (version) VALUES ({})",
            m.version
        ))
        .await?;
        ran.push(m.version);
    }
    tx.commit().await?;
    if !ran.is_empty() {
        info!(schema, versions = ?ran, "schema migrated");
    }
    Ok(())
}

/// The first column of every row `query` returns, as text (simple query protocol).
async fn simple_column(
    client: &impl GenericClient,
    query: &str,
) -> Result<Vec<String>, tokio_postgres::Error> {
    Ok(client
        .simple_query(query)
        .await?
        .into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
            _ => None,
        })
        .collect())
}

/// The advisory-lock key of a schema's migrations (FNV-1a of a fixed prefix and the name).
fn lock_key(schema: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in b"idemlog.migrate.".iter().chain(schema.as_bytes()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h as i64
}

#[cfg(test)]
mod tests {
    //! Each migration as a step from the previous version, on the database in `DATABASE_URL`
    //! (skipped without one, unless `CI` or `IDEMLOG_REQUIRE_POSTGRES=1`).

    use std::hash::{BuildHasher, Hasher};

    use tokio_postgres::{Client, NoTls};

    use super::*;

    async fn client() -> Option<(Client, String)> {
        let url = match std::env::var("DATABASE_URL") {
            Ok(url) if !url.is_empty() => url,
            _ => {
                let required = std::env::var_os("CI").is_some()
                    || std::env::var("IDEMLOG_REQUIRE_POSTGRES").as_deref() == Ok("1");
                assert!(!required, "DATABASE_URL is not set but required here");
                eprintln!("SKIPPED: DATABASE_URL is not set");
                return None;
            }
        };
        let (client, conn) = tokio_postgres::connect(&url, NoTls)
            .await
            .expect("connect to DATABASE_URL");
        tokio::spawn(conn);
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        Some((client, format!("m_{random:016x}")))
    }

    async fn versions(c: &Client, schema: &str) -> Vec<i32> {
        c.query(
            &format!("SELECT version FROM \"{schema}\".schema_migrations ORDER BY version"),
            &[],
        )
        .await
        .expect("read schema_migrations")
        .iter()
        .map(|r| r.get(0))
        .collect()
    }

    async fn drop_schema(c: &Client, schema: &str) {
        c.batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
            .await
            .expect("drop schema");
    }

    #[tokio::test]
    async fn version_1_creates_the_tables_on_an_empty_schema() {
        let Some((mut c, schema)) = client().await else {
            return;
        };
        migrate_to(&mut c, &schema, 1).await.expect("migrate to 1");
        assert_eq!(versions(&c, &schema).await, [1]);
        for table in ["keys", "records", "counters"] {
            c.query(&format!("SELECT * FROM \"{schema}\".{table}"), &[])
                .await
                .unwrap_or_else(|e| panic!("{table}: {e}"));
        }
        c.query(&format!("SELECT nextval('\"{schema}\".fence_seq')"), &[])
            .await
            .expect("fence_seq");
        drop_schema(&c, &schema).await;
    }

    #[tokio::test]
    async fn version_2_from_version_1_adds_request_digests_and_counts_each_scopes_existing_keys() {
        let Some((mut c, schema)) = client().await else {
            return;
        };
        migrate_to(&mut c, &schema, 1).await.expect("migrate to 1");
        for (scope, key) in [("acct_a", "k1"), ("acct_a", "k2"), ("acct_b", "k1")] {
            c.execute(
                &format!(
                    "INSERT INTO \"{schema}\".keys (scope, key, fingerprint, fence, state, \
                     expires_at, created_at) VALUES ($1, $2, '\\x00', 1, 1, now() + interval \
                     '1 hour', now())"
                ),
                &[&scope, &key],
            )
            .await
            .expect("a version-1 key row");
        }
        migrate_to(&mut c, &schema, 2).await.expect("migrate to 2");
        assert_eq!(versions(&c, &schema).await, [1, 2]);
        let counts: Vec<(String, i64)> = c
            .query(
                &format!("SELECT scope, live FROM \"{schema}\".scope_counts ORDER BY scope"),
                &[],
            )
            .await
            .expect("scope_counts")
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        assert_eq!(
            counts,
            [("acct_a".to_string(), 2), ("acct_b".to_string(), 1)]
        );
        let digests: i64 = c
            .query_one(
                &format!("SELECT count(*) FROM \"{schema}\".keys WHERE request_digest IS NULL"),
                &[],
            )
            .await
            .expect("request_digest column")
            .get(0);
        assert_eq!(digests, 3, "the old rows have no request digest");
        drop_schema(&c, &schema).await;
    }

    #[tokio::test]
    async fn version_3_from_version_2_stripes_the_counters_and_keeps_their_values() {
        let Some((mut c, schema)) = client().await else {
            return;
        };
        migrate_to(&mut c, &schema, 2).await.expect("migrate to 2");
        c.batch_execute(&format!(
            "INSERT INTO \"{schema}\".counters (name, value) VALUES ('charges', 41)"
        ))
        .await
        .expect("a version-2 counter");
        migrate_to(&mut c, &schema, 3).await.expect("migrate to 3");
        assert_eq!(versions(&c, &schema).await, [1, 2, 3]);
        // The old value is stripe 0; another stripe of the same name is now a row of its own.
        c.batch_execute(&format!(
            "INSERT INTO \"{schema}\".counters (name, stripe, value) VALUES ('charges', 5, 1)"
        ))
        .await
        .expect("a second stripe");
        let total: i64 = c
            .query_one(
                &format!(
                    "SELECT sum(value)::bigint FROM \"{schema}\".counters WHERE name = 'charges'"
                ),
                &[],
            )
            .await
            .expect("sum")
            .get(0);
        assert_eq!(total, 42);
        drop_schema(&c, &schema).await;
    }

    /// The indexes of `schema`'s `keys` table, by name.
    async fn keys_indexes(c: &Client, schema: &str) -> Vec<String> {
        c.query(
            "SELECT indexname::text FROM pg_catalog.pg_indexes
             WHERE schemaname = $1 AND tablename = 'keys' ORDER BY indexname",
            &[&schema],
        )
        .await
        .expect("pg_indexes")
        .iter()
        .map(|r| r.get(0))
        .collect()
    }

    /// The storage parameters of `schema`'s `keys` table (`fillfactor=50`, …).
    async fn keys_reloptions(c: &Client, schema: &str) -> Vec<String> {
        c.query_one(
            &format!(
                "SELECT COALESCE(reloptions, '{{}}')::text[] FROM pg_catalog.pg_class
                 WHERE oid = '\"{schema}\".keys'::regclass"
            ),
            &[],
        )
        .await
        .expect("pg_class")
        .get(0)
    }

    #[tokio::test]
    async fn version_4_from_version_3_leaves_room_on_keys_pages_and_drops_the_expiry_index() {
        let Some((mut c, schema)) = client().await else {
            return;
        };
        migrate_to(&mut c, &schema, 3).await.expect("migrate to 3");
        for (scope, key, expires) in [("acct_a", "k1", "1 hour"), ("acct_b", "k1", "-1 hour")] {
            c.execute(
                &format!(
                    "INSERT INTO \"{schema}\".keys (scope, key, fingerprint, fence, state, \
                     expires_at, created_at) VALUES ($1, $2, '\\x00', 1, 1, now() + $3::text::interval, \
                     now())"
                ),
                &[&scope, &key, &expires],
            )
            .await
            .expect("a version-3 key row");
        }
        assert_eq!(
            keys_indexes(&c, &schema).await,
            ["keys_expires_at", "keys_pkey", "keys_scope_expires_at"]
        );
        assert!(keys_reloptions(&c, &schema).await.is_empty());
        migrate_to(&mut c, &schema, 4).await.expect("migrate to 4");
        assert_eq!(versions(&c, &schema).await, [1, 2, 3, 4]);
        assert_eq!(
            keys_indexes(&c, &schema).await,
            ["keys_pkey", "keys_scope_expires_at"]
        );
        assert_eq!(keys_reloptions(&c, &schema).await, ["fillfactor=50"]);
        let rows: Vec<(String, bool)> = c
            .query(
                &format!("SELECT scope, expires_at > now() FROM \"{schema}\".keys ORDER BY scope"),
                &[],
            )
            .await
            .expect("keys rows")
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        assert_eq!(
            rows,
            [("acct_a".to_string(), true), ("acct_b".to_string(), false)],
            "the rows are kept, the expired one too"
        );
        // Applying the migrations again changes nothing.
        migrate_to(&mut c, &schema, 4)
            .await
            .expect("migrate to 4 again");
        assert_eq!(versions(&c, &schema).await, [1, 2, 3, 4]);
        drop_schema(&c, &schema).await;
    }

    /// The collation of each text column that keys a row, as `table.column collation`.
    async fn key_collations(c: &Client, schema: &str) -> Vec<String> {
        c.query(
            "SELECT t.relname || '.' || a.attname || ' ' || co.collname
             FROM pg_catalog.pg_attribute a
             JOIN pg_catalog.pg_class t ON t.oid = a.attrelid
             JOIN pg_catalog.pg_namespace n ON n.oid = t.relnamespace
             JOIN pg_catalog.pg_collation co ON co.oid = a.attcollation
             WHERE n.nspname = $1 AND t.relkind = 'r' AND a.attnum > 0
               AND (t.relname, a.attname) IN (('keys', 'scope'), ('keys', 'key'),
                 ('records', 'namespace'), ('records', 'key'), ('scope_counts', 'scope'),
                 ('counters', 'name'))
             ORDER BY 1",
            &[&schema],
        )
        .await
        .expect("pg_attribute")
        .iter()
        .map(|r| r.get(0))
        .collect()
    }

    const BYTE_ORDER: [&str; 6] = [
        "counters.name C",
        "keys.key C",
        "keys.scope C",
        "records.key C",
        "records.namespace C",
        "scope_counts.scope C",
    ];

    #[tokio::test]
    async fn version_5_from_version_4_compares_row_keys_as_bytes_and_keeps_every_row() {
        let Some((mut c, schema)) = client().await else {
            return;
        };
        migrate_to(&mut c, &schema, 4).await.expect("migrate to 4");
        assert!(
            key_collations(&c, &schema)
                .await
                .iter()
                .all(|col| col.ends_with(" default")),
            "version 4 keys rows by the database's collation"
        );
        let s = format!("\"{schema}\"");
        for (scope, key) in [("acct_a", "k1"), ("acct_a", "K1"), ("acct_é", "k1")] {
            c.execute(
                &format!(
                    "INSERT INTO {s}.keys (scope, key, fingerprint, fence, state, expires_at, \
                     created_at) VALUES ($1, $2, '\\x00', 1, 1, now() + interval '1 hour', now())"
                ),
                &[&scope, &key],
            )
            .await
            .expect("a version-4 key row");
        }
        c.batch_execute(&format!(
            "INSERT INTO {s}.records (namespace, key, value) VALUES ('payments', 'pay_1', '\\x01');
             INSERT INTO {s}.scope_counts (scope, live) VALUES ('acct_a', 2), ('acct_é', 1);
             INSERT INTO {s}.counters (name, stripe, value) VALUES ('charges', 3, 7);"
        ))
        .await
        .expect("version-4 rows");
        migrate_to(&mut c, &schema, 5).await.expect("migrate to 5");
        assert_eq!(versions(&c, &schema).await, [1, 2, 3, 4, 5]);
        assert_eq!(key_collations(&c, &schema).await, BYTE_ORDER);
        // Every row is still found through its rebuilt primary key, and keys differing only in
        // case are still two keys.
        for (scope, key) in [("acct_a", "k1"), ("acct_a", "K1"), ("acct_é", "k1")] {
            let found = c
                .query_opt(
                    &format!("SELECT 1 FROM {s}.keys WHERE scope = $1 AND key = $2"),
                    &[&scope, &key],
                )
                .await
                .expect("key lookup");
            assert!(found.is_some(), "{scope}/{key} after the migration");
        }
        let counts: Vec<(String, i64)> = c
            .query(
                &format!("SELECT scope, live FROM {s}.scope_counts ORDER BY scope"),
                &[],
            )
            .await
            .expect("counts")
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        assert_eq!(
            counts,
            [("acct_a".to_string(), 2), ("acct_é".to_string(), 1)]
        );
        let value: i64 = c
            .query_one(
                &format!("SELECT value FROM {s}.counters WHERE name = 'charges' AND stripe = 3"),
                &[],
            )
            .await
            .expect("counter")
            .get(0);
        assert_eq!(value, 7);
        let record = c
            .query_opt(
                &format!(
                    "SELECT 1 FROM {s}.records WHERE namespace = 'payments' AND key = 'pay_1'"
                ),
                &[],
            )
            .await
            .expect("record lookup");
        assert!(record.is_some());
        migrate_to(&mut c, &schema, 5)
            .await
            .expect("migrate to 5 again");
        assert_eq!(versions(&c, &schema).await, [1, 2, 3, 4, 5]);
        drop_schema(&c, &schema).await;
    }

    #[tokio::test]
    async fn a_fresh_schema_ends_in_the_same_shape_as_a_migrated_one() {
        let Some((mut c, schema)) = client().await else {
            return;
        };
        migrate(&mut c, &schema).await.expect("migrate");
        assert_eq!(
            versions(&c, &schema).await,
            (1..=SCHEMA_VERSION).collect::<Vec<_>>()
        );
        assert_eq!(
            keys_indexes(&c, &schema).await,
            ["keys_pkey", "keys_scope_expires_at"]
        );
        assert_eq!(keys_reloptions(&c, &schema).await, ["fillfactor=50"]);
        assert_eq!(key_collations(&c, &schema).await, BYTE_ORDER);
        drop_schema(&c, &schema).await;
    }

    #[test]
    fn every_known_version_has_one_migration_in_order() {
        let versions: Vec<i32> = MIGRATIONS.iter().map(|m| m.version).collect();
        assert_eq!(versions, (1..=SCHEMA_VERSION).collect::<Vec<_>>());
    }
}
