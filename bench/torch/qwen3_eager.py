#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Eager B=1 capture with a native sink running (issue 28): the Qwen3-0.6B-shaped model (transformers
Qwen3ForCausalLM, random bf16 weights, static KV cache), greedy decode at B=1 without a graph, where every step is
CPU-bound (Python and kernel launches). Per preset (hidden-states: 28 hooks, vllm-full: 341) the hooks capture
into a channel whose entries go to ferry's safetensors sink (shards on /dev/shm by default, written by C++
threads: no Python per entry), immediate (``ferry``) and deferred (``deferred``: a gather per batch), against
torch's per-hook ``pinned.copy_(t, non_blocking=True)`` (``torch``). ``hooks``: the same hooks calling a no-op
(the hook layer's own cost). Diagnostics (--diagnostics calls): ``frame`` (begin_forward / end_forward around the
step, no hook), ``incall-ferry`` / ``incall-deferred`` / ``incall-collect`` (the time inside ferry's calls summed
per step, beside the step's overhead); --diagnostics on adds ``pyconsumer`` / ``pybatch`` (immediate capture into
a channel drained by a Python thread with ``poll`` / ``poll_batch``: the consumer that takes the GIL).

Method: interleaved at step level, so that the machine's speed drift (a lent host: the no-capture step itself
varies by tens of percent within a minute) cancels. Each round runs one short turn of every contestant, in a
fresh random order, with a no-capture turn before the first, between every two and after the last (none, c1,
none, c2, ..., none): the decoder reset to the start state, the contestant's hooks installed, the device idle,
then --steps decode steps (default 1) each timed alone (main-thread CPU time, time.thread_time; wall time; the
user-space instructions the main thread retires, where perf_event_open is allowed), then the hooks removed and
the device waited for -- all of that but the steps outside the timed part. Rounds continue until --budget-s
seconds of them have run (at least --min-rounds, at most --rounds). A contestant's overhead is the median over
rounds of (its turn / the mean of the two no-capture turns beside it - 1): on the lent H200 a turn's deviation
from its contestant's median grew from 3.3% (median) against the turn next to it to 6-10% against one 7-12
turns away (169 rounds of 13 contestants at e1f745b, one no-capture turn per round), so each turn is compared
with its neighbours. Reported with its spread (p10..p90, min, max) and a
distribution-free 95% confidence interval of that median (order statistics). The targets' comparisons
(ferry - torch, deferred - ferry) are per-round differences of those overheads, with their own median and
interval: ``decided`` when the interval excludes 0. The garbage collector runs between rounds only.

Before the timed rounds, --check-steps steps (default 1) per (preset, ferry kind) are captured into a fresh
shard run with a witness (a synchronous ``.cpu()`` of every hooked tensor at its hook) and every tensor read back
from the shards is compared bit-exact; the JSON is written after the check and every 10 rounds, so a run cut
short keeps the check and the rounds so far.

  python bench/torch/qwen3_eager.py --out eager_b1.json                                # H200 (about 4 minutes)
  python bench/torch/qwen3_eager.py --device cpu --tiny --layers 2 --rounds 3 --min-rounds 3 --out /tmp/e.json  # smoke
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import shutil
import statistics
import sys
import time

import numpy as np
import torch

import ferry
import ferry.hooks as fh
from qwen3bench.eager import (INSTALL, OTHER_CORES, PyConsumer, Sinked, call_costs, deferred_points, make_contestants,
                              pin_main, pin_threads, sink_dir, turn)
from qwen3bench.meta import device_name, header, log, use_ops, write_json
from qwen3bench.model import Decoder, build_model
from qwen3bench.paired import Instructions, pair_differences, paired, quantile

PRESET_KEY = {"hidden-states": "hidden_states", "vllm-full": "vllm_full"}
KINDS = ("ferry", "deferred", "collect", "bounce", "torch", "hooks")


def parse():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the JSON file (its eager_b1 block goes into sinks.json)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--tiny", action="store_true", help="hidden 64, vocab 512 (tests)")
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--steps", type=int, default=1, help="timed decode steps per contestant turn")
    ap.add_argument("--rounds", type=int, default=400, help="at most this many timed rounds")
    ap.add_argument("--min-rounds", type=int, default=10, help="at least this many, whatever --budget-s says")
    ap.add_argument("--budget-s", type=float, default=160.0,
                    help="the timed rounds stop once they ran this many seconds (after --min-rounds)")
    ap.add_argument("--presets", default="hidden-states,vllm-full")
    ap.add_argument("--capture", choices=["auto", "ops", "core"], default="auto")
    ap.add_argument("--ring-mib", type=int, default=64)
    ap.add_argument("--publish-every", type=int, default=4096)
    ap.add_argument("--shard-mib", type=int, default=256)
    ap.add_argument("--sink-dir", default=None, help="where the shard runs go (default /dev/shm)")
    ap.add_argument("--diagnostics", choices=["on", "calls", "off"], default="off",
                    help="on: frame, incall-* and the Python consumers; calls: frame and incall-* only")
    ap.add_argument("--check-steps", type=int, default=1, help="checked steps per (preset, ferry kind)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bounce", type=int, default=16384,
                    help="the bounce contestant's bounce_capture_max_bytes (0: no bounce contestant)")
    ap.add_argument("--install", choices=["forward", "hooks"], default="forward",
                    help="ferry.hooks.install's via= for every contestant (forward: each hooked module's forward "
                         "wrapped, torch's hook dispatch skipped; hooks: torch forward hooks)")
    ap.add_argument("--pin", choices=["on", "off"], default="on",
                    help="the decode loop on a core of its own, every other thread elsewhere (less noise)")
    ap.add_argument("--kinds", default="all",
                    help="the contestants timed besides no capture, by kind (ferry, deferred, collect, bounce, torch, "
                         "hooks, and the diagnostics' frame, incall-*, pyconsumer, pybatch), comma-separated: a run "
                         "that spends every turn on one comparison (all: every contestant built)")
    ap.add_argument("--drain-idle-us", type=float, default=200.0,
                    help="the channels' drain_idle_sleep (every contestant runs beside the idle drain threads)")
    return ap.parse_args()


def pick(runs, kinds):
    """runs restricted to no capture and the contestants of the --kinds named (all: every one); a kind that names
    no contestant of this run is an error (a typo would time nothing)."""
    if kinds == "all":
        return runs
    want = {k.strip() for k in kinds.split(",") if k.strip()}
    have = {k.partition(":")[0] for k in runs if k != "none"}
    if not want or want - have:
        raise SystemExit(f"qwen3_eager: --kinds: expected kinds among {', '.join(sorted(have))}, got "
                         f"{', '.join(sorted(want - have)) or 'none'} (diagnostics: --diagnostics; bounce: --bounce)")
    return {k: c for k, c in runs.items() if k == "none" or k.partition(":")[0] in want}


def mean_turn(turns):
    """The element-wise mean of turn() results."""
    return tuple(sum(x) / len(turns) for x in zip(*turns))


def summarize(rec, ref, counted):
    """Every contestant's figures from the rounds' records rec[key] = [(cpu ms, wall ms, instructions, in-call us)
    per round]: the median turn (CPU and wall ms per step), and the paired overheads against ref[key], the mean of
    the no-capture turns run just before and just after each of its turns (CPU, wall, instructions where
    `counted`)."""
    out = {}
    for k, v in rec.items():
        cpu, wall, ins = ([x[i] for x in v] for i in range(3))
        s = {"cpu_ms": statistics.median(cpu), "wall_ms": statistics.median(wall),
             "cpu_ms_p10": quantile(cpu, 0.1), "cpu_ms_p90": quantile(cpu, 0.9)}
        if k != "none":
            base = ref[k]
            ov, st = paired(cpu, [x[0] for x in base])
            s.update({"overhead_pct": st["median"], "overhead_pct_ci95": st["ci95"], "overhead_pct_p10": st["p10"],
                      "overhead_pct_p90": st["p90"], "overhead_pct_min": st["min"], "overhead_pct_max": st["max"],
                      "wall_overhead_pct": paired(wall, [x[1] for x in base])[1]["median"], "round_overhead_pct": ov})
            if counted:
                _, si = paired(ins, [x[2] for x in base])
                s.update({"instructions_overhead_pct": si["median"], "instructions_overhead_pct_ci95": si["ci95"]})
        if counted:
            s["instructions_per_step"] = statistics.median(ins)
        if any(len(x) > 3 and x[3] for x in v):
            s["in_call_us"] = statistics.median(x[3] for x in v)  # the diagnostic's time inside ferry's calls
        out[k] = s
    return out


def comparisons(stats, presets):
    """The targets' comparisons per preset (qwen3bench.paired.PAIRS), from the per-round overheads (percentage
    points of the round's no-capture step)."""
    return {PRESET_KEY.get(p, p): pair_differences({x: stats[f"{x}:{p}"]["round_overhead_pct"] for x in KINDS
                                                    if f"{x}:{p}" in stats}) for p in presets}


def check(args, model, dec, pts, preset, stream, ops):
    """(checked, bad): --check-steps steps per ferry kind into a fresh shard run, every tensor read back from
    the shards compared bit-exact with the witness (``.cpu()`` at the hook, beside the capture)."""
    checked = bad = 0
    kinds = [("ferry", False, 0), ("deferred", deferred_points(pts), 0), ("collect", deferred_points(pts), 0)] + (
        [("bounce", False, args.bounce)] if args.bounce else [])
    for kind, deferred, bounce in kinds:
        sk = Sinked(args, model, dec, pts, sink_dir(args, f"{preset}-check-{kind}"), stream, bounce)
        col = fh.Collector(sk.ch, stream, deferred=deferred) if kind == "collect" else None
        cap = col or sk.capture_fn(deferred, ops)
        begin = (lambda tag: col.begin_forward(tag=tag)) if col else (lambda tag: sk.ch.begin_forward(stream, tag=tag))
        end = col.end_forward if col else (lambda: sk.ch.end_forward(stream))
        names = {p.id: p.name for p in pts}
        want = {}

        def witnessed(h, t, step=None):
            cap(h, t)
            want.setdefault(step[0], []).append((names[h], t.detach().to("cpu", copy=True).contiguous()))

        dec.reset()
        for step in range(args.check_steps):
            begin(step)
            with fh.install(model, pts, lambda h, t, s=[step]: witnessed(h, t, s), **INSTALL):
                dec.step()
            end()
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


def st_of(stats, p):
    """{kind: figures} of preset p's contestants among KINDS."""
    return {x: stats[f"{x}:{p}"] for x in KINDS if f"{x}:{p}" in stats}


def document(args, cuda, presets, stats, calls, checked, bad, sink_stats, rounds_done, counted, orders, keys):
    """The JSON: eager_b1 (issue 28's block: medians per step), every contestant's figures, the comparisons,
    the verdict, the rounds' orders."""
    eager = {"rounds": rounds_done, "tokens_per_round": args.steps, "measure": "main-thread CPU ms per step",
             "method": "step-level interleaving: per round one turn of every contestant in a fresh random order, "
                       "a no-capture turn before, between and after them "
                       f"({args.steps} timed step(s) each, decoder reset, hooks installed and device idle outside "
                       "the timed part); overhead = median over rounds of the turn / the mean of the two no-capture "
                       "turns beside it - 1; ci95 = order-statistic 95% interval of that median",
             "no_capture_ms": stats["none"]["cpu_ms"] if stats else None,
             "no_capture_wall_ms": stats["none"]["wall_ms"] if stats else None,
             "entries_checked": checked, "entries_bad": bad}
    cmp = comparisons(stats, presets) if stats else {}
    for p in (presets if stats else ()):
        st = st_of(stats, p)
        ms = {x: st[x]["cpu_ms"] if x in st else None for x in KINDS}  # None: not timed (--kinds)
        blk = {"ferry_ms": ms["ferry"], "deferred_ms": ms["deferred"], "torch_copy_ms": ms["torch"],
               "hooks_only_ms": ms["hooks"], "bounce_ms": ms["bounce"], "collect_ms": ms["collect"],
               "overhead_pct": {x: st[x]["overhead_pct"] for x in st},
               "spread_pct": {x: [st[x]["overhead_pct_p10"], st[x]["overhead_pct_p90"]] for x in st},
               "ci95_pct": {x: st[x]["overhead_pct_ci95"] for x in st},
               "comparisons_pp": cmp[PRESET_KEY.get(p, p)], "hooks": len(presets[p])}
        if counted:
            blk["instructions_overhead_pct"] = {x: st[x]["instructions_overhead_pct"] for x in st}
        eager[PRESET_KEY.get(p, p)] = blk
    verdict = {}
    for p in (presets if stats else ()):
        k = PRESET_KEY.get(p, p)
        ov = {x: s["overhead_pct"] for x, s in st_of(stats, p).items()}
        c = cmp[k]
        verdict[k] = {}
        if "ferry" in ov and "torch" in ov:
            verdict[k].update(ferry_le_torch=ov["ferry"] <= ov["torch"],
                              ferry_le_torch_decided=c["ferry_minus_torch_pp"]["decided"])
        if "deferred" in ov and "ferry" in ov:
            verdict[k].update(deferred_le_ferry=ov["deferred"] <= ov["ferry"],
                              deferred_le_ferry_decided=c["deferred_minus_ferry_pp"]["decided"])
        modes = [ov[x] for x in ("ferry", "deferred", "collect") if x in ov]
        if modes:
            verdict[k]["best_ferry_overhead_pct"] = min(modes)
        if k == "hidden_states":  # <= +1%: per ferry mode, decided when its ci95 lies on one side of 1
            for x, st in st_of(stats, p).items():
                if x in ("ferry", "deferred", "collect"):
                    ci = st["overhead_pct_ci95"]
                    verdict[k][f"{x}_le_1pct"] = st["overhead_pct"] <= 1.0
                    verdict[k][f"{x}_le_1pct_decided"] = bool(ci) and (ci[1] <= 1.0 or ci[0] > 1.0)
    out = header(device_name(cuda), os.environ.get("FERRY_COMMAND")
                 or "python3 " + " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]))
    out.update({"eager_b1": eager, "contestants": stats, "call_cpu_us": calls, "verdict": verdict,
                "entries_checked": checked, "entries_bad": bad, "sinks": sink_stats, "ferry_version": ferry.__version__,
                "instructions_counted": counted, "round_orders": {"keys": keys, "orders": orders},
                "settings": {k: v for k, v in vars(args).items() if k != "out"}})
    return out


def main():
    args = parse()
    INSTALL["via"] = args.install
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
    dec = Decoder(model, cfg, 1, max(args.steps, args.check_steps) + 2, dev, args.seed + 1)
    presets = {p: fh.preset(model, p) for p in args.presets.split(",")}
    ops = use_ops(args.capture)

    checked = bad = 0  # first: a run cut short by a time limit still has its check
    for p, pts in presets.items():
        c, b = check(args, model, dec, pts, p, stream, ops)
        checked, bad = checked + c, bad + b
    log(f"entries checked {checked}, bad {bad}")
    write_json(args.out, document(args, cuda, presets, {}, {}, checked, bad, {}, 0, False, [], []))

    sinked = {p: Sinked(args, model, dec, pts, sink_dir(args, p), stream) for p, pts in presets.items()}
    if args.bounce:
        for p, pts in presets.items():
            sinked[(p, "bounce")] = Sinked(args, model, dec, pts, sink_dir(args, p + "-bounce"), stream, args.bounce)
    pycons = {}
    if args.diagnostics == "on":
        pycons["pyconsumer"] = PyConsumer(args, stream, batch=False)
        if hasattr(pycons["pyconsumer"].ch, "poll_batch"):
            pycons["pybatch"] = PyConsumer(args, stream, batch=True)
    runs = pick(make_contestants(args, model, dec, presets, sinked, pycons, stream), args.kinds)
    keys = list(runs)
    pin_main(main_core)
    counter = Instructions()  # after pin_main: counts the decode loop's thread
    log(f"main thread on core {main_core}, other threads on {OTHER_CORES or 'any'}; "
        f"instructions {'counted' if counter.ok else 'not counted (perf_event_open refused)'}")
    first = next(iter(sinked.values()))
    fbounce = sinked.get((next(iter(presets)), "bounce"))
    calls = call_costs(args, first, stream, sync, fbounce)
    for sk in sinked.values():
        sk.settle()
    log("cpu per call (us): " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                        for k, v in calls.items()))

    rng = random.Random(args.seed)
    assert keys[0] == "none"
    rec = {k: [] for k in runs}
    ref = {k: [] for k in keys[1:]}  # per contestant turn: the mean of the no-capture turns on either side
    orders = []
    rnd, t_start = -1, None  # round -1: the warm-up round (not recorded)
    while rnd < args.rounds:
        if rnd >= args.min_rounds and time.monotonic() - t_start > args.budget_s:
            break
        order = list(range(1, len(keys)))
        rng.shuffle(order)
        seq = [0]
        for i in order:
            seq += [i, 0]  # none, c1, none, c2, ..., none: every contestant between two no-capture turns
        gc.collect()
        gc.disable()
        try:
            got = []
            for i in seq:
                try:
                    got.append(turn(dec, runs[keys[i]], args.steps, sync, counter))
                except Exception:
                    log(f"FAILED: {keys[i]} in round {rnd}")
                    raise
                for sk in sinked.values():
                    sk.settle()
        finally:
            gc.enable()
        if rnd >= 0:
            rec["none"].append(mean_turn(got[0::2]))
            for j, i in enumerate(order):
                rec[keys[i]].append(got[2 * j + 1])
                ref[keys[i]].append(mean_turn((got[2 * j], got[2 * j + 2])))
            orders.append(seq)
        else:
            t_start = time.monotonic()
        rnd += 1
        if rnd > 0 and (rnd % 10 == 0 or rnd <= 3):
            stats = summarize(rec, ref, counter.ok)
            log(f"round {rnd} (overhead % so far, median [ci95]): " + ", ".join(
                f"{k} {s['overhead_pct']:+.2f}" for k, s in stats.items() if k != "none")
                + f"; no capture {stats['none']['cpu_ms']:.2f} ms")
            write_json(args.out, document(args, cuda, presets, stats, calls, checked, bad, {}, rnd, counter.ok,
                                          orders, keys))
    log(f"{rnd} rounds in {time.monotonic() - t_start:.1f} s")
    stats = summarize(rec, ref, counter.ok)
    sink_stats = {}
    for p, sk in sinked.items():
        rep = sk.close()
        p = p if isinstance(p, str) else "-".join(p)
        sink_stats[p] = {k: v for k, v in sk.sink.stats().items() if not isinstance(v, str) or v}
        sink_stats[p]["channel_clean"] = bool(rep.get("clean", False))
        shutil.rmtree(sk.dir, ignore_errors=True)
    for pc in pycons.values():
        pc.close()
    out = document(args, cuda, presets, stats, calls, checked, bad, sink_stats, rnd, counter.ok, orders, keys)
    write_json(args.out, out)
    log("per step (median turn: wall ms, main-thread CPU ms; overhead: median over rounds [ci95] (p10..p90)):")
    for k, s in stats.items():
        if k == "none":
            log(f"  {k:26s} {s['wall_ms']:8.3f} {s['cpu_ms']:8.3f}")
            continue
        ci = s["overhead_pct_ci95"] or [float("nan")] * 2
        ins = f" instr {s['instructions_overhead_pct']:+.2f}%" if counter.ok else ""
        log(f"  {k:26s} {s['wall_ms']:8.3f} {s['cpu_ms']:8.3f} {s['overhead_pct']:+7.2f}% [{ci[0]:+.2f}, "
            f"{ci[1]:+.2f}] ({s['overhead_pct_p10']:+.2f}..{s['overhead_pct_p90']:+.2f}) wall "
            f"{s['wall_overhead_pct']:+.2f}%{ins}" + (f" in ferry's calls {s['in_call_us']:.1f} us/step"
                                                      if "in_call_us" in s else ""))
    for p, c in comparisons(stats, presets).items():
        log(f"  {p}: " + "; ".join(f"{k} {v['median']:+.2f} [{(v['ci95'] or [float('nan')] * 2)[0]:+.2f}, "
                                   f"{(v['ci95'] or [float('nan')] * 2)[1]:+.2f}]{' decided' if v['decided'] else ''}"
                                   for k, v in c.items()))
    log(f"entries checked {checked}, bad {bad}; verdict {out['verdict']}")
    counter.close()
    if ctx:
        ctx.__exit__(None, None, None)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
