#!/usr/bin/env bash
# per_second_cpu.sh BIN [MODE]: one fresh server under wrk -t2 -c64 newkeys.lua for 12 s; each second, the server's CPU per request (µs) / requests answered in that second
BIN=$1; MODE=${2:-none}
exec 9>/tmp/idemlog-bench.lock; flock 9; sync
dir=$(mktemp -d)
env -u DATABASE_URL "$BIN" --listen 127.0.0.1:9191 --data-dir "$dir" --api-key sk_test_alpha=acct_a --gateway-latency 0s --durability $MODE >/dev/null 2>&1 &
pid=$!
for _ in $(seq 200); do curl -fs -o /dev/null http://127.0.0.1:9191/metrics && break; sleep 0.05; done
req() { curl -s http://127.0.0.1:9191/metrics | awk '/^idempotency_requests_total/{s+=$2} END{print s}'; }
(cd /work/shared/peers && wrk -t2 -c64 -d12s -s newkeys.lua http://127.0.0.1:9191 >/dev/null 2>&1) &
w=$!
line=""; j0=$(awk '{print $14+$15}' /proc/$pid/stat); r0=$(req)
for i in $(seq 11); do sleep 1; j1=$(awk '{print $14+$15}' /proc/$pid/stat); r1=$(req); line="$line $(echo "($j1-$j0)*10000/($r1-$r0+1)" | bc -l | cut -c1-4)/$((r1-r0))"; j0=$j1; r0=$r1; done
wait $w
echo "pid $pid: $line"
kill $pid; wait $pid 2>/dev/null; rm -rf "$dir"
