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
const INT4S: Type = Type::INT4_ARRAY;
/// The parameters of a batch of record puts: namespaces, keys, values, after-ms, at-ms.
const PUTS: [Type; 5] = [TEXTS, TEXTS, BYTEAS, INT8S, INT8S];

/// Rows each counter is spread over (see `insert_once`).
pub(crate) const COUNTER_STRIPES: i16 = 16;

/// State value of an in-progress key.
pub(crate) const IN_PROGRESS: i16 = 0;
/// State value of a completed key.
pub(crate) const COMPLETED: i16 = 1;

/// Appended to the `unnest` of a batch's arrays (`{c}`: its alias). Always true (the index of a
/// call in its batch is 0 to 511), it makes the planner estimate one input row, where it
/// estimates ten for an array parameter. Statements are prepared once per connection and after
/// five executions run a generic plan made with the table sizes of that moment; on a table that
/// starts empty, ten input rows against a "small" table gave a plan that scanned the whole keys
/// table for every batch, for the life of the connection (seen: 660 µs of database CPU per
/// request at 12 000 keys, growing with the table). With one input row, joining from the input
/// into the primary key index is the cheapest plan at every table size, and it is the right plan
/// for any batch: a few hundred index lookups at most.
const ONE_ROW: &str = "WHERE {c}.idx >= 0 AND {c}.idx < 2147483647";

/// `{alias}.expires_at > now()`, written so that it is never an index condition. A lookup of a
/// key by `(scope, key)` that also says `expires_at > now()` matches two indexes equally well on
/// a nearly empty table: the primary key, and `keys_scope_expires_at` on `(scope, expires_at)`.
/// A generic plan made then (after five executions on a fresh connection) may pick the second
/// and keep it as the table grows, reading every live key of the scope to find one (seen: the
/// completion statement reading 10 000 index entries per call at 17 000 keys). Here the
/// comparison is a filter on the row the primary key found.
fn unexpired(alias: &str) -> String {
    let prefix = if alias.is_empty() {
        String::new()
    } else {
        format!("{alias}.")
    };
    format!("({prefix}expires_at > now()) IS TRUE")
}

/// An expression whose transaction, once committed with `synchronous_commit` on, has flushed the WAL
/// up to its own commit record, and so every commit before it: a transactional logical message
/// gives the transaction an id and a WAL record of its own. An id alone (`txid_current()`) is not
/// enough: PostgreSQL commits a transaction that wrote no WAL without waiting for a flush, whatever
/// `synchronous_commit` says (`RecordTransactionCommit`); a test that compares the WAL flush
/// position with what a shown claim inserted caught that.
const FLUSH_RECORD: &str = "pg_catalog.pg_logical_emit_message(true, 'idemlog', 'flush')::text";

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
    pub claim_one: Sql,
    pub claim_new: Sql,
    pub claim: Sql,
    pub complete_one: Sql,
    pub complete: Sql,
    pub release: Sql,
    pub extend: Sql,
    pub get: Sql,
    pub record: Sql,
    pub write_puts: Sql,
    pub delete_records: Sql,
    pub insert_one: Sql,
    pub insert_new: Sql,
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
        let unexpired_k = unexpired("k");
        let unexpired_row = unexpired("");
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
            // `claim_new` for a batch of one call (the common case under light load), with scalar
            // parameters: $1 scope, $2 key, $3 fingerprint, $4 ttl ms, $5 lease ms, $6 request
            // digest (or NULL), $7 most live keys of the scope (0: no limit). Same effect and
            // guard as `claim_new`; one row, whose fence is NULL when the key has a row. A batch of
            // one through the array statements took 20-70 µs more of the database's time per
            // statement (measured sequentially on one connection), which was the whole of the
            // latency lost by batching.
            claim_one: Sql::new(
                format!(
                    "WITH ins AS (
                   INSERT INTO {s}.keys AS k
                     (scope, key, fingerprint, fence, state, takeover, lease_until, expires_at,
                      created_at, request_digest)
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
                                 THEN 0 ELSE 1 END AS within_quota,
                        i.fence, i.expires_ms
                 FROM (SELECT 1) one LEFT JOIN ins i ON true",
                    exp_ms = ms("k.expires_at"),
                ),
                &[TEXT, TEXT, BYTEA, INT8, INT8, BYTEA, INT8],
            ),
            // The common case, a batch of keys never seen (see `batch::claims`): arrays, one element
            // per call: $1 index of the call in the batch, $2 scope, $3 key, $4 fingerprint, $5
            // ttl ms, $6 request digest (or NULL); $7 the calls' most live keys per scope (0: no
            // limit), $8 the lease in ms. Keys are distinct within a batch.
            //
            // Inserts every key that has no row (`DO NOTHING`: a key with a row is neither
            // locked nor touched) and adds the inserted keys to their scopes' counts; returns the
            // inserted keys with their fences. The calls of the keys not returned go to `claim`,
            // which handles every case. The count moves exactly with the rows inserted, in the
            // same statement. A scope that the new keys would take past its limit fails the
            // guard (division by zero: the whole statement rolls back) and every call of the
            // batch goes to `claim`, which admits what fits and answers 429 for the rest. Same
            // durability as `claim`: committed without waiting for its WAL flush. Two inserts, no
            // lookup: a small plan whose cost does not depend on the table's size.
            claim_new: Sql::new(
                format!(
                    "WITH ins AS (
                   INSERT INTO {s}.keys AS k
                     (scope, key, fingerprint, fence, state, takeover, lease_until, expires_at,
                      created_at, request_digest)
                   SELECT i.scope, i.key, i.fp, nextval({seq}), {IN_PROGRESS}, 0,
                          now() + $8::bigint * interval '1 millisecond',
                          now() + i.ttl_ms * interval '1 millisecond', now(), i.digest
                   FROM unnest($1::int4[], $2::text[], $3::text[], $4::bytea[], $5::int8[],
                               $6::bytea[]) AS i(idx, scope, key, fp, ttl_ms, digest)
                   ORDER BY i.scope, i.key
                   ON CONFLICT (scope, key) DO NOTHING
                   RETURNING k.scope, k.key, k.fence, {exp_ms} AS expires_ms
                 ), per AS (
                   SELECT scope, count(*) AS n FROM ins GROUP BY scope
                 ), bump AS (
                   INSERT INTO {s}.scope_counts AS q (scope, live)
                   SELECT scope, n FROM per WHERE $7::bigint = 0 OR n <= $7::bigint
                   ORDER BY scope
                   ON CONFLICT (scope) DO UPDATE SET live = q.live + EXCLUDED.live
                   WHERE $7::bigint = 0 OR q.live + EXCLUDED.live <= $7::bigint
                   RETURNING 1
                 )
                 SELECT set_config('synchronous_commit', 'off', true) AS async_commit,
                        1 / CASE WHEN (SELECT count(*) FROM per) = (SELECT count(*) FROM bump)
                                 THEN 1 ELSE 0 END AS within_quota,
                        i.scope, i.key, i.fence, i.expires_ms
                 FROM ins i",
                    exp_ms = ms("k.expires_at"),
                ),
                &[INT4S, TEXTS, TEXTS, BYTEAS, INT8S, BYTEAS, INT8, INT8],
            ),
            // One batch of claims (see `batch::claims`). Arrays, one element per call: $1 index of the
            // call in the batch, $2 scope, $3 key, $4 fingerprint, $5 ttl ms, $6 request digest (or
            // NULL), $7 most live keys of the scope (0: no limit); $8 the lease in ms. The calls'
            // (scope, key) pairs are distinct: copies of a key go in later rounds. One answer row
            // per call, whatever happened to it.
            //
            // One statement in its own implicit transaction, so the rows it locks (the keys', and
            // the count rows of the scopes that get new keys) are held only while it runs, never
            // across a round trip.
            //
            // - `found`: the keys that have a row, as the statement's snapshot shows them. Those
            //   that a claim may take over (expired, or in progress with the same fingerprint and
            //   its lease run out: `takeable`) go to the upsert; the others are answered from the
            //   snapshot (completed: replay; in progress: 409; another fingerprint: mismatch),
            //   without touching their rows.
            // - `fresh`: the keys with no row, new to their scope, ranked per scope in batch
            //   order. `counts` locks their scopes' count rows in scope order (every batch takes
            //   them in that order: no deadlock between lanes); a key is `admitted` if its rank
            //   still fits under its limit (exact when a scope's calls share one limit, as the
            //   layer's do; never over any call's limit otherwise). `bump` adds the admitted keys
            //   to their scopes' counts; a scope whose count row appeared after the snapshot is
            //   not bumped (the guard below then trips and the statement runs again, now with
            //   the row locked).
            // - `claimed`: the upsert of the admitted and takeable keys, with fencing tokens from
            //   the sequence; the update path takes a row over only if it is still takeable.
            // - The guard: the count must move exactly with the rows inserted, scope by scope,
            //   and every admitting scope must be bumped. They disagree only when a row appeared
            //   or disappeared between the snapshot and the upsert (another instance, a
            //   release or the cleanup); the guard then divides by zero, which rolls the whole
            //   statement back, and the batch runs again (SQLSTATE 22012 is read as "stale" for
            //   this statement only).
            //
            // Durability: the transaction commits without waiting for its WAL flush
            // (`synchronous_commit = off`, transaction-local). This is safe because WAL is
            // flushed in order: the request that made a claim answers only after its completion
            // or release, whose synchronous commit flushes every earlier commit record too, the
            // claim's included. A crash before that can lose the claim (and any write-once
            // record the request made, written the same way), together with a request that never
            // got an answer: the key then runs again, and a downstream dedup record derived from
            // it is gone with it, so the downstream effect still happens once. When an answer
            // shows somebody else's claim
            // in progress (a 409, or a mismatch with an in-progress key) the statement instead
            // keeps the session's `synchronous_commit` and writes a WAL record of its own
            // (`FLUSH_RECORD`), so its commit waits for the flush that makes the shown claim
            // durable: nobody acts on a claim a crash could take back. Completed records are written by
            // synchronous commits and are visible only once durable.
            claim: Sql::new(
                format!(
                    "WITH input AS (
                   SELECT * FROM unnest($1::int4[], $2::text[], $3::text[], $4::bytea[],
                                        $5::int8[], $6::bytea[], $7::int8[])
                     AS i(idx, scope, key, fp, ttl_ms, digest, max_live)
                   {one_row}
                 ), found AS (
                   SELECT i.idx, k.*
                   FROM input i CROSS JOIN LATERAL (
                     SELECT k.fingerprint, k.fence, k.state, k.status, k.headers, k.body,
                            k.request_digest, {exp_ms} AS expires_ms,
                            {lease_left} AS lease_left_ms,
                            (k.expires_at <= now()
                             OR (k.state = {IN_PROGRESS} AND k.lease_until <= now()
                                 AND k.fingerprint = i.fp)) AS takeable
                     FROM {s}.keys k WHERE k.scope = i.scope AND k.key = i.key
                     OFFSET 0) k
                 ), fresh AS (
                   SELECT i.idx, i.scope, i.max_live,
                          row_number() OVER (PARTITION BY i.scope ORDER BY i.idx) AS rank
                   FROM input i WHERE NOT EXISTS (SELECT 1 FROM found f WHERE f.idx = i.idx)
                 ), counts AS (
                   SELECT q.scope, q.live FROM {s}.scope_counts q
                   WHERE q.scope IN (SELECT scope FROM fresh)
                   ORDER BY q.scope
                   FOR UPDATE
                 ), admitted AS (
                   SELECT f.idx, f.scope FROM fresh f LEFT JOIN counts c ON c.scope = f.scope
                   WHERE f.max_live = 0 OR COALESCE(c.live, 0) + f.rank <= f.max_live
                 ), bump AS (
                   INSERT INTO {s}.scope_counts AS q (scope, live)
                   SELECT a.scope, count(*) FROM admitted a GROUP BY a.scope ORDER BY a.scope
                   ON CONFLICT (scope) DO UPDATE SET live = q.live + EXCLUDED.live
                   WHERE EXISTS (SELECT 1 FROM counts c WHERE c.scope = q.scope)
                   RETURNING q.scope
                 ), claimed AS (
                   INSERT INTO {s}.keys AS k
                     (scope, key, fingerprint, fence, state, takeover, lease_until, expires_at,
                      created_at, request_digest)
                   SELECT i.scope, i.key, i.fp, nextval({seq}), {IN_PROGRESS}, 0,
                          now() + $8::bigint * interval '1 millisecond',
                          now() + i.ttl_ms * interval '1 millisecond', now(), i.digest
                   FROM input i
                   WHERE i.idx IN (SELECT idx FROM admitted)
                      OR i.idx IN (SELECT idx FROM found WHERE takeable)
                   ORDER BY i.scope, i.key
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
                   RETURNING k.scope, k.key, k.fence, k.takeover, {exp_ms} AS expires_ms,
                             -- The insert path writes takeover 0, the update path 1 or 2: a
                             -- portable way to tell them apart (no xmax).
                             (k.takeover = 0) AS inserted
                 ), checked AS (
                   SELECT
                     NOT EXISTS (
                       SELECT 1 FROM (SELECT scope, 1 AS admitted, 0 AS inserted FROM admitted
                                      UNION ALL
                                      SELECT scope, 0, 1 FROM claimed WHERE inserted) x
                       GROUP BY x.scope HAVING sum(x.admitted) <> sum(x.inserted))
                     AND (SELECT count(DISTINCT scope) FROM admitted) = (SELECT count(*) FROM bump)
                       AS consistent,
                     EXISTS (SELECT 1 FROM found f
                             WHERE f.state = {IN_PROGRESS} AND NOT f.takeable) AS shows_claim
                 ), settled AS (
                   SELECT 1 / CASE WHEN consistent THEN 1 ELSE 0 END AS consistent,
                          CASE WHEN shows_claim
                               THEN current_setting('synchronous_commit') || ' '
                                    || {flush_record}
                               ELSE set_config('synchronous_commit', 'off', true) END AS commit_mode
                   FROM checked
                 )
                 SELECT s.consistent, s.commit_mode, i.idx,
                        c.fence IS NOT NULL AS acquired,
                        COALESCE(c.fence, f.fence) AS fence,
                        c.takeover,
                        COALESCE(c.expires_ms, f.expires_ms) AS expires_ms,
                        f.fingerprint = i.fp AS same_fp,
                        f.state, f.lease_left_ms, f.status,
                        CASE WHEN f.fingerprint = i.fp THEN f.headers END AS headers,
                        CASE WHEN f.fingerprint = i.fp THEN f.body END AS body,
                        CASE WHEN f.fingerprint <> i.fp THEN f.request_digest END AS request_digest,
                        (COALESCE(f.takeable, false) AND c.fence IS NULL) AS stale,
                        (f.idx IS NULL AND a.idx IS NULL) AS quota_full,
                        CASE WHEN f.idx IS NULL AND a.idx IS NULL THEN
                          (SELECT {next_ms} FROM {s}.keys n
                           WHERE n.scope = i.scope AND n.expires_at > now()
                           ORDER BY n.expires_at LIMIT 1) END AS next_expiry_ms
                 FROM settled s CROSS JOIN input i
                 LEFT JOIN claimed c ON c.scope = i.scope AND c.key = i.key
                 LEFT JOIN found f ON f.idx = i.idx
                 LEFT JOIN admitted a ON a.idx = i.idx",
                    exp_ms = ms("k.expires_at"),
                    one_row = ONE_ROW.replace("{c}", "i"),
                    flush_record = FLUSH_RECORD,
                    next_ms = "GREATEST(1, ceil(extract(epoch FROM (n.expires_at - now())) * 1000))::bigint",
                ),
                &[INT4S, TEXTS, TEXTS, BYTEAS, INT8S, BYTEAS, INT8S, INT8],
            ),
            // $1 scope: deletes the scope's expired keys and takes them off its count (a claim
            // refused by the quota does this before it answers 429).
            purge_scope: Sql::new(
                format!(
                    "WITH gone AS (
                   DELETE FROM {s}.keys WHERE scope = $1 AND expires_at <= now() RETURNING 1
                 ), fix AS (
                   UPDATE {s}.scope_counts SET live = live - (SELECT count(*) FROM gone)
                   WHERE scope = $1 AND EXISTS (SELECT 1 FROM gone)
                   RETURNING 1
                 )
                 SELECT count(*) FROM gone"
                ),
                &[TEXT],
            ),
            // `complete` for a batch of one completion, with scalar parameters: $1 scope, $2 key,
            // $3 fence, $4 status, $5 headers, $6 body, $7..$11 the put arrays. Returns 1 if it
            // applied, 0 if the fence no longer holds the key (then nothing is written).
            complete_one: Sql::new(
                format!(
                    "WITH done AS (
                   UPDATE {s}.keys SET state = {COMPLETED}, lease_until = NULL,
                                       status = $4, headers = $5, body = $6
                   WHERE scope = $1 AND key = $2 AND fence = $3 AND state = {IN_PROGRESS}
                     AND {unexpired_row}
                   RETURNING 1
                 ), {records}
                 SELECT (SELECT count(*) FROM done) AS done",
                    records = puts_cte(7, "WHERE EXISTS (SELECT 1 FROM done)"),
                ),
                &[
                    TEXT, TEXT, INT8, INT4, BYTEA, BYTEA, TEXTS, TEXTS, BYTEAS, INT8S, INT8S,
                ],
            ),
            // One batch of completions (see `batch::finish`). Arrays, one element per completion:
            // $1 index in the batch, $2 scope, $3 key, $4 fence, $5 status, $6 headers, $7 body;
            // and one per record put: $8 the index of the completion it belongs to, $9..$13 the
            // put. Keys and record keys are distinct within a batch. Returns the indices of the
            // completions that applied: those whose fence still holds an in-progress, unexpired
            // key; only their puts are written. Commits synchronously (the session's setting):
            // an answer means durable.
            complete: Sql::new(
                format!(
                    "WITH input AS (
                   SELECT * FROM unnest($1::int4[], $2::text[], $3::text[], $4::int8[],
                                        $5::int4[], $6::bytea[], $7::bytea[])
                     AS c(idx, scope, key, fence, status, headers, body)
                   {one_row}
                 ), done AS (
                   UPDATE {s}.keys k SET state = {COMPLETED}, lease_until = NULL,
                                         status = c.status, headers = c.headers, body = c.body
                   FROM input c
                   WHERE k.scope = c.scope AND k.key = c.key AND k.fence = c.fence
                     AND k.state = {IN_PROGRESS} AND {unexpired_k}
                   RETURNING c.idx
                 ), puts AS (
                   INSERT INTO {s}.records AS r (namespace, key, value, expires_at)
                   SELECT w.ns, w.k, w.v, {exp}
                   FROM unnest($8::int4[], $9::text[], $10::text[], $11::bytea[], $12::int8[],
                               $13::int8[]) AS w(owner, ns, k, v, after_ms, at_ms)
                   WHERE w.owner IN (SELECT idx FROM done)
                   ORDER BY w.ns, w.k
                   ON CONFLICT (namespace, key) DO UPDATE
                     SET value = EXCLUDED.value, expires_at = EXCLUDED.expires_at
                   RETURNING 1
                 )
                 SELECT idx FROM done",
                    exp = expiry("w.after_ms", "w.at_ms"),
                    one_row = ONE_ROW.replace("{c}", "c"),
                ),
                &[
                    INT4S, TEXTS, TEXTS, INT8S, INT4S, BYTEAS, BYTEAS, INT4S, TEXTS, TEXTS, BYTEAS,
                    INT8S, INT8S,
                ],
            ),
            // One batch of releases: $1 index in the batch, $2 scope, $3 key, $4 fence. Deletes
            // the keys whose fence still holds them in progress, takes them off their scopes'
            // counts, and returns their indices. Commits synchronously.
            release: Sql::new(
                format!(
                    "WITH input AS (
                   SELECT * FROM unnest($1::int4[], $2::text[], $3::text[], $4::int8[])
                     AS r(idx, scope, key, fence)
                   {one_row}
                 ), gone AS (
                   DELETE FROM {s}.keys k USING input r
                   WHERE k.scope = r.scope AND k.key = r.key AND k.fence = r.fence
                     AND k.state = {IN_PROGRESS} AND {unexpired_k}
                   RETURNING r.idx, k.scope
                 ), per AS (
                   SELECT scope, count(*) AS n FROM gone GROUP BY scope
                 ), fix AS (
                   UPDATE {s}.scope_counts q SET live = q.live - per.n
                   FROM per WHERE q.scope = per.scope
                   RETURNING 1
                 )
                 SELECT idx FROM gone",
                    one_row = ONE_ROW.replace("{c}", "r"),
                ),
                &[INT4S, TEXTS, TEXTS, INT8S],
            ),
            // $1 scope, $2 key, $3 fence, $4 lease ms.
            extend: Sql::new(
                format!(
                "UPDATE {s}.keys SET lease_until = now() + $4::bigint * interval '1 millisecond'
                 WHERE scope = $1 AND key = $2 AND fence = $3 AND state = {IN_PROGRESS}
                   AND {unexpired_row}
                 RETURNING 1"
            ),
                &[TEXT, TEXT, INT8, INT8],
            ),
            // $1 scope, $2 key.
            get: Sql::new(
                format!(
                "SELECT k.fingerprint, k.fence, {exp_ms} AS expires_ms, {created_ms} AS created_ms,
                        k.state,
                        {lease_left} AS lease_left_ms, k.status, k.headers, k.body
                 FROM {s}.keys k
                 WHERE k.scope = $1 AND k.key = $2 AND {unexpired_k}",
                exp_ms = ms("k.expires_at"),
                created_ms = ms("k.created_at"),
            ),
                &[TEXT, TEXT],
            ),
            // $1 namespace, $2 key.
            record: Sql::new(
                format!(
                    "SELECT value FROM {s}.records
                 WHERE namespace = $1 AND key = $2 AND (expires_at IS NULL OR expires_at > now())"
                ),
                &[TEXT, TEXT],
            ),
            // $1..$5 put arrays.
            write_puts: Sql::new(
                format!(
                    "WITH {records} SELECT count(*) FROM puts",
                    records = puts_cte(1, ""),
                ),
                &PUTS,
            ),
            // $1 namespaces, $2 keys.
            delete_records: Sql::new(
                format!(
                    "DELETE FROM {s}.records r
                 USING unnest($1::text[], $2::text[]) AS d(ns, k)
                 WHERE r.namespace = d.ns AND r.key = d.k"
                ),
                &[TEXTS, TEXTS],
            ),
            // `insert_new` for a batch of one call, with scalar parameters: $1 namespace, $2 key,
            // $3 value, $4 after ms, $5 at ms, $6 counter. One row: whether it inserted.
            insert_one: Sql::new(
                format!(
                    "WITH ins AS (
                   INSERT INTO {s}.records AS r (namespace, key, value, expires_at)
                   VALUES ($1, $2, $3, {exp})
                   ON CONFLICT (namespace, key) DO NOTHING
                   RETURNING 1
                 ), bump AS (
                   INSERT INTO {s}.counters AS c (name, stripe, value)
                   SELECT $6::text, floor(random() * {COUNTER_STRIPES})::smallint, 1 FROM ins
                   ON CONFLICT (name, stripe) DO UPDATE SET value = c.value + 1
                   RETURNING 1
                 )
                 SELECT set_config('synchronous_commit', 'off', true) AS async_commit,
                        EXISTS (SELECT 1 FROM ins) AS inserted,
                        EXISTS (SELECT 1 FROM bump) AS counted",
                    exp = expiry("$4::bigint", "$5::bigint"),
                ),
                &[TEXT, TEXT, BYTEA, INT8, INT8, TEXT],
            ),
            // The common case, a batch of records never written (see `batch::inserts`): arrays, one
            // element per call: $1 index in the batch, $2 namespace, $3 key, $4 value, $5 after
            // ms, $6 at ms, $7 the counter the insert adds one to. (namespace, key) pairs are
            // distinct within a batch. Inserts every record that has no row (`DO NOTHING`) and
            // adds the inserted ones to their counters; returns the inserted records. The calls
            // of the records not returned go to `insert_once`. Committed without waiting for its
            // WAL flush (see `insert_once`).
            insert_new: Sql::new(
                format!(
                    "WITH input AS (
                   SELECT * FROM unnest($1::int4[], $2::text[], $3::text[], $4::bytea[],
                                        $5::int8[], $6::int8[], $7::text[])
                     AS i(idx, ns, k, v, after_ms, at_ms, counter)
                 ), ins AS (
                   INSERT INTO {s}.records AS r (namespace, key, value, expires_at)
                   SELECT i.ns, i.k, i.v, {exp} FROM input i
                   ORDER BY i.ns, i.k
                   ON CONFLICT (namespace, key) DO NOTHING
                   RETURNING r.namespace, r.key
                 ), bump AS (
                   INSERT INTO {s}.counters AS c (name, stripe, value)
                   SELECT i.counter, floor(random() * {COUNTER_STRIPES})::smallint, count(*)
                   FROM input i JOIN ins ON ins.namespace = i.ns AND ins.key = i.k
                   GROUP BY i.counter ORDER BY i.counter
                   ON CONFLICT (name, stripe) DO UPDATE SET value = c.value + EXCLUDED.value
                   RETURNING 1
                 )
                 SELECT set_config('synchronous_commit', 'off', true) AS async_commit,
                        n.namespace, n.key
                 FROM ins n",
                    exp = expiry("i.after_ms", "i.at_ms"),
                ),
                &[INT4S, TEXTS, TEXTS, BYTEAS, INT8S, INT8S, TEXTS],
            ),
            // One batch of write-once inserts (see `batch::inserts`). Arrays, one element per call:
            // $1 index in the batch, $2 namespace, $3 key, $4 value, $5 after ms, $6 at ms, $7 the
            // counter the insert adds one to. (namespace, key) pairs are distinct within a batch.
            // One answer row per call: inserted, or the live record already there (NULL when the
            // snapshot shows none although the insert found one: the caller looks again).
            //
            // Commits without waiting for its WAL flush, like `claim` and for the same reason:
            // a write-once record is written inside a request that answers only after a
            // synchronous completion or release. When it shows an existing record, which may
            // itself have committed without its flush, it commits with the session's setting and a
            // WAL record of its own (`FLUSH_RECORD`) instead, so its commit waits for that record
            // to be durable. Each
            // counter is striped over `COUNTER_STRIPES` rows, one chosen at random per batch, so
            // concurrent batches do not queue on one row; `counter` sums the stripes.
            insert_once: Sql::new(
                format!(
                    "WITH input AS (
                   SELECT * FROM unnest($1::int4[], $2::text[], $3::text[], $4::bytea[],
                                        $5::int8[], $6::int8[], $7::text[])
                     AS i(idx, ns, k, v, after_ms, at_ms, counter)
                   {one_row}
                 ), existing AS (
                   SELECT i.idx, r.value FROM input i CROSS JOIN LATERAL (
                     SELECT r.value FROM {s}.records r
                     WHERE r.namespace = i.ns AND r.key = i.k
                       AND (r.expires_at IS NULL OR r.expires_at > now())
                     OFFSET 0) r
                 ), ins AS (
                   INSERT INTO {s}.records AS r (namespace, key, value, expires_at)
                   SELECT i.ns, i.k, i.v, {exp} FROM input i
                   WHERE NOT EXISTS (SELECT 1 FROM existing e WHERE e.idx = i.idx)
                   ORDER BY i.ns, i.k
                   ON CONFLICT (namespace, key) DO UPDATE
                     SET value = EXCLUDED.value, expires_at = EXCLUDED.expires_at
                   WHERE r.expires_at IS NOT NULL AND r.expires_at <= now()
                   RETURNING r.namespace, r.key
                 ), bump AS (
                   INSERT INTO {s}.counters AS c (name, stripe, value)
                   SELECT i.counter, floor(random() * {COUNTER_STRIPES})::smallint, count(*)
                   FROM input i JOIN ins ON ins.namespace = i.ns AND ins.key = i.k
                   GROUP BY i.counter ORDER BY i.counter
                   ON CONFLICT (name, stripe) DO UPDATE SET value = c.value + EXCLUDED.value
                   RETURNING 1
                 ), settled AS (
                   SELECT CASE WHEN EXISTS (SELECT 1 FROM existing)
                               THEN current_setting('synchronous_commit') || ' '
                                    || {flush_record}
                               ELSE set_config('synchronous_commit', 'off', true) END AS commit_mode
                 )
                 SELECT s.commit_mode, i.idx, n.k IS NOT NULL AS inserted,
                        CASE WHEN n.k IS NULL THEN e.value END AS existing
                 FROM settled s CROSS JOIN input i
                 LEFT JOIN (SELECT namespace AS ns, key AS k FROM ins) n
                   ON n.ns = i.ns AND n.k = i.k
                 LEFT JOIN existing e ON e.idx = i.idx",
                    exp = expiry("i.after_ms", "i.at_ms"),
                    one_row = ONE_ROW.replace("{c}", "i"),
                    flush_record = FLUSH_RECORD,
                ),
                &[INT4S, TEXTS, TEXTS, BYTEAS, INT8S, INT8S, TEXTS],
            ),
            counter: Sql::new(
                format!("SELECT COALESCE(sum(value), 0)::bigint FROM {s}.counters WHERE name = $1"),
                &[TEXT],
            ),
            // Forces a WAL flush covering every commit before it (see `FLUSH_RECORD`).
            flush_wal: Sql::new(format!("SELECT {FLUSH_RECORD}"), &[]),
            // $1 batch size, $2 the scope to start at ('' for the first), $3 scopes per statement.
            // Deletes up to $1 expired keys of the first $3 scopes from $2 on (in scope order) and
            // takes them off their scopes' counts. Returns the rows deleted, and the scope the next
            // part of the walk starts at (NULL when no scope is left after these).
            //
            // There is no index on `expires_at` alone (schema version 4 dropped it, see
            // `schema`), so expired keys are found per scope, one descent of
            // `keys_scope_expires_at (scope, expires_at)` each, for the scopes `scope_counts`
            // lists: every scope that has `keys` rows has one there (schema version 2). Bounded
            // both ways per statement: at most $1 rows deleted and $3 scopes visited, so a schema
            // with a million accounts is walked over many statements (`cleanup` keeps the place)
            // and no statement runs into `statement_timeout`. A batch that fills up ($1 deleted)
            // may have stopped inside a scope: the caller runs again from the same $2 (the scopes
            // already emptied cost one descent each again); one that does not fill up emptied all
            // $3 scopes of what it could lock, and the caller moves on to the returned scope.
            // Fetching $3 + 1 scopes names the next scope without a "greater than" of our own.
            //
            // Safe with every instance running it at once: candidate rows are locked `FOR UPDATE
            // SKIP LOCKED` (a row another instance or a claim holds is skipped, not waited for,
            // and a row whose expiry a takeover moved is re-checked when locked), the delete checks
            // the expiry again, and each scope's count goes down by exactly the rows `gone`
            // returns, in the same statement, as in `release` and `purge_scope`.
            //
            // Two guards for the planner, both seen in EXPLAIN (commit message): the per-scope
            // limit is `(SELECT $1)`, a value the planner cannot see, so it plans for reading part
            // of a scope and takes the ordered scan of `keys_scope_expires_at` that stops at the
            // limit; with `LIMIT $1` and a scope estimated to hold fewer expired keys than $1 (an
            // average over all scopes) it took a bitmap scan that reads every expired key of the
            // scope, a big account's whole backlog for every batch. And `d.idx` with its
            // always-true range (as `ONE_ROW`): the planner then expects a few locked rows and
            // deletes them through the primary key; expecting $1 it hashed a sequential scan of
            // the whole table (27 ms against 8 ms for 500 of 60 000 rows).
            cleanup_keys: Sql::new(
                format!(
                    "WITH scopes AS (
                   SELECT q.scope FROM {s}.scope_counts q
                   WHERE q.scope >= $2
                   ORDER BY q.scope LIMIT $3 + 1
                 ), doomed AS (
                   SELECT x.scope, x.key, 0 AS idx
                   FROM (SELECT scope FROM scopes ORDER BY scope LIMIT $3) p
                   CROSS JOIN LATERAL (
                     SELECT k.scope, k.key FROM {s}.keys k
                     WHERE k.scope = p.scope AND k.expires_at <= now()
                     ORDER BY k.expires_at LIMIT (SELECT $1)
                     FOR UPDATE SKIP LOCKED) x
                   LIMIT $1
                 ), gone AS (
                   DELETE FROM {s}.keys k USING doomed d
                   WHERE k.scope = d.scope AND k.key = d.key
                     AND d.idx >= 0 AND d.idx < 2147483647
                     AND k.expires_at <= now()
                   RETURNING k.scope
                 ), per AS (
                   SELECT scope, count(*) AS n FROM gone GROUP BY scope
                 ), fix AS (
                   UPDATE {s}.scope_counts q SET live = q.live - per.n
                   FROM per WHERE q.scope = per.scope
                   RETURNING 1
                 )
                 SELECT (SELECT count(*) FROM gone) AS deleted,
                        (SELECT scope FROM scopes ORDER BY scope OFFSET $3 LIMIT 1) AS next_scope"
                ),
                &[INT8, TEXT, INT8],
            ),
            // $1 batch size. Returns the rows deleted.
            cleanup_records: Sql::new(
                format!(
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
                ),
                &[INT8],
            ),
            keys_estimate: Sql::new(
                format!(
                    "SELECT GREATEST(reltuples, 0)::float8 FROM pg_catalog.pg_class
                 WHERE oid = to_regclass('{s}.keys')"
                ),
                &[],
            ),
        }
    }
}
