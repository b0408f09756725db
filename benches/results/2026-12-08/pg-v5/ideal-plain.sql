\set n :n + 1
BEGIN;
INSERT INTO ideal.keys (scope, key, fingerprint, fence, state, takeover, lease_until, expires_at, created_at)
  SELECT 'acct_a', :prefix || '-' || :client_id || '-' || :n || '-' || g, decode(repeat('ab', 32), 'hex'), g, 0, 0, now() + interval '30 s', now() + interval '1 day', now() FROM generate_series(1, :b) g;
INSERT INTO ideal.records (namespace, key, value, expires_at)
  SELECT 'charges', 'acct_a:' || :prefix || '-' || :client_id || '-' || :n || '-' || g, decode(repeat('cd', 90), 'hex'), now() + interval '1 day' FROM generate_series(1, :b) g;
UPDATE ideal.keys SET state = 1, lease_until = NULL, status = 201, headers = decode(repeat('ef', 60), 'hex'), body = decode(repeat('12', 220), 'hex')
  WHERE scope = 'acct_a' AND key IN (SELECT :prefix || '-' || :client_id || '-' || :n || '-' || g FROM generate_series(1, :b) g);
INSERT INTO ideal.records (namespace, key, value)
  SELECT 'payments', 'pay_' || :prefix || '-' || :client_id || '-' || :n || '-' || g, decode(repeat('34', 250), 'hex') FROM generate_series(1, :b) g;
COMMIT;
