#!/bin/bash
# One A/B step of the PostgreSQL batching notes (NOTEBOOK.md, 2026-12-07, "PostgreSQL: many requests per
# statement"): a server binary on a fresh schema of a running test cluster (scripts/pg-test-cluster),
# wrk -t2 -c64 new keys for 3 s unrecorded then 6 s recorded; prints req/s, the server's and the
# database's CPU per request from /proc, and the batch sizes from /metrics.
# usage: ab_step.sh BIN TAG URLSUFFIX [server args...]   (edit the URL below to your cluster)
BIN=$1; TAG=$2; SUF=$3; shift 3
U="postgres://idemlog:idemlog-test-pw@127.0.0.1:20778/explain_db$SUF"
psql "postgres://idemlog:idemlog-test-pw@127.0.0.1:20778/explain_db" -q -c "DROP SCHEMA IF EXISTS idemlog CASCADE" 2>/dev/null
$BIN --listen 127.0.0.1:9555 --database-url "$U" --api-key sk_test_alpha=acct_a --gateway-latency 0s "$@" > /tmp/try-srv.log 2>&1 &
SP=$!
sleep 1.5
KEYPREFIX=w$TAG wrk -t2 -c64 -d3s -s /work/shared/peers/pg/newkeys_pg.lua http://127.0.0.1:9555 >/dev/null
python3 "$(dirname "$0")/proc_cpu.py" save /tmp/t0.json
KEYPREFIX=m$TAG wrk -t2 -c64 -d6s -s /work/shared/peers/pg/newkeys_pg.lua http://127.0.0.1:9555 > /tmp/try-wrk.txt
python3 - "$SP" <<'PY'
import json,os,sys,re
sp=sys.argv[1]
a=json.load(open('/tmp/t0.json'))
def snap():
    out={}
    for p in os.listdir('/proc'):
        if not p.isdigit(): continue
        try:
            st=open(f'/proc/{p}/stat').read(); cmd=open(f'/proc/{p}/cmdline').read().replace('\0',' ')
        except Exception: continue
        f=st[st.rindex(')')+2:].split(); out[p]=(int(f[11])+int(f[12]),cmd)
    return out
b=snap()
pg=srv=other=0
for p,(t,c) in b.items():
    d=t-a.get(p,[0])[0]
    if d<=0: continue
    if 'postgres: ' in c and 'explain_db' in c: pg+=d
    elif p==sp: srv+=d
    elif 'wrk' not in c and 'python3' not in c: other+=d
w=open('/tmp/try-wrk.txt').read()
rps=float(re.search(r'Requests/sec:\s+([0-9.]+)',w).group(1))
req=int(re.search(r'(\d+) requests in',w).group(1))
print(f"req/s {rps:8.0f}  srv us/req {srv*1e4/req:6.1f}  pg us/req {pg*1e4/req:6.1f}  other_cpu_s {other/100:.2f}")
PY
curl -s localhost:9555/metrics | grep -E "batch_calls_(sum|count)" | awk '{printf "%s=%s ", $1, $2} END {print ""}' | sed 's/idemlog_pg_batch_calls_//g;s/statement=//g'
kill $SP; wait $SP 2>/dev/null
