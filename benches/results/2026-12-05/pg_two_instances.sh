#!/usr/bin/env bash
set -euo pipefail
cd "$(dirname "$0")/../../.."
# One instance with a pool of 16 against two with 8 each (the same 16 database connections), wrk 64
# connections in all, one throwaway cluster. BIN: the server binary.
bin=${BIN:-target/release/idemlog-server}
export PG_TEST_STATE=${TMPDIR:-/tmp}/idemlog-two.$$.state
eval "$(scripts/pg-test-cluster start 2>/dev/null)"
spids=()
work=$(mktemp -d)
trap 'kill ${spids[@]} 2>/dev/null; wait 2>/dev/null; scripts/pg-test-cluster stop >/dev/null 2>&1' EXIT
start() { # port pool
  env -u DATABASE_URL RUST_LOG=warn IDEMLOG_API_KEYS="bench-key=acct_bench" "$bin" --listen 127.0.0.1:$1 \
    --gateway-latency 0ms --database-url "$DATABASE_URL" --database-schema bench --database-pool-size $2 >/dev/null 2>>/dev/null &
  spids+=($!)
  for _ in $(seq 300); do curl -sf http://127.0.0.1:$1/readyz >/dev/null && break; sleep 0.1; done
}
start 18701 16; start 18702 8; start 18703 8
for p in 18701 18702 18703; do wrk -t1 -c8 -d2s -s benches/tools/new-key.lua http://127.0.0.1:$p -- warm$p >/dev/null; done
one() { wrk -t2 -c64 -d10s -s benches/tools/new-key.lua http://127.0.0.1:18701 -- one$1 | awk '/Requests\/sec/{print $2}'; }
two() { wrk -t1 -c32 -d10s -s benches/tools/new-key.lua http://127.0.0.1:18702 -- twoa$1 > "$work/a.txt" & wrk -t1 -c32 -d10s -s benches/tools/new-key.lua http://127.0.0.1:18703 -- twob$1 > "$work/b.txt"; wait; echo "$(awk '/Requests\/sec/{print $2}' "$work/a.txt") + $(awk '/Requests\/sec/{print $2}' "$work/b.txt")" | bc; }
for r in 1 2 3; do sync; echo "round $r: one(pool16) $(one $r)  two(pool8 each) $(two $r)"; done
