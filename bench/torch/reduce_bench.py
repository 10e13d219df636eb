#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Fewer bytes across the link (issue 41): GPU-side reducers against whole capture, and the writers' rates.

t256: DMI's vllm-full hooks on Qwen3-0.6B's shapes (hook_sizes: token ids, the embeddings, 12 points a layer of
2..6 KiB a token, the final residual and norm, the logits [V] bf16; 314 MB a step whole) at T = 256 tokens per step.
(Until session 30 it took bench/d2h's synthetic forward_sizes mix, 434 MB a step: 38% more than the issue's shapes.) The step is a calibrated sleep of --step-us (default:
the H200's t256 no-capture step, docs/perf/h200/select.json) then the captures, on a side stream; on CUDA it is
captured once into a torch.cuda.CUDAGraph and each replay is ch.plan(plan) + replay (host backend: eager).
Contestants, round-robin in one run, median of --reps rounds; a round is --steps back-to-back steps timed by CUDA
events on the step's stream (per step: the round / steps), so a contestant whose D2H outlasts its step shows the
sustained rate (the ring fills and the next plan() waits for the drain), not one step's GPU time:
  none            the step alone
  whole           every hook whole (capture_deferred: one gather per batch)
  topk64          the logits as capture_rows(reduce="topk(64)"), every other hook whole
  fp8_topk64      every bf16 hook as capture_rows_deferred(reduce="fp8_e4m3") (one launch per batch), the logits
                  as top-64, token ids whole
prefill_mean: a prefill of 16 requests x 512 tokens (--prefill-us, calibrated as the t256 step): each of its
layers writes its [8192, hidden] bf16 output (a copy, in both contestants: the tap is read right after it was
written, as in a forward), reduced to each request's mean (capture_rows(query_start_loc=, requests=,
window=(0, 512), reduce="mean")) against none, and beside them torch's own reduction of the same rows left on the
GPU (x.view(16, 512, hidden).sum(1, dtype=float32) a layer: torch_us, what a reduction kernel of the same bytes
costs in that step, not a capture).
After the timing, one checked step per contestant: every reduced entry against torch on the same tensors (topk:
a stable descending sort; fp8: torch's float8_e4m3fn cast with the recorded scale, bit for bit; mean: within
1e-2 relative of the float64 mean of bf16 values). Output (docs/perf/h200/reduce.json, the writers' blocks are
bench/sink's): {"device","commit","date","command","t256_topk64":{...},"t256_fp8_topk64":{...},"prefill_mean":{...}}

  python bench/torch/reduce_bench.py --out reduce.json                              # GPU
  python bench/torch/reduce_bench.py --device cpu --tiny --reps 1 --out /tmp/r.json   # smoke (host)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

import numpy as np
import torch

import ferry
from ferry import reduce as fr
from qwen3bench.meta import device_name, header, log, write_json
from qwen3bench.timing import timed_ms

KIB = 1024


def hook_sizes(layers, hidden, vocab):
    """Elements per token of DMI's vllm-full preset on Qwen3-0.6B's shapes (ferry.hooks: 12 points a layer plus 5;
    hidden 1024, 16 query and 8 key/value heads of 128, intermediate 3072): token ids (int32), the embeddings, each
    layer's points in LAYER_POINTS order, the final residual and norm (bf16), then the logits [vocab]. At 256 tokens
    whole capture is 314 MB a step (1.17 MiB a token, the logits 26% of it), the issue's figures. `hidden` scales
    every width (the --tiny shapes)."""
    from ferry.hooks import LAYER_POINTS

    per = {"q": 2 * hidden, "k": hidden, "v": hidden, "attn_out": 2 * hidden, "act_mul": 3 * hidden}
    layer = [per.get(name, hidden) for name, _, _ in LAYER_POINTS]
    return [1, hidden] + layer * layers + [hidden, hidden, vocab]


class Rig:
    def __init__(self, a):
        self.cuda = a.device == "cuda"
        dev = torch.device(a.device)
        g = torch.Generator(device="cpu").manual_seed(1)
        sizes = hook_sizes(a.t_layers, a.t_hidden, a.vocab)
        self.t = [torch.randint(0, a.vocab, (a.tokens, 1), generator=g, dtype=torch.int32).to(dev)]
        self.t += [torch.randn(a.tokens, w, generator=g).to(torch.bfloat16).to(dev) for w in sizes[1:]]
        self.rows = torch.arange(a.tokens, dtype=torch.int32, device=dev)
        self.ch = ferry.Channel(backend="cuda" if self.cuda else "host", ring_bytes=a.ring_mib << 20,
                                publish_every=4096, fifo_capacity=1 << 14, tuning={"size_slots": 1 << 14})
        self.stream = torch.cuda.Stream() if self.cuda else ferry.Stream(backend="host")
        self.step_us, self.keep, self.got = a.step_us, False, []
        self.drain_cpu_s = 0.0
        self.expected = self.delivered = 0  # entries of the steps run, and delivered (the checked step waits)
        self.cycles = cycles_for(a.step_us) if self.cuda else 0
        self._stop = threading.Event()
        self._drain = threading.Thread(target=self._drain_loop, daemon=True)
        self._drain.start()

    def _drain_loop(self):
        while not self._stop.is_set():
            self.drain_cpu_s = time.thread_time()  # the consumer's CPU time so far (per-kind deltas: t256)
            try:
                es = self.ch.poll(1024, timeout=0.05)
            except ferry.LogicError:  # closed, nothing left
                return
            for e in es:
                if self.keep:
                    self.got.append((e.hook, e.ok, np.array(e.numpy()).view(np.uint8).reshape(-1).copy()))
                e.release()
                self.delivered += 1

    def body(self, kind, s):
        """The step's captures on `s` (the sleep before them is the step's work)."""
        ch, last = self.ch, len(self.t) - 1
        for h, t in enumerate(self.t):
            red = None
            if kind in ("topk64", "fp8_topk64") and h == last:
                red = "topk(64)"
            elif kind == "fp8_topk64" and 0 < h < last:
                red = fr.FP8_E4M3
            if red == fr.FP8_E4M3:  # the bf16 hooks: one reduce_rows_publish per batch
                ch.capture_rows_deferred(h, t, rows=self.rows, stream=s, reduce=red)
            elif red:
                ch.capture_rows(h, t, rows=self.rows, stream=s, reduce=red)
            elif kind != "none":
                ch.capture_deferred(h, t, s)

    def step_fn(self, kind):
        """A callable running one step of `kind` (a CUDA graph replayed after its plan, or eager)."""
        s, n = self.stream, len(self.t) if kind != "none" else 0
        if not self.cuda:
            def eager():
                self.ch.begin_forward(s)
                self.body(kind, s)
                self.ch.end_forward(s)
                self.expected += n
            return eager
        s.wait_stream(torch.cuda.current_stream())
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s, capture_error_mode="thread_local"):
            self.ch.begin_forward(s)
            torch.cuda._sleep(self.cycles)
            self.body(kind, s)
            plan = self.ch.end_forward(s)

        def replay():
            with torch.cuda.stream(s):
                self.ch.plan(plan)
                g.replay()
            self.expected += n
        return replay

    def checked(self, kind, fn):
        """One step of `kind` with every entry kept: (entries checked, entries bad) against torch."""
        while self.delivered < self.expected:  # the timed steps' entries first
            self._stop.wait(0.01)
        self.got, self.keep = [], True
        fn()
        while self.delivered < self.expected:
            self._stop.wait(0.01)
        self.keep = False
        bad = 0
        for hook, ok, raw in self.got:
            x, last = self.t[hook], len(self.t) - 1
            spec = "topk(64)" if hook == last and kind != "whole" else (fr.FP8_E4M3 if kind == "fp8_topk64" and
                                                                         hook > 0 else None)
            bad += 0 if ok and check(raw, x, spec) else 1
        return len(self.got), bad

    def close(self):
        self.ch.close()
        self._stop.set()
        self._drain.join()


def cycles_for(us):
    """torch.cuda._sleep's cycles for `us` microseconds on this GPU (measured: its clock is not 1 GHz)."""
    torch.cuda._sleep(1 << 20)
    ms = timed_ms(lambda: torch.cuda._sleep(1 << 22))
    return int((1 << 22) * us / (ms * 1e3))


def profile(label, fn, steps=2):
    """The GPU kernels of `steps` steps of `fn` (torch.profiler): the 12 with the most device time, per step."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    dev = [(e.key, e.count, getattr(e, "device_time_total", 0.0)) for e in p.key_averages()]
    dev = sorted((x for x in dev if x[2] > 0), key=lambda x: -x[2])[:12]
    log(f"profile {label} (us per step over {steps} steps): "
        + "; ".join(f"{k[:70]} x{n / steps:g} {t / steps:.1f}" for k, n, t in dev))


def trace(path, fn, warm=6, steps=6):
    """A chrome trace (torch.profiler) of `steps` steps of `fn` after `warm` untraced ones, so that the ring and the
    drain are in their steady state: bench/device/probes/trace_timeline.py prints its copies and kernels."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    for _ in range(warm):
        fn()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    p.export_chrome_trace(path)
    log(f"trace: {path}")


def timed_round(fn, steps, host):
    """Microseconds per step of `steps` back-to-back calls of `fn` (one event pair around them)."""
    return timed_ms(lambda: [fn() for _ in range(steps)], host) * 1e3 / steps


def check(raw, x, spec):
    """Whether an entry's bytes are `x` whole (spec None) or torch's reduction of its rows."""
    xc = x.cpu()
    if spec is None:
        return raw.tobytes() == xc.contiguous().view(torch.uint8).numpy().tobytes()
    f = fr.decode(raw, spec, xc.shape[1])
    xf = xc.float()
    if spec == fr.FP8_E4M3:
        ref = (xf / torch.from_numpy(f["scale"]).unsqueeze(1)).to(torch.float8_e4m3fn).view(torch.uint8)
        amax = xf.abs().amax(dim=1)
        scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
        return np.array_equal(f["codes"], ref.numpy()) and np.array_equal(f["scale"], scale.numpy())
    ref = torch.sort(xf, dim=1, descending=True, stable=True)
    k = f["values"].shape[1]
    return np.array_equal(f["values"], ref.values[:, :k].numpy()) and \
        np.array_equal(f["indices"], ref.indices[:, :k].numpy())


def t256(a, out):
    rig = Rig(a)
    kinds = ["none", "whole", "topk64", "fp8_topk64"]
    fns = {k: rig.step_fn(k) for k in kinds}
    host = None if rig.cuda else rig.stream
    times = {k: [] for k in kinds}
    drain_us = {k: 0.0 for k in kinds}  # the Python consumer's CPU time per step (poll + release of each entry)
    for rep in range(a.reps + 1):  # round 0 warms up
        for k in kinds:
            c0 = rig.drain_cpu_s
            with torch.cuda.stream(rig.stream) if rig.cuda else _null():  # the events on the step's stream
                us = timed_round(fns[k], a.steps, host)
            if rep:
                times[k].append(us)
                drain_us[k] += (rig.drain_cpu_s - c0) * 1e6 / (a.reps * a.steps)
    med = {k: statistics.median(v) for k, v in times.items()}
    log("t256 consumer CPU per step (us): " + ", ".join(f"{k} {v:.0f}" for k, v in drain_us.items()))
    if a.profile and rig.cuda:
        for k in kinds:
            profile(f"t256 {k}", fns[k])
    if a.trace and rig.cuda:
        for k in ("whole", "topk64"):
            trace(f"{a.trace}_{k}.json", fns[k])
    checks = {k: rig.checked(k, fns[k]) for k in kinds[1:]}
    rig.close()
    log("t256 medians (us): " + ", ".join(f"{k} {v:.0f}" for k, v in med.items()) + f"; checks {checks}")
    for k in ("whole", "topk64", "fp8_topk64"):
        out["t256_" + k] = {"no_capture_us": med["none"], "ferry_us": med[k],
                            "overhead_pct": (med[k] / med["none"] - 1) * 100, "entries_checked": checks[k][0],
                            "entries_bad": checks[k][1], "spread_us": [min(times[k]), max(times[k])]}


def prefill_mean(a, out):
    dev = torch.device(a.device)
    cuda = a.device == "cuda"
    n_req, per, layers = a.requests, a.prompt, a.layers
    g = torch.Generator(device="cpu").manual_seed(2)
    made = [torch.randn(n_req * per, a.hidden, generator=g).to(torch.bfloat16).to(dev) for _ in range(layers)]
    xs = [torch.empty_like(x) for x in made]  # each layer's output, written by the step before its capture
    qsl = torch.arange(0, (n_req + 1) * per, per, dtype=torch.int32, device=dev)
    req = torch.arange(n_req, dtype=torch.int32, device=dev)
    ch = ferry.Channel(backend="cuda" if cuda else "host", ring_bytes=a.ring_mib << 20, publish_every=4096,
                       tuning={"size_slots": 1024, "programmatic_launch": not a.plain_launch})
    s = torch.cuda.Stream() if cuda else ferry.Stream(backend="host")
    got = []
    layer_cycles = cycles_for(a.prefill_us / layers) if cuda else 0

    def step(kind):
        def run():
            ctx = torch.cuda.stream(s) if cuda else _null()
            with ctx:
                ch.begin_forward(s)
                for h, x in enumerate(xs):
                    if cuda:
                        torch.cuda._sleep(layer_cycles)  # the layer's own work
                    x.copy_(made[h])  # its output
                    if kind == "torch":
                        x.view(n_req, per, -1).sum(1, dtype=torch.float32)
                    elif kind == "mean":
                        ch.capture_rows(h, x, query_start_loc=qsl, requests=req, window=(0, per), stream=s,
                                        reduce="mean")
                ch.end_forward(s)
        return run

    def drain():
        while True:
            es = ch.poll(4096, timeout=0.2)
            if not es:
                break
            for e in es:
                got.append((e.hook, e.ok, np.array(e.numpy()).view(np.uint8).reshape(-1).copy()))
                e.release()

    times = {"none": [], "mean": [], "torch": []}
    for rep in range(a.reps + 1):
        for k in times:
            with torch.cuda.stream(s) if cuda else _null():  # the events on the step's stream
                us = timed_round(step(k), a.steps, None if cuda else s)
            if rep:
                times[k].append(us)
            drain()
    if a.profile and cuda:
        for k in times:
            profile(f"prefill {k}", step(k))
            drain()
    ch.close()
    bad = 0
    for hook, ok, raw in got[-layers:]:
        f = fr.decode(raw, "mean", a.hidden)
        ref = xs[hook].double().cpu().reshape(n_req, per, -1).mean(1).numpy()
        bad += 0 if ok and np.allclose(f["mean"], ref, rtol=1e-2, atol=1e-3) and (f["count"] == per).all() else 1
    med = {k: statistics.median(v) for k, v in times.items()}
    out["prefill_mean"] = {"no_capture_us": med["none"], "ferry_us": med["mean"],
                           "overhead_pct": (med["mean"] / med["none"] - 1) * 100, "entries_checked": layers,
                           "entries_bad": bad, "spread_us": [min(times["mean"]), max(times["mean"])],
                           "torch_us": med["torch"], "torch_pct": (med["torch"] / med["none"] - 1) * 100}
    log(f"prefill_mean: {out['prefill_mean']}")


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="small shapes (tests): 8 tokens, 1 layer (17 hooks) of "
                    "width 16, vocab 512")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--steps", type=int, default=20, help="back-to-back steps per timed round")
    ap.add_argument("--step-us", type=float, default=3016.81, help="the t256 step without capture")
    ap.add_argument("--prefill-us", type=float, default=25000.0, help="the prefill step without capture")
    ap.add_argument("--ring-mib", type=int, default=1024)
    ap.add_argument("--parts", default="t256,prefill_mean")
    ap.add_argument("--plain-launch", action="store_true",
                    help="prefill_mean's channel with tuning programmatic_launch off (its kernels launched plainly)")
    ap.add_argument("--profile", action="store_true", help="then each contestant's kernels (torch.profiler), logged")
    ap.add_argument("--trace", help="then chrome traces of whole and topk64 (PREFIX_whole.json, PREFIX_topk64.json)")
    a = ap.parse_args(argv)
    a.tokens, a.t_layers, a.t_hidden, a.vocab = (8, 1, 16, 512) if a.tiny else (256, 28, 1024, 151936)
    a.requests, a.prompt, a.layers, a.hidden = (2, 8, 3, 64) if a.tiny else (16, 512, 28, 1024)
    if a.tiny:
        a.ring_mib, a.steps = min(a.ring_mib, 64), min(a.steps, 2)
    out = header(device_name(a.device == "cuda"), " ".join([sys.executable] + sys.argv))
    for part in a.parts.split(","):
        {"t256": t256, "prefill_mean": prefill_mean}[part](a, out)
        write_json(a.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
