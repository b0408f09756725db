//! Creating and migrating the schema at start-up, safely when several instances start at once.
//!
//! `CREATE SCHEMA IF NOT EXISTS`, then one transaction that creates `schema_migrations` if missing,
//! reads the applied versions and applies the missing migrations (each `IF NOT EXISTS`), recording
//! them. On PostgreSQL the transaction first takes a transaction-scoped advisory lock, so concurrent
//! start-ups queue; on databases without advisory locks (CockroachDB, YugabyteDB) concurrent runs
//! conflict instead, and the loser retries: serialization failures, deadlocks and the
//! unique/duplicate-object violations that racing `IF NOT EXISTS` statements raise are retried a
//! bounded number of times.

use std::time::Duration;

use tokio_postgres::Client;
use tokio_postgres::error::SqlState;
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
    // Issue 13: the request digest of a key (to name the fields a reused key differs in), and the
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
];

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i32 = 2;

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

/// Creates `schema` if needed and applies the missing migrations.
pub(crate) async fn migrate(client: &mut Client, schema: &str) -> Result<(), String> {
    let mut attempt = 0;
    loop {
        match migrate_once(client, schema).await {
            Err(e) if retryable(&e) && attempt + 1 < ATTEMPTS => {
                attempt += 1;
                warn!(schema, attempt, error = %super::error::describe(&e), "schema migration raced another instance; retrying");
                tokio::time::sleep(super::error::jitter(Duration::from_millis(20), attempt)).await;
            }
            other => return other.map_err(|e| super::error::describe(&e)),
        }
    }
}

async fn migrate_once(client: &mut Client, schema: &str) -> Result<(), tokio_postgres::Error> {
    let s = format!("\"{schema}\"");
    let version: String = client.query_one("SELECT version()", &[]).await?.get(0);
    let advisory = version.starts_with("PostgreSQL") && !version.contains("-YB-");
    client
        .batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {s}"))
        .await?;
    let tx = client.transaction().await?;
    if advisory {
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&lock_key(schema)])
            .await?;
    }
    tx.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {s}.schema_migrations (
             version    integer     PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now()
         )"
    ))
    .await?;
    let applied: Vec<i32> = tx
        .query(&format!("SELECT version FROM {s}.schema_migrations"), &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut ran = Vec::new();
    for m in MIGRATIONS.iter().filter(|m| !applied.contains(&m.version)) {
        tx.batch_execute(&m.sql.replace("{s}", &s)).await?;
        tx.execute(
            &format!("INSERT INTO {s}.schema_migrations (version) VALUES ($1)"),
            &[&m.version],
        )
        .await?;
        ran.push(m.version);
    }
    tx.commit().await?;
    if let Some(newest) = applied.iter().max().filter(|v| **v > SCHEMA_VERSION) {
        warn!(
            schema,
            newest,
            known = SCHEMA_VERSION,
            "the schema is newer than this build"
        );
    }
    if !ran.is_empty() {
        info!(schema, versions = ?ran, "schema migrated");
    }
    Ok(())
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
