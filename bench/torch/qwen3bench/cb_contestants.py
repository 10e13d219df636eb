# SPDX-License-Identifier: Apache-2.0
"""qwen3_cb's contestants, each running decode steps from the decoder's current state, the step's selection
uploaded first (rig.upload.step): no capture; ferry rows (``ferry.hooks.rows_capture``: each hook's selected
token rows, deferred, one gather per batch; ``requests=`` of the step per replay); cpu_select (ferry captures
every hook whole, deferred; the consumer picks the selected rows on the CPU); torch_select (per hook
``index_select`` of the selected rows and ``pinned.copy_(..., non_blocking=True)``, double-buffered: two pinned
slots, one graph per slot; the host copies a slot's rows out once its event completed, before the slot is
reused). In a CUDA run every step is a replay of a graph captured once (``ch.plan(plan, tag=, requests=)``
before each replay of a ferry one); on the host backend the steps are eager."""

from __future__ import annotations

import contextlib

import torch

import ferry.hooks as fh

from .contestants import planned

KINDS = ("rows", "cpu_select", "torch_select")


def rows2d(t):
    """A hooked ``[B, S, ...]`` tensor as its ``B * S`` token rows (as ``ferry.hooks.rows_capture`` takes it)."""
    t = t.detach()
    n = t.shape[0] * t.shape[1] if t.dim() >= 2 else t.shape[0]
    return t.reshape(n, -1)


def host_bytes(t):
    """A synchronous copy of a ``[rows, width]`` tensor on the host, as a uint8 numpy ``[rows, row_bytes]``."""
    return t.detach().contiguous().to("cpu", copy=True).view(torch.uint8).numpy()


class Contestant:
    """One contestant. ``step(i)``: decode step i of a generation (its selection uploaded, then the replay or
    the eager forward); ``armed()``: the hooks an eager contestant needs around its steps (a context manager);
    ``finish()``: after a timed generation, outside the clock (torch_select: the rows of the last slots copied
    out); ``entries``: ferry entries per step; ``consumer``: the consumer's mode while it runs;
    ``witnessed(i)`` (ferry contestants): step i run by a forward that also copies every hooked tensor whole
    beside its capture, returning {hook: uint8 [rows, row_bytes]} of those copies."""

    def __init__(self, kind, step, entries=0, consumer="release", armed=None, finish=None, witnessed=None, keep=None):
        self.kind, self.step, self.entries, self.consumer = kind, step, entries, consumer
        self._armed, self._finish, self.witnessed, self._keep = armed, finish, witnessed, keep

    def armed(self):
        return self._armed() if self._armed is not None else contextlib.nullcontext()

    def generation(self, n):
        with self.armed():
            for i in range(n):
                self.step(i)

    def finish(self):
        if self._finish is not None:
            self._finish()


def make_runs(rig, dec, model, points_by_preset, kinds):
    """{key: Contestant} in round-robin order: none, then per preset rows:, cpu_select:, torch_select: (those in
    ``kinds``)."""
    runs = {"none": uncaptured(rig, dec)}
    for preset, pts in points_by_preset.items():
        for kind in KINDS:
            if kind in kinds:
                make = torch_select if kind == "torch_select" else ferry_run
                runs[f"{kind}:{preset}"] = make(rig, dec, model, pts, kind)
    return runs


def uncaptured(rig, dec):
    """No capture: the same per-step host work (the selection's upload), then the step without hooks."""
    up = rig.upload
    if not rig.cuda:
        return Contestant("none", lambda i: up.step(i, dec.step))
    g = rig.capture_graph(dec, dec.step)
    return Contestant("none", lambda i: up.step(i, g.replay), keep=g)


def capture_call(rig, kind):
    """The hooks' capture call: ferry rows (the selected rows of each hook, deferred) or every hook whole,
    deferred (cpu_select)."""
    if kind == "rows":
        up = rig.upload
        return fh.rows_capture(rig.ch, rig.fstream, deferred=True, rows=up.rows_t, count=up.count_t,
                               max_count=rig.sels.pad)
    return fh.channel_capture(rig.ch, rig.fstream, deferred=True)


def forward_meta(rig, kind, i):
    """The step's attribution: its tag, and (row entries) the request of each selected row, in order. --fault
    requests / tag (a self-test of the check, ferry rows only): the requests rotated by one, the next step's tag."""
    if kind != "rows":
        return {"tag": i}
    rids, fault = rig.sels.rids[i], rig.args.fault
    if fault == "requests":
        rids = rids[1:] + rids[:1]
    return {"tag": i + 1 if fault == "tag" else i, "requests": rids}


def hooked_graph(rig, dec, model, pts, cap):
    """(graph, plan): the decode step between begin_forward and end_forward captured with ``cap`` at the
    preset's points (the hooks are removed after the capture: the graph has them baked in)."""
    holder = {}
    with fh.install(model, pts, cap):
        g = rig.capture_graph(dec, planned(rig.ch, dec, holder), warm=planned(rig.ch, dec), warm_entries=len(pts))
    return g, holder["plan"]


def ferry_run(rig, dec, model, pts, kind):
    """ferry rows or cpu_select. Its witness: the same step with a whole copy of every hooked tensor made by
    the same execution beside its capture (eager: a synchronous host copy at the hook; graph: the forward
    captured again with a device copy of each hooked tensor into a static buffer, read after the replay)."""
    cap = capture_call(rig, kind)
    ch, up = rig.ch, rig.upload
    consumer = "rows" if kind == "rows" else "cpu_select"
    if rig.cuda:
        g, plan = hooked_graph(rig, dec, model, pts, cap)

        def step(i):
            def launch():
                ch.plan(plan, **forward_meta(rig, kind, i))  # stream None: torch's current stream, where replay runs
                g.replay()

            up.step(i, launch)

        wbufs = {}

        def cap_and_copy(h, t):
            cap(h, t)
            r = rows2d(t)
            b = wbufs.get(h)
            if b is None:  # allocated by the eager warm-up, before the capture
                b = torch.empty(r.shape, dtype=r.dtype, device=r.device)
                wbufs[h] = b
            b.copy_(r)

        gw, wplan = hooked_graph(rig, dec, model, pts, cap_and_copy)

        def witnessed(i):
            def launch():
                ch.plan(wplan, **forward_meta(rig, kind, i))
                gw.replay()

            up.step(i, launch)
            rig.sync()
            return {h: host_bytes(b) for h, b in wbufs.items()}

        return Contestant(kind, step, entries=len(pts), consumer=consumer, witnessed=witnessed, keep=(g, gw, wbufs))

    s = rig.fstream

    def step(i):
        def launch():
            ch.begin_forward(s, **forward_meta(rig, kind, i))
            dec.step()
            ch.end_forward(s)

        up.step(i, launch)

    def witnessed(i):
        got = {}

        def cap_and_copy(h, t):
            cap(h, t)
            got[h] = host_bytes(rows2d(t))  # synchronous, at the hook, beside the capture

        with fh.install(model, pts, cap_and_copy):
            step(i)
        rig.sync()
        return got

    return Contestant(kind, step, entries=len(pts), consumer=consumer, armed=lambda: fh.install(model, pts, cap),
                      witnessed=witnessed)


def torch_select(rig, dec, model, pts, kind="torch_select", slots=2):
    """torch-native: per hook ``pinned[slot][h].copy_(rows.index_select(0, sel), non_blocking=True)`` of the
    selection's ``pad`` rows (a graph has static shapes: the host reads the first ``count``), in the graph (one
    per pinned slot). Before a slot is reused the host waits for its event and copies its rows out (the
    consumer's work, on the engine's thread); ``finish()`` does so for the last slots."""
    up, sels = rig.upload, rig.sels
    shapes = {}

    def rec(h, t):
        r = rows2d(t)
        shapes[h] = (r.shape[1], r.dtype)

    with fh.install(model, pts, rec):  # the hooked shapes, from one eager step outside any capture
        dec.reset()
        up.step(0, dec.step)
    rig.sync()
    pinned = [{h: torch.zeros((sels.pad, w), dtype=dt, pin_memory=rig.cuda) for h, (w, dt) in shapes.items()}
              for _ in range(slots)]
    views = [[b.view(torch.uint8).numpy() for b in p.values()] for p in pinned]
    sel = up.rows_t
    pending = [None] * slots  # the step whose rows slot k holds, not yet copied out
    events = [torch.cuda.Event() for _ in range(slots)] if rig.cuda else None

    def consume(k):
        if events is not None:
            events[k].synchronize()
        n = sels.count(pending[k])
        for v in views[k]:
            out = v[:n].copy()
            del out
        pending[k] = None

    def finish():
        for k in sorted((k for k in range(slots) if pending[k] is not None), key=lambda k: pending[k]):
            consume(k)

    def copier(bufs):
        def copy_rows(h, t):
            bufs[h].copy_(rows2d(t).index_select(0, sel), non_blocking=rig.cuda)

        return copy_rows

    if rig.cuda:
        graphs = []
        for k in range(slots):
            with fh.install(model, pts, copier(pinned[k])):
                graphs.append(rig.capture_graph(dec, dec.step))

        def step(i):
            k = i % slots
            if pending[k] is not None:
                consume(k)
            up.step(i, graphs[k].replay)
            events[k].record()
            pending[k] = i

        return Contestant(kind, step, finish=finish, keep=(graphs, pinned))

    cur = [0]

    def copy_rows(h, t):
        pinned[cur[0]][h].copy_(rows2d(t).index_select(0, sel))

    def step(i):
        k = i % slots
        if pending[k] is not None:
            consume(k)
        cur[0] = k
        up.step(i, dec.step)
        pending[k] = i

    return Contestant(kind, step, armed=lambda: fh.install(model, pts, copy_rows), finish=finish, keep=pinned)
