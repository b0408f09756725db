#!/bin/bash
# srvcg.sh BIN N OUT : run the server under callgrind, send N new-key POSTs on one keep-alive connection, stop it; prints total Ir
BIN=$1; N=$2; OUT=$3
dir=$(mktemp -d)
env -u DATABASE_URL valgrind --tool=callgrind --callgrind-out-file=$OUT $BIN --listen 127.0.0.1:9292 --data-dir $dir --api-key sk_test_alpha=acct_a --gateway-latency 0s --durability none > /tmp/srvcg.log 2>&1 &
pid=$!
for _ in $(seq 600); do curl -fs -o /dev/null http://127.0.0.1:9292/healthz && break; sleep 0.1; done
python3 - "$N" <<'PY'
import http.client, sys
n=int(sys.argv[1])
c=http.client.HTTPConnection("127.0.0.1",9292)
body='{"amount": 100.00, "currency": "BRL"}'
for i in range(n):
    c.request("POST","/payments",body,{"Content-Type":"application/json","Authorization":"Bearer sk_test_alpha","Idempotency-Key":f"cg-{i}"})
    r=c.getresponse(); r.read()
    assert r.status==201, r.status
PY
kill -TERM $pid; wait $pid 2>/dev/null; rm -rf $dir
callgrind_annotate $OUT 2>/dev/null | awk '/PROGRAM TOTALS/{gsub(",","",$1);print $1}'
