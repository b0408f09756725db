#!/usr/bin/env python3
# fdatasync after appending 3 000 bytes to a growing file, against overwriting zeros written
# (and synced) beforehand: what the engine's preallocation (engine/src/log/writer.rs, PREALLOCATE) saves.
# Wall time and this process's CPU per fdatasync (the journal thread's CPU is not counted). Usage: python3 fdatasync_append.py
import os, time, resource
N=3000; CH=3000
def run(pre):
    p='/tmp/fst.bin'
    if os.path.exists(p): os.unlink(p)
    fd=os.open(p, os.O_CREAT|os.O_WRONLY)
    if pre:
        os.write(fd, b'\0'*(N*CH+4096)); os.fsync(fd); os.lseek(fd,0,0)
    buf=b'x'*CH
    t0=time.time(); r0=resource.getrusage(resource.RUSAGE_SELF)
    for i in range(N):
        os.write(fd, buf); os.fdatasync(fd)
    t1=time.time(); r1=resource.getrusage(resource.RUSAGE_SELF)
    os.close(fd)
    print(f"{'prealloc' if pre else 'append  '} {1e6*(t1-t0)/N:7.1f} us/fdatasync wall, cpu(sys) {1e6*((r1.ru_stime-r0.ru_stime)+(r1.ru_utime-r0.ru_utime))/N:6.1f} us")
for _ in range(2):
    run(False); run(True)
