\set k random(1, 9000000000000000000)
WITH ins AS (INSERT INTO bench_insert (scope, key) VALUES ('acct_bench', :client_id || '-' || :k) ON CONFLICT DO NOTHING RETURNING 1)
SELECT set_config('synchronous_commit', 'off', true), (SELECT count(*) FROM ins);
