#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Pinned D2H bandwidth by the NUMA node that holds the host pages (device probe, issue 41).

reduce_bench's t256 copies ran at 34-42 GB/s while bench/sink's pinned memcpy reached 55 GB/s. This probe pins
a buffer while the thread runs on each node's CPUs (the pages land on that node: first touch), then times
--reps copies of --mib MiB from the GPU into it with CUDA events (median), alone and beside a sleep kernel on
another stream. Prints one JSON line per node, and the GPU's own node (sysfs).

  python bench/device/probes/pinned_numa.py [--mib 222] [--reps 10]
"""

import argparse
import glob
import json
import os
import statistics

import torch


def nodes():
    out = {}
    for d in sorted(glob.glob("/sys/devices/system/node/node[0-9]*")):
        cpus = set()
        for part in open(os.path.join(d, "cpulist")).read().strip().split(","):
            if part:
                lo, _, hi = part.partition("-")
                cpus.update(range(int(lo), int(hi or lo) + 1))
        if cpus:
            out[int(d.rsplit("node", 1)[1])] = cpus
    return out


def gpu_node():
    p = torch.cuda.get_device_properties(0)
    bus = f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
    try:
        return bus, int(open(f"/sys/bus/pci/devices/{bus}/numa_node").read())
    except OSError:
        return bus, None


def copy_gbps(dst, src, reps, busy):
    s = torch.cuda.Stream()
    other = torch.cuda.Stream()
    times = []
    for r in range(reps + 1):
        if busy:
            with torch.cuda.stream(other):
                torch.cuda._sleep(1 << 26)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(s):
            e0.record()
            dst.copy_(src, non_blocking=True)
            e1.record()
        e1.synchronize()
        if r:
            times.append(e0.elapsed_time(e1))
        torch.cuda.synchronize()
    return src.numel() / statistics.median(times) / 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=222)
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    bus, gnode = gpu_node()
    print(json.dumps({"gpu": torch.cuda.get_device_name(0), "pci": bus, "gpu_numa_node": gnode,
                      "nodes": {n: len(c) for n, c in nodes().items()}}), flush=True)
    src = torch.randint(1, 255, (a.mib << 20,), dtype=torch.uint8, device="cuda")
    every = set(range(os.cpu_count() or 1))
    for n, cpus in nodes().items():
        os.sched_setaffinity(0, cpus)
        dst = torch.empty(a.mib << 20, dtype=torch.uint8).pin_memory()
        os.sched_setaffinity(0, every)
        alone, busy = copy_gbps(dst, src, a.reps, False), copy_gbps(dst, src, a.reps, True)
        print(json.dumps({"host_node": n, "mib": a.mib, "alone_gbps": round(alone, 2),
                          "beside_kernel_gbps": round(busy, 2), "ok": bool(torch.equal(dst[:4096], src[:4096].cpu()))}),
              flush=True)
        del dst


if __name__ == "__main__":
    main()
