# SPDX-License-Identifier: Apache-2.0
"""Paired statistics of the interleaved benchmarks (qwen3_eager.py): each contestant's per-round overhead against
the same round's no-capture turn, its median, spread and a distribution-free confidence interval of the median,
and the instructions the main thread retires (perf_event_open, where the kernel lets this process count them)."""

from __future__ import annotations

import ctypes
import math
import os
import platform
import struct
from fractions import Fraction


def quantile(v, q):
    """The q-quantile of v (linear interpolation between order statistics)."""
    s = sorted(v)
    if not s:
        return None
    x = q * (len(s) - 1)
    lo = math.floor(x)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (x - lo)


def median_ci(v, conf=0.95):
    """A distribution-free confidence interval of the median of v: the order statistics (x_(k), x_(n+1-k)) with
    the largest k such that P(Binomial(n, 1/2) < k) <= (1 - conf) / 2 (at least conf coverage for any continuous
    distribution; None below 6 values, where no such pair reaches 95%)."""
    n = len(v)
    s = sorted(v)
    # exact: binomial counts over 2^n as integers (a float 2.0 ** n overflows past n = 1023 pooled rounds)
    tail, total, cum, c, k = Fraction((1.0 - conf) / 2.0), 1 << n, 0, 1, 0
    for j in range(n + 1):
        if Fraction(cum + c, total) > tail:
            break
        cum += c
        c = c * (n - j) // (j + 1)  # C(n, j + 1)
        k = j + 1  # P(B < k) = P(B <= j) <= tail
    if k < 1:
        return None
    return [s[k - 1], s[n - k]]


def pct(x, base):
    return (x / base - 1.0) * 100.0


def paired(values, base):
    """Per-round paired overheads (%) of `values` against `base` (same rounds, same order), and their summary:
    median, ci95 (median_ci), p10, p90, min, max."""
    ov = [pct(x, b) for x, b in zip(values, base)]
    return ov, summary(ov)


def summary(v):
    if not v:
        return {}
    return {"median": quantile(v, 0.5), "ci95": median_ci(v), "p10": quantile(v, 0.1), "p90": quantile(v, 0.9),
            "min": min(v), "max": max(v)}


def difference(a, b):
    """Per-round differences a - b (percentage points of the same round's no-capture step) and their summary;
    ``decided``: the ci95 excludes 0 (which way: the sign of the median)."""
    d = [x - y for x, y in zip(a, b)]
    s = summary(d)
    ci = s.get("ci95")
    s["decided"] = bool(ci) and (ci[0] > 0 or ci[1] < 0)
    return s


# The paired differences the eager targets use (a - b, percentage points): ferry (immediate) vs torch's copies,
# deferred vs immediate (per-hook deferred and the Collector's batched hand-over), and the capture's cost above the
# no-op hook layer.
PAIRS = (("ferry", "torch"), ("deferred", "ferry"), ("deferred", "torch"), ("ferry", "hooks"), ("collect", "ferry"),
         ("collect", "deferred"), ("collect", "torch"), ("collect", "hooks"))


def pair_differences(rounds):
    """{"<a>_minus_<b>_pp": difference(...)} for each of PAIRS whose two kinds `rounds` ({kind: per-round
    overheads}) holds."""
    return {f"{a}_minus_{b}_pp": difference(rounds[a], rounds[b]) for a, b in PAIRS if a in rounds and b in rounds}


class Instructions:
    """User-space instructions retired by the calling thread (perf_event_open, PERF_COUNT_HW_INSTRUCTIONS,
    exclude_kernel): a count the machine's speed does not change. ``ok`` is False (and read() returns 0) where
    the kernel does not allow it (perf_event_paranoid, a VM without a PMU, seccomp): the benchmark then reports
    no instruction figures."""

    _NR = {"x86_64": 298, "aarch64": 241}

    def __init__(self):
        self.fd = -1
        nr = self._NR.get(platform.machine())
        if nr is None or os.environ.get("FERRY_BENCH_NO_PERF"):
            return
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.syscall.restype = ctypes.c_long
            attr = bytearray(112)  # struct perf_event_attr, PERF_ATTR_SIZE_VER5
            struct.pack_into("IIQ", attr, 0, 0, 112, 1)  # PERF_TYPE_HARDWARE, size, PERF_COUNT_HW_INSTRUCTIONS
            struct.pack_into("Q", attr, 40, (1 << 5) | (1 << 6))  # exclude_kernel, exclude_hv (enabled)
            buf = ctypes.create_string_buffer(bytes(attr), len(attr))
            fd = libc.syscall(ctypes.c_long(nr), buf, ctypes.c_int(0), ctypes.c_int(-1), ctypes.c_int(-1),
                              ctypes.c_ulong(0))
            if fd >= 0:
                os.read(fd, 8)
                self.fd = int(fd)
        except (OSError, AttributeError, ValueError):
            self.fd = -1

    @property
    def ok(self):
        return self.fd >= 0

    def read(self):
        return struct.unpack("Q", os.read(self.fd, 8))[0] if self.fd >= 0 else 0

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
