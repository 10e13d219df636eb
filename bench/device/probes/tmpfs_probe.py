#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""How tmpfs takes writes: one stream against several (device probe, issue 41).

The safetensors sink writes one shard at a time, one write in flight, and on tmpfs it holds the rate of one
dd stream. This probe asks whether anything beats one stream there: --gib GiB written per mode, --rounds rounds
with the modes rotated, GB/s from the open to the fsync's return (each file removed after). Modes:
  w1       one thread, one file, 16 MiB write()s from one 16 MiB buffer (the bench's dd: a cache-hot source)
  w1cold   the same from a 1 GiB source read in turn (a cold source, as the sink's staging)
  wfN      N threads, N files, each its share (N = --threads)
  wsN      N threads, one file, pwrite()s of disjoint 16 MiB pieces
  mmN      one file fallocate()d, mmap()ed, N threads each MADV_POPULATE_WRITE then memcpy their 16 MiB pieces
Every call goes through libc by ctypes (the GIL released). Prints one JSON line per (round, mode).

  python bench/device/probes/tmpfs_probe.py [--dir /dev/shm/ferry-probe] [--gib 2] [--rounds 3] [--threads 2 4]
"""

import argparse
import ctypes
import json
import os
import statistics
import threading
import time

libc = ctypes.CDLL(None, use_errno=True)
libc.pwrite.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long]
libc.pwrite.restype = ctypes.c_ssize_t
libc.memcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
libc.memcpy.restype = ctypes.c_void_p
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.mmap.restype = ctypes.c_void_p
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
MADV_POPULATE_WRITE = 23
PIECE = 16 << 20


def check(rc, what):
    if rc < 0 or rc is None:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")
    return rc


def source(nbytes):
    buf = (ctypes.c_uint64 * (nbytes // 8))()
    view = memoryview(buf).cast("B").cast("Q")
    x = 0x9E3779B97F4A7C15
    for i in range(0, nbytes // 8, 4096):  # a non-zero word every 32 KiB, the rest by a doubling copy
        view[i] = (x * (i + 1)) & 0xFFFFFFFFFFFFFFFF or 1
    raw = ctypes.addressof(buf)
    step = 32 << 10
    filled = step
    while filled < nbytes:  # pages touched before timing
        n = min(filled, nbytes - filled)
        libc.memcpy(raw + filled, raw, n)
        filled += n
    return buf, raw


def write_range(fd, src, src_bytes, begin, end, rotate):
    off = begin
    while off < end:
        n = min(PIECE, end - off)
        s = src + ((off % src_bytes) if rotate else 0)
        done = 0
        while done < n:
            done += check(libc.pwrite(fd, s + done, n - done, off + done), "pwrite")
        off += n


def run(mode, path, total, hot, cold, threads):
    t0 = time.perf_counter()
    files = []
    if mode.startswith("wf"):
        share = total // threads // PIECE * PIECE
        files = [f"{path}.{i}" for i in range(threads)]
        fds = [os.open(f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600) for f in files]
        work = [(fds[i], hot[1], PIECE, 0, share, False) for i in range(threads)]
        jobs = [threading.Thread(target=write_range, args=w) for w in work]
    else:
        files = [path]
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        fds = [fd]
        if mode in ("w1", "w1cold"):
            src = cold if mode == "w1cold" else hot
            jobs = [threading.Thread(target=write_range, args=(fd, src[1], src[2], 0, total, mode == "w1cold"))]
        elif mode.startswith("ws"):
            pieces = total // PIECE
            jobs = [threading.Thread(target=lambda i=i: [write_range(fd, hot[1], PIECE, p * PIECE, (p + 1) * PIECE, False)
                                                          for p in range(i, pieces, threads)]) for i in range(threads)]
        else:  # mmN
            check(libc.fallocate(fd, 0, 0, total), "fallocate")
            base = libc.mmap(None, total, 3, 1, fd, 0)  # PROT_READ|PROT_WRITE, MAP_SHARED
            check(-1 if base in (None, ctypes.c_void_p(-1).value) else 0, "mmap")

            def fill(i):
                for p in range(i, total // PIECE, threads):
                    check(libc.madvise(base + p * PIECE, PIECE, MADV_POPULATE_WRITE), "madvise")
                    libc.memcpy(base + p * PIECE, hot[1], PIECE)

            jobs = [threading.Thread(target=fill, args=(i,)) for i in range(threads)]
    for j in jobs:
        j.start()
    for j in jobs:
        j.join()
    if mode.startswith("mm"):
        libc.munmap(base, total)
    for fd in fds:
        os.fsync(fd)
    s = time.perf_counter() - t0
    for fd in fds:
        os.close(fd)
    for f in files:
        os.unlink(f)
    return total / s / 1e9


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default="/dev/shm/ferry-probe")
    p.add_argument("--gib", type=float, default=2.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, nargs="+", default=[2, 4])
    a = p.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    total = int(a.gib * (1 << 30)) // PIECE * PIECE
    hot_buf, hot_raw = source(PIECE)
    cold_bytes = 1 << 30
    cold_buf, cold_raw = source(cold_bytes)
    hot, cold = (hot_buf, hot_raw, PIECE), (cold_buf, cold_raw, cold_bytes)
    modes = [("w1", 1), ("w1cold", 1)] + [(f"{k}{n}", n) for n in a.threads for k in ("wf", "ws", "mm")]
    got = {m: [] for m, _ in modes}
    for r in range(a.rounds):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        for m, n in order:
            g = run(m, os.path.join(a.dir, "probe"), total, hot, cold, n)
            got[m].append(g)
            print(json.dumps({"round": r, "mode": m, "threads": n, "gib": a.gib, "gbps": round(g, 3)}), flush=True)
    for m, _ in modes:
        v = got[m]
        print(f"{m:8s} median {statistics.median(v):6.3f} GB/s  ({min(v):.3f}-{max(v):.3f})", flush=True)
    os.rmdir(a.dir)


if __name__ == "__main__":
    main()
