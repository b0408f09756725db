#!/usr/bin/env bash
# fdatasync_histogram.sh BIN [server flags]: --durability sync, wrk newkeys 10 s; the fdatasync histogram and the log bytes appended over 6 s of it
BIN=$1; shift
exec 9>/tmp/idemlog-bench.lock; flock 9; sync
dir=$(mktemp -d)
env -u DATABASE_URL "$BIN" --listen 127.0.0.1:9191 --data-dir "$dir" --api-key sk_test_alpha=acct_a --gateway-latency 0s --durability sync "$@" >/tmp/fdh-server.log 2>&1 &
pid=$!
for _ in $(seq 200); do curl -fs -o /dev/null http://127.0.0.1:9191/metrics && break; sleep 0.05; done
(cd /work/shared/peers && wrk -t2 -c64 -d10s -s newkeys.lua http://127.0.0.1:9191 > /tmp/fdh.wrk 2>&1) &
w=$!
sleep 2; curl -s http://127.0.0.1:9191/metrics > /tmp/f1; sleep 6; curl -s http://127.0.0.1:9191/metrics > /tmp/f2
wait $w; kill $pid; wait $pid 2>/dev/null; rm -rf "$dir"
grep Requests/sec /tmp/fdh.wrk
python3 - <<'PY'
def load(f):
    d={}
    for l in open(f):
        if l.startswith('#'): continue
        p=l.split()
        if len(p)==2: d[p[0]]=float(p[1])
    return d
a=load('/tmp/f1'); b=load('/tmp/f2')
prev=0
for k in sorted([k for k in b if k.startswith('idemlog_fdatasync_duration_seconds_bucket')], key=lambda k: float(k.split('"')[1]) if k.split('"')[1]!='+Inf' else 1e9):
    v=b[k]-a.get(k,0); print("%10s %8.0f" % (k.split(chr(34))[1], v-prev)); prev=v
print('bytes appended MiB', (b['idemlog_bytes_appended_total']-a['idemlog_bytes_appended_total'])/2**20)
print('syncs', b['idemlog_fdatasync_duration_seconds_count']-a['idemlog_fdatasync_duration_seconds_count'])
PY
