# SPDX-License-Identifier: Apache-2.0
"""The round-robin timing loop: every contestant timed once per round, in one process, so that slow drifts of
the machine (clocks, temperature, other tenants) fall on all contestants alike."""

from __future__ import annotations

import os
import time

from .meta import log


def timed_ms(fn, host_stream=None):
    """Milliseconds of ``fn()``: CUDA events around it on torch's current stream (GPU time), or, with a host
    backend ``ferry.Stream``, wall time until that stream has finished."""
    if host_stream is None:
        import torch

        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        return e0.elapsed_time(e1)
    t = time.perf_counter()
    fn()
    host_stream.synchronize()
    return (time.perf_counter() - t) * 1e3


def round_robin(keys, reps, timed_one, what, after_round=None):
    """{key: [reps samples]}: ``reps + 1`` rounds of ``timed_one(key)`` over ``keys`` in order; round 0 is a
    warm-up, not recorded. ``after_round(rep, times)`` after each recorded round. A failure (an asynchronous
    fault surfaces in the timing's synchronize) is logged with the contestant's name and ``what``."""
    times = {k: [] for k in keys}
    for rep in range(reps + 1):
        for key in keys:
            try:
                v = timed_one(key)
            except Exception:
                log(f"  FAILED in {what} of {key} (rep {rep})")
                raise
            if rep:
                times[key].append(v)
        if rep and after_round is not None:
            after_round(rep, times)
    return times


def write_rate(path: str, nbytes: int, *, direct: bool = False) -> float:
    """The sequential write rate of the medium under `path` (GB/s): `nbytes` in 64 MiB writes of random bytes, then
    fsync (the medium a sink's rate is compared with, measured in the same run). `direct`: O_DIRECT writes from a
    page-aligned buffer, as dd oflag=direct does (0.0 where the medium refuses O_DIRECT, e.g. tmpfs); else buffered
    writes through the page cache."""
    import mmap
    import numpy as np
    os.makedirs(path, exist_ok=True)
    f = os.path.join(path, "ferry-medium-probe.bin")
    buf = mmap.mmap(-1, 64 << 20)  # page-aligned, as O_DIRECT needs
    buf.write(np.random.default_rng(1).integers(1, 255, 64 << 20, dtype=np.uint8).tobytes())
    n = max(1, nbytes // len(buf))
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (getattr(os, "O_DIRECT", 0) if direct else 0)
    try:
        fd = os.open(f, flags, 0o644)
    except OSError:
        if not direct:
            raise
        return 0.0
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            view = memoryview(buf)
            while view:
                view = view[os.write(fd, view):]
            view.release()
        os.fsync(fd)
        dt = time.perf_counter() - t0
    except OSError:
        if not direct:
            raise
        return 0.0
    finally:
        os.close(fd)
        os.unlink(f)
        buf.close()
    return n * (64 << 20) / dt / 1e9
