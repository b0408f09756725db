#!/usr/bin/env bash
# sync_on_tmpfs.sh BIN MODE: one fresh server (data directory under $DATA_PARENT), wrk -t2 -c64 newkeys.lua 10 s; vmstat and /metrics over 6 s of it.
# Used for the twelfth step: --durability sync on the ext4 disk (/tmp) against sync on tmpfs (/dev/shm, where fdatasync costs nothing) and none.
BIN=$1; MODE=$2; shift 2
exec 9>/tmp/idemlog-bench.lock; flock 9; sync
dir=$(mktemp -d -p ${DATA_PARENT:-/tmp})
env -u DATABASE_URL "$BIN" --listen 127.0.0.1:9191 --data-dir "$dir" --api-key sk_test_alpha=acct_a \
    --gateway-latency 0s --durability $MODE "$@" >/tmp/idle-server.log 2>&1 &
pid=$!
for _ in $(seq 200); do curl -fs -o /dev/null http://127.0.0.1:9191/metrics && break; sleep 0.05; done
(cd /work/shared/peers && wrk -t2 -c64 -d10s -s newkeys.lua http://127.0.0.1:9191 > /tmp/idle.wrk 2>&1) &
w=$!
sleep 2; curl -s http://127.0.0.1:9191/metrics > /tmp/m1; t1=$(awk '{print $14+$15}' /proc/$pid/stat)
vmstat 1 6 | tail -6 > /tmp/idle.vmstat
curl -s http://127.0.0.1:9191/metrics > /tmp/m2; t2=$(awk '{print $14+$15}' /proc/$pid/stat)
wait $w
kill $pid; wait $pid 2>/dev/null; rm -rf "$dir"
grep Requests/sec /tmp/idle.wrk
echo "server cpu ticks in ~6s: $((t2-t1))"
cat /tmp/idle.vmstat | awk '{print "us",$13,"sy",$14,"id",$15,"wa",$16,"cs",$12}'
for m in idemlog_fdatasync_duration_seconds_count idemlog_fdatasync_duration_seconds_sum; do a=$(grep "^$m " /tmp/m1 | awk "{print \$2}"); b=$(grep "^$m " /tmp/m2 | awk "{print \$2}"); echo "$m $a -> $b"; done
