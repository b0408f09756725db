#!/usr/bin/env bash
# HTTP/2 (h2c, prior knowledge) beside HTTP/1.1 on the same port and the same release binary:
# h2load (Debian nghttp2-client) and wrk (Debian wrk) sending the same POST /payments load, one
# after the other, alternating, in one run.
#
#   benches/h2_http1.sh            # ROUNDS (2), DURATION (10 s), CONNECTIONS (64), STREAMS (h2load -m, 1: the same 64 requests in flight as wrk), BIN
#
# h2load sends the same headers on every request, so it cannot give each request a new
# Idempotency-Key. The loads both tools can send identically:
#   replay   one key, one body: every request after the first is a replay (fingerprint, store
#            lookup, stored response) through the idempotency layer;
#   one-off  --idempotency off, no key: every request is a new charge and a new payment record,
#            the handler's write path without the layer.
# And for reference the new-key load of benches/NOTEBOOK.md, with wrk only (benches/tools/new-key.lua).
# Every server: --gateway-latency 0ms, RUST_LOG=warn, a fresh data directory, durability sync.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
rounds="${ROUNDS:-2}"
duration="${DURATION:-10}"
connections="${CONNECTIONS:-64}"
streams="${STREAMS:-1}"
bin="${BIN:-$CARGO_TARGET_DIR/release/idemlog-server}"   # BIN: another build of the server
key=bench-key

if [[ -z ${BIN:-} ]]; then cargo build --release --locked -p idemlog-server >&2; fi
work=$(mktemp -d)
pid=
cleanup() {
  if [[ -n $pid ]]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
body='{"amount": 100.00, "currency": "BRL"}'
printf '%s' "$body" >"$work/body.json"
cat >"$work/replay.lua" <<LUA
wrk.method = "POST"
wrk.body = '$body'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $key"
wrk.headers["Idempotency-Key"] = "replay-key"
LUA
cat >"$work/oneoff.lua" <<LUA
wrk.method = "POST"
wrk.body = '$body'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $key"
LUA

start() {
  rm -rf "$work/data"
  RUST_LOG=warn "$bin" --listen 127.0.0.1:18480 --data-dir "$work/data" --api-key "$key=acct_bench" \
    --gateway-latency 0ms "$@" >"$work/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do curl -fsS http://127.0.0.1:18480/readyz >/dev/null 2>&1 && return; sleep 0.1; done
  echo "server did not start" >&2; cat "$work/server.log" >&2; exit 1
}
stop() { kill "$pid"; wait "$pid" 2>/dev/null || true; pid=; }

run_wrk() {  # load lua
  echo "-- wrk $1: wrk -t1 -c$connections -d${duration}s -s $1.lua"
  wrk -t1 -c"$connections" -d"${duration}s" --latency -s "$work/$1.lua" http://127.0.0.1:18480/payments |
    grep -E 'Requests/sec|50%|99%|Non-2xx'
}
run_h2load() {  # load [extra headers...]
  local load=$1; shift
  echo "-- h2load $load: h2load -t1 -c$connections -m$streams -D$duration -d body.json $*"
  h2load -t1 -c"$connections" -m"$streams" -D"$duration" -d "$work/body.json" \
    -H 'content-type: application/json' -H "authorization: Bearer $key" "$@" \
    http://127.0.0.1:18480/payments | grep -E 'finished in|status codes|time for request' -A0
}

for round in $(seq "$rounds"); do
  echo "== round $round"
  start; curl -fsS -o /dev/null -X POST -H 'content-type: application/json' -H "authorization: Bearer $key" \
    -H 'idempotency-key: replay-key' -d "$body" http://127.0.0.1:18480/payments
  if (( round % 2 )); then run_wrk replay; run_h2load replay -H 'idempotency-key: replay-key'
  else run_h2load replay -H 'idempotency-key: replay-key'; run_wrk replay; fi
  stop
  start --idempotency off
  if (( round % 2 )); then run_wrk oneoff; run_h2load oneoff
  else run_h2load oneoff; run_wrk oneoff; fi
  stop
  start
  echo "-- wrk new-key: wrk -t1 -c$connections -d${duration}s -s benches/tools/new-key.lua"
  wrk -t1 -c"$connections" -d"${duration}s" --latency -s benches/tools/new-key.lua http://127.0.0.1:18480/payments |
    grep -E 'Requests/sec|50%|99%|Non-2xx'
  stop
done
