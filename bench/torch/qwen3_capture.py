#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Qwen3-0.6B-shaped capture benchmark: complete greedy generation time with activation capture on.

A transformers Qwen3ForCausalLM built from Qwen3-0.6B's config (random bf16 weights, nothing downloaded), a
static KV cache, greedy decode of --tokens new tokens from one random token per sequence. Modes: b1_eager,
b1_graph, b16_graph (the decode step captured in a torch.cuda.CUDAGraph that this script owns: ch.plan(plan)
before each replay; every graph of the run captured into one shared memory pool, as vLLM and SGLang capture
theirs: --pool). Contestants, round-robin in one run: no capture; ferry and gather (ferry.hooks presets through
torch.ops.ferry.capture where built, else Channel.capture; immediate and deferred capture); torch-native
per-hook ``pinned[h].copy_(t, non_blocking=True)`` (captured into the graph, read after an event); in graph
modes also the no-capture step captured a second time, after every other graph (JSON "noise": the spread
between two captures of one step, the graph rows' noise floor). After the timed reps, one untimed generation
per (mode, ferry contestant, preset) is checked step by step: every ferry entry of a captured step is compared
bit-exact (blake2b of the bytes) with its witness, a synchronous copy of the same tensor made by the same
execution beside its capture (JSON "check": the method, and diagnostics that tell wrong bytes from a model
that is not bit-reproducible: the step replayed eagerly without capture from the same state, two whole
reference generations compared with each other, steps whose replay produced another next token or KV[pos]).
H2D: vLLM-V1-like decode metadata at B=64 through ferry.Publisher vs per-tensor gpu[:n].copy_(cpu[:n]) from
pinned buffers, GPU span (events) from before the upload to after the first consumer kernel, eager and graph.

  python bench/torch/qwen3_capture.py --out torch_qwen3.json                     # H200 (about 3-5 minutes)
  python bench/torch/qwen3_capture.py --layers 2 --tokens 4 --device cpu --tiny --out /tmp/q.json   # smoke (host)
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import os
import statistics
import sys
import traceback

import torch

import ferry.hooks as fh
from qwen3bench.check import Checker
from qwen3bench.contestants import make_runs
from qwen3bench.h2d import h2d_step
from qwen3bench.meta import device_name, header, log, write_json
from qwen3bench.model import Decoder, build_model
from qwen3bench.rig import Rig
from qwen3bench.timing import round_robin

MODES = {"b1_eager": (1, False), "b1_graph": (1, True), "b16_graph": (16, True)}  # name: (batch, graph)


def decode_mode(rig, checker, noise, name, batch, graph, model, cfg, presets):
    """One decode mode: its contestants timed round-robin (a whole generation each), then one checked
    generation per ferry contestant and preset; the medians of the JSON "decode"[name] (and "noise"[name])."""
    args = rig.args
    log(f"{name}: B={batch} {'graph' if graph else 'eager'}")
    max_len = args.cache if args.cache else args.tokens + 1
    dec = Decoder(model, cfg, batch, max_len, rig.device, args.seed + batch)
    pts = {p: fh.preset(model, p) for p in presets}
    rp = "vllm-full" if "vllm-full" in presets else presets[0]
    checker.reference_vs_reference(name, dec, model, rp, pts[rp])
    # a fresh pool per mode: torch refuses a pool handle whose graphs were all destroyed (the last mode's)
    rig.pool = torch.cuda.graph_pool_handle() if graph and args.pool == "shared" else None
    runs = make_runs(rig, dec, model, pts, graph)
    reps = args.graph_reps if graph else args.eager_reps

    def generation_ms(key):
        c = runs[key]
        rig.drain.wait(rig.expected)
        dec.reset()
        rig.sync()
        if args.drain_during == "off":
            rig.drain.pause()
        ms = rig.timed_ms(lambda: c.generation(args.tokens))
        rig.drain.resume()
        rig.expected += c.entries * args.tokens
        rig.drain.wait(rig.expected)
        return ms

    def progress(rep, times):
        log(f"  rep {rep}/{reps}: " + ", ".join(f"{k} {v[-1]:.1f} ms" for k, v in times.items()))

    times = round_robin(list(runs), reps, generation_ms, "the timed generation", progress)
    for key, c in runs.items():  # untimed: one checked generation per ferry contestant and preset
        if key.startswith(("ferry:", "gather:")) and c.witnessed is not None:
            checker.checked_generation(name, key, dec, model, pts[key.split(":")[1]], c)
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {"no_capture_ms": med["none"]}
    if "none_b" in med:
        noise[name] = {"no_capture_ms": med["none"], "second_capture_ms": med["none_b"],
                       "spread_pct": 100.0 * (med["none_b"] / med["none"] - 1)}
    for p in presets:
        out[p.replace("-", "_")] = {"ferry_ms": med.get(f"ferry:{p}"), "gather_ms": med.get(f"gather:{p}"),
                                    "torch_copy_ms": med.get(f"torch:{p}")}
    return out


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the JSON file (torch_qwen3.json schema)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--tokens", type=int, default=128, help="new tokens per generation")
    ap.add_argument("--cache", type=int, default=512, help="static KV cache length (0: tokens + 1)")
    ap.add_argument("--tiny", action="store_true", help="hidden 64, vocab 512 (tests)")
    ap.add_argument("--modes", default="b1_eager,b1_graph,b16_graph")
    ap.add_argument("--presets", default="hidden-states,vllm-full")
    ap.add_argument("--eager-reps", type=int, default=None, help="default 3 (cuda), 1 (cpu)")
    ap.add_argument("--graph-reps", type=int, default=5)
    ap.add_argument("--h2d-iters", type=int, default=None, help="default 200 (cuda), 20 (cpu)")
    ap.add_argument("--h2d-upload", choices=["auto", "packed", "direct", "zerocopy"], default="auto",
                    help="the Publisher's upload backend (auto: its calibration's choice, eager and graph)")
    ap.add_argument("--h2d-reps", type=int, default=3)
    ap.add_argument("--ring-mib", type=int, default=256)
    ap.add_argument("--publish-every", type=int, default=4096,
                    help="the channel's K; 4096 (more than any preset's hooks): one release per forward, at "
                         "end_forward (docs/api/d2h.md, 'Choosing K in a graph')")
    ap.add_argument("--branch-publish", choices=["on", "off"], default="on",
                    help="Channel(tuning={'branch_publish': ...}): batch releases on a branch (on) or on the stream (off)")
    ap.add_argument("--capture", choices=["auto", "ops", "core"], default="auto",
                    help="torch.ops.ferry.capture (ops), Channel.capture (core), ops where built (auto)")
    ap.add_argument("--attn", default="sdpa", help="transformers attention implementation (sdpa, eager)")
    ap.add_argument("--contestants", default="ferry,gather,torch",
                    help="which contestants run beside no capture (a diagnostic subset; the JSON then has null for "
                         "the others)")
    ap.add_argument("--witness", choices=["on", "off"], default="on",
                    help="graph modes: capture each ferry contestant's witness graph and check one generation "
                         "(on), or neither (off: a diagnostic; nothing is checked)")
    ap.add_argument("--pool", choices=["own", "shared"], default="shared",
                    help="graph memory pools: one per captured graph (own) or one shared by all (shared: every "
                         "contestant's activations at the same addresses; graphs are replayed one at a time)")
    ap.add_argument("--drain-during", choices=["on", "off"], default="on",
                    help="off: the Python consumer is paused while a generation is timed (a diagnostic: whether "
                         "its GIL holds slow the engine's thread; ferry's own drain thread keeps copying, the "
                         "entries wait in pinned staging, which must hold a whole generation)")
    ap.add_argument("--bounce-capture-max", type=int, default=16384,
                    help="Channel(tuning={'bounce_capture_max_bytes': ...}): immediate captures up to this size bounce (0: off; "
                         "the default stages every hook but the logits: a device copy per hook, one gather per 128)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--commit", default=None)
    args = ap.parse_args(argv)
    cpu = args.device == "cpu"
    args.eager_reps = args.eager_reps if args.eager_reps is not None else (1 if cpu else 3)
    args.h2d_iters = args.h2d_iters if args.h2d_iters is not None else (20 if cpu else 200)
    if cpu:
        args.cache = args.cache if args.cache and args.cache <= args.tokens + 1 else 0
    return args


def main(argv=None):
    args = parse_args(argv)
    faulthandler.enable()  # a crash prints every thread's Python stack
    sys.setswitchinterval(2e-4)  # the consumer thread hands the GIL back to the engine's thread quickly
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    cfg, model = build_model(args, device)
    log(f"model: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, vocab {cfg.vocab_size}, "
        f"device {device}, transformers attention {args.attn}")
    rig = Rig(args)
    checker = Checker(rig)
    ctx = torch.cuda.stream(rig.main) if rig.cuda else contextlib.nullcontext()
    presets = [p for p in args.presets.split(",") if p]
    decode, failures, h2d, report, cpu_hook, noise = {}, [], {}, {}, {}, {}
    try:
        with torch.inference_mode(), ctx:
            for name in [m for m in args.modes.split(",") if m]:  # --modes "": H2D only
                batch, graph = MODES[name]
                if graph and not rig.cuda:
                    log(f"{name}: skipped (graphs need --device cuda)")
                    continue
                try:
                    decode[name] = decode_mode(rig, checker, noise, name, batch, graph, model, cfg, presets)
                except Exception:  # keep the other modes' figures; the run still fails at the end
                    failures.append(name)
                    log(f"{name}: FAILED\n{traceback.format_exc()}")
            try:
                cpu_hook = rig.cpu_per_hook()
            except Exception:
                failures.append("cpu_per_hook")
                log(f"cpu_per_hook: FAILED\n{traceback.format_exc()}")
            if args.h2d_iters > 0:
                try:
                    h2d = h2d_step(rig, args)
                except Exception:
                    failures.append("h2d_step")
                    log(f"h2d_step: FAILED\n{traceback.format_exc()}")
    finally:
        report = rig.close()
    for mode in ("eager", "graph"):
        h2d.setdefault(mode, {"torch_copies_us": None, "ferry_us": None})
    for name in MODES:
        decode.setdefault(name, {"no_capture_ms": None,
                                 **{p.replace("-", "_"): {"ferry_ms": None, "gather_ms": None, "torch_copy_ms": None}
                                    for p in ("hidden-states", "vllm-full")}})

    command = " ".join([os.path.basename(sys.executable)] + sys.argv)
    write_json(args.out, {
        **header(device_name(rig.cuda), command, args.commit),
        "decode": decode,
        "entries_checked": checker.entries_checked,
        "entries_bad": checker.entries_bad,
        "h2d_step": h2d,
        "check": checker.diag,
        "noise": noise,
        "config": {"pool": args.pool, "publish_every": args.publish_every, "ring_mib": args.ring_mib,
                   "branch_publish": args.branch_publish, "capture": args.capture, "witness": args.witness,
                   "drain_during": args.drain_during, "bounce_capture_max": args.bounce_capture_max,
                   "h2d_upload": args.h2d_upload},
    })
    summary(args, report, decode, noise, checker, h2d, cpu_hook, failures)
    return 0 if checker.entries_bad == 0 and not failures else 1


def summary(args, report, decode, noise, checker, h2d, cpu_hook, failures):
    """The run's figures on stdout (the JSON has them all)."""
    print(f"# torch {torch.__version__}, ferry capture={args.capture}, channel close clean={report.get('clean')}")
    for name, d in decode.items():
        base = d["no_capture_ms"]
        if base is None:
            continue
        print(f"{name} no_capture {base:.2f} ms")
        for p in ("hidden_states", "vllm_full"):
            if p in d:
                cells = [f"{label} {d[p][key]:.2f} ms ({100 * (d[p][key] / base - 1):+.2f}%)"
                         for key, label in (("ferry_ms", "ferry"), ("gather_ms", "gather"), ("torch_copy_ms", "torch_copy"))
                         if d[p][key] is not None]
                if cells:
                    print(f"{name} {p} " + " ".join(cells))
    for name, nz in noise.items():
        print(f"{name} no_capture captured twice: {nz['no_capture_ms']:.2f} / {nz['second_capture_ms']:.2f} ms "
              f"({nz['spread_pct']:+.2f}%: the graph rows' noise floor)")
    print(f"entries_checked {checker.entries_checked} entries_bad {checker.entries_bad}"
          + (f" first_bad: {checker.first_bad}" if checker.first_bad else ""))
    dg = checker.diag
    print(f"check: replay_bad {dg['replay_bad']} reference_vs_reference_bad {dg['reference_vs_reference_bad']} step_token_mismatches "
          f"{dg['step_token_mismatches']} step_kv_mismatches {dg['step_kv_mismatches']}\ncheck method: {dg['method']}")
    for mode, d in h2d.items():
        if d["ferry_us"] is not None:
            print(f"h2d_step {mode} torch_copies {d['torch_copies_us']:.1f} us ferry {d['ferry_us']:.1f} us "
                  f"({d['ferry_us'] / d['torch_copies_us']:.2f}x)")
    if cpu_hook:
        print("python eager capture, CPU us per call: " + ", ".join(f"{k} {v:.2f}" for k, v in cpu_hook.items()))
    if failures:
        print(f"FAILED: {', '.join(failures)} (see the log above)")


if __name__ == "__main__":
    sys.exit(main())
