#!/usr/bin/env python3
# CPU of one write + fdatasync by the size written (1 KB to 64 KB), over a preallocated file as the
# engine's active segment is: is an fdatasync's cost per byte or per call? This process's CPU
# (user + system) per cycle, and its voluntary context switches. Usage: python3 fdatasync_size.py [DIR]
import os, sys, time, resource
d = sys.argv[1] if len(sys.argv) > 1 else '.'
path = os.path.join(d, 'fsync-size-probe.bin')
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.pwrite(fd, b'\0' * (8 << 20), 0); os.fsync(fd)
for size in (1000, 5000, 20000, 64000):
    buf = b'x' * size; off = 0; n = 2000
    r0 = resource.getrusage(resource.RUSAGE_SELF); t0 = time.time()
    for i in range(n):
        os.pwrite(fd, buf, off); os.fdatasync(fd); off += size
        if off + size > (8 << 20): off = 0
    r1 = resource.getrusage(resource.RUSAGE_SELF); t1 = time.time()
    cpu = (r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) / n * 1e6
    print(f"{size:6d} B: wall {(t1-t0)/n*1e6:6.1f} us, cpu {cpu:5.1f} us per write+fdatasync, "
          f"voluntary context switches {(r1.ru_nvcsw-r0.ru_nvcsw)/n:.2f}")
os.close(fd); os.unlink(path)
