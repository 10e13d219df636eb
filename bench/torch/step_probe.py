#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Where the capture cost of a graphed Qwen3-0.6B decode step goes (an investigation tool, not the benchmark).

The decode step of bench/torch/qwen3_capture.py captured into a torch.cuda.CUDAGraph, replayed --steps times
per timing (CUDA events around the replays, GPU time), contestants round-robin in one run, median of --reps:

  none            no capture
  none_b          no capture, a second graph captured separately (the spread between two captures of the same
                  step: where torch's allocator placed its activations)
  d2d             per hook ``buf[h].copy_(t)`` into a static device buffer: one torch copy kernel node per hook
                  (what one extra tiny kernel per hook costs in this graph)
  elt             per hook ``torch.mul(t, 1, out=buf[h])``: one of torch's own elementwise kernels per hook
  hold            no capture; the hooks only hold their tensors as deferred capture does (until every
                  --publish-every-th hook and the end of the step): what the longer lifetimes alone change in
                  the allocator's placement of the step's activations
  hold_k32        the same, held in batches of 32
  fork            no capture; every --publish-every-th hook forks a side stream running one tiny torch kernel,
                  joined back at the end of the step: the graph topology of ferry's branch releases without ferry
  empty           ferry's begin_forward/end_forward only, no hooks (the per-forward fixed cost)
  ferry           a copy kernel per hook, publish_every K, branch release, programmatic launch (the defaults)
  ferry_plain     the same, plain (non-programmatic) launches
  ferry_stream    the same, batch releases on the stream (branch_publish=False)
  ferry_end       the same, publish_every 4096 (one release per forward: the boundary's)
  ferry_k32       the same, publish_every 32
  ferry_v1        the same, copy_vecs_per_thread 1 (a 2 KiB entry: 128 threads of one 16-byte vector; default 2)
  ferry_v4        the same, copy_vecs_per_thread 4
  ferry_general   the same with lean_copy_kernel=False (the general copy kernel: pass loop, byte tail)
  ferry_staged    immediate capture staged (staged_capture_max_bytes 16 KiB: every hook but the logits): a
                  device-to-device copy per hook into ferry's staging, one gather per K (ferry_staged_k32: K=32)
  ferry_ring8     the same with an 8 MiB ring (ferry_ring1g: 1 GiB; --ring-mib sets the others'): does the
                  ring's footprint (its pages, written once per hook and by nothing else) change the kernel's cost?
  ferry_x2        ferry, each hook captured twice (two copy kernels back to back: the second one's code and
                  state are warm; x2 minus ferry is what a warm copy kernel costs)
  ferry_plain_x2  the same with plain launches (no programmatic overlap between the two)
  d2d_x2, elt_x2  d2d / elt with two torch kernels per hook
  staged          per hook ``stage[h].copy_(t)`` (torch's device copy into a static buffer of its own) and a
                  deferred capture of that buffer: one gather per K hooks (immediate capture's semantics
                  built from d2d and gather)
  staged_k32      the same with publish_every 32
  gather          deferred capture: one gather kernel per K hooks (the presets' choice)
  gather_plain    the same, plain launches
  gather_k32      the same with publish_every 32 (hidden-states: one gather per forward, which also does the
                  forward boundary's release)
  gather_ring8    gather with an 8 MiB ring
  gather_fused    the same as gather (K=16) with each batch's release fused into its gather's last block
                  (gather_branch_publish=False: no branch in the graph)

With --drain-during off the consumer threads are paused while a contestant is timed (its entries are drained
after the timing): whether the drain's D2H copies and polling slow the step.

With --pool shared (the default, as qwen3_capture.py and as vLLM and SGLang capture their graphs) every graph is
captured into one memory pool (torch.cuda.graph(pool=...)), so the contestants' activations land at the same
addresses as far as their allocations allow (each graph is replayed alone, from static inputs: sharing is
safe). With --pool own each capture has a pool of its own (where the allocator puts a graph's activations
moved a graph's step time by up to ~1.3%: docs/perf/journal.md).

With --profile, one replay of each contestant is traced with torch.profiler (CUPTI: the graph's kernels) and
summarized: span, kernel count and time, ferry's kernels and the idle time around them, and the time of the
other kernels (do they get slower?).

  python bench/torch/step_probe.py --out step_probe.json --profile      # H200, about 1-2 minutes
"""

from __future__ import annotations

import argparse
import collections
import datetime
import faulthandler
import json
import os
import statistics
import sys
import tempfile

import torch

import ferry
import ferry.hooks as fh

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qwen3_capture import Decoder, Drain, _git_commit, build_model, log  # noqa: E402

CHANNELS = {  # contestant -> (Channel kwargs, deferred)
    "ferry": (dict(), False),
    "ferry_plain": (dict(programmatic_launch=False), False),
    "ferry_stream": (dict(branch_publish=False), False),
    "ferry_end": (dict(publish_every=4096), False),
    "ferry_k32": (dict(publish_every=32), False),
    "ferry_v1": (dict(copy_vecs_per_thread=1), False),
    "ferry_v4": (dict(copy_vecs_per_thread=4), False),
    "ferry_general": (dict(lean_copy_kernel=False), False),
    "ferry_staged": (dict(staged_capture_max_bytes=16 << 10), False),
    "ferry_staged_k32": (dict(staged_capture_max_bytes=16 << 10, publish_every=32), False),
    "ferry_ring8": (dict(ring_bytes=8 << 20), False),
    "ferry_ring1g": (dict(ring_bytes=1 << 30), False),
    "gather": (dict(), True),
    "gather_ring8": (dict(ring_bytes=8 << 20), True),
    "gather_plain": (dict(programmatic_launch=False), True),
    "gather_k32": (dict(publish_every=32), True),
    "gather_fused": (dict(gather_branch_publish=False), True),
}


class Probe:
    def __init__(self, args, model, cfg, dec):
        self.args, self.model, self.cfg, self.dec = args, model, cfg, dec
        self.channels: dict[str, tuple] = {}  # config key -> (channel, drain, expected entries)
        self.only = set(args.only.split(",")) | {"none"} if args.only else None
        self.pool = None
        # Tensors a captured graph writes or reads that no Python object holds once the hooks are removed
        # (per-hook device buffers, staging buffers): a graph does not keep its tensors alive, and a buffer
        # freed to the caching allocator while a graph still writes it is reused by later allocations
        # (this made the vllm-full preset fault in an elementwise contestant's replay).
        self.keep: list = []

    def new_pool(self):
        """The graph memory pool of the next preset's captures (--pool shared), or None (own: one per graph)."""
        self.pool = torch.cuda.graph_pool_handle() if self.args.pool == "shared" else None

    def want(self, name):
        return self.only is None or name in self.only

    def channel(self, kw):
        key = tuple(sorted(kw.items()))
        if key not in self.channels:
            opts = dict(ring_bytes=self.args.ring_mib << 20, publish_every=self.args.publish_every,
                        fifo_capacity=1 << 16, timeout=30.0, backend="cuda")
            opts.update(kw)
            ch = ferry.Channel(0, **opts)
            d = Drain(ch)
            d.start()
            self.channels[key] = [ch, d, 0]
        return self.channels[key]

    def graph(self, body, warm=None, slot=None, per_step=0):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.dec.reset()
                (warm or body)()
                if slot is not None:
                    slot[2] += per_step
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        if slot is not None:
            slot[1].wait(slot[2])
        self.dec.reset()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool, capture_error_mode="thread_local"):
            body()
        torch.cuda.synchronize()
        return g

    def contestants(self, pts):
        dec, model = self.dec, self.model
        runs = {}
        g = self.graph(lambda: dec.step())
        runs["none"] = (lambda g=g: g.replay(), None, 0)
        if self.want("none_b"):
            gb = self.graph(lambda: dec.step())
            runs["none_b"] = (lambda g=gb: g.replay(), None, 0)

        def d2d(t, b):
            b.copy_(t)

        def elt(t, b):
            torch.mul(t, 1, out=b)

        for name, op, times in (("d2d", d2d, 1), ("elt", elt, 1), ("d2d_x2", d2d, 2), ("elt_x2", elt, 2)):
            if self.want(name):
                log(f"  capturing {name}")
                runs[name] = self.per_hook_run(pts, op, times=times)

        for name, k in (("hold", self.args.publish_every), ("hold_k32", 32)):
            if not self.want(name):
                continue
            held: list[torch.Tensor] = []

            def hold(h, t, held=held, k=k):
                held.append(t)
                if len(held) >= k:
                    held.clear()

            def body(held=held):
                dec.step()
                held.clear()

            with fh.install(model, pts, hold):
                g = self.graph(body)
            runs[name] = (lambda g=g: g.replay(), None, 0)

        if self.want("fork"):
            side = torch.cuda.Stream()
            tiny = torch.zeros(1, device=torch.device("cuda", 0))
            self.keep.append((side, tiny))
            state = {"n": 0, "open": False}
            k = self.args.publish_every

            def fork(h, t, state=state, side=side, tiny=tiny, k=k):
                state["n"] += 1
                if state["n"] % k == 0:
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        tiny.add_(1)
                    state["open"] = True

            def fork_body(state=state, side=side):
                state["n"] = 0
                dec.step()
                if state["open"]:
                    torch.cuda.current_stream().wait_stream(side)
                    state["open"] = False

            with fh.install(model, pts, fork):
                g = self.graph(fork_body)
            runs["fork"] = (lambda g=g: g.replay(), None, 0)
        if self.want("empty"):
            runs["empty"] = self.ferry_run(self.channel({}), 0)
        for name, (kw, deferred) in CHANNELS.items():
            if not self.want(name):
                continue
            slot = self.channel(kw)
            cap = fh.capture_fn(slot[0], None, use_ops="auto", device=torch.device("cuda", 0),
                                deferred=pts if deferred else False)
            log(f"  capturing {name}")
            with fh.install(model, pts, cap):
                runs[name] = self.ferry_run(slot, len(pts))
        for name, base in (("ferry_x2", "ferry"), ("ferry_plain_x2", "ferry_plain")):
            if not self.want(name):
                continue
            slot = self.channel(CHANNELS[base][0])
            cap = fh.capture_fn(slot[0], None, use_ops="auto", device=torch.device("cuda", 0))

            def twice(h, t, cap=cap):
                cap(h, t)
                cap(h, t)

            log(f"  capturing {name}")
            with fh.install(model, pts, twice):
                runs[name] = self.ferry_run(slot, 2 * len(pts))
        for name, k in (("staged", self.args.publish_every), ("staged_k32", 32)):
            if not self.want(name):
                continue
            slot = self.channel(dict(publish_every=k))
            cap = fh.capture_fn(slot[0], None, use_ops="auto", device=torch.device("cuda", 0), deferred=True)
            stage: dict[int, torch.Tensor] = {}
            self.keep.append(stage)

            def staged(h, t, cap=cap, stage=stage):
                b = buffer_for(stage, h, t)
                b.copy_(t.detach())
                cap(h, b)

            log(f"  capturing {name}")
            with fh.install(model, pts, staged):
                runs[name] = self.ferry_run(slot, len(pts))
        return runs

    def per_hook_run(self, pts, op, times=1):
        """A contestant whose hooks write each hooked tensor into a static device buffer of its own with
        ``op(t, buf)`` (one of torch's kernels per hook; ``times`` buffers and kernels per hook); the buffers
        come from one uncaptured step."""
        bufs: dict[tuple, torch.Tensor] = {}
        self.keep.append(bufs)

        def hook(h, t):
            for i in range(times):
                op(t.detach(), buffer_for(bufs, (h, i), t))

        with fh.install(self.model, pts, hook):
            self.dec.reset()
            self.dec.step()
            torch.cuda.synchronize()
            g = self.graph(lambda: self.dec.step())
        return (lambda g=g: g.replay(), None, 0)

    def ferry_run(self, slot, per_step):
        """A contestant replaying the decode step captured between the channel's begin_forward and end_forward
        (with whatever hooks are installed): (replay, slot, entries per step)."""
        ch, holder = slot[0], {}

        def body():
            s = torch.cuda.current_stream()
            ch.begin_forward(s)
            self.dec.step()
            holder["plan"] = ch.end_forward(s)

        g = self.graph(body, slot=slot, per_step=per_step)
        plan = holder["plan"]
        return (lambda: (ch.plan(plan), g.replay()), slot, per_step)

    def time_runs(self, runs):
        steps, reps = self.args.steps, self.args.reps
        times = {k: [] for k in runs}
        for rep in range(reps + 1):
            for key, (replay, slot, per_step) in runs.items():
                self.dec.reset()
                torch.cuda.synchronize()
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                paused = self.args.drain_during == "off" and slot is not None
                if paused:
                    slot[1].pause()
                e0.record()
                for _ in range(steps):
                    replay()
                e1.record()
                try:
                    e1.synchronize()
                except Exception:  # an asynchronous fault of these replays surfaces here: name the contestant
                    log(f"  FAILED in the replays of {key} (rep {rep})")
                    raise
                if paused:
                    slot[1].resume()
                if slot is not None:
                    slot[2] += per_step * steps
                    slot[1].wait(slot[2])
                if rep:
                    times[key].append(e0.elapsed_time(e1) * 1e3 / steps)
        return {k: statistics.median(v) for k, v in times.items()}, times

    def profile(self, runs):
        from torch.profiler import ProfilerActivity, profile

        out, traces = {}, {}
        for key, (replay, slot, per_step) in runs.items():
            self.dec.reset()
            replay()  # warm
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
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


def buffer_for(bufs, key, t):
    """The static device buffer ``bufs[key]`` shaped like ``t`` (allocated on first use, outside any capture)."""
    b = bufs.get(key)
    if b is None:
        b = bufs[key] = torch.empty_like(t)
    return b


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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--cache", type=int, default=512)
    ap.add_argument("--steps", type=int, default=64, help="replays per timing")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--presets", default="hidden-states,vllm-full")
    ap.add_argument("--ring-mib", type=int, default=128)
    ap.add_argument("--publish-every", type=int, default=16)
    ap.add_argument("--pool", choices=["own", "shared"], default="shared",
                    help="one graph memory pool per capture (own) or one for all (shared)")
    ap.add_argument("--drain-during", choices=["on", "off"], default="on",
                    help="off: the consumer threads are paused while a contestant is timed")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated contestants to keep (none is always kept)")
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true")
    args = ap.parse_args(argv)
    faulthandler.enable()  # a crash prints every thread's Python stack
    sys.setswitchinterval(2e-4)
    device = torch.device("cuda", 0)
    cfg, model = build_model(args, device)
    main_stream = torch.cuda.Stream()
    result = {"device": torch.cuda.get_device_name(0), "commit": os.environ.get("FERRY_COMMIT") or _git_commit(),
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "command": "python3 bench/torch/step_probe.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "batch": args.batch, "steps": args.steps, "reps": args.reps, "publish_every": args.publish_every,
              "pool": args.pool, "ring_mib": args.ring_mib, "drain_during": args.drain_during,
              "presets": {}}
    with torch.cuda.stream(main_stream):
        dec = Decoder(model, cfg, args.batch, args.cache, device, args.seed + args.batch)
        probe = Probe(args, model, cfg, dec)
        for preset in [p for p in args.presets.split(",") if p]:
            pts = fh.preset(model, preset)
            probe.new_pool()  # torch refuses a pool handle whose graphs were all destroyed
            runs = probe.contestants(pts)
            log(f"{preset}: timing {len(runs)} contestants")
            med, all_times = probe.time_runs(runs)
            base = med["none"]
            rows = {}
            for k, v in med.items():
                rows[k] = {"us_per_step": v, "delta_us": v - base, "delta_pct": 100.0 * (v - base) / base,
                           "delta_us_per_hook": (v - base) / len(pts), "samples": all_times[k]}
            log(f"{preset} ({len(pts)} hooks), B={args.batch}, median of {args.reps} x {args.steps} replays:")
            for k, r in rows.items():
                log(f"  {k:13s} {r['us_per_step']:9.1f} us/step  {r['delta_us']:+8.1f} us ({r['delta_pct']:+6.2f}%)"
                    f"  {r['delta_us_per_hook']:+6.2f} us/hook")
            entry = {"hooks": len(pts), "timing": rows}
            if args.profile:
                prof = probe.profile(runs)
                entry["profile"] = prof
                for k, p in prof.items():
                    log(f"  profile {k:13s} " + ", ".join(
                        f"{a} {b:.1f}" if isinstance(b, float) else f"{a} {b}" for a, b in p.items()
                        if a != "ferry_kernel_names") + f" {p.get('ferry_kernel_names', {})}")
            result["presets"][preset] = entry
        for ch, d, n in probe.channels.values():
            d.wait(n)
            d.stop()
            ch.close(timeout=30.0)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
