#!/usr/bin/env bash
# One wrk run against a fresh embedded-store server, as used for issue 23's A/B figures.
#   run1.sh BIN MODE [DURATION] [file|pipe]  ->  "BIN MODE rps=… us/req=… non2xx=…"
# MODE is --durability; the server's stderr goes to a file, or into a pipe read by `cat` (as under
# systemd or docker). Server CPU per request from /proc/<pid>/stat. Uses ../shared/peers/newkeys.lua.
BIN=$1; MODE=$2; D=${3:-8s}; STDERR=${4:-file}
peers=$(cd "$(dirname "$0")/../../../../shared/peers" && pwd)
dir=$(mktemp -d)
log=/tmp/run1-server.log
start() {
  exec env -u DATABASE_URL "$BIN" --listen 127.0.0.1:9191 --data-dir "$dir" --api-key sk_test_alpha=acct_a \
    --gateway-latency 0s --durability "$MODE"
}
case "$STDERR" in
  file) start >"$log" 2>&1 & ;;
  pipe) start 2> >(cat >"$log") & ;;
  *) echo "stderr: file or pipe" >&2; exit 2 ;;
esac
pid=$!
for _ in $(seq 200); do curl -fs -o /dev/null http://127.0.0.1:9191/metrics && break; sleep 0.05; done
j0=$(awk '{print $14+$15}' /proc/$pid/stat)
out=$(cd "$peers" && wrk -t2 -c64 -d$D -s newkeys.lua http://127.0.0.1:9191 2>&1)
j1=$(awk '{print $14+$15}' /proc/$pid/stat)
kill $pid; wait $pid 2>/dev/null; rm -rf "$dir"
rps=$(echo "$out" | awk '/Requests\/sec/{print $2}')
req=$(echo "$out" | awk '/ requests in /{print $1}')
bad=$(echo "$out" | awk -F= '/^non2xx=/{print $2}')
echo "$(basename "$BIN") $MODE rps=$rps us/req=$(echo "($j1-$j0)*10000/$req" | bc -l | cut -c1-6) non2xx=$bad"
