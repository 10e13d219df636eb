# SPDX-License-Identifier: Apache-2.0
"""step_probe's --profile: one replay of each contestant traced with torch.profiler (CUPTI: the graph's
kernels) and summarized: span, kernel count and time, ferry's kernels and the idle time around them, and the
time of the other kernels (do they get slower?)."""

from __future__ import annotations

import collections
import json
import os
import statistics
import tempfile

import torch
from torch.profiler import ProfilerActivity
from torch.profiler import profile as torch_profile


def profile(dec, runs):
    """{contestant: summary}: one replay of each contestant (after a warm one) traced with torch.profiler
    (CUPTI: the graph's kernels), summarized (summarize) and compared with the no-capture replay's kernels
    (extra_kernels)."""
    out, traces = {}, {}
    for key, (replay, slot, per_step) in runs.items():
        dec.reset()
        replay()  # warm
        torch.cuda.synchronize()
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            replay()
            torch.cuda.synchronize()
        if slot is not None:
            slot[2] += per_step * 2
            slot[1].wait(slot[2])
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            path = f.name
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
        os.unlink(path)
        ks = sorted((e for e in trace.get("traceEvents", []) if e.get("cat") == "kernel"), key=lambda e: e["ts"])
        out[key] = summarize(ks)
        traces[key] = ks
    base = traces.get("none", [])
    for key, ks in traces.items():
        out[key].update(extra_kernels(ks, base))
    return out


def extra_kernels(ks, base):
    """The kernels of trace ``ks`` beyond those of the no-capture trace ``base`` (by name, counted): whatever
    the hooks added (ferry's kernels, or torch's own for d2d and elt), their time and the idle gap before each."""
    left = collections.Counter(k["name"] for k in base)
    extra, gaps, prev_end = [], [], None
    for k in ks:
        if left[k["name"]] > 0:
            left[k["name"]] -= 1
        else:
            extra.append(k)
            if prev_end is not None:
                gaps.append(k["ts"] - prev_end)
        prev_end = k["ts"] + k["dur"] if prev_end is None else max(prev_end, k["ts"] + k["dur"])
    durs = [k["dur"] for k in extra]
    return {"extra_kernels": len(extra), "extra_kernel_us": sum(durs),
            "extra_kernel_median_us": statistics.median(durs) if durs else 0,
            "idle_before_extra_median_us": statistics.median(gaps) if gaps else 0}


def is_ferry(name: str) -> bool:
    return "ferry" in name or "d2h_" in name


def summarize(ks):
    if not ks:
        return {"kernels": 0}
    span = ks[-1]["ts"] + ks[-1]["dur"] - ks[0]["ts"]
    fer = [k for k in ks if is_ferry(k["name"])]
    other = [k for k in ks if not is_ferry(k["name"])]
    # idle before each ferry kernel: from the end of the latest kernel that ended before it started
    idle_before, idle_after = [], []
    for i, k in enumerate(ks):
        if not is_ferry(k["name"]):
            continue
        prev_end = max((p["ts"] + p["dur"] for p in ks[:i] if p["ts"] + p["dur"] <= k["ts"] + k["dur"]),
                       default=None)
        if prev_end is not None:
            idle_before.append(k["ts"] - prev_end)
        nxt = next((n for n in ks[i + 1:] if not is_ferry(n["name"])), None)
        if nxt is not None:
            idle_after.append(nxt["ts"] - (k["ts"] + k["dur"]))
    names = {}
    for k in fer:
        names[k["name"][:60]] = names.get(k["name"][:60], 0) + 1
    busy = sum(k["dur"] for k in ks)
    return {
        "span_us": span, "kernels": len(ks), "kernel_us": busy, "other_kernels": len(other),
        "other_kernel_us": sum(k["dur"] for k in other), "ferry_kernels": len(fer),
        "ferry_kernel_us": sum(k["dur"] for k in fer),
        "ferry_kernel_median_us": statistics.median([k["dur"] for k in fer]) if fer else 0,
        "idle_before_ferry_median_us": statistics.median(idle_before) if idle_before else 0,
        "idle_after_ferry_median_us": statistics.median(idle_after) if idle_after else 0,
        "ferry_kernel_names": names,
    }
