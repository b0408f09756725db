\set k random(1, 9000000000000000000)
WITH ins AS (
   INSERT INTO bench.keys AS k
     (scope, key, fingerprint, fence, state, takeover, lease_until, expires_at, created_at, request_digest)
   VALUES ('acct_bench', :client_id || '-' || :k, '\x0102'::bytea, nextval('bench.fence_seq'), 0, 0,
           now() + 30000::bigint * interval '1 millisecond',
           now() + 86400000::bigint * interval '1 millisecond', now(), '\x01020304050607080910'::bytea)
   ON CONFLICT (scope, key) DO NOTHING
   RETURNING k.fence, floor(extract(epoch FROM k.expires_at) * 1000)::bigint AS expires_ms
 ), bump AS (
   INSERT INTO bench.scope_counts AS q (scope, live)
   SELECT 'acct_bench', 1 FROM ins
   ON CONFLICT (scope) DO UPDATE SET live = q.live + 1
   WHERE 1000000::bigint = 0 OR q.live < 1000000::bigint
   RETURNING 1
 )
 SELECT set_config('synchronous_commit', 'off', true) AS async_commit,
        1 / CASE WHEN EXISTS (SELECT 1 FROM ins) AND NOT EXISTS (SELECT 1 FROM bump)
                 THEN 0 ELSE 1 END AS consistent,
        i.fence, i.expires_ms
 FROM (SELECT 1) one LEFT JOIN ins i ON true;
