#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Tensor-parallel capture (issue 42): what ferry's per-rank capture costs a TP decode step, beside gathering in
the forward, and whether ``ferry.tp.open`` assembles every captured tensor to the TP=1 model's.

The model: --layers decoder-like blocks, Qwen3-0.6B-shaped by default (hidden 1024, 16 query heads and 8 KV heads
of 128, ffn 3072, 28 layers), random weights from one seeded generator (the full weights are drawn on every rank,
each rank keeps its slices, rank 0 the full ones for the reference), bf16 on CUDA, float32 on the CPU. Megatron-
style TP written by hand: attention as its TP shape (a column-parallel fused qkv projection, this rank's heads,
q/k RMSNorm, causal attention over the step's own tokens, no KV cache, no rotary: ``z`` [tokens, local_heads *
head_dim], then the row-parallel o_proj + all_reduce), the MLP (column-parallel gate/up, ``act = silu(gate) * up``
[tokens, ffn / world], row-parallel down + all_reduce), RMSNorms and residual adds. A decode step is --batch
tokens (default 64).

Contestants, round-robin in one run (a warm-up round, then --reps rounds; the median), every rank timing each
step (CUDA events on the step's stream; wall time on the CPU), rank 0 reporting:
  none       the step, no capture
  ferry      each rank its own ferry.Channel and ferry.sinks.safetensors(<dir>/rank{r}): per layer the residual
             stream after it (layers.{i}.hidden: replicated, rank 0 only) and layers.{i}.attn.z, layers.{i}.mlp.act
             (sharded: ferry.tp.spec, dim 0 of the row), capture_deferred (a gather per 128 entries: one per step
             at 28 layers), a forward tagged by its step; nothing gathered across ranks
  allgather  the in-forward gather (nnsight-style): each sharded tensor all_gather_into_tensor'ed inside the step,
             rank 0 copying every whole tensor to pinned host buffers (non_blocking)
On CUDA each contestant's step is captured once into a torch.cuda.CUDAGraph (NCCL collectives included) and
replayed, ferry's after ``ch.plan(plan, tag=step)``; on the CPU (gloo, ferry's host backend) every step is eager.
Before each timed step the ranks meet (a gloo barrier; on CUDA also a one-element all_reduce and a short GPU sleep
before the start event, so both ranks' steps start together and the host has launched the step by then); after a
ferry step, untimed, the rank waits until its channel and sink have taken everything (no backlog in the next
turn).

Check (after the timing, untimed): one more ferry step on every rank, with its own tag and an input of its own;
the channels and sinks closed, rank 0 runs the TP=1 model (full weights, the same input) and compares each tensor
that ``ferry.tp.open`` assembles from the ranks' runs against it, layer by layer (check(): ``tensors_checked``,
``tensors_bad``; the tolerance: TOL).

Output (rank 0; docs/perf/h200/tp.json): {"device","commit","date","command","tp","no_capture_us","ferry_us",
"allgather_us","tensors_checked","tensors_bad","overhead_pct":{"ferry","allgather"},"spread_us":{contestant: [min,
max]}} and, to read them by, "per_rank_us" (each rank's medians), "model", "reps", "tolerance", "max_rel_err",
"max_rel_err_end_to_end", "forwards_written" (of the timed and checked steps, all in the runs). The exit status is
0 whatever tensors_bad is (the reader checks it).

  torchrun --nproc-per-node 2 bench/torch/tp_bench.py --out tp.json                 # GPU (NCCL), TP=2
  torchrun --nproc-per-node 2 bench/torch/tp_bench.py --device cpu --tiny --out /tmp/tp.json   # smoke (gloo)

The run directories go to --dir (kept), else to a fresh directory under /dev/shm (when it has room; else the temp
directory) that rank 0 removes at the end. Every rank must see it: one host.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

import ferry
import ferry.tp
from qwen3bench.drain import settle_sink
from qwen3bench.meta import device_name, header, log, write_json

QWEN3 = {"hidden": 1024, "heads": 16, "kv_heads": 8, "head_dim": 128, "ffn": 3072, "layers": 28}
TINY = {"hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16, "ffn": 128, "layers": 2}
KINDS = ("none", "ferry", "allgather")
HIDDEN, Z, ACT = 0, 1, 2  # a layer's hooks: hook id 3 * layer + kind
NAMES = ("layers.{}.hidden", "layers.{}.attn.z", "layers.{}.mlp.act")
# An assembled tensor is good when ||got - ref|| / ||ref|| (Frobenius, in float64) is at most TOL[dtype], ref being
# the TP=1 model's layer run on the same input (check()). The two differ by rounding only: the row-parallel
# linears' partial sums are reduced in a different order than the unsharded matmul's (each rank's partial sum of
# o_proj / down rounded to the dtype before the all-reduce adds them, where the unsharded matmul accumulates in
# fp32 and rounds once), and GEMMs of other shapes block differently. float32: ~1e-6. bf16: ~4e-3 (act, measured
# on the Qwen3 shapes), the hidden state and z less. A norm rather than an elementwise bound: an element near zero
# has no useful relative error.
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
MADE: list[str] = []  # the run directory rank 0 made (removed at the end, also when the run fails)


def rms_norm(x, w, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def full_weights(cfg, batch, seed, dtype):
    """The TP=1 model's weights, the timed steps' input and the checked step's (CPU), drawn from one seeded
    generator in a fixed order: the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    hid, hd, heads, kv, ffn = cfg["hidden"], cfg["head_dim"], cfg["heads"], cfg["kv_heads"], cfg["ffn"]

    def lin(o, i):  # [out, in], N(0, 1 / in): activations stay O(1) through the layers
        return (torch.randn(o, i, generator=g) / math.sqrt(i)).to(dtype)

    def norm(n):
        return (1 + 0.1 * torch.randn(n, generator=g)).to(dtype)

    layers = []
    for _ in range(cfg["layers"]):
        layers.append({"ln1": norm(hid), "q": lin(heads * hd, hid), "k": lin(kv * hd, hid), "v": lin(kv * hd, hid),
                       "q_norm": norm(hd), "k_norm": norm(hd), "o": lin(hid, heads * hd), "ln2": norm(hid),
                       "gate": lin(ffn, hid), "up": lin(ffn, hid), "down": lin(hid, ffn)})
    x = torch.randn(batch, hid, generator=g).to(dtype)
    x_check = torch.randn(batch, hid, generator=g).to(dtype)
    return layers, x, x_check


def shard(layer, cfg, rank, world):
    """Rank `rank`'s slices of one layer: the column-parallel weights' rows (fused qkv: this rank's query heads,
    then its KV heads; fused gate/up), the row-parallel weights' columns (o_proj, down)."""
    hd = cfg["head_dim"]
    lq, lkv, lf = cfg["heads"] // world * hd, cfg["kv_heads"] // world * hd, cfg["ffn"] // world

    def rows(w, n):
        return w[rank * n:(rank + 1) * n]

    def cols(w, n):
        return w[:, rank * n:(rank + 1) * n].contiguous()

    return {"ln1": layer["ln1"], "ln2": layer["ln2"], "q_norm": layer["q_norm"], "k_norm": layer["k_norm"],
            "qkv": torch.cat([rows(layer["q"], lq), rows(layer["k"], lkv), rows(layer["v"], lkv)]),
            "o": cols(layer["o"], lq), "gate_up": torch.cat([rows(layer["gate"], lf), rows(layer["up"], lf)]),
            "down": cols(layer["down"], lf)}


class TPModel:
    """Rank `rank` of `world` of the model (world 1: the TP=1 model, no collective). ``model(x, cap)`` runs one
    step; ``cap(layer, kind, tensor)`` (kind HIDDEN, Z or ACT) sees each hooked tensor, this rank's slice of a
    sharded one. Every op makes a new tensor: nothing hooked is written in place afterwards (capture_deferred's
    contract)."""

    def __init__(self, layers, cfg, rank, world, device):
        self.world, self.hd = world, cfg["head_dim"]
        self.lh, self.lkv, self.lf = cfg["heads"] // world, cfg["kv_heads"] // world, cfg["ffn"] // world
        self.layers = [{k: v.to(device) for k, v in shard(p, cfg, rank, world).items()} for p in layers]

    def reduce(self, t):
        if self.world > 1:
            dist.all_reduce(t)

    def attention(self, p, x):
        """z [tokens, local_heads * head_dim]: this rank's heads, causal over the step's tokens."""
        n, hd, lh, lkv = x.shape[0], self.hd, self.lh, self.lkv
        q, k, v = F.linear(x, p["qkv"]).split([lh * hd, lkv * hd, lkv * hd], dim=1)
        q = rms_norm(q.reshape(n, lh, hd), p["q_norm"]).transpose(0, 1)  # [heads, tokens, head_dim]
        k = rms_norm(k.reshape(n, lkv, hd), p["k_norm"]).transpose(0, 1)
        v = v.reshape(n, lkv, hd).transpose(0, 1)
        if lkv != lh:  # grouped-query: each KV head serves lh / lkv query heads (the same on every rank)
            k, v = k.repeat_interleave(lh // lkv, dim=0), v.repeat_interleave(lh // lkv, dim=0)
        o = F.scaled_dot_product_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), is_causal=True)[0]
        return o.transpose(0, 1).reshape(n, lh * hd).contiguous()

    def layer(self, i, x, cap=None):
        """Layer `i` on the residual stream `x`: the stream after it."""
        p = self.layers[i]
        z = self.attention(p, rms_norm(x, p["ln1"]))
        if cap is not None:
            cap(i, Z, z)
        a = F.linear(z, p["o"])  # this rank's partial sum of o_proj
        self.reduce(a)
        h = x + a
        gate, up = F.linear(rms_norm(h, p["ln2"]), p["gate_up"]).split(self.lf, dim=1)
        act = F.silu(gate) * up
        if cap is not None:
            cap(i, ACT, act)
        m = F.linear(act, p["down"])
        self.reduce(m)
        x = h + m
        if cap is not None:
            cap(i, HIDDEN, x)
        return x

    def __call__(self, x, cap=None):
        for i in range(len(self.layers)):
            x = self.layer(i, x, cap)
        return x


def schema(cfg, dtype, rank, world):
    """The rank's hook schema: the sharded z and act on every rank, the replicated hidden on rank 0 only."""
    s, hd = {}, cfg["head_dim"]
    for i in range(cfg["layers"]):
        if rank == 0:
            s[3 * i + HIDDEN] = (NAMES[HIDDEN].format(i), dtype, (cfg["hidden"],))
        s[3 * i + Z] = ferry.tp.spec(NAMES[Z].format(i), dtype, (cfg["heads"] // world * hd,), 0, rank, world)
        s[3 * i + ACT] = ferry.tp.spec(NAMES[ACT].format(i), dtype, (cfg["ffn"] // world,), 0, rank, world)
    return s


def step_bytes(sch, batch, dtype):
    """Bytes one step captures under schema `sch`."""
    size = torch.empty((), dtype=dtype).element_size()
    return sum(batch * math.prod(spec[2]) * size for spec in sch.values())


class FerryCap:
    """The ferry contestant's hook: every tensor of the rank's schema, deferred (one gather per batch)."""

    def __init__(self, ch, stream, hooks):
        self.ch, self.stream, self.hooks = ch, stream, hooks

    def __call__(self, i, kind, t):
        if 3 * i + kind in self.hooks:
            self.ch.capture_deferred(3 * i + kind, t, self.stream)


class GatherCap:
    """The in-forward gather contestant: each sharded tensor all-gathered inside the step, rank 0 copying every
    whole tensor (the gathered ones as [world * tokens, local]: rank-major, the host can reorder them) into pinned
    host buffers, non_blocking."""

    def __init__(self, cfg, batch, dtype, rank, world, pinned):
        self.rank, self.world = rank, world
        hd, self.host = cfg["head_dim"], {}
        if rank == 0:
            widths = {HIDDEN: (batch, cfg["hidden"]), Z: (world * batch, cfg["heads"] // world * hd),
                      ACT: (world * batch, cfg["ffn"] // world)}
            for i in range(cfg["layers"]):
                for kind, shape in widths.items():
                    self.host[(i, kind)] = torch.empty(shape, dtype=dtype, pin_memory=pinned)

    def __call__(self, i, kind, t):
        if kind != HIDDEN:
            whole = torch.empty((self.world * t.shape[0], t.shape[1]), dtype=t.dtype, device=t.device)
            dist.all_gather_into_tensor(whole, t)
            t = whole
        if self.rank == 0:
            self.host[(i, kind)].copy_(t, non_blocking=True)


class Rank:
    """One rank's model, channel, sink and the contestants' steps."""

    def __init__(self, a, cfg, layers, x, rank, world, local, base):
        self.a, self.cfg, self.rank, self.world = a, cfg, rank, world
        self.cuda = a.device == "cuda"
        self.dev = torch.device("cuda", local) if self.cuda else torch.device("cpu")
        self.model = TPModel(layers, cfg, rank, world, self.dev)
        self.x = x.to(self.dev)
        self.dir = os.path.join(base, f"rank{rank}")
        self.schema = schema(cfg, a.dtype, rank, world)
        per_step = step_bytes(self.schema, a.batch, a.dtype)
        self.sink = ferry.sinks.safetensors(self.dir, self.schema, overwrite=True, policy="block",
                                            max_queue_bytes=max(64 << 20, 4 * per_step), block_timeout=60.0)
        ring = 1 << max(24, (4 * per_step - 1).bit_length())  # 4 steps, a power of two, >= 16 MiB
        self.ch = ferry.Channel(local if self.cuda else 0, backend="cuda" if self.cuda else "host", ring_bytes=ring,
                                publish_every=3 * cfg["layers"] + 1, timeout=60.0, sink=self.sink)
        # a side stream (ferry refuses torch's legacy default stream); the host backend's own stream on the CPU
        self.stream = torch.cuda.Stream(self.dev) if self.cuda else ferry.Stream(backend="host")
        self.caps = {"none": None, "ferry": FerryCap(self.ch, self.stream, set(self.schema)),
                     "allgather": GatherCap(cfg, a.batch, a.dtype, rank, world, self.cuda)}
        self.tag = 0  # the next ferry forward's tag: the same sequence on every rank
        self.steps = self._graphs() if self.cuda else {k: self._eager(k) for k in KINDS}

    def _eager(self, kind):
        ch, s, cap = self.ch, self.stream, self.caps[kind]

        def run(tag):
            if kind == "ferry":
                ch.begin_forward(s, tag=tag)
            self.model(self.x, cap)
            if kind == "ferry":
                ch.end_forward(s)
        return run

    def _graphs(self):
        """Each contestant's step captured into a CUDA graph on the side stream, after eager warm-up steps there
        (NCCL's communicator, cuBLAS' workspaces, lazily loaded kernels); the ranks capture in the same order."""
        s = self.stream
        s.wait_stream(torch.cuda.current_stream(self.dev))
        with torch.cuda.stream(s):
            for _ in range(2):
                self.model(self.x)
                self.model(self.x, self.caps["allgather"])
        torch.cuda.synchronize(self.dev)
        steps = {}
        for kind in KINDS:
            g = torch.cuda.CUDAGraph()
            # thread_local: ferry's drain thread (and NCCL's watchdog) make CUDA calls of their own meanwhile
            with torch.cuda.graph(g, stream=s, capture_error_mode="thread_local"):
                if kind == "ferry":
                    self.ch.begin_forward(s)
                self.model(self.x, self.caps[kind])
                plan = self.ch.end_forward(s) if kind == "ferry" else None
            steps[kind] = self._replay(g, plan)
        torch.cuda.synchronize(self.dev)
        return steps

    def _replay(self, g, plan):
        def run(tag):
            if plan is not None:
                self.ch.plan(plan, self.stream, tag=tag)  # this replay's ring space, its forward's tag
            g.replay()
        return run

    def run(self, kind):
        """One step of `kind` (on the side stream on CUDA); a ferry step takes the next tag."""
        tag = None
        if kind == "ferry":
            tag, self.tag = self.tag, self.tag + 1
        self.steps[kind](tag)
        return tag

    def settle(self, timeout=120.0):
        settle_sink(self.ch, self.sink, f"rank {self.rank}: sink {self.dir}", timeout)

    def close(self):
        """Closes the channel, then the sink: (channel report clean, the sink's first error or None)."""
        rep = self.ch.close(timeout=60.0)
        stats = self.sink.close()
        return bool(rep.get("clean", True)), stats.get("first_error")


class Timer:
    """Times one step of a contestant on every rank, the ranks starting together."""

    def __init__(self, r, cpu_group, lead_us):
        self.r, self.group = r, cpu_group
        if r.cuda:
            self.align = torch.zeros(1, device=r.dev)
            self.e0, self.e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.lead = self._cycles(lead_us)

    def _cycles(self, us):
        """torch.cuda._sleep's cycles for `us` microseconds, measured."""
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.r.stream):
            torch.cuda._sleep(1 << 16)
            e0.record()
            torch.cuda._sleep(1 << 22)
            e1.record()
        e1.synchronize()
        return int((1 << 22) * us / max(e0.elapsed_time(e1) * 1e3, 1e-3))

    def __call__(self, kind):
        """Microseconds of one step of `kind` on this rank."""
        r = self.r
        if r.cuda:
            torch.cuda.synchronize(r.dev)
        dist.barrier(group=self.group)
        if r.cuda:
            with torch.cuda.stream(r.stream):
                dist.all_reduce(self.align)  # the GPUs meet here; the sleep lets the host launch the step first
                torch.cuda._sleep(self.lead)
                self.e0.record()
                r.run(kind)
                self.e1.record()
            self.e1.synchronize()
            us = self.e0.elapsed_time(self.e1) * 1e3
        else:
            t = time.perf_counter()
            r.run(kind)
            r.stream.synchronize()
            us = (time.perf_counter() - t) * 1e6
        if kind == "ferry":
            r.settle()  # untimed: the next turn starts without this one's backlog
        return us


def to_float(a):
    """A read-back array as a float32 torch tensor (BF16 without ml_dtypes comes as its uint16 bits)."""
    a = np.array(a)
    if a.dtype == np.uint16:
        return torch.from_numpy(a).view(torch.bfloat16).float()
    return torch.from_numpy(a.astype(np.float32))


def check(layers, cfg, x, dtype, device, dirs, tag):
    """The forward tagged `tag` as ferry.tp.open assembles it from the ranks' runs `dirs`, against the TP=1 model
    (full weights) on its input `x`: {"checked", "bad", "max_rel_err", "max_rel_err_end_to_end", "forwards"}.

    Layer by layer: layer i of the TP=1 model runs on the residual stream that ferry captured after layer i - 1
    (layer 0 on `x`), and its z, act and hidden are compared (TOL). Run end to end instead, the two models' rounding
    differences add up over the layers (a random walk: in bf16, from ~4e-3 at layer 0 to ~3e-2 at layer 27 of the
    Qwen3 shapes, measured with gloo on the CPU), which says nothing about the capture; that end-to-end error is
    reported beside (``max_rel_err_end_to_end``), not judged. A tensor captured wrong (a slice at the wrong offset,
    a stale buffer, another step's forward: the checked step's input is its own) is off by O(1) where it goes
    wrong."""
    run = ferry.tp.open(dirs)
    got = run.forward(tag)
    ref = TPModel(layers, cfg, 0, 1, device)
    forced, e2e = {}, {}

    def keep(into):
        return lambda i, kind, t: into.__setitem__(NAMES[kind].format(i), t.float().cpu())

    with torch.no_grad():
        ref(x.to(device), keep(e2e))
        prev = x.to(device)
        for i in range(cfg["layers"]):
            prev = ref.layer(i, prev, keep(forced))
            name = NAMES[HIDDEN].format(i)
            if name in got and tuple(got[name].shape) == tuple(prev.shape):
                prev = to_float(got[name]).to(device=device, dtype=dtype)  # what ferry captured feeds layer i + 1

    def rel(name, want):
        return ((to_float(got[name]).double() - want.double()).norm() / max(want.double().norm().item(),
                                                                              1e-30)).item()

    bad, worst, tol = 0, 0.0, TOL[dtype]
    for name, want in forced.items():
        if name not in got or tuple(got[name].shape) != tuple(want.shape):
            log(f"  bad: {name}: {'missing' if name not in got else f'shape {tuple(got[name].shape)}'}, expected "
                f"{tuple(want.shape)}")
            bad += 1
            continue
        err = rel(name, want)
        if not math.isfinite(err) or err > tol:
            log(f"  bad: {name}: relative error {err:.3g} > {tol}")
            bad += 1
        worst = max(worst, err) if math.isfinite(err) else math.inf
    e2e_worst = max((rel(n, w) for n, w in e2e.items() if n in got and tuple(got[n].shape) == tuple(w.shape)),
                    default=math.nan)
    extra = set(got) - set(forced)
    if extra:
        log(f"  unexpected tensors in forward {tag}: {sorted(extra)}")
    return {"checked": len(forced), "bad": bad, "max_rel_err": worst, "max_rel_err_end_to_end": e2e_worst,
            "forwards": len(run.tags)}


def pick_dir(need):
    """A fresh directory for the runs: under /dev/shm when it has twice `need` bytes free, else the temp dir."""
    for base in ("/dev/shm", tempfile.gettempdir()):
        try:
            st = os.statvfs(base)
        except OSError:
            continue
        if st.f_bavail * st.f_frsize > 2 * need:
            return tempfile.mkdtemp(prefix="ferry-tp-", dir=base)
    return tempfile.mkdtemp(prefix="ferry-tp-")


def command(world):
    argv = " ".join(sys.argv)
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return f"torchrun --nproc-per-node {os.environ.get('LOCAL_WORLD_SIZE', world)} {argv}"
    return f"{sys.executable} {argv} (rank 0 of {world})"


def bench(a):
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", rank))
    cfg = dict(TINY if a.tiny else QWEN3)
    if a.layers:
        cfg["layers"] = a.layers
    for key in ("heads", "kv_heads", "ffn"):
        if cfg[key] % world:
            raise SystemExit(f"tp_bench: {key} {cfg[key]} is not a multiple of the world size {world}")
    cuda = a.device == "cuda"
    timeout = datetime.timedelta(seconds=a.timeout)
    if world == 1:  # a plain `python tp_bench.py`: TP=1, its own store on a port the OS picks
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "0")
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
    if cuda:
        torch.cuda.set_device(local)
    # a failing rank makes the others fail after `timeout` instead of hanging
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timeout)
    cpu = dist.new_group(backend="gloo", timeout=timeout) if cuda else None  # barriers and objects
    log(f"rank {rank} of {world}: {'cuda:%d' % local if cuda else 'cpu'}, {cfg}, batch {a.batch}, {a.dtype}")

    made = a.dir is None
    base = [a.dir]
    if rank == 0 and made:
        s0, s1 = (step_bytes(schema(cfg, a.dtype, r, world), a.batch, a.dtype) for r in (0, min(1, world - 1)))
        base = [pick_dir((a.reps + 2) * (s0 + (world - 1) * s1))]
        MADE.append(base[0])
    dist.broadcast_object_list(base, src=0, group=cpu)
    base = base[0]
    os.makedirs(base, exist_ok=True)

    t0 = time.perf_counter()
    layers, x, x_check = full_weights(cfg, a.batch, a.seed, a.dtype)
    with torch.no_grad():  # not inference_mode: capture_deferred checks the tensors' version counters
        r = Rank(a, cfg, layers, x, rank, world, local, base)
        if rank != 0:
            layers = None  # rank 0 keeps the full weights for the TP=1 reference
        log(f"rank {rank}: model built, steps made in {time.perf_counter() - t0:.1f} s; runs in {base}")
        timer = Timer(r, cpu, a.lead_us)
        times = {k: [] for k in KINDS}
        for rep in range(a.reps + 1):  # round 0 warms up
            for kind in KINDS:
                us = timer(kind)
                if rep:
                    times[kind].append(us)
        med = {k: statistics.median(v) for k, v in times.items()}
        log(f"rank {rank}: medians (us): " + ", ".join(f"{k} {v:.1f}" for k, v in med.items()))

        # the checked step: one more ferry forward, its own tag and an input of its own (the timed steps all had
        # the same: a forward read back from another step would pass unnoticed)
        if cuda:
            torch.cuda.synchronize(r.dev)
        dist.barrier(group=cpu)
        if cuda:
            with torch.cuda.stream(r.stream):
                r.x.copy_(x_check)  # the graphs read their input from r.x at every replay
                check_tag = r.run("ferry")
            r.stream.synchronize()
        else:
            r.x.copy_(x_check)
            check_tag = r.run("ferry")
            r.stream.synchronize()
        forwards = r.tag
        r.steps = None  # the graphs go before the channel and the communicators they launch into
        clean, sink_error = r.close()
    mine = {"rank": rank, "medians": med, "clean": clean, "sink_error": sink_error and str(sink_error)}
    ranks = [None] * world
    dist.all_gather_object(ranks, mine, group=cpu)  # every rank's run is closed after this

    failed = None
    if rank == 0:
        try:
            for o in ranks:
                if o["sink_error"] or not o["clean"]:
                    log(f"rank {o['rank']}: channel clean {o['clean']}, sink error {o['sink_error']}")
            dirs = [os.path.join(base, f"rank{k}") for k in range(world)]
            c = check(layers, cfg, x_check, a.dtype, r.dev, dirs, check_tag)
            log(f"checked {c['checked']} tensors of forward {check_tag}: {c['bad']} bad, largest relative error "
                f"{c['max_rel_err']:.3g} (tolerance {TOL[a.dtype]}; end to end {c['max_rel_err_end_to_end']:.3g}); "
                f"{c['forwards']} forwards written of {forwards}")
            out = header(device_name(cuda), command(world))
            out.update({"tp": world, "no_capture_us": med["none"], "ferry_us": med["ferry"],
                        "allgather_us": med["allgather"], "tensors_checked": c["checked"],
                        "tensors_bad": c["bad"],
                        "overhead_pct": {k: (med[k] / med["none"] - 1) * 100 for k in ("ferry", "allgather")},
                        "spread_us": {k: [min(v), max(v)] for k, v in times.items()},
                        "per_rank_us": {k: [o["medians"][k] for o in ranks] for k in KINDS},
                        "model": dict(cfg, batch=a.batch, dtype=str(a.dtype).replace("torch.", "")),
                        "reps": a.reps, "tolerance": TOL[a.dtype], "max_rel_err": c["max_rel_err"],
                        "max_rel_err_end_to_end": c["max_rel_err_end_to_end"], "forwards_written": c["forwards"]})
            write_json(a.out, out)
            log(f"wrote {a.out}: ferry {out['overhead_pct']['ferry']:+.2f}%, allgather "
                f"{out['overhead_pct']['allgather']:+.2f}%")
        except BaseException as e:  # noqa: BLE001 (re-raised below, after the other ranks were let go)
            failed = e
        if made and not a.keep:
            shutil.rmtree(base, ignore_errors=True)
    dist.barrier(group=cpu)  # the other ranks wait for rank 0's check (their runs must stay until it is read)
    if cpu is not None:
        dist.destroy_process_group(cpu)
    dist.destroy_process_group()
    if failed is not None:
        raise failed
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the JSON (written by rank 0)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="hidden 64, 4 heads (2 KV) x 16, ffn 128, 2 layers")
    ap.add_argument("--layers", type=int, default=0, help="layers (default: 28, --tiny 2)")
    ap.add_argument("--batch", type=int, default=64, help="tokens of the decode step")
    ap.add_argument("--dtype", choices=["auto", "bfloat16", "float32"], default="auto",
                    help="auto: bfloat16 on CUDA, float32 on the CPU")
    ap.add_argument("--reps", type=int, default=None, help="timed rounds (default 50 on CUDA, 3 on the CPU)")
    ap.add_argument("--dir", default=None, help="the ranks' run directories go to DIR/rank{r} (kept)")
    ap.add_argument("--keep", action="store_true", help="keep the runs of a directory made for them")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--lead-us", type=float, default=200.0, help="GPU sleep before each timed step (CUDA)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a rank waits for the others")
    a = ap.parse_args(argv)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # before NCCL starts: no NVLink multicast
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("tp_bench: --device cuda without CUDA (use --device cpu)")
    if a.dtype == "auto":
        a.dtype = "bfloat16" if a.device == "cuda" else "float32"
    a.dtype = getattr(torch, a.dtype)
    if a.reps is None:
        a.reps = 50 if a.device == "cuda" else 3
    if a.reps < 1 or a.batch < 1 or a.layers < 0:
        raise SystemExit(f"tp_bench: expected --reps >= 1, --batch >= 1, --layers >= 0, got {a.reps}, {a.batch}, "
                         f"{a.layers}")
    try:
        return bench(a)
    except SystemExit:
        raise
    except BaseException:
        # every rank must exit: this one leaves now (its peers fail in their next collective, or after --timeout)
        print(f"tp_bench rank {os.environ.get('RANK', 0)} failed:", file=sys.stderr)
        traceback.print_exc()
        if not a.keep:
            for d in MADE:
                shutil.rmtree(d, ignore_errors=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


if __name__ == "__main__":
    sys.exit(main())
