#!/usr/bin/env bash
# What idempotent-proxy-server 1.2.2 does with the cases idemlog-proxy's contract names, observed
# against a counting upstream (Python standard library, below): how many times the upstream ran per
# key, and what the client got. Not a benchmark; the notebook's correctness notes come from here.
#   IPX (default /tmp/ipx/bin/idempotent-proxy-server), REDIS_MODE=no|yes (Redis on port 19379),
#   OUT (default a new folder in TMPDIR). Every process started here is stopped by its PID.
set -u
IPX=${IPX:-/tmp/ipx/bin/idempotent-proxy-server}
REDIS_MODE=${REDIS_MODE:-no}
OUT=${OUT:-${TMPDIR:-/tmp}/proxy-peer-checks/$(date +%Y%m%dT%H%M%S)}
UP=19180 PX=19182 RP=19379
mkdir -p "$OUT/tmp"
PIDS=()
cleanup() { local p; for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done; rm -rf "$OUT/tmp"; }
trap cleanup EXIT

cat >"$OUT/tmp/upstream.py" <<'EOF'
# Counting upstream: runs per Idempotency-Key; body "fail500" answers 500; header X-Delay-Ms sleeps.
import json, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
runs, lock = {}, threading.Lock()
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        body = json.dumps(runs).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0); data = self.rfile.read(n).decode()
        key = self.headers.get("Idempotency-Key", "")
        with lock:
            runs[key] = runs.get(key, 0) + 1; run = runs[key]
        time.sleep(int(self.headers.get("X-Delay-Ms") or 0) / 1000)
        body = json.dumps({"key": key, "run": run, "body": data,
                           "tenant": self.headers.get("Authorization", "")}).encode()
        self.send_response(500 if "fail500" in data else 200)
        self.send_header("Content-Type", "application/json"); self.send_header("Set-Cookie", "s=1")
        self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
EOF
python3 "$OUT/tmp/upstream.py" "$UP" >"$OUT/upstream.log" 2>&1 &
PIDS+=("$!")
if [ "$REDIS_MODE" = yes ]; then
  redis-server --port "$RP" --bind 127.0.0.1 --dir "$OUT/tmp" --save '' >"$OUT/redis.log" 2>&1 &
  PIDS+=("$!"); sleep 0.5
fi
mkdir -p "$OUT/tmp/ipx"
{ echo "SERVER_ADDR=127.0.0.1:$PX"; echo "URL_UP=http://127.0.0.1:$UP/payments"; echo "LOG=warn"
  [ "$REDIS_MODE" = yes ] && echo "REDIS_URL=redis://127.0.0.1:$RP"; } >"$OUT/tmp/ipx/.env"
(cd "$OUT/tmp/ipx" && exec "$IPX") >"$OUT/ipx.log" 2>&1 &
PIDS+=("$!")
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$UP/" && curl -s -o /dev/null "http://127.0.0.1:$PX/" && break; sleep 0.1; done

post() { # key body [extra curl args] -> "status body"
  local k=$1 b=$2; shift 2
  curl -s -w ' -> %{http_code}' -X POST -H "Idempotency-Key: $k" -H 'Content-Type: application/json' "$@" \
    --data "$b" "http://127.0.0.1:$PX/URL_UP"; echo
}
runs() { curl -s "http://127.0.0.1:$UP/"; echo; }
{
  echo "== 1. 20 concurrent copies of one key (upstream sleeps 300 ms)"
  for i in $(seq 20); do post conc-1 '{"a":1}' -H 'X-Delay-Ms: 300' >"$OUT/tmp/c$i" & done; wait
  sort "$OUT/tmp"/c* | uniq -c
  echo "== 1b. one retry of that key after the burst"
  post conc-1 '{"a":1}'
  echo "== 2. same key, other body"
  post body-1 '{"amount":1}'; post body-1 '{"amount":999}'
  echo "== 3. same key from two tenants (Authorization A, then B)"
  post tenant-1 '{"a":1}' -H 'Authorization: Bearer tenant-A'; post tenant-1 '{"a":1}' -H 'Authorization: Bearer tenant-B'
  echo "== 4. upstream 500, then a retry with the same key"
  post fail-1 'fail500'; post fail-1 'fail500'
  echo "== 5. replay headers (Set-Cookie from the upstream, a replay marker)"
  curl -s -D - -o /dev/null -X POST -H 'Idempotency-Key: hdr-1' --data x "http://127.0.0.1:$PX/URL_UP"
  curl -s -D - -o /dev/null -X POST -H 'Idempotency-Key: hdr-1' --data x "http://127.0.0.1:$PX/URL_UP"
  echo "== 6. the same key 11 s later (REQUEST_TIMEOUT, the cache TTL, defaults to 10 s)"
  post ttl-1 '{"a":1}'; sleep 11; post ttl-1 '{"a":1}'
  echo "== upstream runs per key"
  runs
} 2>&1 | tee "$OUT/checks.txt"
echo "results: $OUT"
