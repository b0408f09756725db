#!/usr/bin/env bash
# The PostgreSQL backend against the database's own speed, on one throwaway cluster, in one run:
# pgbench's bare insert (one INSERT per transaction into a table keyed (scope, key)) beside
# idemlog-server --database-url under the same 64 connections, new Idempotency-Key per request.
#
#   benches/pg_speed.sh                        # needs wrk and pgbench (Debian: wrk, postgresql-client)
#   SERVER=/path/to/old/idemlog-server benches/pg_speed.sh   # a given binary instead of a fresh build
#
# Rows, each ROUNDS (3) times for DURATION (10s) with CONNECTIONS (64), alternating in every round:
#   pgbench   pgbench -n -M prepared -c64 -j2 -f insert.sql (the baseline)
#   1 acct    one instance, every request on one account
#   64 accts  one instance, requests spread over 64 accounts (API key by request)
#   2 inst    two instances on the one database (wrk -c32 against each), one account
# For every row it prints the medians of req/s (tps for pgbench), ratio to pgbench's median, and
# per request: transactions (Δ pg_stat_database.xact_commit), WAL flushes (Δ pg_stat_wal.wal_sync)
# and WAL writes (Δ wal_write), and CPU time per request: the whole machine's (busy jiffies in
# /proc/stat: the database, the servers and the load generator) and the servers' own (their
# /proc/<pid>/stat), so the budget behind the ratio can be read off. The cluster runs with
# fsync=on, synchronous_commit=on (scripts/pg-test-cluster). The server: --gateway-latency 0ms, RUST_LOG=warn, pool 16.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
rounds="${ROUNDS:-3}"
duration="${DURATION:-10s}"
connections="${CONNECTIONS:-64}"
lua="$PWD/benches/tools/new-key.lua"
lua_accounts="$PWD/benches/tools/new-key-accounts.lua"
if [[ -n "${SERVER:-}" ]]; then
  bin="$SERVER"
else
  cargo build --release --locked -p idemlog-server >&2
  bin="$CARGO_TARGET_DIR/release/idemlog-server"
fi
command -v wrk >/dev/null || { echo "wrk is missing (apt-get install wrk)" >&2; exit 1; }
command -v pgbench >/dev/null || { echo "pgbench is missing (apt-get install postgresql-client)" >&2; exit 1; }

export PG_TEST_STATE="${TMPDIR:-/tmp}/idemlog-pg-speed.$$.state"
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
q() { psql "$DATABASE_URL" -Atqc "$1"; }

echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD), server $bin, nproc $(nproc)"
echo "postgres: $(q 'select version()' | cut -d, -f1); fsync=$(q 'show fsync')," \
  "synchronous_commit=$(q 'show synchronous_commit'), shared_buffers=$(q 'show shared_buffers')," \
  "wal_sync_method=$(q 'show wal_sync_method'), commit_delay=$(q 'show commit_delay')"

q "CREATE TABLE bench_insert (scope text NOT NULL, key text NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (scope, key))"
cat >"$work/insert.sql" <<'EOF'
\set k random(1, 9000000000000000000)
INSERT INTO bench_insert (scope, key) VALUES ('acct_bench', :client_id || '-' || :k) ON CONFLICT DO NOTHING;
EOF

keys="bench-key=acct_bench"
for i in $(seq 0 63); do keys="$keys,bench-key-$i=acct_bench_$i"; done
port=18500
start_server() { # args...
  port=$((port + 1))
  env -u DATABASE_URL RUST_LOG=warn IDEMLOG_API_KEYS="$keys" "$bin" --listen "127.0.0.1:$port" \
    --gateway-latency 0ms --database-url "$DATABASE_URL" --database-schema bench "$@" \
    >/dev/null 2>"$work/server-$port.log" &
  pids+=($!)
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && return
    sleep 0.1
  done
  echo "server on $port did not start" >&2; cat "$work/server-$port.log" >&2; exit 1
}
start_server; a=$port
start_server; b=$port
for p in $a $b; do
  wrk -t1 -c8 -d2s -s "$lua" "http://127.0.0.1:$p" -- "warm-$p" >/dev/null 2>&1
done

# Busy jiffies of the whole machine (user, nice, system, irq, softirq, steal) and of the servers.
machine_busy() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9}' /proc/stat; }
servers_busy() { local t=0 pid; for pid in "${pids[@]}"; do t=$((t + $(awk '{print $14+$15}' "/proc/$pid/stat"))); done; echo "$t"; }
hz=$(getconf CLK_TCK)
counters() { q "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()) || ' ' || wal_sync || ' ' || wal_write FROM pg_stat_wal"; }

run_id=0
declare -A rates tx flushes writes machine_us server_us
measure() { # label requests-command...: runs it, records rate and per-request deltas
  local label=$1; shift
  # Dirty page cache left by anything before (a previous run, a build) written back during this
  # run slows its WAL flushes several times over: write it back first.
  sync
  sleep 1.2 # let the statistics of the previous run reach the shared counters
  read -r c0 s0 w0 <<<"$(counters)"
  local out requests secs m0 m1 v0 v1
  m0=$(machine_busy); v0=$(servers_busy)
  out=$("$@")
  m1=$(machine_busy); v1=$(servers_busy)
  requests=${out% *}; secs=${out#* }
  sleep 1.2
  read -r c1 s1 w1 <<<"$(counters)"
  local rate t f w mu su
  rate=$(echo "$requests / $secs" | bc -l)
  t=$(echo "($c1 - $c0) / $requests" | bc -l)
  f=$(echo "($s1 - $s0) / $requests" | bc -l)
  w=$(echo "($w1 - $w0) / $requests" | bc -l)
  mu=$(echo "($m1 - $m0) * 1000000 / $hz / $requests" | bc -l)
  su=$(echo "($v1 - $v0) * 1000000 / $hz / $requests" | bc -l)
  rates[$label]+="$rate "; tx[$label]+="$t "; flushes[$label]+="$f "; writes[$label]+="$w "
  machine_us[$label]+="$mu "; server_us[$label]+="$su "
  printf '  %-9s %8.0f /s  tx/req %.2f  wal_sync/req %.3f  wal_write/req %.3f  machine µs/req %.0f  server µs/req %.0f\n' \
    "$label" "$rate" "$t" "$f" "$w" "$mu" "$su" >&2
}

pgbench_run() {
  local out
  out=$(pgbench -n -M prepared -c "$connections" -j 2 -T "${duration%s}" -f "$work/insert.sql" "$DATABASE_URL" 2>&1)
  local n; n=$(grep -oP 'number of transactions actually processed: \K[0-9]+' <<<"$out")
  echo "$n ${duration%s}"
}

wrk_run() { # script conns port...
  local script=$1 conns=$2; shift 2
  local per=$(( conns / $# )) waits=() total=0 secs=0
  for p in "$@"; do
    run_id=$((run_id + 1))
    wrk -t1 -c"$per" -d"$duration" -s "$script" "http://127.0.0.1:$p" -- "r$run_id-$p" >"$work/wrk-$p.txt" 2>&1 &
    waits+=($!)
  done
  wait "${waits[@]}"
  for p in "$@"; do
    local requests=0 duration_s=1 non2xx=0 errors=0 p50_ms=0 p99_ms=0
    eval "$(grep '^RESULT' "$work/wrk-$p.txt" | sed 's/^RESULT //; s/ /; /g')"
    if (( non2xx + errors > 0 )); then echo "wrk on $p: $non2xx non-2xx, $errors errors" >&2; fi
    total=$((total + requests)); secs=$duration_s
  done
  echo "$total $secs"
}

labels=("pgbench" "1 acct" "64 accts" "2 inst")
for r in $(seq 1 "$rounds"); do
  echo "round $r" >&2
  order=("${labels[@]}")
  (( r % 2 == 0 )) && order=("2 inst" "64 accts" "1 acct" "pgbench")
  for label in "${order[@]}"; do
    case $label in
      pgbench) measure "$label" pgbench_run ;;
      "1 acct") measure "$label" wrk_run "$lua" "$connections" "$a" ;;
      "64 accts") measure "$label" wrk_run "$lua_accounts" "$connections" "$a" ;;
      "2 inst") measure "$label" wrk_run "$lua" "$connections" "$a" "$b" ;;
    esac
  done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
base=$(median <<<"${rates[pgbench]}")
echo
echo "| row | req/s or tps (median of $rounds) | ÷ pgbench | transactions/req | WAL flushes/req | WAL writes/req | machine CPU µs/req | servers' CPU µs/req |"
echo "|---|---|---|---|---|---|---|---|"
for label in "${labels[@]}"; do
  m=$(median <<<"${rates[$label]}")
  printf '| %s | %.0f | %.3f | %.2f | %.3f | %.3f | %.0f | %.0f |\n' "$label" "$m" "$(echo "$m / $base" | bc -l)" \
    "$(median <<<"${tx[$label]}")" "$(median <<<"${flushes[$label]}")" "$(median <<<"${writes[$label]}")" \
    "$(median <<<"${machine_us[$label]}")" "$(median <<<"${server_us[$label]}")"
done
