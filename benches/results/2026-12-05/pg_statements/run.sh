#!/usr/bin/env bash
# Our statements in isolation under pgbench (-M prepared -c16 -j2, 8 s each) beside a plain insert,
# on one throwaway cluster whose schema the server creates (started once, then stopped).
#   BIN=target/release/idemlog-server benches/results/2026-12-05/pg_statements/run.sh
# claim_new.sql and insert_once.sql are the backend's `claim_new` and `insert_once` (sql.rs) with
# literal parameters; plain_async.sql is the bare insert with the same per-statement
# `synchronous_commit = off` the two use.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../../.."
bin=${BIN:-target/release/idemlog-server}
export PG_TEST_STATE=${TMPDIR:-/tmp}/idemlog-pg-statements.$$.state
eval "$(scripts/pg-test-cluster start 2>/dev/null)"
trap 'scripts/pg-test-cluster stop >/dev/null 2>&1' EXIT
env -u DATABASE_URL RUST_LOG=warn IDEMLOG_API_KEYS="bench-key=acct_bench" "$bin" --listen 127.0.0.1:18900 \
  --gateway-latency 0ms --database-url "$DATABASE_URL" --database-schema bench >/dev/null 2>&1 &
sp=$!
for _ in $(seq 100); do curl -sf http://127.0.0.1:18900/readyz >/dev/null && break; sleep 0.1; done
kill "$sp"; wait "$sp" 2>/dev/null
psql "$DATABASE_URL" -qc "CREATE TABLE bench_insert (scope text NOT NULL, key text NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (scope, key))"
pb() { pgbench -n -M prepared -c 16 -j 2 -T 8 -f "$here/$1" "$DATABASE_URL" 2>&1 | awk -v n="$1" '/^tps/{printf "%-16s %8.0f tps\n", n, $3}'; }
for round in 1 2; do
  echo "round $round"
  pb plain.sql; pb plain_async.sql; pb claim_new.sql; pb insert_once.sql
done
echo "without the keys_expires_at index"
psql "$DATABASE_URL" -qc "DROP INDEX bench.keys_expires_at"
for round in 1 2; do pb claim_new.sql; done
