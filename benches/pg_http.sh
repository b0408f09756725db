#!/usr/bin/env bash
# HTTP throughput and latency of new-key payments: the embedded store (default, durability sync)
# beside PostgreSQL with one and with two instances, in one run, alternating, with wrk.
#
#   benches/pg_http.sh            # needs wrk (apt-get install wrk) and PostgreSQL server binaries
#
# Every server runs the release binary with --gateway-latency 0ms and RUST_LOG=warn. PostgreSQL is a
# throwaway cluster from scripts/pg-test-cluster (fsync=on, synchronous_commit=on: every commit
# waits for its WAL fdatasync), on this same machine. ROUNDS (2), DURATION (10s), CONNECTIONS (64).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
rounds="${ROUNDS:-2}"
duration="${DURATION:-10s}"
connections="${CONNECTIONS:-64}"
bin="$CARGO_TARGET_DIR/release/idemlog-server"
lua="$PWD/benches/tools/new-key.lua"

cargo build --release --locked -p idemlog-server >&2
export PG_TEST_STATE="${TMPDIR:-/tmp}/idemlog-pg-bench.$$.state"
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  scripts/pg-test-cluster stop >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
eval "$(scripts/pg-test-cluster start)"

echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD), nproc $(nproc)"
echo "postgres: $(psql "$DATABASE_URL" -Atc 'select version()' | cut -d, -f1);" \
  "fsync=$(psql "$DATABASE_URL" -Atc 'show fsync')," \
  "synchronous_commit=$(psql "$DATABASE_URL" -Atc 'show synchronous_commit')," \
  "shared_buffers=$(psql "$DATABASE_URL" -Atc 'show shared_buffers')"

port=18400
start_server() { # args... ; sets $port to the new server's port (not in a subshell: pids must stay)
  port=$((port + 1))
  if curl -s "http://127.0.0.1:$port/healthz" >/dev/null 2>&1; then
    echo "port $port is already in use" >&2; exit 1
  fi
  # DATABASE_URL is in the environment (for psql): a server started without --database-url must
  # not pick it up, or the "embedded" server would run on PostgreSQL too.
  env -u DATABASE_URL RUST_LOG=warn "$bin" --listen "127.0.0.1:$port" --api-key bench-key=acct_bench \
    --gateway-latency 0ms "$@" >/dev/null 2>"$work/server-$port.log" &
  pids+=($!)
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && return
    sleep 0.1
  done
  echo "server on $port did not start" >&2; cat "$work/server-$port.log" >&2; exit 1
}

start_server --data-dir "$work/data"; embedded=$port
start_server --database-url "$DATABASE_URL" --database-schema bench; pg_a=$port
start_server --database-url "$DATABASE_URL" --database-schema bench; pg_b=$port
for p in $embedded $pg_a $pg_b; do
  kill -0 "${pids[$((p - 18401))]}" || { echo "server on $p exited" >&2; exit 1; }
done
# A short warm-up of each server (page cache, pool connections), not recorded.
for p in $embedded $pg_a $pg_b; do
  wrk -t1 -c8 -d2s -s "$lua" "http://127.0.0.1:$p" -- "warm-$p" >/dev/null 2>&1
done

run_id=0
run() { # label conns port...
  local label=$1 conns=$2; shift 2
  local n=$# per=$(( conns / $# )) out=()
  for p in "$@"; do
    run_id=$((run_id + 1))
    wrk -t1 -c"$per" -d"$duration" -s "$lua" "http://127.0.0.1:$p" -- "r$run_id-$p" >"$work/wrk-$p.txt" 2>&1 &
    out+=($!)
  done
  wait "${out[@]}"
  local total=0 rate=0 bad=0 p50s="" p99s=""
  for p in "$@"; do
    local requests=0 duration_s=1 non2xx=0 errors=0 p50_ms=0 p99_ms=0
    eval "$(grep '^RESULT' "$work/wrk-$p.txt" | sed 's/^RESULT //; s/ /; /g')"
    total=$((total + requests)); bad=$((bad + non2xx + errors))
    rate=$(echo "$rate + $requests / $duration_s" | bc -l)
    p50s="$p50s${p50s:+ / }$p50_ms"; p99s="$p99s${p99s:+ / }$p99_ms"
  done
  printf '| %s | %d | %.0f | %s | %s | %d |\n' "$label" "$n" "$rate" "$p50s" "$p99s" "$bad"
}

echo
echo "| backend | instances | req/s (sum) | p50 ms (per instance) | p99 ms (per instance) | non-2xx or errors |"
echo "|---|---|---|---|---|---|"
for r in $(seq 1 "$rounds"); do
  if (( r % 2 == 1 )); then
    run "embedded (sync)" "$connections" "$embedded"
    run "postgres" "$connections" "$pg_a"
    run "postgres" "$connections" "$pg_a" "$pg_b"
  else
    run "postgres" "$connections" "$pg_a" "$pg_b"
    run "postgres" "$connections" "$pg_a"
    run "embedded (sync)" "$connections" "$embedded"
  fi
done
