#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Eager B=1 capture with a native sink running (issue 28): the Qwen3-0.6B-shaped model (transformers
Qwen3ForCausalLM, random bf16 weights, static KV cache), greedy decode at B=1 without a graph, where every step is
CPU-bound (Python and kernel launches). Per preset (hidden-states: 28 hooks, vllm-full: 341) the hooks capture
into a channel whose entries go to ferry's safetensors sink (shards on /dev/shm by default, written by C++
threads: no Python per entry), immediate (``ferry``) and deferred (``deferred``: a gather per batch), against
torch's per-hook ``pinned.copy_(t, non_blocking=True)`` (``torch``). Diagnostics: ``hooks`` (the same hooks
calling a no-op: the hook layer's own cost), ``pyconsumer`` / ``pybatch`` (immediate capture into a channel
drained by a Python thread with ``poll`` / ``poll_batch``: the consumer that takes the GIL from the decode loop).

Measured so that noise cannot decide it: the contestants interleaved round-robin (--rounds, plus a warm-up
round), each turn --tokens steps from the same start state; per step the wall time and the main thread's CPU time
(time.thread_time); medians over rounds, the spread of each contestant's per-round overhead against the same
round's no-capture turn. After the timed rounds, --check-steps steps per (preset, ferry kind) are captured into a
fresh shard run with a witness (a synchronous ``.cpu()`` of every hooked tensor at its hook) and every tensor read
back from the shards is compared bit-exact.

  python bench/torch/qwen3_eager.py --out eager_b1.json                                # H200 (about 4 minutes)
  python bench/torch/qwen3_eager.py --device cpu --tiny --layers 2 --tokens 3 --rounds 1 --out /tmp/e.json  # smoke
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys

import numpy as np
import torch

import ferry
import ferry.hooks as fh
from qwen3bench.eager import (OTHER_CORES, PyConsumer, Sinked, call_costs, deferred_points, make_contestants,
                              pin_main, pin_threads, sink_dir, timed_step)
from qwen3bench.meta import device_name, header, log, write_json
from qwen3bench.model import Decoder, build_model

PRESET_KEY = {"hidden-states": "hidden_states", "vllm-full": "vllm_full"}


def parse():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the JSON file (its eager_b1 block goes into sinks.json)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--tiny", action="store_true", help="hidden 64, vocab 512 (tests)")
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--tokens", type=int, default=32, help="decode steps per contestant turn")
    ap.add_argument("--rounds", type=int, default=12, help="timed rounds (after one warm-up round)")
    ap.add_argument("--presets", default="hidden-states,vllm-full")
    ap.add_argument("--capture", choices=["auto", "ops", "core"], default="auto")
    ap.add_argument("--ring-mib", type=int, default=64)
    ap.add_argument("--publish-every", type=int, default=4096)
    ap.add_argument("--shard-mib", type=int, default=256)
    ap.add_argument("--sink-dir", default=None, help="where the shard runs go (default /dev/shm)")
    ap.add_argument("--diagnostics", choices=["on", "off"], default="on")
    ap.add_argument("--check-steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bounce", type=int, default=16384,
                    help="the bounce contestant's bounce_capture_max_bytes (0: no bounce contestant)")
    ap.add_argument("--pin", choices=["on", "off"], default="on",
                    help="the decode loop on a core of its own, every other thread elsewhere (less noise)")
    ap.add_argument("--drain-idle-us", type=float, default=200.0,
                    help="the channels' drain_idle_sleep (every contestant runs beside the idle drain threads)")
    return ap.parse_args()


def pct(x, base):
    return (x / base - 1.0) * 100.0


def summary(turns, none):
    """One contestant's figures from its turns [(wall ms/step, cpu ms/step, [cpu ms of each step])]: the
    median step (main-thread CPU ms over every step of every turn, the figure the tables show), the median
    wall ms per step of its turns, and its overhead against no capture: the median over rounds of (its turn's
    median step / the same round's no-capture turn's median step - 1), with that per-round overhead's spread
    (min, p10, p90, max)."""
    steps = [x for _, _, s in turns for x in s]
    med = [statistics.median(s) for _, _, s in turns]
    none_med = [statistics.median(s) for _, _, s in none]
    ov = [pct(m, n) for m, n in zip(med, none_med)]
    ow = [pct(w, n[0]) for (w, _, _), n in zip(turns, none)]
    q = (lambda v: statistics.quantiles(v, n=10) if len(v) > 1 else [v[0]] * 9)
    return {"cpu_ms": statistics.median(steps), "wall_ms": statistics.median(w for w, _, _ in turns),
            "cpu_ms_p10": q(steps)[0], "cpu_ms_p90": q(steps)[8],
            "overhead_pct": statistics.median(ov), "wall_overhead_pct": statistics.median(ow),
            "overhead_pct_min": min(ov), "overhead_pct_max": max(ov), "overhead_pct_p10": q(ov)[0],
            "overhead_pct_p90": q(ov)[8], "turn_median_cpu_ms": med, "turn_wall_ms": [w for w, _, _ in turns]}


def check(args, model, dec, pts, preset, stream, use_ops):
    """(checked, bad): --check-steps steps per ferry kind into a fresh shard run, every tensor read back from
    the shards compared bit-exact with the witness (``.cpu()`` at the hook, beside the capture)."""
    checked = bad = 0
    kinds = [("ferry", False, 0), ("deferred", deferred_points(pts), 0)] + ([("bounce", False, args.bounce)]
                                                                           if args.bounce else [])
    for kind, deferred, bounce in kinds:
        sk = Sinked(args, model, dec, pts, sink_dir(args, f"{preset}-check-{kind}"), stream, bounce)
        cap = sk.capture_fn(deferred, use_ops)
        names = {p.id: p.name for p in pts}
        want = {}

        def witnessed(h, t, step=None):
            cap(h, t)
            want.setdefault(step[0], []).append((names[h], t.detach().to("cpu", copy=True).contiguous()))

        dec.reset()
        for step in range(args.check_steps):
            sk.ch.begin_forward(stream, tag=step)
            with fh.install(model, pts, lambda h, t, s=[step]: witnessed(h, t, s)):
                dec.step()
            sk.ch.end_forward(stream)
        sk.close()
        run = ferry.shards.open(sk.dir)
        got = {}
        for tag, name, a in run:
            got.setdefault(tag, {}).setdefault(name, []).append(a)
        for step, items in want.items():
            seen = {}
            for name, t in items:
                k = seen.get(name, 0)
                seen[name] = k + 1
                arrs = got.get(step, {}).get(name, [])
                ref = t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy()
                ok = k < len(arrs) and arrs[k].tobytes() == np.ascontiguousarray(ref).tobytes()
                checked += 1
                bad += not ok
        shutil.rmtree(sk.dir, ignore_errors=True)
    return checked, bad


def document(args, cuda, presets, stats, calls, checked, bad, sink_stats, rounds_done):
    """The JSON: eager_b1 (issue 28's block: medians per step), every contestant's figures, the verdict."""
    eager = {"rounds": rounds_done, "tokens_per_round": args.tokens, "measure": "main-thread CPU ms per step",
             "no_capture_ms": stats["none"]["cpu_ms"], "no_capture_wall_ms": stats["none"]["wall_ms"]}
    for p in presets:
        st = {x: stats[f"{x}:{p}"] for x in ("ferry", "deferred", "bounce", "torch", "hooks") if f"{x}:{p}" in stats}
        eager[PRESET_KEY.get(p, p)] = {
            "ferry_ms": st["ferry"]["cpu_ms"], "deferred_ms": st["deferred"]["cpu_ms"],
            "torch_copy_ms": st["torch"]["cpu_ms"], "hooks_only_ms": st["hooks"]["cpu_ms"],
            "bounce_ms": st["bounce"]["cpu_ms"] if "bounce" in st else None,
            "overhead_pct": {x: st[x]["overhead_pct"] for x in st},
            "spread_pct": {x: [st[x]["overhead_pct_p10"], st[x]["overhead_pct_p90"]] for x in st},
            "hooks": len(presets[p])}
    verdict = {}
    for p in presets:
        k = PRESET_KEY.get(p, p)
        f, d, t = (stats[f"{x}:{p}"]["overhead_pct"] for x in ("ferry", "deferred", "torch"))
        verdict[k] = {"ferry_le_torch": f <= t, "deferred_le_ferry": d <= f, "best_ferry_overhead_pct": min(f, d)}
    out = header(device_name(cuda), os.environ.get("FERRY_COMMAND")
                 or "python3 " + " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]))
    out.update({"eager_b1": eager, "contestants": stats, "call_cpu_us": calls, "verdict": verdict,
                "entries_checked": checked, "entries_bad": bad, "sinks": sink_stats, "ferry_version": ferry.__version__,
                "settings": {k: v for k, v in vars(args).items() if k != "out"}})
    return out


def main():
    args = parse()
    main_core = pin_threads() if args.pin == "on" else None  # before torch and ferry start their threads
    cuda = args.device == "cuda"
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    stream = None if cuda else ferry.Stream(backend="host")
    main_stream = torch.cuda.Stream() if cuda else None
    ctx = torch.cuda.stream(main_stream) if cuda else None
    if ctx:
        ctx.__enter__()
    sync = (lambda: torch.cuda.current_stream().synchronize()) if cuda else stream.synchronize
    cfg, model = build_model(args, dev)
    dec = Decoder(model, cfg, 1, args.tokens + 2, dev, args.seed + 1)
    presets = {p: fh.preset(model, p) for p in args.presets.split(",")}
    use_ops = {"auto": "auto", "ops": True, "core": False}[args.capture]
    sinked = {p: Sinked(args, model, dec, pts, sink_dir(args, p), stream) for p, pts in presets.items()}
    if args.bounce:
        for p, pts in presets.items():
            sinked[(p, "bounce")] = Sinked(args, model, dec, pts, sink_dir(args, p + "-bounce"), stream, args.bounce)
    pycons = {"pyconsumer": PyConsumer(args, stream, batch=False)}
    if hasattr(pycons["pyconsumer"].ch, "poll_batch"):
        pycons["pybatch"] = PyConsumer(args, stream, batch=True)
    runs = make_contestants(args, model, dec, presets, sinked, pycons if args.diagnostics == "on" else {}, stream)
    pin_main(main_core)
    log(f"main thread on core {main_core}, other threads on {OTHER_CORES or 'any'}")
    first = next(iter(sinked.values()))
    fbounce = sinked.get((next(iter(presets)), "bounce"))
    calls = call_costs(args, first, stream, sync, fbounce)
    first.settle()
    if fbounce is not None:
        fbounce.settle()
    log("cpu per call: " + ", ".join(f"{k} {v:.2f}" for k, v in calls.items()))
    times = {k: [] for k in runs}
    for rnd in range(args.rounds + 1):
        for key, c in runs.items():
            try:
                v = timed_step(dec, c, args.tokens, sync)
            except Exception:
                log(f"FAILED: {key} in round {rnd}")
                raise
            for sk in sinked.values():
                sk.settle()
            if rnd:
                times[key].append(v)
        if rnd:
            log(f"round {rnd}/{args.rounds} (median step, cpu ms): " +
                ", ".join(f"{k} {statistics.median(v[-1][2]):.2f}" for k, v in times.items()))
            # the rounds so far (entries_checked 0: not checked yet), so a run cut short still reports them
            partial = {k: summary(v, times["none"]) for k, v in times.items()}
            write_json(args.out, document(args, cuda, presets, partial, calls, 0, 0, {}, rnd))
    stats = {k: summary(v, times["none"]) for k, v in times.items()}
    checked = bad = 0
    for p, pts in presets.items():
        c, b = check(args, model, dec, pts, p, stream, use_ops)
        checked, bad = checked + c, bad + b
    sink_stats = {}
    for p, sk in sinked.items():
        rep = sk.close()
        p = p if isinstance(p, str) else "-".join(p)
        sink_stats[p] = {k: v for k, v in sk.sink.stats().items() if not isinstance(v, str) or v}
        sink_stats[p]["channel_clean"] = bool(rep.get("clean", False))
        shutil.rmtree(sk.dir, ignore_errors=True)
    for pc in pycons.values():
        pc.close()
    out = document(args, cuda, presets, stats, calls, checked, bad, sink_stats, args.rounds)
    write_json(args.out, out)
    verdict = out["verdict"]
    log("medians per step (wall ms, main-thread CPU ms, overhead % [p10..p90]):")
    for k, s in stats.items():
        log(f"  {k:28s} {s['wall_ms']:8.3f} {s['cpu_ms']:8.3f} {s['overhead_pct']:+7.2f}% "
            f"[{s['overhead_pct_p10']:+.2f}..{s['overhead_pct_p90']:+.2f}] wall {s['wall_overhead_pct']:+.2f}%")
    log(f"entries checked {checked}, bad {bad}; verdict {verdict}")
    if ctx:
        ctx.__exit__(None, None, None)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
