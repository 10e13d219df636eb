#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The GPU timeline of a torch.profiler chrome trace (reduce_bench.py --trace): every kernel and copy, in start
order, with its stream, start (us from the first), duration and bytes; the host's graph launches and D2H
enqueues with their threads; then per stream the busy time and each copy's rate.

  python bench/device/probes/trace_timeline.py TRACE.json [--limit 400]
"""

import argparse
import collections
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--limit", type=int, default=400)
    a = ap.parse_args()
    ev = json.load(open(a.trace))["traceEvents"]
    gpu = [e for e in ev if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    host = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "cuda_runtime"
            and any(n in e.get("name", "") for n in ("MemcpyAsync", "GraphLaunch", "StreamWaitEvent"))]
    rows = [(e["ts"], "gpu", e) for e in gpu] + [(e["ts"], "host", e) for e in host]
    rows.sort(key=lambda r: r[0])
    if not rows:
        print("no events")
        return
    t0 = rows[0][0]
    busy = collections.defaultdict(float)
    for ts, side, e in rows[:a.limit]:
        args = e.get("args", {})
        if side == "gpu":
            nbytes = args.get("bytes", "")
            rate = f" {nbytes / e['dur'] / 1e3:.1f} GB/s" if nbytes and e["dur"] else ""
            print(f"{ts - t0:10.1f} +{e['dur']:8.1f}  s{args.get('stream', '?'):<4} {e['name'][:60]}"
                  f"{' ' + str(nbytes) + ' B' if nbytes else ''}{rate}")
        else:
            print(f"{ts - t0:10.1f} +{e['dur']:8.1f}  host t{e.get('tid', '?')} {e['name'][:40]}")
    for e in gpu:
        busy[(e.get("args", {}).get("stream", "?"), e.get("cat"))] += e["dur"]
    span = max(e["ts"] + e["dur"] for e in gpu) - min(e["ts"] for e in gpu)
    print(f"span {span:.1f} us; busy per stream: "
          + "; ".join(f"s{s} {c} {t:.1f}" for (s, c), t in sorted(busy.items(), key=lambda x: str(x))))


if __name__ == "__main__":
    main()
