#!/usr/bin/env bash
# One wrk run against a fresh embedded-store server (issue 23 A/B figures from 2026-12-06 on).
#   ab.sh BIN MODE [DURATION] [newkeys.lua|replay.lua]  ->  "BIN MODE LUA rps=… us/req=… non2xx=…"
# Holds /tmp/idemlog-bench.lock so that runs never overlap, and syncs first so that the kernel is
# not writing back unrelated dirty pages during the run. Server CPU per request from /proc/<pid>/stat.
BIN=$1; MODE=$2; D=${3:-8s}; LUA=${4:-newkeys.lua}
peers=$(cd "$(dirname "$0")/../../../../shared/peers" && pwd)
dir=$(mktemp -d); log=/tmp/ab-server.log
exec 9>/tmp/idemlog-bench.lock; flock 9; sync
env -u DATABASE_URL "$BIN" --listen 127.0.0.1:9191 --data-dir "$dir" --api-key sk_test_alpha=acct_a \
    --gateway-latency 0s --durability "$MODE" >"$log" 2>&1 &
pid=$!
for _ in $(seq 200); do curl -fs -o /dev/null http://127.0.0.1:9191/metrics && break; sleep 0.05; done
j0=$(awk '{print $14+$15}' /proc/$pid/stat)
out=$(cd "$peers" && wrk -t2 -c64 -d$D -s $LUA http://127.0.0.1:9191 2>&1)
j1=$(awk '{print $14+$15}' /proc/$pid/stat)
kill $pid; wait $pid 2>/dev/null; rm -rf "$dir"
rps=$(echo "$out" | awk '/Requests\/sec/{print $2}')
req=$(echo "$out" | awk '/ requests in /{print $1}')
bad=$(echo "$out" | awk -F= '/^non2xx=/{print $2}')
echo "$(basename "$BIN") $MODE $LUA rps=$rps us/req=$(echo "($j1-$j0)*10000/$req" | bc -l | cut -c1-6) non2xx=$bad"
