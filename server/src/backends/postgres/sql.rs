//! The statements, with the (validated, quoted) schema name baked in once at connect time.
//!
//! Key states: `state` 0 = in progress, 1 = completed. `takeover` records how the current claim
//! came to be: 0 = fresh insert, 1 = replaced an expired record, 2 = took over a lease that ran out.
//! Every time comes from the database's `now()`; epoch milliseconds are computed in SQL.

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
    pub claim: String,
    pub complete: String,
    pub release: String,
    pub extend: String,
    pub get: String,
    pub record: String,
    pub write_puts: String,
    pub delete_records: String,
    pub insert_once: String,
    pub counter: String,
    pub cleanup_keys: String,
    pub cleanup_records: String,
    pub keys_estimate: String,
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
            // $1 scope, $2 key, $3 fingerprint, $4 ttl ms, $5 lease ms.
            claim: format!(
                "WITH claimed AS (
                   INSERT INTO {s}.keys AS k
                     (scope, key, fingerprint, fence, state, takeover, lease_until, expires_at, created_at)
                   VALUES ($1, $2, $3, nextval({seq}), {IN_PROGRESS}, 0,
                           now() + $5::bigint * interval '1 millisecond',
                           now() + $4::bigint * interval '1 millisecond', now())
                   ON CONFLICT (scope, key) DO UPDATE SET
                     fingerprint = EXCLUDED.fingerprint,
                     fence = GREATEST(nextval({seq}), k.fence + 1),
                     state = {IN_PROGRESS},
                     takeover = CASE WHEN k.expires_at <= now() THEN 1 ELSE 2 END,
                     lease_until = EXCLUDED.lease_until,
                     expires_at = EXCLUDED.expires_at,
                     created_at = EXCLUDED.created_at,
                     status = NULL, headers = NULL, body = NULL
                   WHERE k.expires_at <= now()
                      OR (k.state = {IN_PROGRESS} AND k.lease_until <= now()
                          AND k.fingerprint = EXCLUDED.fingerprint)
                   RETURNING k.fence, k.takeover, {exp_ms} AS expires_ms
                 )
                 SELECT true AS acquired, fence, takeover, expires_ms,
                        NULL::bool AS same_fp, NULL::smallint AS state, NULL::bigint AS lease_left_ms,
                        NULL::integer AS status, NULL::bytea AS headers, NULL::bytea AS body,
                        NULL::bool AS takeable
                 FROM claimed
                 UNION ALL
                 SELECT false, k.fence, NULL, {exp_ms}, k.fingerprint = $3, k.state, {lease_left},
                        k.status,
                        CASE WHEN k.fingerprint = $3 THEN k.headers END,
                        CASE WHEN k.fingerprint = $3 THEN k.body END,
                        (k.expires_at <= now()
                         OR (k.state = {IN_PROGRESS} AND k.lease_until <= now() AND k.fingerprint = $3))
                 FROM {s}.keys k
                 WHERE k.scope = $1 AND k.key = $2 AND NOT EXISTS (SELECT 1 FROM claimed)",
                exp_ms = ms("k.expires_at"),
            ),
            // $1 scope, $2 key, $3 fence, $4 status, $5 headers, $6 body, $7..$11 put arrays.
            complete: format!(
                "WITH done AS (
                   UPDATE {s}.keys SET state = {COMPLETED}, lease_until = NULL,
                                       status = $4, headers = $5, body = $6
                   WHERE scope = $1 AND key = $2 AND fence = $3 AND state = {IN_PROGRESS}
                     AND expires_at > now()
                   RETURNING 1
                 ), {records}
                 SELECT (SELECT count(*) FROM done) AS done",
                records = puts_cte(7, "WHERE EXISTS (SELECT 1 FROM done)"),
            ),
            // $1 scope, $2 key, $3 fence.
            release: format!(
                "DELETE FROM {s}.keys
                 WHERE scope = $1 AND key = $2 AND fence = $3 AND state = {IN_PROGRESS}
                   AND expires_at > now()"
            ),
            // $1 scope, $2 key, $3 fence, $4 lease ms.
            extend: format!(
                "UPDATE {s}.keys SET lease_until = now() + $4::bigint * interval '1 millisecond'
                 WHERE scope = $1 AND key = $2 AND fence = $3 AND state = {IN_PROGRESS}
                   AND expires_at > now()"
            ),
            // $1 scope, $2 key.
            get: format!(
                "SELECT k.fingerprint, k.fence, {exp_ms} AS expires_ms, k.state,
                        {lease_left} AS lease_left_ms, k.status, k.headers, k.body
                 FROM {s}.keys k
                 WHERE k.scope = $1 AND k.key = $2 AND k.expires_at > now()",
                exp_ms = ms("k.expires_at"),
            ),
            // $1 namespace, $2 key.
            record: format!(
                "SELECT value FROM {s}.records
                 WHERE namespace = $1 AND key = $2 AND (expires_at IS NULL OR expires_at > now())"
            ),
            // $1..$5 put arrays.
            write_puts: format!(
                "WITH {records} SELECT count(*) FROM puts",
                records = puts_cte(1, ""),
            ),
            // $1 namespaces, $2 keys.
            delete_records: format!(
                "DELETE FROM {s}.records r
                 USING unnest($1::text[], $2::text[]) AS d(ns, k)
                 WHERE r.namespace = d.ns AND r.key = d.k"
            ),
            // $1 namespace, $2 key, $3 value, $4 after ms, $5 at ms, $6 counter.
            insert_once: format!(
                "WITH ins AS (
                   INSERT INTO {s}.records AS r (namespace, key, value, expires_at)
                   VALUES ($1, $2, $3, {exp})
                   ON CONFLICT (namespace, key) DO UPDATE
                     SET value = EXCLUDED.value, expires_at = EXCLUDED.expires_at
                   WHERE r.expires_at IS NOT NULL AND r.expires_at <= now()
                   RETURNING 1
                 ), bump AS (
                   INSERT INTO {s}.counters AS c (name, value)
                   SELECT $6::text, 1 FROM ins
                   ON CONFLICT (name) DO UPDATE SET value = c.value + 1
                   RETURNING c.value
                 )
                 SELECT EXISTS (SELECT 1 FROM ins) AS inserted,
                        (SELECT r.value FROM {s}.records r
                         WHERE r.namespace = $1 AND r.key = $2
                           AND (r.expires_at IS NULL OR r.expires_at > now())) AS existing",
                exp = expiry("$4::bigint", "$5::bigint"),
            ),
            counter: format!("SELECT value FROM {s}.counters WHERE name = $1"),
            // $1 batch size.
            cleanup_keys: format!(
                "DELETE FROM {s}.keys
                 WHERE (scope, key) IN (
                   SELECT scope, key FROM {s}.keys WHERE expires_at <= now()
                   LIMIT $1 FOR UPDATE SKIP LOCKED)
                   AND expires_at <= now()"
            ),
            cleanup_records: format!(
                "DELETE FROM {s}.records
                 WHERE (namespace, key) IN (
                   SELECT namespace, key FROM {s}.records
                   WHERE expires_at IS NOT NULL AND expires_at <= now()
                   LIMIT $1 FOR UPDATE SKIP LOCKED)
                   AND expires_at IS NOT NULL AND expires_at <= now()"
            ),
            keys_estimate: format!(
                "SELECT GREATEST(reltuples, 0)::float8 FROM pg_catalog.pg_class
                 WHERE oid = to_regclass('{s}.keys')"
            ),
        }
    }
}
