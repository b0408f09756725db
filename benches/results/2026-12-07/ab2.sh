#!/usr/bin/env bash
# ab2.sh BIN CONNS DURATION LABEL  (env passes through: IDEMLOG_PROTO_WHILE_BUSY_US)
BIN=$1; C=$2; D=${3:-6s}; LABEL=$4
peers=$(cd "$(dirname "$0")/../../../../shared/peers" && pwd)
dir=$(mktemp -d); log=/tmp/ab-server.log
exec 9>/tmp/idemlog-bench.lock; flock 9; sync
env -u DATABASE_URL "$BIN" --listen 127.0.0.1:9191 --data-dir "$dir" --api-key sk_test_alpha=acct_a \
    --gateway-latency 0s --durability sync >"$log" 2>&1 &
pid=$!
for _ in $(seq 200); do curl -fs -o /dev/null http://127.0.0.1:9191/metrics && break; sleep 0.05; done
s0=$(curl -fs http://127.0.0.1:9191/metrics | awk '/^idemlog_engine_fdatasyncs_total|^idemlog_syncs_total/{print $2}' | head -1)
j0=$(awk '{print $14+$15}' /proc/$pid/stat)
t=2; [ "$C" -lt 2 ] && t=1
out=$(cd "$peers" && wrk -t$t -c$C -d$D --latency -s newkeys.lua http://127.0.0.1:9191 2>&1)
j1=$(awk '{print $14+$15}' /proc/$pid/stat)
s1=$(curl -fs http://127.0.0.1:9191/metrics | awk '/^idemlog_engine_fdatasyncs_total|^idemlog_syncs_total/{print $2}' | head -1)
kill $pid; wait $pid 2>/dev/null; rm -rf "$dir"
rps=$(echo "$out" | awk '/Requests\/sec/{print $2}')
req=$(echo "$out" | awk '/ requests in /{print $1}')
p50=$(echo "$out" | awk '$1=="50%"{print $2}'); p99=$(echo "$out" | awk '$1=="99%"{print $2}')
bad=$(echo "$out" | awk -F= '/^non2xx=/{print $2}')
echo "$LABEL c=$C rps=$rps us/req=$(echo "($j1-$j0)*10000/$req" | bc -l | cut -c1-6) syncs/req=$(echo "($s1-$s0)/$req" | bc -l | cut -c1-5) p50=$p50 p99=$p99 non2xx=$bad"
