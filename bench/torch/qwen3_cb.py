#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Selective capture under continuous batching (issue 27): a Qwen3-0.6B-shaped decode step of B = 64 requests
(one token each, static KV cache, the step captured into a torch.cuda.CUDAGraph; on the host backend: eager)
in which each step a seeded random 4..16 of the 64 requests want their activations.

The step's selection (int32 row indices = the requests' batch slots, padded to 16, at a fixed device address,
plus an int32 device count) is uploaded by ferry.Publisher (one group of two buffers: begin(slot), producer,
write, set_count, publish on the compute stream) before every step, by every contestant. Contestants, timed
round-robin in one run (a warm-up round, then --rounds rounds of a whole generation of --tokens steps each;
GPU time by CUDA events, host: wall time):

  none          the step without capture
  rows          ferry.hooks.rows_capture(ch, deferred=True, rows=sel, count=cnt, max_count=16) at every point
                of the preset (hidden-states, vllm-full): each hook's selected token rows, one gather per batch;
                ch.plan(plan, tag=step, requests=[the selected request ids]) before each replay; the consumer
                thread copies each entry's rows out
  cpu_select    ferry captures every hook whole (capture_deferred); the consumer picks the selected rows of each
                entry on the CPU (fancy index, one copy)
  torch_select  torch-native: per hook rows.index_select(0, sel) + pinned.copy_(..., non_blocking=True) in the
                graph (two pinned slots, one graph each); the engine's thread waits for a slot's event and copies
                its first count rows out before reusing it

Then one untimed generation per ferry contestant and preset is checked step by step: every delivered row
bit-exact against a witness (the same tensors copied whole by the same execution, beside the capture; rows picked
with the host's selection), and attributed to the right step and request (entry.tag == step;
entry.rows_of(request id) == the witness row of that request): rows_checked, rows_bad, misattributed.

  python bench/torch/qwen3_cb.py --out qwen3_cb.json                                  # H200 (1-2 minutes)
  python bench/torch/qwen3_cb.py --device cpu --tiny --layers 2 --tokens 4 --out /tmp/cb.json   # smoke (host)
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import os
import statistics
import sys
import time
import traceback

import torch

import ferry.hooks as fh
from qwen3bench.cb import CbRig, Selections
from qwen3bench.cb_check import CHECK_METHOD, RowChecker
from qwen3bench.cb_contestants import KINDS, make_runs
from qwen3bench.meta import device_name, header, log, write_json
from qwen3bench.model import Decoder, build_model
from qwen3bench.timing import timed_ms


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the JSON file")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--tokens", type=int, default=64, help="decode steps per generation")
    ap.add_argument("--cache", type=int, default=512, help="static KV cache length (0: tokens + 1)")
    ap.add_argument("--tiny", action="store_true", help="hidden 64, vocab 512 (tests)")
    ap.add_argument("--batch", type=int, default=64, help="requests decoding (one token each)")
    ap.add_argument("--min-select", type=int, default=4, help="fewest requests that want capture in a step")
    ap.add_argument("--max-select", type=int, default=16, help="most requests that want capture in a step")
    ap.add_argument("--pad", type=int, default=16, help="the device selection's length (max_count)")
    ap.add_argument("--presets", default="hidden-states,vllm-full")
    ap.add_argument("--contestants", default=",".join(KINDS),
                    help="which contestants run beside no capture (the JSON has null for the others)")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds after the warm-up one; default 10 "
                                                              "(cuda), 1 (cpu)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="no new round starts once the timed rounds took this long (0: no limit); default 120 "
                         "(cuda), 0 (cpu)")
    ap.add_argument("--check", choices=["on", "off"], default="on",
                    help="the checked generation of each ferry contestant (off: a diagnostic, nothing checked)")
    ap.add_argument("--ring-mib", type=int, default=256)
    ap.add_argument("--publish-every", type=int, default=4096,
                    help="the channel's K: one release per forward, at end_forward")
    ap.add_argument("--size-slots", type=int, default=4096,
                    help="Channel(tuning={'size_slots': n}): row entries are dynamic (0: derived, one per FIFO slot)")
    ap.add_argument("--upload", choices=["auto", "packed", "direct", "zerocopy"], default="auto",
                    help="the selection Publisher's upload backend")
    ap.add_argument("--attn", default="sdpa", help="transformers attention implementation (sdpa, eager)")
    ap.add_argument("--fault", choices=["none", "rows", "requests", "tag"], default="none",
                    help="a self-test of the check (the run must then fail): ferry rows get the wrong rows (the "
                         "uploaded selection shifted by one slot; torch_select too), the requests rotated by one, or "
                         "the next step's tag")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--commit", default=None)
    args = ap.parse_args(argv)
    cpu = args.device == "cpu"
    args.rounds = args.rounds if args.rounds is not None else (1 if cpu else 10)
    args.budget_s = args.budget_s if args.budget_s is not None else (0 if cpu else 120)
    if cpu:
        args.cache = args.cache if args.cache and args.cache <= args.tokens + 1 else 0
    return args


def spread(samples):
    med = statistics.median(samples)
    return {"median_ms": med, "min_ms": min(samples), "max_ms": max(samples),
            "spread_pct": 100.0 * (max(samples) - min(samples)) / med if med else None,
            "samples_ms": [round(s, 4) for s in samples]}


def run(args, rig, checker, model, cfg, presets, kinds, failures):
    """The contestants' timed rounds and the checks; {key: [ms samples]}."""
    max_len = args.cache if args.cache else args.tokens + 1
    dec = Decoder(model, cfg, args.batch, max_len, rig.device, args.seed + args.batch)
    pts = {p: fh.preset(model, p) for p in presets}
    log(f"B={args.batch} {'graph' if rig.cuda else 'eager'}; hooks per step: "
        + ", ".join(f"{p} {len(v)}" for p, v in pts.items()) + f"; selected per step {rig.sels.summary()}")
    runs = make_runs(rig, dec, model, pts, kinds)
    log(f"contestants: {', '.join(runs)}")

    def generation_ms(key):
        c = runs[key]
        rig.drained()
        dec.reset()
        rig.sync()
        rig.consumer.mode = c.consumer
        ms = timed_ms(lambda: c.generation(args.tokens), None if rig.cuda else rig.fstream)
        c.finish()  # outside the clock: torch_select's last slots
        rig.expected += c.entries * args.tokens
        rig.drained()
        rig.consumer.mode = "release"
        return ms

    def progress(rep, times):
        log(f"  round {rep}/{args.rounds}: " + ", ".join(f"{k} {v[-1]:.2f} ms" for k, v in times.items()))

    # round-robin (as qwen3bench.timing.round_robin): round 0 a warm-up, not recorded; no new round starts once
    # the recorded ones took --budget-s
    keys = list(runs)
    times = {k: [] for k in keys}
    start = time.perf_counter()
    for rep in range(args.rounds + 1):
        if rep == 1:
            start = time.perf_counter()
        elif rep > 1 and args.budget_s and time.perf_counter() - start > args.budget_s:
            log(f"  --budget-s {args.budget_s:g} spent: {rep - 1} of {args.rounds} rounds")
            break
        for key in keys:
            try:
                v = generation_ms(key)
            except Exception:
                log(f"  FAILED in the timed generation of {key} (round {rep})")
                raise
            if rep:
                times[key].append(v)
        if rep:
            progress(rep, times)
    if args.check == "on":
        for key, c in runs.items():
            if c.witnessed is not None:
                try:
                    checker.checked_generation(key, dec, c, args.tokens)
                except Exception:
                    failures.append(f"check {key}")
                    log(f"check {key}: FAILED\n{traceback.format_exc()}")
    return times


def main(argv=None):
    args = parse_args(argv)
    faulthandler.enable()  # a crash prints every thread's Python stack
    sys.setswitchinterval(2e-4)  # the consumer thread hands the GIL back to the engine's thread quickly
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    presets = [p for p in args.presets.split(",") if p]
    kinds = {k for k in args.contestants.split(",") if k}
    unknown = kinds - set(KINDS)
    if unknown:
        raise SystemExit(f"--contestants: expected some of {','.join(KINDS)}, got {','.join(sorted(unknown))}")
    cfg, model = build_model(args, device)
    log(f"model: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, vocab {cfg.vocab_size}, device {device}, "
        f"transformers attention {args.attn}")
    sels = Selections(args.tokens, args.batch, args.min_select, args.max_select, args.pad, args.seed)
    failures, times, report, upload_info = [], {}, {}, None
    rig = CbRig(args, sels)
    checker = RowChecker(rig)
    ctx = torch.cuda.stream(rig.main) if rig.cuda else contextlib.nullcontext()
    try:
        with torch.inference_mode(), ctx:
            try:
                times = run(args, rig, checker, model, cfg, presets, kinds, failures)
            except Exception:
                failures.append("run")
                log(f"FAILED\n{traceback.format_exc()}")
        upload_info = rig.upload.info()
    finally:
        report = rig.close()

    med = {k: statistics.median(v) for k, v in times.items() if v}
    main_p = "vllm-full" if "vllm-full" in presets else (presets[0] if presets else None)
    per_preset = {p.replace("-", "_"): {f"{k}_ms": med.get(f"{k}:{p}") for k in KINDS}
                  for p in ("hidden-states", "vllm-full")}
    result = {
        "no_capture_ms": med.get("none"),
        "hidden_states_ms": med.get("rows:hidden-states"),
        "vllm_full_ms": med.get("rows:vllm-full"),
        "cpu_select_ms": med.get(f"cpu_select:{main_p}"),
        "torch_select_ms": med.get(f"torch_select:{main_p}"),
        "rows_checked": checker.rows_checked,
        "rows_bad": checker.rows_bad,
        "misattributed": checker.misattributed,
        "select_preset": main_p,  # the preset of cpu_select_ms and torch_select_ms
        "per_preset": per_preset,
        "spreads": {k: spread(v) for k, v in times.items() if v},
        "batch": args.batch,
        "tokens": args.tokens,
        "rounds": min(len(v) for v in times.values()) if times else 0,
        "rounds_asked": args.rounds,
        "selected": sels.summary(),
    }
    command = " ".join([os.path.basename(sys.executable)] + sys.argv)
    write_json(args.out, {
        **header(device_name(rig.cuda), command, args.commit),
        "qwen3_cb": result,
        "check": {"method": CHECK_METHOD, "runs": checker.runs, "first_bad": checker.first_bad},
        "config": {"layers": args.layers, "tiny": args.tiny, "cache": args.cache, "pad": args.pad,
                   "min_select": args.min_select, "max_select": args.max_select, "presets": presets,
                   "contestants": sorted(kinds), "ring_mib": args.ring_mib, "publish_every": args.publish_every,
                   "size_slots": args.size_slots, "upload": args.upload, "upload_info": upload_info,
                   "check": args.check, "fault": args.fault, "graph": rig.cuda,
                   "channel_close_clean": report.get("clean")},
        "failures": failures,
    })
    summary(result, checker, failures)
    ok = not failures and checker.rows_bad == 0 and checker.misattributed == 0
    if args.check == "on" and checker.rows_checked == 0:
        print("FAILED: no row was checked")
        ok = False
    return 0 if ok else 1


def summary(r, checker, failures):
    """The run's figures on stdout (the JSON has them all)."""
    print(f"# torch {torch.__version__}; B={r['batch']}, {r['tokens']} tokens per generation, {r['rounds']} rounds; "
          f"selected per step {r['selected']['min']}..{r['selected']['max']} (mean {r['selected']['mean']:.1f})")
    base = r["no_capture_ms"]
    if base is not None:
        print(f"no_capture {base:.2f} ms (spread {r['spreads']['none']['spread_pct']:.1f}%)")
        for p, d in r["per_preset"].items():
            cells = [f"{k} {v:.2f} ms ({100 * (v / base - 1):+.2f}%, spread "
                     f"{r['spreads'][k[:-3] + ':' + p.replace('_', '-')]['spread_pct']:.1f}%)"
                     for k, v in d.items() if v is not None]
            if cells:
                print(f"{p}: " + ", ".join(cells))
    print(f"rows_checked {r['rows_checked']} rows_bad {r['rows_bad']} misattributed {r['misattributed']}"
          + (f" first_bad: {checker.first_bad}" if checker.first_bad else ""))
    if failures:
        print(f"FAILED: {', '.join(failures)} (see the log above)")


if __name__ == "__main__":
    sys.exit(main())
