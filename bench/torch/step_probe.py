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
  ferry_bounce    immediate capture bounced (bounce_capture_max_bytes 16 KiB: every hook but the logits): a
                  device-to-device copy per hook into ferry's staging, one gather per K (ferry_bounce_k32: K=32)
  ferry_ring8     the same with an 8 MiB ring (ferry_ring1g: 1 GiB; --ring-mib sets the others'): does the
                  ring's footprint (its pages, written once per hook and by nothing else) change the kernel's cost?
  ferry_x2        ferry, each hook captured twice (two copy kernels back to back: the second one's code and
                  state are warm; x2 minus ferry is what a warm copy kernel costs)
  ferry_plain_x2  the same with plain launches (no programmatic overlap between the two)
  d2d_x2, elt_x2  d2d / elt with two torch kernels per hook
  staged          per hook ``stage[h].copy_(t)`` (torch's device copy into a static buffer of its own) and a
                  deferred capture of that buffer: one gather per K hooks (immediate capture's semantics
                  built from d2d and gather)
  bounce_k32      the same with publish_every 32
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
import faulthandler
import statistics
import sys

import torch

import ferry.hooks as fh
from qwen3bench.meta import device_name, header, log, write_json
from qwen3bench.model import Decoder, build_model
from qwen3bench.probe import Probe
from qwen3bench.timing import round_robin, timed_ms
from qwen3bench.trace import profile


def time_runs(args, dec, runs):
    """({contestant: median us per step}, {contestant: samples}): --reps rounds of --steps replays each
    (CUDA events around the replays)."""
    steps = args.steps

    def replays(replay):
        for _ in range(steps):
            replay()

    def replays_us(key):
        replay, slot, per_step = runs[key]
        dec.reset()
        torch.cuda.synchronize()
        paused = args.drain_during == "off" and slot is not None
        if paused:
            slot[1].pause()
        ms = timed_ms(lambda: replays(replay))
        if paused:
            slot[1].resume()
        if slot is not None:
            slot[2] += per_step * steps
            slot[1].wait(slot[2])
        return ms * 1e3 / steps

    times = round_robin(list(runs), args.reps, replays_us, "the replays")
    return {k: statistics.median(v) for k, v in times.items()}, times


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
    command = "python3 bench/torch/step_probe.py " + " ".join(argv if argv is not None else sys.argv[1:])
    result = {**header(device_name(True), command),
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
            med, all_times = time_runs(args, dec, runs)
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
                prof = profile(dec, runs)
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
    write_json(args.out, result, indent=1, newline=False)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
