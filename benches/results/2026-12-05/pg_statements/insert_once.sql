\set k random(1, 9000000000000000000)
WITH ins AS (
   INSERT INTO bench.records AS r (namespace, key, value, expires_at)
   VALUES ('gateway.charges', :client_id || '-' || :k, '\x7b226964223a2263685f3031323334353637383961626364656630313233343536222c22616d6f756e745f6d696e6f72223a31303030302c2263757272656e6379223a2242524c227d'::bytea, now() + 86400000::bigint * interval '1 millisecond')
   ON CONFLICT (namespace, key) DO UPDATE
     SET value = EXCLUDED.value, expires_at = EXCLUDED.expires_at
   WHERE r.expires_at IS NOT NULL AND r.expires_at <= now()
   RETURNING 1
 ), bump AS (
   INSERT INTO bench.counters AS c (name, stripe, value)
   SELECT 'charges_total', floor(random() * 16)::smallint, 1 FROM ins
   ON CONFLICT (name, stripe) DO UPDATE SET value = c.value + 1
   RETURNING c.value
 )
 SELECT set_config('synchronous_commit', 'off', true) AS async_commit,
        EXISTS (SELECT 1 FROM ins) AS inserted,
        EXISTS (SELECT 1 FROM bump) AS counted,
        (SELECT r.value FROM bench.records r
         WHERE r.namespace = 'gateway.charges' AND r.key = :client_id || '-' || :k
           AND (r.expires_at IS NULL OR r.expires_at > now())) AS existing;
