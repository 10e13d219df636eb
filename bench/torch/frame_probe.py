#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Diagnostic: where an eager forward's begin_forward / end_forward time goes on the Qwen3-0.6B-shaped decode
step (qwen3_eager's ``frame`` contestant). Times each call alone (wall and thread CPU us), back to back and
around a decode step, on channels with and without a sink, the stream given and resolved."""
from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import statistics
import sys
import time

import torch

import ferry
from qwen3bench.model import Decoder, build_model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n", type=int, default=200)
    args = ap.parse_args()
    dev = torch.device("cuda", 0)
    s = torch.cuda.Stream()
    torch.cuda.set_stream(s)
    cfg, model = build_model(args, dev)
    dec = Decoder(model, cfg, 1, 4, dev, args.seed + 1)
    d = "/dev/shm/ferry-frame-probe"
    shutil.rmtree(d, ignore_errors=True)
    sink = ferry.sinks.safetensors(d, {0: ferry.sinks.row_spec("h", torch.zeros(8, dtype=torch.bfloat16))})
    chans = {"sink": ferry.Channel(0, ring_bytes=64 << 20, publish_every=4096, backend="cuda", timeout=30.0,
                                   sink=sink, tuning={"drain_idle_sleep": 200e-6}),
             "nosink": ferry.Channel(0, ring_bytes=64 << 20, publish_every=4096, backend="cuda", timeout=30.0,
                                     tuning={"drain_idle_sleep": 200e-6})}
    pc, tt = time.perf_counter, time.thread_time
    out = {}

    def timed(fn):
        w0, c0 = pc(), tt()
        fn()
        return (pc() - w0) * 1e6, (tt() - c0) * 1e6

    for name, ch in chans.items():
        for sname, st in (("none", None), ("given", s)):
            for mode in ("loop", "step"):
                rec = {"begin": [], "end": [], "step": []}
                for i in range(args.n):
                    if mode == "step":
                        dec.reset()
                        torch.cuda.current_stream().synchronize()
                    rec["begin"].append(timed(lambda: ch.begin_forward(st)))
                    if mode == "step":
                        rec["step"].append(timed(dec.step))
                    rec["end"].append(timed(lambda: ch.end_forward(st)))
                    if mode == "loop" and i % 50 == 49:
                        torch.cuda.current_stream().synchronize()
                key = f"{name}/{sname}/{mode}"
                out[key] = {k: {"wall_us_median": statistics.median(x[0] for x in v),
                                "cpu_us_median": statistics.median(x[1] for x in v),
                                "wall_us_p90": sorted(x[0] for x in v)[int(0.9 * len(v))],
                                "wall_us_max": max(x[0] for x in v)} for k, v in rec.items() if v}
                print(key, json.dumps({k: [round(v["wall_us_median"], 1), round(v["cpu_us_median"], 1),
                                           round(v["wall_us_p90"], 1)] for k, v in out[key].items()}), flush=True)
    # the same pair with nothing but torch work between (no model): a tiny kernel between begin and end
    x = torch.zeros(16, device=dev)
    ch = chans["sink"]
    rec = {"begin": [], "end": []}
    for i in range(args.n):
        rec["begin"].append(timed(lambda: ch.begin_forward(None)))
        x.add_(1)
        rec["end"].append(timed(lambda: ch.end_forward(None)))
    out["sink/none/tiny"] = {k: {"wall_us_median": statistics.median(a[0] for a in v),
                                 "cpu_us_median": statistics.median(a[1] for a in v)} for k, v in rec.items()}
    print("sink/none/tiny", json.dumps(out["sink/none/tiny"]), flush=True)
    # in context: per hooked call of the hidden-states preset, the first call and a second call right after it
    # (cold vs warm), for ferry's deferred / immediate capture_fn and torch's pinned copy_
    import ferry.hooks as fh
    importlib.import_module("ferry.torch_ops")  # lends ferry._ferry the tensor reader
    print("tensor reader", bool(getattr(ferry._ferry, "_tensor_reader_bound", lambda: False)()), flush=True)
    ch = chans["nosink"]
    pts = fh.preset(model, "hidden-states")
    pinned = {}

    def tcopy(h, t):
        b = pinned.get(h)
        if b is None:
            b = pinned[h] = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        b.copy_(t, non_blocking=True)

    fns = {"deferred": ch.capture_fn(None, deferred=True), "immediate": ch.capture_fn(None, deferred=False),
           "torch": tcopy, "noop": lambda h, t: None}
    for name, fn in fns.items():
        first, second = [], []

        def hook(h, t):
            w0 = pc()
            fn(h, t)
            w1 = pc()
            fn(h, t)
            w2 = pc()
            first.append((w1 - w0) * 1e6)
            second.append((w2 - w1) * 1e6)

        with fh.install(model, pts, hook, via="forward"):
            for i in range(40):
                dec.reset()
                torch.cuda.current_stream().synchronize()
                ch.begin_forward(None)
                dec.step()
                ch.end_forward(None)
                torch.cuda.current_stream().synchronize()
                got = 0
                while got < (2 * len(pts) if name in ("deferred", "immediate") else 0):
                    es = ch.poll(256, 1.0)
                    got += len(es)
                    for e in es:
                        e.release()
        out[f"incontext/{name}"] = {"first_us_median": statistics.median(first),
                                    "second_us_median": statistics.median(second),
                                    "first_us_p90": sorted(first)[int(0.9 * len(first))], "calls": len(first)}
        print(f"incontext/{name}", json.dumps(out[f"incontext/{name}"]), flush=True)
    for ch in chans.values():
        ch.close(timeout=30.0)
    sink.close()
    shutil.rmtree(d, ignore_errors=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
