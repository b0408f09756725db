#!/bin/bash
# usage: ab.sh pgbench | ab.sh BIN [schema]   -- prints req/s and postgres CPU µs per request (tree incl. exited children)
PGPID=$(head -1 /tmp/pgprof/data/postmaster.pid)
U=postgres://idemlog:idemlog-test-pw@127.0.0.1:20778/explain_db
D=${D:-8}
tree_jiffies() {
  cat /proc/[0-9]*/stat 2>/dev/null | awk -v roots="$*" '
    { pid=$1; rest=$0; sub(/^.*\) /, "", rest); split(rest, f, " ");
      pp[pid]=f[2]; t[pid]=f[12]+f[13]+f[14]+f[15] }
    END { n=split(roots, r, " "); for (i=1; i<=n; i++) if (r[i] in t) in_[r[i]]=1
          c=1; while (c) { c=0; for (p in pp) if (!(p in in_) && (pp[p] in in_)) { in_[p]=1; c=1 } }
          s=0; for (p in in_) s+=t[p]; print s }'
}
psql "$U" -qc "CHECKPOINT" 2>/dev/null
if [ "$1" = pgbench ]; then
  psql "$U" -qc "CREATE TABLE IF NOT EXISTS bench_keys (scope text NOT NULL, key text NOT NULL, created_at timestamptz NOT NULL, PRIMARY KEY (scope, key))"
  perf stat -x, -e instructions,cycles -o /tmp/pgprof/pstat.txt -p $(pgrep -d, postgres) -- sleep $((D+1)) & PS=$!
  p0=$(tree_jiffies $PGPID); l0=$(psql "$U" -Atc "select pg_current_wal_lsn()")
  /usr/lib/postgresql/15/bin/pgbench -n -M prepared -c 64 -j 2 -T $D -f /work/shared/peers/pg/pgbench_insert.sql -D prefix="p$RANDOM$RANDOM" -D n=0 -h 127.0.0.1 -p 20778 -U idemlog explain_db > /tmp/pgprof/pgb.txt 2>&1
  sleep 1; p1=$(tree_jiffies $PGPID); l1=$(psql "$U" -Atc "select pg_current_wal_lsn()")
  req=$(awk '/number of transactions actually processed/{print $NF}' /tmp/pgprof/pgb.txt)
  rps=$(awk '/^tps = /{print $3}' /tmp/pgprof/pgb.txt | tail -1)
else
  BIN=$1; SCHEMA=${2:-idemlog}
  psql "$U" -qc "DROP SCHEMA IF EXISTS $SCHEMA CASCADE" 2>/dev/null
  IDEMLOG_DATABASE_SCHEMA=$SCHEMA $BIN --listen 127.0.0.1:9555 --database-url "$U" --api-key sk_test_alpha=acct_a --gateway-latency 0s > /tmp/pgprof/srv.log 2>&1 & SP=$!
  sleep 1.5
  [ -n "$EXTRA" ] && psql "$U" -qc "${EXTRA//SCHEMA/$SCHEMA}"
  KEYPREFIX=w$RANDOM$RANDOM wrk -t2 -c64 -d2s -s /work/shared/peers/pg/newkeys_pg.lua http://127.0.0.1:9555 >/dev/null
  psql "$U" -qc "CHECKPOINT"
  [ -n "$PROF" ] && (sleep 2; perf record -F 999 -g -o /tmp/pgprof/perf.data -p $(pgrep -d, -f "postgres: idemlog explain_db") -- sleep 3 >/dev/null 2>&1) &
  perf stat -x, -e instructions,cycles -o /tmp/pgprof/pstat.txt -p $(pgrep -d, postgres) -- sleep $((D+1)) & PS=$!
  p0=$(tree_jiffies $PGPID); s0=$(tree_jiffies $SP); l0=$(psql "$U" -Atc "select pg_current_wal_lsn()")
  KEYPREFIX=m$RANDOM$RANDOM wrk -t2 -c64 -d${D}s -s /work/shared/peers/pg/newkeys_pg.lua http://127.0.0.1:9555 > /tmp/pgprof/wrk.txt
  sleep 1; p1=$(tree_jiffies $PGPID); s1=$(tree_jiffies $SP); l1=$(psql "$U" -Atc "select pg_current_wal_lsn()")
  curl -s -H "Authorization: Bearer sk_test_alpha" http://127.0.0.1:9555/metrics > /tmp/pgprof/metrics.txt
  kill $SP; wait $SP 2>/dev/null
  python3 - <<'PY'
import re
ones={}; cnt={}; s={}
for l in open('/tmp/pgprof/metrics.txt'):
    m=re.match(r'idemlog_pg_batch_calls_bucket\{statement="(\w+)",le="1(\.0)?"\} (\d+)',l)
    if m: ones[m.group(1)]=int(m.group(3))
    m=re.match(r'idemlog_pg_batch_calls_count\{statement="(\w+)"\} (\d+)',l)
    if m: cnt[m.group(1)]=int(m.group(2))
    m=re.match(r'idemlog_pg_batch_calls_sum\{statement="(\w+)"\} ([0-9.e+]+)',l)
    if m: s[m.group(1)]=float(m.group(2))
print(' '.join(f"{k}:{ones.get(k,0)}/{cnt[k]}stmts,{s.get(k,0)/max(cnt[k],1):.1f}calls" for k in cnt), end=' | ')
PY
  req=$(awk '/ requests in /{print $1}' /tmp/pgprof/wrk.txt); rps=$(awk '/^Requests\/sec/{print $2}' /tmp/pgprof/wrk.txt)
  echo -n "srv_us/req $(( (s1-s0)*10000/req )) non2xx=$(grep non2xx /tmp/pgprof/wrk.txt|cut -d= -f2) "
fi
wait $PS
ins=$(awk -F, '/instructions/{print $1}' /tmp/pgprof/pstat.txt); cyc=$(awk -F, '/cycles/{print $1}' /tmp/pgprof/pstat.txt)
echo -n "pg_kinstr/req $(( ins/req/1000 )) pg_kcyc/req $(( cyc/req/1000 )) "
wal=$(psql "$U" -Atc "select pg_wal_lsn_diff('$l1','$l0')")
echo "$1 req/s $rps pg_us/req $(( (p1-p0)*10000/req )) wal_B/req $(( ${wal%.*}/req ))"
