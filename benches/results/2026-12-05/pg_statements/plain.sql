\set k random(1, 9000000000000000000)
INSERT INTO bench_insert (scope, key) VALUES ('acct_bench', :client_id || '-' || :k) ON CONFLICT DO NOTHING;
