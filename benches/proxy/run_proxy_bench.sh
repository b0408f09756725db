#!/usr/bin/env bash
# idemlog-proxy against nginx's plain proxy_pass and idempotent-proxy-server 1.2.2 (issue 43).
#
# One trivial upstream for every candidate (a separate nginx answering `return 200` with a fixed
# JSON body: no build, no disk, the cheapest handler on these cores, identical for all). Then, for
# ROUNDS rounds with the order reversed every other round, each candidate is started fresh, checked
# with one curl POST (must be 2xx), warmed up for W, and loaded for D with
#   wrk -t2 -c64 -d$D -s newkeys.lua     (POST, a new Idempotency-Key per request)
# Candidates (CANDIDATES, space separated, default all of them):
#   nginx           nginx plain proxy_pass, keep-alive upstream pool (nginx-proxy.conf), 2 workers
#   ipx-mem         idempotent-proxy-server 1.2.2, in-memory cache
#   ipx-redis-always  the same on Redis with appendonly yes, appendfsync always
#   ipx-redis-default the same on Redis with redis-server's defaults (no AOF; RDB snapshots)
#   idemlog-sync    idemlog-proxy, embedded store, --durability sync, fresh --data-dir, --static-scope bench
#   idemlog-none    the same with --durability none (not in the default list: a diagnostic)
#   idemlog-sync-b  idemlog-sync with the binary IDEMLOG_PROXY_B (another build, for an A/B)
#   idemlog-passthrough, nginx-passthrough: requests without Idempotency-Key (pass-through; diagnostic)
#
# Per window: req/s, p50/p99 (wrk), non-2xx (wrk's status errors, > 399) and socket errors, and CPU
# from /proc over the wrk window: the proxy's own (utime+stime of its processes; nginx: master and
# workers), the store's (redis-server), the upstream's, wrk's (/usr/bin/time), the whole machine's
# busy time (/proc/stat, everything but idle and iowait), foreign = busy - all of those (other
# processes on the machine), and steal. top.txt names the processes that used the most CPU in each
# window (procsnap.py), so foreign CPU can be told apart: compilers, or kernel threads flushing.
#
# Env: IDEMLOG_PROXY (path to the idemlog-proxy binary; its candidate is skipped when unset),
# IPX (default /tmp/ipx/bin/idempotent-proxy-server), REDIS (default /usr/bin/redis-server),
# NGINX (default /usr/sbin/nginx), D (default 10s), W (warm-up, default 2s), ROUNDS (default 3),
# OUT (results folder, default a new folder in TMPDIR).
# Priority: the kernel schedules by session (autogroup), so `nice` alone does nothing against other
# sessions' compilers; to give the measured processes priority, run it in a session of its own
# whose autogroup is reniced (env.txt records both):
#   setsid bash -c 'echo -10 >/proc/self/autogroup; exec benches/proxy/run_proxy_bench.sh' </dev/null
# Every process started here is stopped by its PID. Scratch only under $OUT/tmp (removed at the end).
set -u
HERE=$(dirname "$(readlink -f "$0")")
IPX=${IPX:-/tmp/ipx/bin/idempotent-proxy-server}
REDIS=${REDIS:-/usr/bin/redis-server}
NGINX=${NGINX:-/usr/sbin/nginx}
IDEMLOG_PROXY=${IDEMLOG_PROXY:-}
IDEMLOG_PROXY_B=${IDEMLOG_PROXY_B:-}
D=${D:-10s}
W=${W:-2s}
ROUNDS=${ROUNDS:-3}
CANDIDATES=${CANDIDATES:-nginx ipx-mem ipx-redis-always ipx-redis-default idemlog-sync}
OUT=${OUT:-${TMPDIR:-/tmp}/proxy-bench/$(date +%Y%m%dT%H%M%S)}
UP_PORT=19080 NGINX_PORT=19081 IPX_PORT=19082 IDEMLOG_PORT=19083 IDEMLOG_ADMIN=19093 REDIS_PORT=19379
TMPROOT=$OUT/tmp
mkdir -p "$OUT" "$TMPROOT"
TSV=$OUT/results.tsv
printf 'round\tsystem\treq_s\trequests\tnon2xx\tsockerr\tp50_ms\tp99_ms\tproxy_cpu_s\tstore_cpu_s\tupstream_cpu_s\twrk_cpu_s\tbusy_s\tforeign_s\tsteal_s\tproxy_us_req\tproxy_store_us_req\n' >"$TSV"

PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
  rm -rf "$TMPROOT"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
stop() { kill "$1" 2>/dev/null; wait "$1" 2>/dev/null; }

# nginx_conf template prefix port -> a config file under prefix
nginx_conf() {
  mkdir -p "$2"
  sed -e "s#@PREFIX@#$2#g" -e "s#@PORT@#${3:-0}#g" -e "s#@UP_PORT@#$UP_PORT#g" "$HERE/$1" >"$2/nginx.conf"
  echo "$2/nginx.conf"
}
# PIDs of an nginx master and its workers.
nginx_pids() { echo "$1 $(pgrep -d' ' -P "$1")"; }

# probe name url: one POST with a fresh key; must answer 2xx. Saves the response (headers + body).
probe() {
  local code i
  for i in $(seq 200); do
    code=$(curl -s -o "$OUT/$1.probe" -D "$OUT/$1.probe.headers" -w '%{http_code}' -X POST \
      -H 'Content-Type: application/json' -H "Idempotency-Key: probe-$1-$i" \
      --data '{"amount": 100.00, "currency": "BRL"}' "$2" 2>/dev/null)
    case $code in 2??) return 0 ;; 000) sleep 0.1 ;; *) echo "$1: probe answered $code" >&2; return 1 ;; esac
  done
  echo "$1: not up: $2" >&2; return 1
}

busy() { local _c u n s i w irq sirq st _r; read -r _c u n s i w irq sirq st _r </proc/stat; echo "$((u+n+s+irq+sirq+st)) $st"; }
# Context switches (voluntary + involuntary) of all threads of the given PIDs.
csw() { local p; for p in "$@"; do cat /proc/"$p"/task/*/status 2>/dev/null; done | awk '/ctxt_switches/{t+=$2} END{print t+0}'; }
pjif() { local t=0 p; for p in "$@"; do [ -r "/proc/$p/stat" ] && t=$((t + $(awk '{print $14+$15}' "/proc/$p/stat"))); done; echo "$t"; }

UPSTREAM_PIDS=()
PROXY_PIDS=()
STORE_PIDS=()
# bench round name path: warm-up, then the measured window; one row in results.tsv.
bench() {
  local round=$1 name=$2 url=$3 path=$4 f b0 b1 p0 p1 s0 s1 u0 u1
  case $name in *-passthrough) export NO_KEY=1 ;; *) export NO_KEY=0 ;; esac
  f="$OUT/r$round-$name"
  KEY_PREFIX="w$round$name" PROXY_PATH="$path" wrk -t2 -c64 -d"$W" -s "$HERE/newkeys.lua" "$url" >"$f.warmup.txt" 2>&1
  python3 "$HERE/procsnap.py" snap "$TMPROOT/snap0"
  head -1 /proc/stat >"$f.procstat"
  local c0 c1; c0=$(csw "${PROXY_PIDS[@]}")
  b0=$(busy); p0=$(pjif "${PROXY_PIDS[@]}"); s0=$(pjif "${STORE_PIDS[@]}"); u0=$(pjif "${UPSTREAM_PIDS[@]}")
  KEY_PREFIX="m$round$name" PROXY_PATH="$path" /usr/bin/time -f '%U %S' -o "$f.time" \
    wrk -t2 -c64 -d"$D" -s "$HERE/newkeys.lua" "$url" >"$f.txt" 2>&1
  b1=$(busy); p1=$(pjif "${PROXY_PIDS[@]}"); s1=$(pjif "${STORE_PIDS[@]}"); u1=$(pjif "${UPSTREAM_PIDS[@]}")
  head -1 /proc/stat >>"$f.procstat"
  c1=$(csw "${PROXY_PIDS[@]}")
  echo "proxy context switches in the window: $((c1 - c0))" >>"$f.procstat"
  python3 "$HERE/procsnap.py" snap "$TMPROOT/snap1"
  python3 "$HERE/procsnap.py" diff "$TMPROOT/snap0" "$TMPROOT/snap1" >"$f.top"
  echo "r$round $name: $(cat "$f.top")" >>"$OUT/top.txt"
  awk -v r="$round" -v n="$name" -v b0="$b0" -v b1="$b1" -v p0="$p0" -v p1="$p1" -v s0="$s0" -v s1="$s1" \
      -v u0="$u0" -v u1="$u1" -v wt="$(tail -1 "$f.time")" '
    /Requests\/sec/{rps=$2} / requests in /{req=$1}
    /^non2xx=/{split($0,a,"="); bad=a[2]} /^sockerr=/{split($0,a,"="); se=a[2]}
    /^p50_us=/{split($0,a,"="); p50=a[2]/1000} /^p99_us=/{split($0,a,"="); p99=a[2]/1000}
    END{split(b0,x," "); split(b1,y," "); split(wt,w," ");
        busy=(y[1]-x[1])/100; px=(p1-p0)/100; st=(s1-s0)/100; up=(u1-u0)/100; wrk=w[1]+w[2];
        printf "%s\t%s\t%s\t%s\t%s\t%s\t%.3f\t%.3f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.1f\t%.1f\n",
          r, n, rps, req, bad, se, p50, p99, px, st, up, wrk, busy, busy-px-st-up-wrk, (y[2]-x[2])/100,
          req ? px*1e6/req : 0, req ? (px+st)*1e6/req : 0}' "$f.txt" | tee -a "$TSV"
}

start_upstream() {
  local conf; conf=$(nginx_conf nginx-upstream.conf "$TMPROOT/upstream")
  "$NGINX" -p "$TMPROOT/upstream" -c "$conf" -e "$TMPROOT/upstream/error.log" >"$OUT/upstream.log" 2>&1 &
  PIDS+=("$!"); UPSTREAM_MASTER=$!
  for _ in $(seq 100); do curl -fs -o /dev/null "http://127.0.0.1:$UP_PORT/" && break; sleep 0.05; done
  read -ra UPSTREAM_PIDS <<<"$(nginx_pids "$UPSTREAM_MASTER")"
}

run_nginx() { # round [passthrough]
  local conf pid name=nginx${2:+-$2}; conf=$(nginx_conf nginx-proxy.conf "$TMPROOT/nginx-r$1" "$NGINX_PORT")
  "$NGINX" -p "$TMPROOT/nginx-r$1" -c "$conf" -e "$TMPROOT/nginx-r$1/error.log" >"$OUT/r$1-nginx.log" 2>&1 &
  pid=$!; PIDS+=("$pid")
  if probe "r$1-$name" "http://127.0.0.1:$NGINX_PORT/payments"; then
    read -ra PROXY_PIDS <<<"$(nginx_pids "$pid")"; STORE_PIDS=()
    bench "$1" "$name" "http://127.0.0.1:$NGINX_PORT" /payments
  fi
  cat "$TMPROOT/nginx-r$1/error.log" >>"$OUT/r$1-nginx.log" 2>/dev/null
  stop "$pid"
}

# ipx round name [redis-mode]: idempotent-proxy-server reads a .env file in its working directory
# (it exits without one); the upstream is reached through the path /URL_UP (its only way to an
# http:// target; a X-Forwarded-Host target is always https). LOG=warn: it logs every request at
# info level by default, which the other candidates do not; this gives it its best case.
run_ipx() { # round name redis(no|always|default)
  local dir rdir rpid="" pid name=$2
  dir="$TMPROOT/$name-r$1"; mkdir -p "$dir"
  { echo "SERVER_ADDR=127.0.0.1:$IPX_PORT"
    echo "URL_UP=http://127.0.0.1:$UP_PORT/payments"
    echo "LOG=warn"
    [ "$3" != no ] && echo "REDIS_URL=redis://127.0.0.1:$REDIS_PORT"
  } >"$dir/.env"
  cp "$dir/.env" "$OUT/r$1-$name.env"
  STORE_PIDS=()
  if [ "$3" != no ]; then
    rdir="$dir/redis"; mkdir -p "$rdir"
    if [ "$3" = always ]; then
      "$REDIS" --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$rdir" --save '' --appendonly yes --appendfsync always >"$OUT/r$1-$name.redis.log" 2>&1 &
    else
      "$REDIS" --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$rdir" >"$OUT/r$1-$name.redis.log" 2>&1 &
    fi
    rpid=$!; PIDS+=("$rpid"); STORE_PIDS=("$rpid")
    for _ in $(seq 100); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
  fi
  (cd "$dir" && exec "$IPX") >"$OUT/r$1-$name.log" 2>&1 &
  pid=$!; PIDS+=("$pid"); PROXY_PIDS=("$pid")
  if probe "r$1-$name" "http://127.0.0.1:$IPX_PORT/URL_UP"; then
    bench "$1" "$name" "http://127.0.0.1:$IPX_PORT" /URL_UP
    if [ -n "$rpid" ]; then
      { redis-cli -p "$REDIS_PORT" info commandstats | grep -E 'cmdstat_(set|get|del)'
        redis-cli -p "$REDIS_PORT" info persistence | grep -E 'aof_enabled|rdb_changes|aof_rewrites'
        echo "dbsize=$(redis-cli -p "$REDIS_PORT" dbsize)"; } >"$OUT/r$1-$name.redis.info" 2>&1
    fi
  fi
  stop "$pid"; [ -n "$rpid" ] && stop "$rpid"
  rm -rf "$dir"
}

run_idemlog() { # round durability(sync|none) [passthrough|b]
  local dir pid name=idemlog-$2${3:+-$3} bin=$IDEMLOG_PROXY
  [ "${3:-}" = b ] && bin=$IDEMLOG_PROXY_B
  [ -n "$bin" ] || return 0
  dir="$TMPROOT/idemlog-r$1"; mkdir -p "$dir"
  "$bin" --upstream "http://127.0.0.1:$UP_PORT" --listen "127.0.0.1:$IDEMLOG_PORT" \
    --admin-listen "127.0.0.1:$IDEMLOG_ADMIN" --data-dir "$dir/data" --durability "$2" \
    --static-scope bench >"$OUT/r$1-$name.log" 2>&1 &
  pid=$!; PIDS+=("$pid"); PROXY_PIDS=("$pid"); STORE_PIDS=()
  if probe "r$1-$name" "http://127.0.0.1:$IDEMLOG_PORT/payments"; then
    bench "$1" "$name" "http://127.0.0.1:$IDEMLOG_PORT" /payments
    curl -s "http://127.0.0.1:$IDEMLOG_ADMIN/metrics" >"$OUT/r$1-$name.metrics" 2>&1
    du -sh "$dir/data" >>"$OUT/r$1-$name.log" 2>&1
  fi
  stop "$pid"
  rm -rf "$dir"
}

step() { # round candidate
  case $2 in
    nginx) run_nginx "$1" ;;
    ipx-mem) run_ipx "$1" ipx-mem no ;;
    ipx-redis-always) run_ipx "$1" ipx-redis-always always ;;
    ipx-redis-default) run_ipx "$1" ipx-redis-default default ;;
    idemlog-sync) run_idemlog "$1" sync ;;
    idemlog-none) run_idemlog "$1" none ;;
    idemlog-sync-b) run_idemlog "$1" sync b ;;
    idemlog-passthrough) run_idemlog "$1" none passthrough ;;
    nginx-passthrough) run_nginx "$1" passthrough ;;
    *) echo "unknown candidate $2" >&2 ;;
  esac
}

read -ra SEQ <<<"$CANDIDATES"
{ echo "date: $(date -Is)  host: $(nproc) cores, $(uname -r)  D=$D W=$W ROUNDS=$ROUNDS"
  echo "load: wrk -t2 -c64 -d$D -s newkeys.lua (warm-up $W with other keys first)"
  echo "candidates: $CANDIDATES"
  echo "wrk: $(wrk -v 2>&1 | head -1)"; echo "nginx: $("$NGINX" -v 2>&1)"; echo "redis: $("$REDIS" --version)"
  echo "idempotent-proxy-server: $IPX $(sha256sum "$IPX" 2>/dev/null | cut -c1-16)"
  [ -n "$IDEMLOG_PROXY" ] && echo "idemlog-proxy: $IDEMLOG_PROXY $(ls -l --time-style=+%FT%T "$IDEMLOG_PROXY" | awk '{print $6}') $(sha256sum "$IDEMLOG_PROXY" | cut -c1-16)"
  [ -n "$IDEMLOG_PROXY_B" ] && echo "idemlog-proxy B: $IDEMLOG_PROXY_B $(sha256sum "$IDEMLOG_PROXY_B" | cut -c1-16)"
  echo "niceness of the harness and everything it starts: $(nice); autogroup: $(cat /proc/self/autogroup 2>/dev/null)"
  echo "loadavg at start: $(cat /proc/loadavg)"
} >"$OUT/env.txt"
# The disk's state: fdatasync latency in the data directories' file system, before and after.
mkdir -p "$TMPROOT/fsync"
{ echo "fsync probe at start (benches/tools/fsync_probe.py in $TMPROOT):"; python3 "$HERE/../tools/fsync_probe.py" "$TMPROOT/fsync"; } >>"$OUT/env.txt" 2>&1
cp "$HERE"/nginx-*.conf "$HERE/newkeys.lua" "$OUT/" 2>/dev/null
start_upstream
echo "upstream pids: ${UPSTREAM_PIDS[*]}" >>"$OUT/env.txt"
for r in $(seq "$ROUNDS"); do
  if (( r % 2 == 1 )); then order=("${SEQ[@]}"); else order=(); for ((i=${#SEQ[@]}-1; i>=0; i--)); do order+=("${SEQ[i]}"); done; fi
  echo "== round $r: ${order[*]}" >&2
  for c in "${order[@]}"; do step "$r" "$c"; sleep 1; done
done
echo "loadavg at end: $(cat /proc/loadavg)" >>"$OUT/env.txt"
{ echo "fsync probe at end:"; python3 "$HERE/../tools/fsync_probe.py" "$TMPROOT/fsync"; } >>"$OUT/env.txt" 2>&1
python3 "$HERE/summarize.py" "$TSV" | tee "$OUT/summary.txt"
echo "results: $OUT"
