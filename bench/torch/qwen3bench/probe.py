# SPDX-License-Identifier: Apache-2.0
"""step_probe's contestants: the graphed decode step with no capture, with torch's own kernels per hook, with
the hooks only holding or forking, and with ferry's capture under channel variants (bench/torch/step_probe.py's
docstring lists them). Each is (replay, slot, entries per step): ``replay()`` replays one step; ``slot`` the
[channel, drain, expected entries] its entries go to, or None."""

from __future__ import annotations

import torch

import ferry
import ferry.hooks as fh

from .contestants import planned
from .drain import Drain
from .meta import log

CHANNELS = {  # contestant -> (Channel kwargs and tuning keys, one flat dict: Probe.channel splits them; deferred)
    "ferry": (dict(), False),
    "ferry_plain": (dict(programmatic_launch=False), False),
    "ferry_stream": (dict(branch_publish=False), False),
    "ferry_end": (dict(publish_every=4096), False),
    "ferry_k32": (dict(publish_every=32), False),
    "ferry_v1": (dict(copy_vecs_per_thread=1), False),
    "ferry_v4": (dict(copy_vecs_per_thread=4), False),
    "ferry_general": (dict(lean_copy_kernel=False), False),
    "ferry_bounce": (dict(bounce_capture_max_bytes=16 << 10), False),
    "ferry_bounce_k32": (dict(bounce_capture_max_bytes=16 << 10, publish_every=32, gather_batch=32), False),
    "ferry_ring8": (dict(ring_bytes=8 << 20), False),
    "ferry_ring1g": (dict(ring_bytes=1 << 30), False),
    "gather": (dict(), True),
    "gather_ring8": (dict(ring_bytes=8 << 20), True),
    "gather_plain": (dict(programmatic_launch=False), True),
    "gather_k32": (dict(publish_every=32, gather_batch=32), True),
    "gather_fused": (dict(gather_branch_publish=False), True),
}
CUDA0 = torch.device("cuda", 0)


def buffer_for(bufs, key, t):
    """The static device buffer ``bufs[key]`` shaped like ``t`` (allocated on first use, outside any capture)."""
    b = bufs.get(key)
    if b is None:
        b = bufs[key] = torch.empty_like(t)
    return b


def d2d(t, b):
    b.copy_(t)


def elt(t, b):
    torch.mul(t, 1, out=b)


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
            tuning = {}
            for k, v in kw.items():
                (tuning if k in ferry._ferry.channel_tuning_fields else opts)[k] = v
            tuning.setdefault("gather_batch", min(opts["publish_every"], 128))  # K-sized gathers, as measured before
            ch = ferry.Channel(0, tuning=tuning, **opts)
            d = Drain(ch)
            d.start()
            self.channels[key] = [ch, d, 0]
        return self.channels[key]

    def graph(self, body, slot=None, per_step=0):
        """The step ``body()`` captured after two warm-up steps (whose ``per_step`` entries each ``slot``'s
        drain has consumed before the capture)."""

        def warmed():
            slot[2] += 2 * per_step
            slot[1].wait(slot[2])

        return self.dec.capture_graph(body, self.pool, torch.cuda.synchronize,
                                      warmed=warmed if slot is not None else None)

    def replaying(self, body):
        """A contestant without entries: the graph of ``body()`` (with whatever hooks are installed)."""
        g = self.graph(body)
        return (lambda: g.replay(), None, 0)

    def contestants(self, pts):
        runs = {}
        for add in (self.uncaptured, self.torch_kernels, self.holds, self.fork, self.ferry_channels,
                    self.ferry_twice, self.staged):
            add(runs, pts)
        return runs

    def uncaptured(self, runs, pts):
        runs["none"] = self.replaying(self.dec.step)
        if self.want("none_b"):
            runs["none_b"] = self.replaying(self.dec.step)

    def torch_kernels(self, runs, pts):
        for name, op, times in (("d2d", d2d, 1), ("elt", elt, 1), ("d2d_x2", d2d, 2), ("elt_x2", elt, 2)):
            if self.want(name):
                log(f"  capturing {name}")
                runs[name] = self.per_hook_run(pts, op, times=times)

    def holds(self, runs, pts):
        for name, k in (("hold", self.args.publish_every), ("hold_k32", 32)):
            if not self.want(name):
                continue
            held: list[torch.Tensor] = []

            def hold(h, t, held=held, k=k):
                held.append(t)
                if len(held) >= k:
                    held.clear()

            def body(held=held):
                self.dec.step()
                held.clear()

            with fh.install(self.model, pts, hold):
                runs[name] = self.replaying(body)

    def fork(self, runs, pts):
        if not self.want("fork"):
            return
        side = torch.cuda.Stream()
        tiny = torch.zeros(1, device=CUDA0)
        self.keep.append((side, tiny))
        state = {"n": 0, "open": False}
        k = self.args.publish_every

        def fork(h, t):
            state["n"] += 1
            if state["n"] % k == 0:
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    tiny.add_(1)
                state["open"] = True

        def fork_body():
            state["n"] = 0
            self.dec.step()
            if state["open"]:
                torch.cuda.current_stream().wait_stream(side)
                state["open"] = False

        with fh.install(self.model, pts, fork):
            runs["fork"] = self.replaying(fork_body)

    def ferry_channels(self, runs, pts):
        if self.want("empty"):
            runs["empty"] = self.ferry_run(self.channel({}), 0)
        for name, (kw, deferred) in CHANNELS.items():
            if not self.want(name):
                continue
            slot = self.channel(kw)
            cap = fh.capture_fn(slot[0], None, use_ops="auto", device=CUDA0, deferred=pts if deferred else False)
            log(f"  capturing {name}")
            with fh.install(self.model, pts, cap):
                runs[name] = self.ferry_run(slot, len(pts))

    def ferry_twice(self, runs, pts):
        for name, base in (("ferry_x2", "ferry"), ("ferry_plain_x2", "ferry_plain")):
            if not self.want(name):
                continue
            slot = self.channel(CHANNELS[base][0])
            cap = fh.capture_fn(slot[0], None, use_ops="auto", device=CUDA0)

            def twice(h, t, cap=cap):
                cap(h, t)
                cap(h, t)

            log(f"  capturing {name}")
            with fh.install(self.model, pts, twice):
                runs[name] = self.ferry_run(slot, 2 * len(pts))

    def staged(self, runs, pts):
        for name, k in (("staged", self.args.publish_every), ("bounce_k32", 32)):
            if not self.want(name):
                continue
            slot = self.channel(dict(publish_every=k, gather_batch=min(k, 128)))
            cap = fh.capture_fn(slot[0], None, use_ops="auto", device=CUDA0, deferred=True)
            stage: dict[int, torch.Tensor] = {}
            self.keep.append(stage)

            def staged(h, t, cap=cap, stage=stage):
                b = buffer_for(stage, h, t)
                b.copy_(t.detach())
                cap(h, b)

            log(f"  capturing {name}")
            with fh.install(self.model, pts, staged):
                runs[name] = self.ferry_run(slot, len(pts))

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
            return self.replaying(self.dec.step)

    def ferry_run(self, slot, per_step):
        """A contestant replaying the decode step captured between the channel's begin_forward and end_forward
        (with whatever hooks are installed): (replay, slot, entries per step)."""
        ch, holder = slot[0], {}
        g = self.graph(planned(ch, self.dec, holder), slot=slot, per_step=per_step)
        plan = holder["plan"]
        return (lambda: (ch.plan(plan), g.replay()), slot, per_step)
