"""Who used the CPU in a measurement window: `procsnap.py snap FILE` saves every process's
utime+stime (all threads, from /proc/<pid>/stat), `procsnap.py diff BEFORE AFTER` prints the
processes that used the most CPU between the two snapshots, summed by command name (a process
born in the window counts whole; one that ended in the window is not seen). Used by
run_proxy_bench.sh to say what the "foreign" CPU was (other helpers' compilers, kernel threads
doing a candidate's disk flushes, ...). Standard library only.
"""

import json
import os
import sys


def snap():
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                s = f.read()
        except OSError:
            continue
        comm = s[s.index("(") + 1 : s.rindex(")")]
        fields = s[s.rindex(")") + 2 :].split()
        # fields[0] is field 3 (state); utime and stime are fields 14 and 15; starttime is 22.
        out[pid] = [comm, int(fields[11]) + int(fields[12]), fields[19]]
    return out


if sys.argv[1] == "snap":
    with open(sys.argv[2], "w") as f:
        json.dump(snap(), f)
else:
    a = json.load(open(sys.argv[2]))
    b = json.load(open(sys.argv[3]))
    by = {}
    for pid, (comm, t, start) in b.items():
        t0 = a[pid][1] if pid in a and a[pid][2] == start else 0
        if t - t0 > 0:
            by[comm] = by.get(comm, 0) + t - t0
    top = sorted(by.items(), key=lambda x: -x[1])[:10]
    print("  ".join(f"{c}={j / 100:.2f}s" for c, j in top))
