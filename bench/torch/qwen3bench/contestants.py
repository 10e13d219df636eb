# SPDX-License-Identifier: Apache-2.0
"""qwen3_capture's contestants of one decode mode, each running decode steps from the decoder's current state:
no capture; ferry (immediate capture: bounced up to --bounce-capture-max, else a copy kernel per hook) and gather
(deferred capture: one gather kernel per batch), each with its witness; torch-native pinned copies; in graph
modes the no-capture step captured a second time (none_b)."""

from __future__ import annotations

import contextlib

import torch

import ferry.hooks as fh

from .check import tensor_digest


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
        return self._armed() if self._armed is not None else contextlib.nullcontext()

    def generation(self, n):
        """The timed run: n steps with the hooks installed once around them."""
        with self.armed():
            self.steps(n)


def planned(ch, dec, holder=None):
    """A graph body: the decode step between ``ch.begin_forward`` and ``ch.end_forward`` on torch's current
    stream; the plan (``ch.plan(plan)`` before each replay) kept in ``holder["plan"]``, or dropped (warm-up)."""

    def body():
        s = torch.cuda.current_stream()
        ch.begin_forward(s)
        dec.step()
        plan = ch.end_forward(s)
        if holder is not None:
            holder["plan"] = plan

    return body


def make_runs(rig, dec, model, points_by_preset, graph):
    """{key: Contestant} of one mode, in round-robin order: none, then per preset ferry:, gather: (those in
    --contestants) and torch:, then none_b (graph modes)."""
    runs: dict[str, Contestant] = {}
    runs["none"] = uncaptured(rig, dec, graph)
    for preset, pts in points_by_preset.items():
        for kind, deferred in (("ferry", False), ("gather", pts)):
            if kind in rig.kinds:
                make = ferry_graph if graph else ferry_eager
                runs[f"{kind}:{preset}"] = make(rig, dec, model, pts, deferred)
        runs[f"torch:{preset}"] = torch_copies(rig, dec, model, pts, graph)
    for key in [k for k in runs if k.startswith("torch:") and "torch" not in rig.kinds]:
        del runs[key]  # built (its buffers exist) but not run: --contestants
    if graph:
        # the same uncaptured step captured again, after every other graph: the spread between two captures
        # of one step (where the allocator placed its activations), the noise floor of the graph rows
        runs["none_b"] = uncaptured(rig, dec, graph)
    return runs


def uncaptured(rig, dec, graph):
    """No capture: the eager step, or a graph replaying the step captured without any hook."""
    if not graph:

        def none_eager(n):
            for _ in range(n):
                dec.step()

        return Contestant(none_eager)
    g = rig.capture_graph(dec, lambda: dec.step())

    def steps(n):
        for _ in range(n):
            g.replay()

    return Contestant(steps)


def hooked_graph(rig, dec, model, pts, cap):
    """(graph, plan): the decode step between begin_forward and end_forward captured with ``cap`` at the
    preset's points (the hooks are removed after the capture: the graph has them baked in)."""
    holder = {}
    hooks = fh.install(model, pts, cap)
    try:
        g = rig.capture_graph(dec, planned(rig.ch, dec, holder), warm=planned(rig.ch, dec), warm_entries=len(pts))
    finally:
        hooks.remove()
    return g, holder["plan"]


def ferry_graph(rig, dec, model, pts, deferred):
    """ferry's capture in the graph: ``ch.plan(plan)`` before each replay. The witness (--witness on): the same
    forward captured again, each hooked tensor also copied (device to device) into a static buffer beside its
    capture; buffers and hook order come from the warm-up."""
    g, plan = hooked_graph(rig, dec, model, pts, rig.capture_fn(deferred))

    def steps(n):
        for _ in range(n):
            rig.ch.plan(plan)
            g.replay()

    witnessed = None
    if rig.args.witness == "on":
        wbufs: dict[int, torch.Tensor] = {}
        worder: list[int] = []
        cap = rig.capture_fn(deferred)

        def cap_and_copy(h, t):
            cap(h, t)
            b = wbufs.get(h)
            if b is None:
                b = torch.empty_like(t)
                wbufs[h] = b
                worder.append(h)
            b.copy_(t)

        gw, wplan = hooked_graph(rig, dec, model, pts, cap_and_copy)

        def witness_step(step):
            rig.ch.plan(wplan)
            gw.replay()
            rig.sync()
            return [(step, h, tensor_digest(wbufs[h])) for h in worder]

        witnessed = witness_step
    return Contestant(steps, entries=len(pts), witnessed=witnessed)


def ferry_eager(rig, dec, model, pts, deferred):
    """ferry's capture in the eager step, between begin_forward and end_forward; the hooks are installed outside
    the step loop (Contestant.armed), as the timed run does. The witness: ``t.cpu()`` at the hook, beside the
    capture."""

    def steps(n):
        s = rig.stream_arg()
        for _ in range(n):
            rig.ch.begin_forward(s)
            dec.step()
            rig.ch.end_forward(s)

    def witnessed(step):
        cap, got = rig.capture_fn(deferred), []

        def cap_and_copy(h, t):
            cap(h, t)
            got.append((step, h, tensor_digest(t)))  # synchronous .cpu() beside the capture

        with fh.install(model, pts, cap_and_copy):
            steps(1)
        rig.sync()
        return got

    return Contestant(steps, lambda: fh.install(model, pts, rig.capture_fn(deferred)), entries=len(pts),
                      witnessed=witnessed)


def torch_copies(rig, dec, model, pts, graph):
    """torch-native: one pinned buffer per hook, copy_(non_blocking) on the current stream, an event per step
    after which the host may read them (the buffers are overwritten by the next step)."""
    pinned: dict[int, torch.Tensor] = {}
    events = [torch.cuda.Event() for _ in range(rig.args.tokens)] if rig.cuda else []

    def torch_copy(h, t):
        buf = pinned.get(h)
        if buf is None:
            buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=rig.cuda)
            pinned[h] = buf
        buf.copy_(t.detach(), non_blocking=True)

    with fh.install(model, pts, torch_copy):
        dec.reset()
        dec.step()  # allocates the pinned buffers outside any capture
        rig.sync()
        g = rig.capture_graph(dec, lambda: dec.step()) if graph else None
    if graph:

        # the closure holds the pinned buffers: the graph writes them but does not keep them alive
        def torch_graph(n, pinned=pinned):
            for i in range(n):
                g.replay()
                events[i].record()
            events[n - 1].synchronize()

        return Contestant(torch_graph)

    def torch_eager(n):
        for i in range(n):
            dec.step()
            if rig.cuda:
                events[i].record()
        if rig.cuda:
            events[n - 1].synchronize()

    return Contestant(torch_eager, lambda: fh.install(model, pts, torch_copy))
