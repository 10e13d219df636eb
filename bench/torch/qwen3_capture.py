#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Qwen3-0.6B-shaped capture benchmark: complete greedy generation time with activation capture on.

A transformers Qwen3ForCausalLM built from Qwen3-0.6B's config (random bf16 weights, nothing downloaded), a
static KV cache, greedy decode of --tokens new tokens from one random token per sequence. Modes: b1_eager,
b1_graph, b16_graph (the decode step captured in a torch.cuda.CUDAGraph that this script owns: ch.plan(plan)
before each replay; every graph of the run captured into one shared memory pool, as vLLM and SGLang capture
theirs: --pool). Contestants, round-robin in one run: no capture; ferry (ferry.hooks presets through
torch.ops.ferry.capture where built, else Channel.capture); torch-native per-hook
``pinned[h].copy_(t, non_blocking=True)`` (captured into the graph, read after an event); in graph modes also
the no-capture step captured a second time, after every other graph (JSON "noise": the spread between two
captures of one step, the graph rows' noise floor). After the timed reps,
one untimed generation per (mode, ferry contestant, preset) is checked step by step: every ferry entry of a
captured step is compared bit-exact (blake2b of the bytes) with a reference capture, the synchronous ``.cpu()``
of the same tensors in an uncaptured eager replay of the same step from the same state (JSON "check": the
method, and diagnostics that tell wrong bytes from a model that is not bit-reproducible: two whole reference
generations compared with each other, steps whose replay produced another next token or KV[pos]).
H2D: vLLM-V1-like decode metadata at B=64 through ferry.Publisher vs per-tensor gpu[:n].copy_(cpu[:n]) from
pinned buffers, GPU span (events) from before the upload to after the first consumer kernel, eager and graph.

  python bench/torch/qwen3_capture.py --out torch_qwen3.json                     # H200 (about 3-5 minutes)
  python bench/torch/qwen3_capture.py --layers 2 --tokens 4 --device cpu --tiny --out /tmp/q.json   # smoke (host)
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import hashlib
import inspect
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import traceback

import numpy as np
import torch

import ferry
import ferry.hooks as fh

T0 = time.perf_counter()
CHECK_METHOD = ("witness copies: one untimed generation per (mode, ferry contestant, preset), step by step; every "
                "ferry entry is compared (blake2b) with a synchronous copy of the same tensor made by the same "
                "execution beside its capture (eager: t.cpu() at the hook; graph: the same forward captured with a "
                "device copy of each hooked tensor next to its capture, read after the replay). Diagnostic: each "
                "step is also replayed eagerly without capture from the same tok, pos and KV[0..pos-1] (replay_bad; "
                "reference_vs_reference_bad: two uncaptured generations compared), and the generation continues "
                "from the captured step's tok, pos and KV[pos]")


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


def digest(buf) -> bytes:
    return hashlib.blake2b(buf, digest_size=16).digest()


def tensor_digest(t: torch.Tensor) -> bytes:
    """Synchronous reference: the tensor's bytes on the host (.cpu() waits for the device)."""
    c = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
    return digest(c)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN payloads and -0.0 included), on the tensors' device."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


# ------------------------------------------------------------------------------------------------- model


class StaticKV:
    """A static KV cache the decode graph can own: per layer [B, kv_heads, max_len, head_dim], written at the
    device position ``pos`` (index_copy_, no host sync). Duck-typed Cache for Qwen3Attention's update()."""

    is_compileable = True

    def __init__(self, layers, batch, kv_heads, max_len, head_dim, dtype, device, pos):
        shape = (batch, kv_heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.pos = pos

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        self.keys[layer_idx].index_copy_(2, self.pos, key_states)
        self.values[layer_idx].index_copy_(2, self.pos, value_states)
        return self.keys[layer_idx], self.values[layer_idx]

    def get_seq_length(self, layer_idx=0):
        return 0

    def __len__(self):
        return len(self.keys)


class Decoder:
    """Greedy decode of one token per sequence per step; every op is a device op on static tensors, so one
    step can be captured into a CUDA graph and replayed (tok, pos, mask and the cache advance on the device)."""

    def __init__(self, model, cfg, batch, max_len, device, seed):
        self.model, self.batch = model, batch
        dtype = model.dtype
        g = torch.Generator().manual_seed(seed)
        self.start = torch.randint(0, cfg.vocab_size, (batch, 1), generator=g).to(device)
        self.tok = self.start.clone()
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.pos_ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.ar = torch.arange(max_len, device=device)
        self.mask = torch.zeros(batch, 1, 1, max_len, dtype=dtype, device=device)
        self.neg = torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=device)
        self.zero = torch.zeros((), dtype=dtype, device=device)
        # transformers >= 5.2x names the argument `cache` (`past_key_values` is deprecated there)
        params = inspect.signature(model.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"
        self.kv = StaticKV(cfg.num_hidden_layers, batch, cfg.num_key_value_heads, max_len, cfg.head_dim, dtype,
                           device, self.pos)

    def reset(self):
        """The start state of a generation: the start tokens, position 0 and a zeroed KV cache (the positions
        past ``pos`` are masked, but a cache left by the previous generation would make two generations start
        from different states)."""
        self.tok.copy_(self.start)
        self.pos.zero_()
        for t in self.kv.keys + self.kv.values:
            t.zero_()

    def step(self):
        self.pos_ids.copy_(self.pos.expand(self.batch, 1))
        self.mask.copy_(torch.where(self.ar <= self.pos, self.zero, self.neg).expand_as(self.mask))
        out = self.model(input_ids=self.tok, position_ids=self.pos_ids, attention_mask={"full_attention": self.mask},
                         use_cache=True, **{self.cache_kw: self.kv})
        self.tok.copy_(out.logits[:, -1, :].argmax(-1, keepdim=True))
        self.pos.add_(1)


def build_model(args, device):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if args.tiny:
        dims = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    vocab_size=512)
    else:  # Qwen3-0.6B
        dims = dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=16, num_key_value_heads=8,
                    head_dim=128, vocab_size=151936)
    cfg = Qwen3Config(num_hidden_layers=args.layers, max_position_embeddings=40960, rms_norm_eps=1e-6,
                      tie_word_embeddings=True, **dims)
    cfg._attn_implementation = args.attn
    torch.manual_seed(args.seed)
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg)
    model = model.to(device=device, dtype=torch.bfloat16).eval()
    return cfg, model


# ------------------------------------------------------------------------------------------------- D2H side


class Drain(threading.Thread):
    """The consumer: polls the channel in batches and releases the entries; with ``check`` set, records
    (hook, blake2b(bytes)) of every entry."""

    def __init__(self, ch):
        super().__init__(daemon=True)
        self.ch, self.count, self.check, self.items, self.error = ch, 0, False, [], None
        self.batch = 256
        self._halt = threading.Event()
        self._paused = threading.Event()

    def pause(self):
        """Stop polling until resume() (a diagnostic: bench/torch/step_probe.py --drain-during off)."""
        self._paused.set()

    def resume(self):
        self._paused.clear()

    def run(self):
        try:
            while not self._halt.is_set():
                if self._paused.is_set():
                    time.sleep(0.001)
                    continue
                got = self.ch.poll(self.batch, 0.02)  # small batches: short GIL holds
                if self.check:
                    for e in got:
                        self.items.append((e.hook, digest(e.numpy())))
                        e.release()
                else:
                    for e in got:
                        e.release()
                self.count += len(got)
                del got
        except Exception as err:  # reported by wait()
            self.error = err

    def wait(self, n, timeout=120.0):
        end = time.perf_counter() + timeout
        while self.count < n:
            if self.error is not None:
                raise self.error
            if time.perf_counter() > end:
                raise RuntimeError(f"drain: expected {n} entries, got {self.count} after {timeout} s")
            time.sleep(0.001)

    def stop(self):
        self._halt.set()
        self.join()


class Contestant:
    """One contestant of a decode mode. ``steps(n)`` runs n decode steps from the decoder's current state (tok,
    pos, the KV cache): eager ones call ``dec.step()`` (ferry's between begin_forward and end_forward) and need
    their capture hooks installed (``armed()``: a context manager, entered outside the step loop); graph ones
    replay their graph (ferry's after ``ch.plan(plan)``), the hooks baked in. ``entries``: ferry entries per
    step. ``witnessed(step)`` (ferry contestants): one captured step whose every hooked tensor is also copied
    by the same execution, beside ferry's capture, and returns [(step, hook, blake2b)] of those copies (eager:
    ``t.cpu()`` at the hook; graph: the same graph captured with a device copy of each hooked tensor into a
    static buffer next to each capture, read with ``.cpu()`` after the replay)."""

    def __init__(self, steps, armed=None, entries=0, witnessed=None):
        self.steps, self._armed, self.entries, self.witnessed = steps, armed, entries, witnessed

    def armed(self):
        return self._armed() if self._armed is not None else _null()

    def generation(self, n):
        """The timed run: n steps with the hooks installed once around them."""
        with self.armed():
            self.steps(n)


class Bench:
    def __init__(self, args):
        self.args = args
        self.kinds = set(args.contestants.split(","))
        self.pool = None  # decode_mode: one graph memory pool per mode (--pool shared) or one per graph (own)
        self.cuda = args.device == "cuda"
        self.device = torch.device("cuda", 0) if self.cuda else torch.device("cpu")
        if self.cuda:
            self.main = torch.cuda.Stream()  # never the legacy default stream (ferry refuses handle 0)
            self.fstream = None             # ferry: torch's current stream
        else:
            self.fstream = ferry.Stream(backend="host")
        backend = "cuda" if self.cuda else "host"
        self.ch = ferry.Channel(device=0, ring_bytes=args.ring_mib << 20, publish_every=args.publish_every,
                                backend=backend, fifo_capacity=1 << 16, timeout=30.0,
                                branch_publish=args.branch_publish == "on",
                                staged_capture_max_bytes=args.staged_capture_max)
        self.drain = Drain(self.ch)
        self.drain.start()
        self.expected = 0  # entries produced so far
        self.entries_checked = 0
        self.entries_bad = 0
        self.first_bad = None
        self.noise = {}  # graph modes: the no-capture step captured twice (decode_mode)
        self.diag = {"method": CHECK_METHOD, "replay_bad": 0, "reference_vs_reference_bad": 0, "step_token_mismatches": 0,
                     "step_kv_mismatches": 0, "reference_vs_reference": {}, "runs": {}}

    # -- timing
    def sync(self):
        if self.cuda:
            torch.cuda.current_stream().synchronize()
        else:
            self.fstream.synchronize()

    def timed_ms(self, fn):
        if self.cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn()
            e1.record()
            e1.synchronize()
            return e0.elapsed_time(e1)
        t = time.perf_counter()
        fn()
        self.fstream.synchronize()
        return (time.perf_counter() - t) * 1e3

    def capture_fn(self, deferred=False):
        """The hooks' capture call; ``deferred``: the preset's points (those marked deferred use deferred
        capture: one gather launch per batch of up to min(publish_every, 128) entries), or False."""
        use = {"auto": "auto", "ops": True, "core": False}[self.args.capture]
        return fh.capture_fn(self.ch, self.fstream, use_ops=use, device=self.device, deferred=deferred)

    def stream_arg(self):
        return torch.cuda.current_stream() if self.cuda else self.fstream

    # -- contestants: each runs decode steps from the decoder's current state (Contestant.steps)
    def make_runs(self, dec, model, points_by_preset, graph):
        runs: dict[str, Contestant] = {}
        tokens = self.args.tokens
        n_by = {p: len(pts) for p, pts in points_by_preset.items()}

        def uncaptured_graph():
            """A contestant replaying the step captured without any hook."""
            g = self.capture_graph(dec, lambda: dec.step())

            def steps(n):
                for _ in range(n):
                    g.replay()

            return Contestant(steps)

        # no capture
        if graph:
            runs["none"] = uncaptured_graph()
        else:

            def none_eager(n):
                for _ in range(n):
                    dec.step()

            runs["none"] = Contestant(none_eager)

        for preset, pts in points_by_preset.items():
            # ferry (immediate capture: staged up to --staged-capture-max, else a copy kernel per hook) and
            # gather (deferred capture: one gather kernel per batch)
            for kind, deferred in (("ferry", False), ("gather", pts)):
                if kind not in self.kinds:
                    continue
                if graph:
                    holder = {}

                    def ferry_body(holder=holder):
                        s = torch.cuda.current_stream()
                        self.ch.begin_forward(s)
                        dec.step()
                        holder["plan"] = self.ch.end_forward(s)

                    def ferry_warm():
                        self.ch.begin_forward(self.stream_arg())
                        dec.step()
                        self.ch.end_forward(self.stream_arg())

                    hooks = fh.install(model, pts, self.capture_fn(deferred))
                    try:
                        g = self.capture_graph(dec, ferry_body, warm=ferry_warm, warm_entries=n_by[preset])
                    finally:
                        hooks.remove()
                    plan = holder["plan"]

                    def ferry_graph(n, g=g, plan=plan):
                        for _ in range(n):
                            self.ch.plan(plan)
                            g.replay()

                    witnessed_graph = None
                    if self.args.witness == "on":
                        # the witness graph: the same forward, each hooked tensor also copied (device to device)
                        # into a static buffer beside its capture; buffers and hook order come from the warm-up
                        wbufs: dict[int, torch.Tensor] = {}
                        worder: list[int] = []
                        cap = self.capture_fn(deferred)

                        def cap_and_copy(h, t, cap=cap, wbufs=wbufs, worder=worder):
                            cap(h, t)
                            b = wbufs.get(h)
                            if b is None:
                                b = torch.empty_like(t)
                                wbufs[h] = b
                                worder.append(h)
                            b.copy_(t)

                        wholder = {}

                        def witness_body(holder=wholder):
                            s = torch.cuda.current_stream()
                            self.ch.begin_forward(s)
                            dec.step()
                            holder["plan"] = self.ch.end_forward(s)

                        hooks = fh.install(model, pts, cap_and_copy)
                        try:
                            gw = self.capture_graph(dec, witness_body, warm=ferry_warm, warm_entries=n_by[preset])
                        finally:
                            hooks.remove()

                        def witnessed_graph(step, gw=gw, plan=wholder["plan"], wbufs=wbufs, worder=worder):
                            self.ch.plan(plan)
                            gw.replay()
                            self.sync()
                            return [(step, h, tensor_digest(wbufs[h])) for h in worder]
                    runs[f"{kind}:{preset}"] = Contestant(ferry_graph, entries=n_by[preset], witnessed=witnessed_graph)
                else:

                    def ferry_eager(n):
                        s = self.stream_arg()
                        for _ in range(n):
                            self.ch.begin_forward(s)
                            dec.step()
                            self.ch.end_forward(s)

                    def witnessed_eager(step, pts=pts, deferred=deferred, ferry_eager=ferry_eager):
                        cap, got = self.capture_fn(deferred), []

                        def cap_and_copy(h, t):
                            cap(h, t)
                            got.append((step, h, tensor_digest(t)))  # synchronous .cpu() beside the capture

                        with fh.install(model, pts, cap_and_copy):
                            ferry_eager(1)
                        self.sync()
                        return got

                    # the hooks are installed outside the step loop (Contestant.armed), as the timed run does
                    runs[f"{kind}:{preset}"] = Contestant(
                        ferry_eager, lambda pts=pts, deferred=deferred: fh.install(model, pts, self.capture_fn(deferred)),
                        entries=n_by[preset], witnessed=witnessed_eager)

            # torch-native: one pinned buffer per hook, copy_(non_blocking) on the current stream, an event per
            # step after which the host may read them (the buffers are overwritten by the next step).
            pinned: dict[int, torch.Tensor] = {}
            events = [torch.cuda.Event() for _ in range(tokens)] if self.cuda else []

            def torch_copy(h, t, pinned=pinned):
                buf = pinned.get(h)
                if buf is None:
                    buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=self.cuda)
                    pinned[h] = buf
                buf.copy_(t.detach(), non_blocking=True)

            with fh.install(model, pts, torch_copy):
                dec.reset()
                dec.step()  # allocates the pinned buffers outside any capture
                self.sync()
                g = self.capture_graph(dec, lambda: dec.step()) if graph else None
            if graph:

                # the closure holds the pinned buffers: the graph writes them but does not keep them alive
                def torch_graph(n, g=g, events=events, pinned=pinned):
                    for i in range(n):
                        g.replay()
                        events[i].record()
                    events[n - 1].synchronize()

                runs[f"torch:{preset}"] = Contestant(torch_graph)
            else:

                def torch_eager(n, events=events):
                    for i in range(n):
                        dec.step()
                        if self.cuda:
                            events[i].record()
                    if self.cuda:
                        events[n - 1].synchronize()

                runs[f"torch:{preset}"] = Contestant(
                    torch_eager, lambda pts=pts, torch_copy=torch_copy: fh.install(model, pts, torch_copy))
        for key in [k for k in runs if k.startswith("torch:") and "torch" not in self.kinds]:
            del runs[key]  # built (its buffers exist) but not run: --contestants
        if graph:
            # the same uncaptured step captured again, after every other graph: the spread between two captures
            # of one step (where the allocator placed its activations), the noise floor of the graph rows
            runs["none_b"] = uncaptured_graph()
        return runs

    def capture_graph(self, dec, body, warm=None, warm_entries=0):
        """torch.cuda.graph capture of one decode step (the engine's graph), after eager warm-up on a side
        stream."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                dec.reset()
                (warm or body)()
                self.expected += warm_entries
        torch.cuda.current_stream().wait_stream(side)
        self.sync()
        self.drain.wait(self.expected)
        dec.reset()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool, capture_error_mode="thread_local"):
            body()
        self.sync()
        return g

    # -- the reference captures and the check
    def reference(self, dec, model, pts):
        """One whole uncaptured eager generation from the start state, (step, hook, blake2b of t.cpu()) of every
        hooked tensor: only for the reference-vs-reference determinism diagnostic."""
        ref = []
        step = [0]

        def rec(h, t):
            ref.append((step[0], h, tensor_digest(t)))

        dec.reset()
        with fh.install(model, pts, rec):
            for i in range(self.args.tokens):
                step[0] = i
                dec.step()
        self.sync()
        return ref

    def reference_vs_reference(self, name, dec, model, preset, pts):
        """Two uncaptured eager generations with the reference hooks, compared with each other: nonzero means
        the model itself is not bit-reproducible run to run (no ferry involved)."""
        a = self.reference(dec, model, pts)
        b = self.reference(dec, model, pts)
        bad = abs(len(a) - len(b))
        first = None
        for (s, h, d), (_, h2, d2) in zip(a, b):
            if h != h2 or d != d2:
                bad += 1
                first = s if first is None else first
        self.diag["reference_vs_reference_bad"] += bad
        self.diag["reference_vs_reference"][name] = {"preset": preset, "entries": len(a), "bad": bad,
                                                     "first_bad_step": first}
        log(f"  reference vs reference ({preset}): {len(a)} captures, {bad} differ"
            + (f" (first at step {first})" if first is not None else ""))

    def checked_generation(self, name, key, dec, model, pts, c):
        """One untimed generation of contestant ``c`` (a ferry one), checked step by step. The reference of a
        step's ferry entries (entries_bad): the witness copies the same execution made of the same tensors
        beside each capture (``c.witnessed``). A diagnostic besides: each captured step is followed by an
        uncaptured eager replay of the same step from the same state, whose hooked tensors' synchronous
        ``.cpu()`` bytes are compared too (a model that is not bit-reproducible shows there, not in
        entries_bad)."""
        ref, step, witness = [], [0], []

        def rec(h, t):
            ref.append((step[0], h, tensor_digest(t)))

        kv = dec.kv
        layers = range(len(kv.keys))
        diverged: set[int] = set()  # steps whose replay produced another next token or KV[pos]
        tok_mismatches = kv_mismatches = 0
        self.drain.wait(self.expected)
        self.drain.items, self.drain.check = [], True
        dec.reset()
        self.sync()
        for i in range(self.args.tokens):
            tok0, pos0 = dec.tok.clone(), dec.pos.clone()
            # the captured step (graph replay after plan(), or eager with ferry's hooks) and its witness copies
            witness.extend(c.witnessed(i))
            tok1, pos1 = dec.tok.clone(), dec.pos.clone()
            kv1 = [(kv.keys[j].index_select(2, pos0), kv.values[j].index_select(2, pos0)) for j in layers]
            # The reference: the same step again, eager and uncaptured, from the pre-step state (tok, pos). It
            # rewrites KV[pos] of every layer (its cache update runs before its attention reads the cache), so
            # its inputs are exactly the captured step's: tok, pos and KV[0..pos-1], which nothing changed.
            dec.tok.copy_(tok0)
            dec.pos.copy_(pos0)
            step[0] = i
            with fh.install(model, pts, rec):
                dec.step()
            self.sync()
            tok_diff = not torch.equal(dec.tok, tok1)
            kv_diff = any(not same_bits(kv.keys[j].index_select(2, pos0), k1)
                          or not same_bits(kv.values[j].index_select(2, pos0), v1) for j, (k1, v1) in zip(layers, kv1))
            tok_mismatches += int(tok_diff)
            kv_mismatches += int(kv_diff)
            if tok_diff or kv_diff:
                diverged.add(i)
            # continue from the captured step's results: its token, position and KV[pos]
            for j, (k1, v1) in zip(layers, kv1):
                kv.keys[j].index_copy_(2, pos0, k1)
                kv.values[j].index_copy_(2, pos0, v1)
            dec.tok.copy_(tok1)
            dec.pos.copy_(pos1)
        self.sync()
        self.expected += c.entries * self.args.tokens
        self.drain.wait(self.expected)
        self.drain.check = False
        items, self.drain.items = self.drain.items, []
        label = f"{name} {key}"
        res, _ = self.check(items, witness, label)  # entries_bad: ferry's bytes vs the same execution's copies
        rres, bad_steps = self.check(items, ref, f"{label} (vs the uncaptured replay)", count=False)
        res.update(replay_bad=rres["bad"], replay_bad_steps=rres["bad_steps"], token_mismatches=tok_mismatches,
                   kv_mismatches=kv_mismatches, bad_steps_where_replay_diverged=len(bad_steps & diverged))
        self.diag["replay_bad"] += rres["bad"]
        self.diag["step_token_mismatches"] += tok_mismatches
        self.diag["step_kv_mismatches"] += kv_mismatches
        self.diag["runs"][label] = res
        log(f"  replay vs captured step {label}: next token differs in {tok_mismatches}, KV[pos] in "
            f"{kv_mismatches} of {self.args.tokens} steps; {res['bad_steps_where_replay_diverged']} of "
            f"{res['bad_steps']} steps with bad entries are among those")

    def check(self, items, ref, label, count=True):
        """ferry's entries (hook, digest) against the reference captures (step, hook, digest), in order: the
        counts for JSON "check" and the set of steps with a bad entry; ``count``: add to entries_checked /
        entries_bad."""
        n = len(ref)
        bad = 0
        if len(items) != n:
            bad += abs(len(items) - n)
        by_hook: dict[int, int] = {}
        bad_steps: set[int] = set()
        for i, ((h, d), (s, rh, rd)) in enumerate(zip(items, ref)):
            if h != rh or d != rd:
                bad += 1
                by_hook[rh] = by_hook.get(rh, 0) + 1
                bad_steps.add(s)
                if count and self.first_bad is None:
                    what = f"hook {h} vs reference hook {rh}" if h != rh else f"hook {h}: bytes differ"
                    self.first_bad = f"{label}: entry {i} (step {s}): {what}"
        if count:
            self.entries_checked += len(items)
            self.entries_bad += bad
        worst = sorted(by_hook.items(), key=lambda kv: -kv[1])[:12]
        log(f"  check {label}: {len(items)} entries against {n} reference captures, {bad} bad"
            + (f" in {len(bad_steps)} steps; bad per hook id (top): {worst}" if bad else ""))
        return {"entries": len(items), "reference": n, "bad": bad, "bad_steps": len(bad_steps),
                "first_bad_step": min(bad_steps) if bad_steps else None}, bad_steps

    # -- one mode
    def decode_mode(self, name, batch, graph, model, cfg, presets):
        args = self.args
        log(f"{name}: B={batch} {'graph' if graph else 'eager'}")
        max_len = args.cache if args.cache else args.tokens + 1
        dec = Decoder(model, cfg, batch, max_len, self.device, args.seed + batch)
        pts = {p: fh.preset(model, p) for p in presets}
        rp = "vllm-full" if "vllm-full" in presets else presets[0]
        self.reference_vs_reference(name, dec, model, rp, pts[rp])
        # a fresh pool per mode: torch refuses a pool handle whose graphs were all destroyed (the last mode's)
        self.pool = torch.cuda.graph_pool_handle() if graph and args.pool == "shared" else None
        runs = self.make_runs(dec, model, pts, graph)
        times: dict[str, list[float]] = {k: [] for k in runs}
        reps = args.graph_reps if graph else args.eager_reps
        for rep in range(reps + 1):  # rep 0: warm-up, not recorded
            for key, c in runs.items():
                self.drain.wait(self.expected)
                dec.reset()
                self.sync()
                if args.drain_during == "off":
                    self.drain.pause()
                try:
                    ms = self.timed_ms(lambda: c.generation(args.tokens))
                except Exception:  # an asynchronous fault of this generation surfaces here: name the contestant
                    log(f"  FAILED in the timed generation of {key} (rep {rep})")
                    raise
                self.drain.resume()
                self.expected += c.entries * args.tokens
                self.drain.wait(self.expected)
                if rep:
                    times[key].append(ms)
            if rep:
                log(f"  rep {rep}/{reps}: " + ", ".join(f"{k} {v[-1]:.1f} ms" for k, v in times.items()))
        for key, c in runs.items():  # untimed: one checked generation per ferry contestant and preset
            if key.startswith(("ferry:", "gather:")) and c.witnessed is not None:
                self.checked_generation(name, key, dec, model, pts[key.split(":")[1]], c)
        med = {k: statistics.median(v) for k, v in times.items()}
        out = {"no_capture_ms": med["none"]}
        if "none_b" in med:
            self.noise[name] = {"no_capture_ms": med["none"], "second_capture_ms": med["none_b"],
                                "spread_pct": 100.0 * (med["none_b"] / med["none"] - 1)}
        for p in presets:
            out[p.replace("-", "_")] = {"ferry_ms": med.get(f"ferry:{p}"), "gather_ms": med.get(f"gather:{p}"),
                                        "torch_copy_ms": med.get(f"torch:{p}")}
        return out

    def cpu_per_hook(self, n=2000):
        """CPU us per capture call in an eager forward: the bare binding call (Channel.capture or the torch op)
        and the same call through a ferry.hooks forward hook (minus the module call itself)."""
        t = torch.randn(1024, device=self.device).to(torch.bfloat16)  # 2 KiB
        ident = torch.nn.Identity()
        cap = self.capture_fn()
        s = self.stream_arg()

        def timed(fn):
            self.ch.begin_forward(s)
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            dt = (time.perf_counter() - t0) / n * 1e6
            self.ch.end_forward(s)
            self.sync()
            return dt

        bare = timed(lambda: cap(7, t))
        self.expected += n
        plain = timed(lambda: ident(t))
        with fh.install(ident, [fh.HookPoint(7, "x", "", "output")], cap):
            hooked = timed(lambda: ident(t))
        self.expected += n
        self.drain.wait(self.expected)
        out = {"capture_call_us": bare, "module_call_us": plain, "hooked_module_call_us": hooked,
               "hook_layer_us": hooked - plain - bare}
        log("cpu per hook: " + ", ".join(f"{k} {v:.2f}" for k, v in out.items()))
        return out

    def close(self):
        try:
            self.drain.wait(self.expected, timeout=30.0)
        except Exception as err:
            log(f"drain at close: {err}")
        self.drain.stop()
        try:
            return self.ch.close(timeout=30.0)
        except ferry.Error as err:
            log(f"channel close: {err}")
            return {"clean": False}


# ------------------------------------------------------------------------------------------------- H2D side

H2D_BATCH = 64
H2D_BLOCKS = 128  # block-table row length (2,048 tokens at block size 16)


def h2d_specs(cap):
    # name, dtype, per-row elements (1 = a vector), count for n requests
    return [("input_ids", torch.int32, 1, lambda n: n), ("positions", torch.int64, 1, lambda n: n),
            ("slot_mapping", torch.int64, 1, lambda n: n), ("seq_lens", torch.int32, 1, lambda n: n),
            ("query_start_loc", torch.int32, 1, lambda n: n + 1), ("block_table", torch.int32, H2D_BLOCKS, lambda n: n),
            ("temperature", torch.float32, 1, lambda n: n), ("top_p", torch.float32, 1, lambda n: n),
            ("top_k", torch.int32, 1, lambda n: n)]


def h2d_step(bench, args):
    """Median GPU span in us: {"eager": {"torch_copies_us", "ferry_us"}, "graph": {...}} (graph: CUDA only)."""
    dev, cuda = bench.device, bench.cuda
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
    owner = bench.stream_arg()  # the publisher's owner stream: its graph uploads are captured on it
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
        bench.sync()
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
            bench.sync()
        spans = {"torch": [], "ferry": []}
        it = 0
        for rep in range(args.h2d_reps + 1):
            for who in ("torch", "ferry"):
                for j in range(args.h2d_iters):
                    i, slot = it % steps, it % 2
                    it += 1
                    if who == "torch":
                        bench.sync()  # the pinned sources are reused: the previous upload must have read them
                        fill_torch(i)
                        fn = (lambda: g_t.replay()) if mode == "graph" else (lambda: (upload_torch(), consume(tgpu)))
                        us = bench.timed_ms(fn) * 1e3
                        if j == 0:
                            check(tgpu, i, f"{mode} torch")
                    else:
                        with pub.begin(slot):
                            fill_ferry(i, slot)
                            if mode == "graph":
                                pub.stage("step")
                                us = bench.timed_ms(lambda: g_f[slot].replay()) * 1e3
                            else:
                                us = bench.timed_ms(lambda: (pub.publish("step", bench.stream_arg()), consume(fgpu))) * 1e3
                        if j == 0:
                            check(fgpu, i, f"{mode} ferry")
                    if rep:
                        spans[who].append(us)
        results[mode] = {"torch_copies_us": statistics.median(spans["torch"]),
                         "ferry_us": statistics.median(spans["ferry"])}
        log(f"h2d {mode}: torch copies {results[mode]['torch_copies_us']:.1f} us, "
            f"ferry {results[mode]['ferry_us']:.1f} us (info {pub.info('step')})")
    return results


# ------------------------------------------------------------------------------------------------- main


def main(argv=None):
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
                    help="Channel(branch_publish=...): batch releases on a branch (on) or on the stream (off)")
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
    ap.add_argument("--staged-capture-max", type=int, default=16384,
                    help="Channel(staged_capture_max_bytes=...): immediate captures up to this size staged (0: off; "
                         "the default stages every hook but the logits: a device copy per hook, one gather per 128)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--commit", default=None)
    args = ap.parse_args(argv)
    faulthandler.enable()  # a crash prints every thread's Python stack
    sys.setswitchinterval(2e-4)  # the consumer thread hands the GIL back to the engine's thread quickly
    cpu = args.device == "cpu"
    args.eager_reps = args.eager_reps if args.eager_reps is not None else (1 if cpu else 3)
    args.h2d_iters = args.h2d_iters if args.h2d_iters is not None else (20 if cpu else 200)
    if cpu:
        args.cache = args.cache if args.cache and args.cache <= args.tokens + 1 else 0

    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    cfg, model = build_model(args, device)
    log(f"model: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, vocab {cfg.vocab_size}, "
        f"device {device}, transformers attention {args.attn}")
    bench = Bench(args)
    ctx = torch.cuda.stream(bench.main) if bench.cuda else _null()
    presets = [p for p in args.presets.split(",") if p]
    decode, failures, h2d, report, cpu_hook = {}, [], {}, {}, {}
    mode_specs = {"b1_eager": (1, False), "b1_graph": (1, True), "b16_graph": (16, True)}
    try:
        with torch.inference_mode(), ctx:
            for name in [m for m in args.modes.split(",") if m]:  # --modes "": H2D only
                batch, graph = mode_specs[name]
                if graph and not bench.cuda:
                    log(f"{name}: skipped (graphs need --device cuda)")
                    continue
                try:
                    decode[name] = bench.decode_mode(name, batch, graph, model, cfg, presets)
                except Exception:  # keep the other modes' figures; the run still fails at the end
                    failures.append(name)
                    log(f"{name}: FAILED\n{traceback.format_exc()}")
            try:
                cpu_hook = bench.cpu_per_hook()
            except Exception:
                failures.append("cpu_per_hook")
                log(f"cpu_per_hook: FAILED\n{traceback.format_exc()}")
            if args.h2d_iters > 0:
                try:
                    h2d = h2d_step(bench, args)
                except Exception:
                    failures.append("h2d_step")
                    log(f"h2d_step: FAILED\n{traceback.format_exc()}")
    finally:
        report = bench.close()
    for mode in ("eager", "graph"):
        h2d.setdefault(mode, {"torch_copies_us": None, "ferry_us": None})
    for name in mode_specs:
        decode.setdefault(name, {"no_capture_ms": None,
                                 **{p.replace("-", "_"): {"ferry_ms": None, "gather_ms": None, "torch_copy_ms": None}
                                    for p in ("hidden-states", "vllm-full")}})

    out = {
        "device": torch.cuda.get_device_name(0) if bench.cuda else "cpu (ferry host backend)",
        "commit": args.commit or os.environ.get("FERRY_COMMIT") or _git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "decode": decode,
        "entries_checked": bench.entries_checked,
        "entries_bad": bench.entries_bad,
        "h2d_step": h2d,
        "check": bench.diag,
        "noise": bench.noise,
        "config": {"pool": args.pool, "publish_every": args.publish_every, "ring_mib": args.ring_mib,
                   "branch_publish": args.branch_publish, "capture": args.capture, "witness": args.witness,
                   "drain_during": args.drain_during, "staged_capture_max": args.staged_capture_max,
                   "h2d_upload": args.h2d_upload},
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")

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
    for name, nz in bench.noise.items():
        print(f"{name} no_capture captured twice: {nz['no_capture_ms']:.2f} / {nz['second_capture_ms']:.2f} ms "
              f"({nz['spread_pct']:+.2f}%: the graph rows' noise floor)")
    print(f"entries_checked {bench.entries_checked} entries_bad {bench.entries_bad}"
          + (f" first_bad: {bench.first_bad}" if bench.first_bad else ""))
    dg = bench.diag
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
    return 0 if bench.entries_bad == 0 and not failures else 1


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except Exception:
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
