#!/bin/bash
# Per-statement database cost (pg_stat_statements must be in shared_preload_libraries, the extension
# created in schema public): a server binary on a fresh schema, optional SQL run once the schema
# exists (e.g. a fillfactor or a dropped index), wrk -t2 -c64 new keys; prints req/s, CPU per
# request, and per statement: calls, rows, exec µs per row, WAL records and bytes per row.
# usage: statements_step.sh BIN "SQL"
BIN=$1; EXTRA=$2
U=postgres://idemlog:idemlog-test-pw@127.0.0.1:20778/explain_db
psql "$U" -q -c "DROP SCHEMA IF EXISTS idemlog CASCADE" 2>/dev/null
$BIN --listen 127.0.0.1:9555 --database-url "$U" --api-key sk_test_alpha=acct_a --gateway-latency 0s > /tmp/ss-srv.log 2>&1 & SP=$!
sleep 1.5
[ -n "$EXTRA" ] && psql "$U" -q -c "$EXTRA"
KEYPREFIX=ss$RANDOM wrk -t2 -c64 -d3s -s /work/shared/peers/pg/newkeys_pg.lua http://127.0.0.1:9555 >/dev/null
psql "$U" -q -c "select public.pg_stat_statements_reset()" >/dev/null
python3 "$(dirname "$0")/proc_cpu.py" save /tmp/t0.json
KEYPREFIX=st$RANDOM wrk -t2 -c64 -d6s -s /work/shared/peers/pg/newkeys_pg.lua http://127.0.0.1:9555 > /tmp/ss-wrk.txt
python3 - $SP <<'PY'
import json,os,sys,re
sp=sys.argv[1]
a=json.load(open('/tmp/t0.json'))
pg=srv=0
for p in os.listdir('/proc'):
    if not p.isdigit(): continue
    try:
        st=open(f'/proc/{p}/stat').read(); cmd=open(f'/proc/{p}/cmdline').read()
    except Exception: continue
    f=st[st.rindex(')')+2:].split(); t=int(f[11])+int(f[12]); d=t-a.get(p,[0])[0]
    if 'postgres' in cmd and d>0: pg+=d
    if p==sp: srv+=d
w=open('/tmp/ss-wrk.txt').read()
req=int(re.search(r'(\d+) requests in',w).group(1)); rps=float(re.search(r'Requests/sec:\s+([0-9.]+)',w).group(1))
print(f"req/s {rps:.0f} pg us/req {pg*1e4/req:.1f} srv us/req {srv*1e4/req:.1f}")
PY
psql "$U" -At -F' ' -c "select calls, rows, round((total_exec_time*1000/rows)::numeric,1) us_per_row, round(wal_records::numeric/rows,2) walrec_per_row, wal_bytes/rows, left(regexp_replace(query, '\s+', ' ', 'g'), 40) q from public.pg_stat_statements where dbid = (select oid from pg_database where datname='explain_db') and rows > 0 order by total_exec_time desc limit 4"
psql "$U" -At -c "select n_tup_upd, n_tup_hot_upd from pg_stat_user_tables where relname='keys' and schemaname='idemlog'"
kill $SP; wait $SP 2>/dev/null
