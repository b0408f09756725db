//! The SQLite reference design of issue 5: what a team would otherwise build.
//!
//! One table, WAL, a claim that is a single `INSERT … ON CONFLICT DO UPDATE … WHERE expired`, and a
//! completion that is a guarded `UPDATE`. Every thread has its own connection with a busy timeout and
//! its own prepared statements; every statement commits on its own (autocommit), as it must: a claim
//! has to be durable before the handler runs.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

/// `PRAGMA synchronous` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synchronous {
    /// fsync of the WAL at every commit.
    Full,
    /// WAL fsynced only at checkpoints.
    Normal,
}

impl Synchronous {
    fn pragma(self) -> &'static str {
        match self {
            Synchronous::Full => "FULL",
            Synchronous::Normal => "NORMAL",
        }
    }
}

/// How long a connection waits for the write lock before failing with `SQLITE_BUSY`.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The schema, verbatim from the column list.
pub const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS idempotency_keys (
    scope        TEXT    NOT NULL,
    key          TEXT    NOT NULL,
    fingerprint  BLOB    NOT NULL,
    state        TEXT    NOT NULL,
    status_code  INTEGER,
    content_type TEXT,
    location     TEXT,
    body         BLOB,
    created_at   INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL,
    PRIMARY KEY (scope, key)
)";

/// Claim: insert, or take over a row whose TTL has passed. One row changed means acquired.
pub const CLAIM: &str = "INSERT INTO idempotency_keys
    (scope, key, fingerprint, state, created_at, expires_at)
    VALUES (?1, ?2, ?3, 'in_progress', ?4, ?5)
    ON CONFLICT (scope, key) DO UPDATE SET
        fingerprint = excluded.fingerprint,
        state = 'in_progress',
        status_code = NULL,
        content_type = NULL,
        location = NULL,
        body = NULL,
        created_at = excluded.created_at,
        expires_at = excluded.expires_at
    WHERE idempotency_keys.expires_at <= excluded.created_at";

/// Complete: store the response on a row still in progress.
pub const COMPLETE: &str = "UPDATE idempotency_keys
    SET state = 'completed', status_code = ?3, content_type = ?4, location = ?5, body = ?6
    WHERE scope = ?1 AND key = ?2 AND state = 'in_progress'";

/// After a claim that changed nothing: what is there (the replay path).
pub const LOOKUP: &str = "SELECT fingerprint, state, status_code, content_type, location, body
    FROM idempotency_keys WHERE scope = ?1 AND key = ?2";

/// Creates the database file with its table, in WAL mode.
pub fn create(path: &Path) -> rusqlite::Result<()> {
    let conn = connect(path, Synchronous::Full)?;
    conn.execute_batch(SCHEMA)
}

/// Opens a connection as each caller thread does: WAL, the given `synchronous`, a busy timeout.
pub fn connect(path: &Path, synchronous: Synchronous) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    assert_eq!(mode.to_ascii_lowercase(), "wal", "SQLite refused WAL mode");
    conn.execute_batch(&format!("PRAGMA synchronous = {}", synchronous.pragma()))?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    Ok(conn)
}

/// A thread's connection and prepared statements.
pub struct Session<'c> {
    claim: rusqlite::Statement<'c>,
    complete: rusqlite::Statement<'c>,
    lookup: rusqlite::Statement<'c>,
}

/// What a claim found.
#[derive(Debug, PartialEq, Eq)]
pub enum Claimed {
    /// The row was inserted (or an expired one taken over).
    Acquired,
    /// The key was completed with this fingerprint: replay status and body.
    Completed {
        /// Stored status.
        status: i64,
        /// Stored body length.
        body_len: usize,
    },
    /// Anything else (in progress or another fingerprint).
    Other,
}

impl<'c> Session<'c> {
    /// Prepares the statements on `conn`.
    pub fn new(conn: &'c Connection) -> rusqlite::Result<Self> {
        Ok(Session {
            claim: conn.prepare(CLAIM)?,
            complete: conn.prepare(COMPLETE)?,
            lookup: conn.prepare(LOOKUP)?,
        })
    }

    /// Claims `(scope, key)`; when the row was not acquired, reads it back as the reference design
    /// must to answer the request.
    pub fn claim(
        &mut self,
        scope: &str,
        key: &str,
        fingerprint: &[u8],
        ttl_ms: i64,
    ) -> rusqlite::Result<Claimed> {
        let now = idemlog_benches::now_ms();
        let changed = self
            .claim
            .execute(params![scope, key, fingerprint, now, now + ttl_ms])?;
        if changed == 1 {
            return Ok(Claimed::Acquired);
        }
        let row = self
            .lookup
            .query_row(params![scope, key], |r| {
                let stored_fp: Vec<u8> = r.get(0)?;
                let state: String = r.get(1)?;
                let status: Option<i64> = r.get(2)?;
                let _content_type: Option<String> = r.get(3)?;
                let _location: Option<String> = r.get(4)?;
                let body: Option<Vec<u8>> = r.get(5)?;
                Ok((stored_fp, state, status, body))
            })
            .optional()?;
        Ok(match row {
            Some((stored_fp, state, Some(status), Some(body)))
                if stored_fp == fingerprint && state == "completed" =>
            {
                Claimed::Completed {
                    status,
                    body_len: body.len(),
                }
            }
            _ => Claimed::Other,
        })
    }

    /// Completes a claimed row; returns whether it was still in progress.
    pub fn complete(
        &mut self,
        scope: &str,
        key: &str,
        status: i64,
        content_type: &str,
        location: &str,
        body: &[u8],
    ) -> rusqlite::Result<bool> {
        let changed =
            self.complete
                .execute(params![scope, key, status, content_type, location, body])?;
        Ok(changed == 1)
    }
}
