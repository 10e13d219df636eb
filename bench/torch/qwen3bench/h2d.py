# SPDX-License-Identifier: Apache-2.0
"""qwen3_capture's H2D side: vLLM-V1-like decode metadata at B=64 through ferry.Publisher vs per-tensor
gpu[:n].copy_(cpu[:n]) from pinned buffers, GPU span (events) from before the upload to after the first
consumer kernel, eager and graph."""

from __future__ import annotations

import statistics

import numpy as np
import torch

import ferry

from .meta import log

H2D_BATCH = 64
H2D_BLOCKS = 128  # block-table row length (2,048 tokens at block size 16)


def h2d_specs(cap):
    # name, dtype, per-row elements (1 = a vector), count for n requests
    return [("input_ids", torch.int32, 1, lambda n: n), ("positions", torch.int64, 1, lambda n: n),
            ("slot_mapping", torch.int64, 1, lambda n: n), ("seq_lens", torch.int32, 1, lambda n: n),
            ("query_start_loc", torch.int32, 1, lambda n: n + 1), ("block_table", torch.int32, H2D_BLOCKS, lambda n: n),
            ("temperature", torch.float32, 1, lambda n: n), ("top_p", torch.float32, 1, lambda n: n),
            ("top_k", torch.int32, 1, lambda n: n)]


def h2d_step(rig, args):
    """Median GPU span in us: {"eager": {"torch_copies_us", "ferry_us"}, "graph": {...}} (graph: CUDA only)."""
    dev, cuda = rig.device, rig.cuda
    cap, n = 256, H2D_BATCH
    specs = h2d_specs(cap)
    rng = np.random.default_rng(args.seed)
    steps = 8  # distinct metadata sets, cycled

    def shape(row, c):
        return (c,) if row == 1 else (c, row)

    data = []
    for i in range(steps):
        d = {}
        for name, dt, row, cnt in specs:
            k = cnt(n)
            arr = rng.integers(0, 1 << 20, size=shape(row, k)).astype(torch.empty(0, dtype=dt).numpy().dtype)
            d[name] = arr
        data.append(d)

    # torch: vLLM's CpuGpuBuffer (pinned cpu + gpu), per-tensor gpu[:k].copy_(cpu[:k], non_blocking=True)
    tcpu = {nm: torch.zeros(shape(row, cap + 1), dtype=dt, pin_memory=cuda) for nm, dt, row, _ in specs}
    tgpu = {nm: torch.zeros(shape(row, cap + 1), dtype=dt, device=dev) for nm, dt, row, _ in specs}
    # ferry: one group, destinations are torch tensors the consumer reads
    backend = "cuda" if cuda else "host"
    pub = ferry.Publisher(device=0, backend=backend)
    fgpu = {nm: torch.zeros(shape(row, cap + 1), dtype=dt, device=dev) for nm, dt, row, _ in specs}
    bufs = {}
    for nm, dt, row, _ in specs:
        np_dt = torch.empty(0, dtype=dt).numpy().dtype
        if row == 1:
            bufs[nm] = pub.declare(nm, ["step"], np_dt, cap + 1, dst=fgpu[nm])
        else:
            bufs[nm] = pub.declare(nm, ["step"], np_dt, cap + 1, unit="rows", row=row, dst=fgpu[nm])
    owner = rig.stream_arg()  # the publisher's owner stream: its graph uploads are captured on it
    pub.initialize(slots=2, stream=owner, upload=args.h2d_upload)
    sink = torch.zeros(n, dtype=torch.int32, device=dev)

    def fill_torch(i):
        for nm, _, _, cnt in specs:
            k = cnt(n)
            tcpu[nm][:k].numpy()[...] = data[i][nm]

    def upload_torch():
        for nm, _, _, cnt in specs:
            k = cnt(n)
            tgpu[nm][:k].copy_(tcpu[nm][:k], non_blocking=True)

    def consume(dst):
        sink.copy_(dst["input_ids"][:n])  # the first consumer kernel

    def fill_ferry(i, slot):
        with pub.producer("step") as p:
            for nm, _, _, cnt in specs:
                k = cnt(n)
                p.source(bufs[nm])[:k] = data[i][nm]
                p.set_count(bufs[nm], k)

    def check(dst, i, label):
        rig.sync()
        for nm, _, _, cnt in specs:
            k = cnt(n)
            got = dst[nm][:k].cpu().numpy()
            if not np.array_equal(got, data[i][nm]):
                raise RuntimeError(f"h2d {label}: {nm} differs from the source after step {i}")

    results = {}
    modes = ["eager"] + (["graph"] if cuda else [])
    for mode in modes:
        if mode == "graph":
            # torch: one graph of the copies + consumer; ferry: one per slot of capture_upload + consumer
            g_t = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g_t, capture_error_mode="thread_local"):
                upload_torch()
                consume(tgpu)
            g_f = []
            for slot in range(2):
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, stream=owner, capture_error_mode="thread_local"):
                    pub.capture_upload("step", slot, owner)  # capture_upload runs on the owner stream only
                    consume(fgpu)
                g_f.append(g)
            rig.sync()
        spans = {"torch": [], "ferry": []}
        it = 0
        for rep in range(args.h2d_reps + 1):
            for who in ("torch", "ferry"):
                for j in range(args.h2d_iters):
                    i, slot = it % steps, it % 2
                    it += 1
                    if who == "torch":
                        rig.sync()  # the pinned sources are reused: the previous upload must have read them
                        fill_torch(i)
                        fn = (lambda: g_t.replay()) if mode == "graph" else (lambda: (upload_torch(), consume(tgpu)))
                        us = rig.timed_ms(fn) * 1e3
                        if j == 0:
                            check(tgpu, i, f"{mode} torch")
                    else:
                        with pub.begin(slot):
                            fill_ferry(i, slot)
                            if mode == "graph":
                                pub.stage("step")
                                us = rig.timed_ms(lambda: g_f[slot].replay()) * 1e3
                            else:
                                us = rig.timed_ms(lambda: (pub.publish("step", rig.stream_arg()), consume(fgpu))) * 1e3
                        if j == 0:
                            check(fgpu, i, f"{mode} ferry")
                    if rep:
                        spans[who].append(us)
        results[mode] = {"torch_copies_us": statistics.median(spans["torch"]),
                         "ferry_us": statistics.median(spans["ferry"])}
        log(f"h2d {mode}: torch copies {results[mode]['torch_copies_us']:.1f} us, "
            f"ferry {results[mode]['ferry_us']:.1f} us (info {pub.info('step')})")
    return results
