#!/usr/bin/env bash
# syscalls_per_request.sh BIN MODE LUA -> system calls per request by type (perf stat on the server under wrk -t2 -c64)
# The request count comes from idempotency_requests_total read just before and after perf stat, so its
# window is a little longer than perf's 4 s: the per-request figures read slightly low (0.87-0.89 for
# what is one recvfrom and one writev per request).
BIN=$1; MODE=$2; LUA=$3
exec 9>/tmp/idemlog-bench.lock; flock 9; sync
dir=$(mktemp -d)
env -u DATABASE_URL "$BIN" --listen 127.0.0.1:9191 --data-dir "$dir" --api-key sk_test_alpha=acct_a \
    --gateway-latency 0s --durability $MODE >/tmp/sysc-server.log 2>&1 &
pid=$!
for _ in $(seq 200); do curl -fs -o /dev/null http://127.0.0.1:9191/metrics && break; sleep 0.05; done
(cd /work/shared/peers && wrk -t2 -c64 -d8s -s $LUA http://127.0.0.1:9191 > /tmp/sysc.wrk 2>&1) &
w=$!
sleep 2
r0=$(curl -s http://127.0.0.1:9191/metrics | awk '/^idempotency_requests_total/{s+=$2} END{print s}')
perf stat -e 'raw_syscalls:sys_enter' -e 'syscalls:sys_enter_read,syscalls:sys_enter_recvfrom,syscalls:sys_enter_writev,syscalls:sys_enter_write,syscalls:sys_enter_sendto,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_futex,syscalls:sys_enter_pwrite64,syscalls:sys_enter_fdatasync,syscalls:sys_enter_clock_gettime,syscalls:sys_enter_sched_yield,syscalls:sys_enter_pread64,syscalls:sys_enter_madvise,syscalls:sys_enter_mmap,syscalls:sys_enter_munmap' -p $pid -o /tmp/sysc.stat -- sleep 4
r1=$(curl -s http://127.0.0.1:9191/metrics | awk '/^idempotency_requests_total/{s+=$2} END{print s}')
wait $w
kill $pid; wait $pid 2>/dev/null; rm -rf "$dir"
n=$((r1-r0)); echo "requests=$n"
awk -v n=$n '/syscalls|raw_/{gsub(",","",$1); printf "%-40s %.3f\n", $2, $1/n}' /tmp/sysc.stat
