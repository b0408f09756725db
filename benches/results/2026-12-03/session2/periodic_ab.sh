#!/bin/bash
# Periodic-mode HTTP A/B: new vs old server binary, alternated, wrk -t1 -c64 new keys.
NEW=/work/main/target/release/idemlog-server
OLD=/work/target-old/release/idemlog-server
run() { # label bin port
  local dir=$(mktemp -d /tmp/pab.XXXX)
  $2 --listen 127.0.0.1:$3 --data-dir $dir/data --durability periodic --gateway-latency 0ms --api-key bench-key=acct_bench --max-live-keys-per-account 1000000000 > $dir/log 2>&1 &
  local pid=$!
  for i in $(seq 1 100); do curl -sf http://127.0.0.1:$3/healthz >/dev/null && break; sleep 0.1; done
  wrk -t1 -c64 -d2s -s /work/main/benches/tools/new-key.lua http://127.0.0.1:$3 -- warm$1$RANDOM > /dev/null
  local r=$(wrk -t1 -c64 -d8s -s /work/main/benches/tools/new-key.lua http://127.0.0.1:$3 -- run$1$RANDOM | grep RESULT)
  echo "$1 $r"
  kill $pid; wait $pid 2>/dev/null; rm -rf $dir
  sync
}
for round in 1 2 3; do
  if [ $((round % 2)) = 1 ]; then run new $NEW 18081; run old $OLD 18082; else run old $OLD 18082; run new $NEW 18081; fi
done
