"""Medians, spread and ratios from run_proxy_bench.sh's results.tsv (standard library only).

One line per round and candidate, then per candidate the median of the rounds with min-max, and
the ratios of idemlog-proxy's median req/s to every other candidate's median (and per round, from
the windows of the same round, which ran next to each other).
"""

import csv
import statistics
import sys

rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
order, by = [], {}
for r in rows:
    if r["system"] not in by:
        order.append(r["system"])
    by.setdefault(r["system"], []).append(r)


def col(system, name):
    return [float(r[name] or 0) for r in by[system]]


def med(system, name):
    return statistics.median(col(system, name))


print("per window (CPU seconds in the window: proxy / store / upstream / wrk / foreign / steal; busy total)")
print(f"{'round':>5} {'system':<18} {'req/s':>8} {'non2xx':>6} {'sockerr':>7} {'p50 ms':>7} {'p99 ms':>7}"
      f" {'proxy µs/req':>12} {'+store':>7}  cpu")
for r in rows:
    print(f"{r['round']:>5} {r['system']:<18} {float(r['req_s'] or 0):8.0f} {r['non2xx']:>6} {r['sockerr']:>7}"
          f" {float(r['p50_ms']):7.2f} {float(r['p99_ms']):7.2f} {float(r['proxy_us_req']):12.1f}"
          f" {float(r['proxy_store_us_req']):7.1f}  {r['proxy_cpu_s']}/{r['store_cpu_s']}/{r['upstream_cpu_s']}"
          f"/{r['wrk_cpu_s']}/{r['foreign_s']}/{r['steal_s']}; {r['busy_s']}")

print()
print("medians over the rounds (min-max of req/s)")
print(f"{'system':<18} {'req/s':>8} {'min-max':>15} {'p50 ms':>7} {'p99 ms':>7} {'proxy µs/req':>12}"
      f" {'+store':>7} {'foreign s':>9} {'steal s':>7} {'non2xx':>6}")
for s in order:
    rs = col(s, "req_s")
    bad = sum(int(r["non2xx"] or 0) + int(r["sockerr"] or 0) for r in by[s])
    print(f"{s:<18} {med(s, 'req_s'):8.0f} {min(rs):7.0f}-{max(rs):<7.0f} {med(s, 'p50_ms'):7.2f}"
          f" {med(s, 'p99_ms'):7.2f} {med(s, 'proxy_us_req'):12.1f} {med(s, 'proxy_store_us_req'):7.1f}"
          f" {med(s, 'foreign_s'):9.2f} {med(s, 'steal_s'):7.2f} {bad:6d}")

ours = "idemlog-sync"
if ours in by:
    print()
    print(f"{ours} / X: ratio of medians, and per round (same round's windows)")
    for s in order:
        if s == ours:
            continue
        ratio = med(ours, "req_s") / med(s, "req_s") if med(s, "req_s") else float("nan")
        mine = {r["round"]: float(r["req_s"] or 0) for r in by[ours]}
        per = []
        for r in by[s]:
            x = float(r["req_s"] or 0)
            if r["round"] in mine and x:
                per.append(f"r{r['round']} {mine[r['round']] / x:.2f}")
        cpu = med(ours, "proxy_us_req") / med(s, "proxy_us_req") if med(s, "proxy_us_req") else float("nan")
        print(f"  / {s:<18} req/s {ratio:5.2f}   ({', '.join(per)})   proxy CPU per request {cpu:5.2f}")
