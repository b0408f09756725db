#!/bin/bash
# usage: ideal.sh B  -- pgbench with ideal.sql, B requests (4 rows each) per transaction; PG CPU per request
PGPID=$(head -1 /tmp/pgprof/data/postmaster.pid)
U=postgres://idemlog:x@127.0.0.1:20778/explain_db
B=$1; D=${D:-8}
tree_jiffies() {
  cat /proc/[0-9]*/stat 2>/dev/null | awk -v roots="$*" '
    { pid=$1; rest=$0; sub(/^.*\) /, "", rest); split(rest, f, " ");
      pp[pid]=f[2]; t[pid]=f[12]+f[13]+f[14]+f[15] }
    END { n=split(roots, r, " "); for (i=1; i<=n; i++) if (r[i] in t) in_[r[i]]=1
          c=1; while (c) { c=0; for (p in pp) if (!(p in in_) && (pp[p] in in_)) { in_[p]=1; c=1 } }
          s=0; for (p in in_) s+=t[p]; print s }'
}
psql "$U" -qc "CHECKPOINT"
p0=$(tree_jiffies $PGPID)
/usr/lib/postgresql/15/bin/pgbench -n -M prepared -c ${C:-64} -j 2 -T $D -f /tmp/pgprof/ideal.sql -D prefix="'i$RANDOM$RANDOM'" -D n=0 -D b=$B -h 127.0.0.1 -p 20778 -U idemlog explain_db > /tmp/pgprof/ideal.txt 2>&1
sleep 1; p1=$(tree_jiffies $PGPID)
tx=$(awk '/number of transactions actually processed/{print $NF}' /tmp/pgprof/ideal.txt)
echo "ideal b=$B tx $tx requests/s $(( tx*B/D )) pg_us/req $(( (p1-p0)*10000/(tx*B) ))"
