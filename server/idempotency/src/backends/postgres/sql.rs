//! The statements, with the (validated, quoted) schema name baked in once at connect time.
//!
//! Key states: `state` 0 = in progress, 1 = completed. `takeover` records how the current claim
//! came to be: 0 = fresh insert, 1 = replaced an expired record, 2 = took over a lease that ran out.
//! Every time comes from the database's `now()`; epoch milliseconds are computed in SQL. Each
//! statement carries its parameter types (see [`super::statement`] for why and how it is sent).

use tokio_postgres::types::Type;

use super::statement::Sql;

const TEXT: Type = Type::TEXT;
const BYTEA: Type = Type::BYTEA;
const INT4: Type = Type::INT4;
const INT8: Type = Type::INT8;
const TEXTS: Type = Type::TEXT_ARRAY;
const BYTEAS: Type = Type::BYTEA_ARRAY;
const INT8S: Type = Type::INT8_ARRAY;
/// The parameters of a batch of record puts: namespaces, keys, values, after-ms, at-ms.
const PUTS: [Type; 5] = [TEXTS, TEXTS, BYTEAS, INT8S, INT8S];

/// Rows each counter is spread over (see `insert_once`).
pub(crate) const COUNTER_STRIPES: i16 = 16;

/// State value of an in-progress key.
pub(crate) const IN_PROGRESS: i16 = 0;
/// State value of a completed key.
pub(crate) const COMPLETED: i16 = 1;

/// `expr` (a timestamptz) as epoch milliseconds.
fn ms(expr: &str) -> String {
    format!("floor(extract(epoch FROM {expr}) * 1000)::bigint")
}

/// The expiry of a record from two nullable parameters: `after_ms` (from now) or `at_ms` (epoch
/// ms); both NULL means never.
fn expiry(after: &str, at: &str) -> String {
    format!(
        "CASE WHEN {after} IS NOT NULL THEN now() + {after} * interval '1 millisecond' \
         WHEN {at} IS NOT NULL THEN to_timestamp(0) + {at} * interval '1 millisecond' END"
    )
}

/// All statements of one schema.
pub(crate) struct Statements {
    pub claim_new: Sql,
    pub claim: Sql,
    pub complete: Sql,
    pub release: Sql,
    pub extend: Sql,
    pub get: Sql,
    pub record: Sql,
    pub write_puts: Sql,
    pub delete_records: Sql,
    pub insert_once: Sql,
    pub counter: Sql,
    pub cleanup_keys: Sql,
    pub purge_scope: Sql,
    pub cleanup_records: Sql,
    pub keys_estimate: Sql,
    pub flush_wal: Sql,
}

impl Statements {
    pub(crate) fn new(schema: &str) -> Self {
        let s = format!("\"{schema}\"");
        let seq = format!("'\"{schema}\".fence_seq'");
        let lease_left =
            "GREATEST(0, ceil(extract(epoch FROM (k.lease_until - now())) * 1000))::bigint";
        // Puts of business records, from arrays starting at parameter `first`. Removals are a
        // separate statement: CockroachDB refuses two modifications of one table in a statement.
        let puts_cte = |first: usize, guard: &str| {
            let (ns, key, value, after, at) = (first, first + 1, first + 2, first + 3, first + 4);
            format!(
                "puts AS (
                   INSERT INTO {s}.records AS r (namespace, key, value, expires_at)
                   SELECT w.ns, w.k, w.v, {exp}
                   FROM unnest(${ns}::text[], ${key}::text[], ${value}::bytea[], ${after}::bigint[],
                               ${at}::bigint[]) AS w(ns, k, v, after_ms, at_ms)
                   {guard}
                   ON CONFLICT (namespace, key) DO UPDATE
                     SET value = EXCLUDED.value, expires_at = EXCLUDED.expires_at
                   RETURNING 1
                 )",
                exp = expiry("w.after_ms", "w.at_ms"),
            )
        };
        Self {
            // The common case, a key never seen: $1 scope, $2 key, $3 fingerprint, $4 ttl ms, $5
            // lease ms, $6 request digest (or NULL), $7 most live keys of the scope (0: no limit).
            //
            // Inserts the key unless it has a row, and counts it; returns its fence, or no fence
            // when the key has a row (the caller then runs `claim`, which handles every case).
            // A key inserted over the quota trips the same guard as `claim` (the statement rolls
            // back) and the caller runs `claim`, which answers 429 after its purge. Same
            // durability as `claim`. About a third of `claim`'s database CPU (measured with
            // pgbench: 456 against 668 µs per call on the 2-core test machine), because it plans
            // and starts up only two small modifications.
            claim_new: Sql::new(format!(
                "WITH ins AS (
                   INSERT INTO {s}.keys AS k
                     (scope, key, fingerprint, fence, state, takeover, lease_until, expires_at, created_at,
                      request_digest)
                   VALUES ($1, $2, $3, nextval({seq}), {IN_PROGRESS}, 0,
                           now() + $5::bigint * interval '1 millisecond',
                           now() + $4::bigint * interval '1 millisecond', now(), $6::bytea)
                   ON CONFLICT (scope, key) DO NOTHING
                   RETURNING k.fence, {exp_ms} AS expires_ms
                 ), bump AS (
                   INSERT INTO {s}.scope_counts AS q (scope, live)
                   SELECT $1, 1 FROM ins
                   ON CONFLICT (scope) DO UPDATE SET live = q.live + 1
                   WHERE $7::bigint = 0 OR q.live < $7::bigint
                   RETURNING 1
                 )
                 SELECT set_config('synchronous_commit', 'off', true) AS async_commit,
                        1 / CASE WHEN EXISTS (SELECT 1 FROM ins) AND NOT EXISTS (SELECT 1 FROM bump)
                                 THEN 0 ELSE 1 END AS consistent,
                        i.fence, i.expires_ms
                 FROM (SELECT 1) one LEFT JOIN ins i ON true",
                exp_ms = ms("k.expires_at"),
            ), &[TEXT, TEXT, BYTEA, INT8, INT8, BYTEA, INT8]),
            // $1 scope, $2 key, $3 fingerprint, $4 ttl ms, $5 lease ms, $6 request digest (or
            // NULL), $7 most live keys of the scope (0: no limit).
            //
            // One statement in its own implicit transaction, so the rows it locks (the key's, and
            // the scope's count row that every new key of the scope updates) are held only while
            // it runs, never across a round trip.
            //
            // A key with no row is new: `bump` adds it to the scope's row count, unless the count
            // has reached $7, and only then is it inserted. The count stays exact: the `guard`
            // row divides by zero, which aborts the statement and rolls the count back, when
            // `bumped` and `inserted` disagree (a concurrent insert or delete of the key between
            // the snapshot and the upsert); the caller then runs it again (SQLSTATE 22012 is
            // read as "stale" for this statement only). The guard's columns are selected, so the
            // planner cannot drop them, and it is the left side of a LEFT JOIN, so it is
            // evaluated even when the answer has no row.
            //
            // Durability: the statement sets `synchronous_commit = off` for its own transaction
            // (`set_config(..., true)` is transaction-local), so the claim commits without
            // waiting for its WAL flush. This is safe because WAL is flushed in order: the
            // request that made the claim answers only after its `complete` or `release`, whose
            // synchronous commit flushes every earlier commit record too, the claim's included.
            // A crash before that can lose the claim (and the provider's charge record, written
            // the same way), together with a request that never got an answer: the key then runs
            // again, and the provider's record of the downstream key is gone with it, so nothing
            // is charged twice. An answer that shows a claim in progress or a mismatch is sent
            // only after the caller has forced a flush (`flush_wal`), so nobody acts on a claim
            // a crash could take back. Completed records are written by synchronous commits and
            // are visible only once durable.
            claim: Sql::new(format!(
                "WITH existing AS (
                   SELECT 1 FROM {s}.keys WHERE scope = $1 AND key = $2
                 ), bump AS (
                   INSERT INTO {s}.scope_counts AS q (scope, live)
                   SELECT $1, 1 WHERE NOT EXISTS (SELECT 1 FROM existing)
                   ON CONFLICT (scope) DO UPDATE SET live = q.live + 1
                   WHERE $7::bigint = 0 OR q.live < $7::bigint
                   RETURNING 1
                 ), claimed AS (
                   INSERT INTO {s}.keys AS k
                     (scope, key, fingerprint, fence, state, takeover, lease_until, expires_at, created_at,
                      request_digest)
                   SELECT $1, $2, $3, nextval({seq}), {IN_PROGRESS}, 0,
                           now() + $5::bigint * interval '1 millisecond',
                           now() + $4::bigint * interval '1 millisecond', now(), $6::bytea
                   WHERE EXISTS (SELECT 1 FROM existing) OR EXISTS (SELECT 1 FROM bump)
                   ON CONFLICT (scope, key) DO UPDATE SET
                     fingerprint = EXCLUDED.fingerprint,
                     fence = GREATEST(nextval({seq}), k.fence + 1),
                     state = {IN_PROGRESS},
                     takeover = CASE WHEN k.expires_at <= now() THEN 1 ELSE 2 END,
                     lease_until = EXCLUDED.lease_until,
                     expires_at = EXCLUDED.expires_at,
                     created_at = EXCLUDED.created_at,
                     request_digest = EXCLUDED.request_digest,
                     status = NULL, headers = NULL, body = NULL
                   WHERE k.expires_at <= now()
                      OR (k.state = {IN_PROGRESS} AND k.lease_until <= now()
                          AND k.fingerprint = EXCLUDED.fingerprint)
                   RETURNING k.fence, k.takeover, {exp_ms} AS expires_ms,
                             -- The insert path writes takeover 0, the update path 1 or 2: a
                             -- portable way to tell them apart (no xmax).
                             (k.takeover = 0) AS inserted
                 ), answer AS (
                   SELECT true AS acquired, fence, takeover, expires_ms,
                          NULL::bool AS same_fp, NULL::smallint AS state, NULL::bigint AS lease_left_ms,
                          NULL::integer AS status, NULL::bytea AS headers, NULL::bytea AS body,
                          NULL::bool AS takeable, NULL::bytea AS request_digest,
                          false AS quota_full, NULL::bigint AS next_expiry_ms
                   FROM claimed
                   UNION ALL
                   SELECT false, k.fence, NULL, {exp_ms}, k.fingerprint = $3, k.state, {lease_left},
                          k.status,
                          CASE WHEN k.fingerprint = $3 THEN k.headers END,
                          CASE WHEN k.fingerprint = $3 THEN k.body END,
                          (k.expires_at <= now()
                           OR (k.state = {IN_PROGRESS} AND k.lease_until <= now() AND k.fingerprint = $3)),
                          CASE WHEN k.fingerprint <> $3 THEN k.request_digest END,
                          false, NULL
                   FROM {s}.keys k
                   WHERE k.scope = $1 AND k.key = $2 AND NOT EXISTS (SELECT 1 FROM claimed)
                   UNION ALL
                   SELECT false, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                          true,
                          (SELECT {next_ms} FROM {s}.keys n
                           WHERE n.scope = $1 AND n.expires_at > now()
                           ORDER BY n.expires_at LIMIT 1)
                   WHERE NOT EXISTS (SELECT 1 FROM existing) AND NOT EXISTS (SELECT 1 FROM bump)
                 )
                 SELECT g.async_commit, g.consistent, a.*
                 FROM (SELECT set_config('synchronous_commit', 'off', true) AS async_commit,
                              1 / CASE WHEN EXISTS (SELECT 1 FROM bump)
                                          = EXISTS (SELECT 1 FROM claimed WHERE inserted)
                                       THEN 1 ELSE 0 END AS consistent) g
                 LEFT JOIN answer a ON true",
                exp_ms = ms("k.expires_at"),
                next_ms = "GREATEST(1, ceil(extract(epoch FROM (n.expires_at - now())) * 1000))::bigint",
            ), &[TEXT, TEXT, BYTEA, INT8, INT8, BYTEA, INT8]),
            // $1 scope: deletes the scope's expired keys and takes them off its count (a claim
            // refused by the quota does this before it answers 429).
            purge_scope: Sql::new(format!(
                "WITH gone AS (
                   DELETE FROM {s}.keys WHERE scope = $1 AND expires_at <= now() RETURNING 1
                 ), fix AS (
                   UPDATE {s}.scope_counts SET live = live - (SELECT count(*) FROM gone)
                   WHERE scope = $1 AND EXISTS (SELECT 1 FROM gone)
                   RETURNING 1
                 )
                 SELECT count(*) FROM gone"
            ), &[TEXT]),
            // $1 scope, $2 key, $3 fence, $4 status, $5 headers, $6 body, $7..$11 put arrays.
            complete: Sql::new(format!(
                "WITH done AS (
                   UPDATE {s}.keys SET state = {COMPLETED}, lease_until = NULL,
                                       status = $4, headers = $5, body = $6
                   WHERE scope = $1 AND key = $2 AND fence = $3 AND state = {IN_PROGRESS}
                     AND expires_at > now()
                   RETURNING 1
                 ), {records}
                 SELECT (SELECT count(*) FROM done) AS done",
                records = puts_cte(7, "WHERE EXISTS (SELECT 1 FROM done)"),
            ), &[TEXT, TEXT, INT8, INT4, BYTEA, BYTEA, TEXTS, TEXTS, BYTEAS, INT8S, INT8S]),
            // $1 scope, $2 key, $3 fence.
            release: Sql::new(format!(
                "WITH gone AS (
                   DELETE FROM {s}.keys
                   WHERE scope = $1 AND key = $2 AND fence = $3 AND state = {IN_PROGRESS}
                     AND expires_at > now()
                   RETURNING 1
                 ), fix AS (
                   UPDATE {s}.scope_counts SET live = live - 1
                   WHERE scope = $1 AND EXISTS (SELECT 1 FROM gone)
                   RETURNING 1
                 )
                 SELECT count(*) FROM gone"
            ), &[TEXT, TEXT, INT8]),
            // $1 scope, $2 key, $3 fence, $4 lease ms.
            extend: Sql::new(format!(
                "UPDATE {s}.keys SET lease_until = now() + $4::bigint * interval '1 millisecond'
                 WHERE scope = $1 AND key = $2 AND fence = $3 AND state = {IN_PROGRESS}
                   AND expires_at > now()
                 RETURNING 1"
            ), &[TEXT, TEXT, INT8, INT8]),
            // $1 scope, $2 key.
            get: Sql::new(format!(
                "SELECT k.fingerprint, k.fence, {exp_ms} AS expires_ms, {created_ms} AS created_ms,
                        k.state,
                        {lease_left} AS lease_left_ms, k.status, k.headers, k.body
                 FROM {s}.keys k
                 WHERE k.scope = $1 AND k.key = $2 AND k.expires_at > now()",
                exp_ms = ms("k.expires_at"),
                created_ms = ms("k.created_at"),
            ), &[TEXT, TEXT]),
            // $1 namespace, $2 key.
            record: Sql::new(format!(
                "SELECT value FROM {s}.records
                 WHERE namespace = $1 AND key = $2 AND (expires_at IS NULL OR expires_at > now())"
            ), &[TEXT, TEXT]),
            // $1..$5 put arrays.
            write_puts: Sql::new(format!(
                "WITH {records} SELECT count(*) FROM puts",
                records = puts_cte(1, ""),
            ), &PUTS),
            // $1 namespaces, $2 keys.
            delete_records: Sql::new(format!(
                "DELETE FROM {s}.records r
                 USING unnest($1::text[], $2::text[]) AS d(ns, k)
                 WHERE r.namespace = d.ns AND r.key = d.k"
            ), &[TEXTS, TEXTS]),
            // $1 namespace, $2 key, $3 value, $4 after ms, $5 at ms, $6 counter.
            //
            // Commits without waiting for its WAL flush, like `claim` and for the same reason:
            // the provider's record is written inside a request that answers only after a
            // synchronous `complete` or `release`. The counter is striped over
            // `COUNTER_STRIPES` rows chosen at random, so concurrent charges do not queue on one
            // row; `counter` sums the stripes.
            insert_once: Sql::new(format!(
                "WITH ins AS (
                   INSERT INTO {s}.records AS r (namespace, key, value, expires_at)
                   VALUES ($1, $2, $3, {exp})
                   ON CONFLICT (namespace, key) DO UPDATE
                     SET value = EXCLUDED.value, expires_at = EXCLUDED.expires_at
                   WHERE r.expires_at IS NOT NULL AND r.expires_at <= now()
                   RETURNING 1
                 ), bump AS (
                   INSERT INTO {s}.counters AS c (name, stripe, value)
                   SELECT $6::text, floor(random() * {COUNTER_STRIPES})::smallint, 1 FROM ins
                   ON CONFLICT (name, stripe) DO UPDATE SET value = c.value + 1
                   RETURNING c.value
                 )
                 SELECT set_config('synchronous_commit', 'off', true) AS async_commit,
                        EXISTS (SELECT 1 FROM ins) AS inserted,
                        EXISTS (SELECT 1 FROM bump) AS counted,
                        (SELECT r.value FROM {s}.records r
                         WHERE r.namespace = $1 AND r.key = $2
                           AND (r.expires_at IS NULL OR r.expires_at > now())) AS existing",
                exp = expiry("$4::bigint", "$5::bigint"),
            ), &[TEXT, TEXT, BYTEA, INT8, INT8, TEXT]),
            counter: Sql::new(
                format!("SELECT COALESCE(sum(value), 0)::bigint FROM {s}.counters WHERE name = $1"),
                &[TEXT],
            ),
            // Forces a WAL flush covering every commit before it: a transaction that takes an
            // id writes a commit record, and its synchronous commit waits for that record (and
            // so every earlier one) to be flushed. See `claim`.
            flush_wal: Sql::new("SELECT pg_catalog.txid_current()".to_string(), &[]),
            // $1 batch size. Returns the rows deleted; takes them off their scopes' counts.
            cleanup_keys: Sql::new(format!(
                "WITH gone AS (
                   DELETE FROM {s}.keys
                   WHERE (scope, key) IN (
                     SELECT scope, key FROM {s}.keys WHERE expires_at <= now()
                     LIMIT $1 FOR UPDATE SKIP LOCKED)
                     AND expires_at <= now()
                   RETURNING scope
                 ), per AS (
                   SELECT scope, count(*) AS n FROM gone GROUP BY scope
                 ), fix AS (
                   UPDATE {s}.scope_counts q SET live = q.live - per.n
                   FROM per WHERE q.scope = per.scope
                   RETURNING 1
                 )
                 SELECT count(*) FROM gone"
            ), &[INT8]),
            // $1 batch size. Returns the rows deleted.
            cleanup_records: Sql::new(format!(
                "WITH gone AS (
                   DELETE FROM {s}.records
                   WHERE (namespace, key) IN (
                     SELECT namespace, key FROM {s}.records
                     WHERE expires_at IS NOT NULL AND expires_at <= now()
                     LIMIT $1 FOR UPDATE SKIP LOCKED)
                     AND expires_at IS NOT NULL AND expires_at <= now()
                   RETURNING 1
                 )
                 SELECT count(*) FROM gone"
            ), &[INT8]),
            keys_estimate: Sql::new(format!(
                "SELECT GREATEST(reltuples, 0)::float8 FROM pg_catalog.pg_class
                 WHERE oid = to_regclass('{s}.keys')"
            ), &[]),
        }
    }
}
