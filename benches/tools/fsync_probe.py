# fdatasync latency on a disk: appending 140-byte records (the file grows, as an idemlog segment does)
# vs overwriting a preallocated, already-written file (size unchanged, as SQLite reuses its WAL),
# 2000 each. Usage: python3 benches/tools/fsync_probe.py DIR
import os, time, statistics, sys
d = sys.argv[1]
def run(path, prealloc):
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    if prealloc:
        os.write(fd, b"\0" * (1 << 20)); os.fdatasync(fd); os.lseek(fd, 0, 0)
    rec = b"x" * 140
    lat = []
    for i in range(2000):
        os.pwrite(fd, rec, i * 140)
        t = time.perf_counter(); os.fdatasync(fd); lat.append(time.perf_counter() - t)
    os.close(fd); os.unlink(path)
    lat.sort()
    return statistics.median(lat) * 1e6, lat[int(len(lat) * 0.99)] * 1e6
for name, pre in (("append (file grows)", False), ("overwrite (preallocated, written)", True)):
    p50, p99 = run(os.path.join(d, "probe.bin"), pre)
    print(f"{name}: fdatasync p50 {p50:.0f} us, p99 {p99:.0f} us")
