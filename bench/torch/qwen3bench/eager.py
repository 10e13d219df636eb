# SPDX-License-Identifier: Apache-2.0
"""qwen3_eager's contestants: eager B=1 decode steps of the Qwen3-0.6B-shaped model, each preset's hooks
capturing into a channel whose entries go to a native sink (C++ threads: no Python and no GIL per entry), beside
torch's own per-hook pinned copies; diagnostics that split the capture's cost (the hook layer alone, a Python
consumer thread polling the same channel per entry or per batch)."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time

import torch

import ferry
import ferry.hooks as fh

from .drain import settle_sink
from .meta import use_ops


OTHER_CORES: list[int] = []  # pin_threads: the cores of every thread but the decode loop's
INSTALL = {"via": "forward"}  # fh.install's via= for every contestant (qwen3_eager.py --install)


class Sinked:
    """One preset's channel and its native sink (safetensors shards in ``directory``: a tmpfs by default, so the
    disk does not pace the decode), the schema from one recorded step (every hook's dtype and row shape)."""

    def __init__(self, args, model, dec, pts, directory, stream, bounce=0):
        self.pts, self.dir = pts, directory
        specs = {}

        def record(h, t):
            specs.setdefault(h, t)

        with fh.install(model, pts, record, **INSTALL):
            dec.reset()
            dec.step()
        names = {p.id: p.name for p in pts}
        schema = {h: ferry.sinks.row_spec(names[h], t) for h, t in specs.items()}
        shutil.rmtree(directory, ignore_errors=True)
        self.sink = ferry.sinks.safetensors(directory, schema, shard_bytes=args.shard_mib << 20, policy="block",
                                            max_queue_bytes=256 << 20, block_timeout=30.0)
        self.ch = ferry.Channel(0, ring_bytes=args.ring_mib << 20, publish_every=args.publish_every,
                                backend="cuda" if args.device == "cuda" else "host", fifo_capacity=1 << 16,
                                timeout=30.0, sink=self.sink,
                                tuning={"drain_idle_sleep": args.drain_idle_us * 1e-6,
                                        "bounce_capture_max_bytes": bounce,
                                        "gather_batch": min(args.publish_every, 128)})
        self.stream = stream

    def settle(self, timeout=120.0):
        settle_sink(self.ch, self.sink, f"sink {self.dir}", timeout, poll=0.002)

    def capture_fn(self, deferred, use_ops):
        return fh.capture_fn(self.ch, self.stream, use_ops=use_ops, deferred=deferred)

    def close(self):
        rep = self.ch.close(timeout=60.0)
        self.sink.close()
        return rep


class PyConsumer:
    """Diagnostic: a channel without a sink, drained by a Python thread (``poll`` per entry, or ``poll_batch``
    where the build has it), started for its contestant's turn only (it takes the GIL from the decode loop)."""

    def __init__(self, args, stream, batch):
        self.ch = ferry.Channel(0, ring_bytes=args.ring_mib << 20, publish_every=args.publish_every,
                                backend="cuda" if args.device == "cuda" else "host", fifo_capacity=1 << 16,
                                timeout=30.0, tuning={"drain_idle_sleep": args.drain_idle_us * 1e-6})
        self.stream, self.batch, self.count = stream, batch and hasattr(self.ch, "poll_batch"), 0
        self._halt, self._thread = threading.Event(), None

    def _run(self):
        if OTHER_CORES:
            os.sched_setaffinity(0, OTHER_CORES)  # started from the pinned main thread: off its core
        while not self._halt.is_set():
            if self.batch:
                with self.ch.poll_batch(256, 0.02) as b:
                    self.count += len(b)
            else:
                got = self.ch.poll(256, 0.02)
                for e in got:
                    e.release()
                self.count += len(got)
                del got

    @contextlib.contextmanager
    def running(self):
        self._halt.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        try:
            yield
        finally:
            self._halt.set()
            self._thread.join()

    def close(self):
        return self.ch.close(timeout=60.0)


def deferred_points(pts):
    """The preset's deferred points but token_ids: the decoder writes its input tokens in place at the end of a
    step (``tok.copy_(argmax)``), before end_forward flushes the last batch (with 341 hooks the batch holding
    token_ids flushes at its 128th capture, mid-step; a small model's single batch would see the new tokens, and
    ferry refuses that flush)."""
    return frozenset(p.id for p in pts if p.deferred and p.name != "token_ids")


def framed_step(dec, begin, end, *args):
    """One step of a contestant that frames the decode step: ``begin(*args)``, the step, ``end(*args)``."""
    def step():
        begin(*args)
        dec.step()
        end(*args)
    return step


def forward_step(dec, ch, stream):
    """One step of a ferry contestant: the forward opened and ended around the decode step."""
    return framed_step(dec, ch.begin_forward, ch.end_forward, stream)


class Contestant:
    """One contestant: ``step()`` is one timed decode step (with what the contestant does per step around it:
    a forward opened and ended, an event recorded), ``context()`` installs its hooks (entered and left outside
    the timed part, as a user's context manager would be)."""

    def __init__(self, step, entries=0, context=None, in_call=None):
        self.step, self.entries, self.context = step, entries, context or contextlib.nullcontext
        self.in_call = in_call  # InCall: the diagnostic's time inside ferry's calls, else None


class InCall:
    """Diagnostic (--diagnostics on / calls): wall seconds spent inside ferry's calls during a timed step (perf_counter
    around each capture closure and begin_forward / end_forward; the decode loop's thread is busy throughout,
    so its wall time there is its CPU time), to set beside the step's measured overhead."""

    def __init__(self):
        self.s = 0.0

    def wrap(self, fn):
        pc = time.perf_counter

        def timed(*a):
            t0 = pc()
            fn(*a)
            self.s += pc() - t0
        return timed

    def step(self, dec, ch, stream):
        return framed_step(dec, self.wrap(ch.begin_forward), self.wrap(ch.end_forward), stream)

    def take_us(self):
        s, self.s = self.s, 0.0
        return s * 1e6


def make_contestants(args, model, dec, presets, sinked, pycons, stream):
    """{key: Contestant}: none; per preset: hooks (a no-op hook: the hook layer's own cost), ferry (immediate
    capture), deferred (the preset's deferred points: a gather per batch), collect (the same points through ferry.hooks.Collector:
    appended per hook, handed over in one call at end_forward), bounce (immediate capture on a
    channel with bounce_capture_max_bytes: a device copy into a bounce slot per hook, one gather per batch;
    ``sinked[(preset, "bounce")]``, where built), torch (pinned copy_ per hook, an event per step); diagnostics
    (--diagnostics on, or calls without the Python consumers): frame (begin_forward / end_forward around the step,
    no hook), incall-ferry / incall-deferred / incall-collect (InCall), pyconsumer / pybatch (ferry
    immediate into a channel drained by a Python thread)."""
    ops = use_ops(args.capture)
    runs = {"none": Contestant(dec.step)}
    for preset in presets:
        pts, sk = presets[preset], sinked[preset]

        def noop(h, t):
            pass

        def installed(fn, pts=pts):
            return lambda: fh.install(model, pts, fn, **INSTALL)

        runs[f"hooks:{preset}"] = Contestant(dec.step, context=installed(noop))
        kinds = [("ferry", False, sk), ("deferred", deferred_points(pts), sk)]
        if (preset, "bounce") in sinked:
            kinds.append(("bounce", False, sinked[(preset, "bounce")]))
        for kind, deferred, s in kinds:
            cap = s.capture_fn(deferred, ops)
            runs[f"{kind}:{preset}"] = Contestant(forward_step(dec, s.ch, stream), entries=len(pts),
                                                  context=installed(cap))
        # collect: ferry.hooks.Collector (the deferred points appended per hook, handed over at end_forward)
        col = fh.Collector(sk.ch, stream, deferred=deferred_points(pts))
        runs[f"collect:{preset}"] = Contestant(framed_step(dec, col.begin_forward, col.end_forward), entries=len(pts),
                                               context=installed(col))
        runs[f"torch:{preset}"] = torch_copies(args, model, dec, pts)
        if args.diagnostics in ("on", "calls"):
            # frame: the forward opened and ended around the step, no hook (ferry's fixed cost per step)
            runs[f"frame:{preset}"] = Contestant(forward_step(dec, sk.ch, stream))
            # incall-*: ferry and deferred again, the time inside ferry's calls summed per step (InCall)
            for kind, deferred in (("ferry", False), ("deferred", deferred_points(pts))):
                ic = InCall()
                cap = ic.wrap(sk.capture_fn(deferred, ops))
                runs[f"incall-{kind}:{preset}"] = Contestant(ic.step(dec, sk.ch, stream), entries=len(pts),
                                                             context=installed(cap), in_call=ic)
            # incall-collect: collect again, the time inside begin_forward, the hand-over and end_forward summed
            # per step (the hooks' appends are not ferry calls: collect - hooks gives them)
            ic, icol = InCall(), fh.Collector(sk.ch, stream, deferred=deferred_points(pts))
            runs[f"incall-collect:{preset}"] = Contestant(
                framed_step(dec, ic.wrap(icol.begin_forward), ic.wrap(icol.end_forward)), entries=len(pts),
                context=installed(icol), in_call=ic)
            for kind, pc in (pycons.items() if args.diagnostics == "on" else ()):
                cap = fh.capture_fn(pc.ch, stream, use_ops=ops, deferred=False)

                @contextlib.contextmanager
                def ctx(pc=pc, cap=cap, pts=pts):
                    with pc.running(), fh.install(model, pts, cap, **INSTALL):
                        yield

                runs[f"{kind}:{preset}"] = Contestant(forward_step(dec, pc.ch, stream), entries=len(pts), context=ctx)
    return runs


def torch_copies(args, model, dec, pts):
    """torch-native: one pinned buffer per hook, ``copy_(non_blocking=True)`` on the current stream, an event
    per step after which the host may read them (the next step overwrites them)."""
    cuda = args.device == "cuda"
    pinned: dict[int, torch.Tensor] = {}

    def copy(h, t):
        buf = pinned.get(h)
        if buf is None:
            buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=cuda)
            pinned[h] = buf
        buf.copy_(t.detach(), non_blocking=True)

    with fh.install(model, pts, copy, **INSTALL):
        dec.reset()
        dec.step()  # allocates the buffers
    event = torch.cuda.Event() if cuda else None

    def step():
        dec.step()
        if cuda:
            event.record()

    return Contestant(step, context=lambda: fh.install(model, pts, copy, **INSTALL))


def turn(dec, c, steps, sync, counter):
    """One turn of contestant c: its hooks installed, ``steps`` decode steps from the start state (the decoder
    reset and the device idle before the first), each timed alone; the reset, install, uninstall and the wait
    for the device are outside the timed part. Returns (main-thread CPU ms, wall ms, user instructions) per
    step, each the mean over the turn's steps (instructions 0 without a counter), and the us per step inside
    ferry's calls (an InCall contestant's; else 0). The caller keeps the garbage collector off (its passes land on
    whichever step they fall)."""
    dec.reset()
    clock, wall = time.thread_time, time.perf_counter
    cpu = w = ins = 0.0
    if c.in_call is not None:
        c.in_call.take_us()
    with c.context():
        sync()
        for _ in range(steps):
            i0 = counter.read()
            t0, c0 = wall(), clock()
            c.step()
            c1, t1 = clock(), wall()
            ins += counter.read() - i0
            cpu += c1 - c0
            w += t1 - t0
        sync()
    return cpu * 1e3 / steps, w * 1e3 / steps, ins / steps, (c.in_call.take_us() / steps if c.in_call else 0.0)


def pin_threads():
    """Keeps the decode loop's core to itself: every thread started after this call (ferry's drain and sink
    threads, the consumers) runs on the other cores, off the main core's SMT siblings; the main thread is then
    pinned to its core by ``pin_main``. Returns the main core (None where affinity is not settable)."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
    if len(cores) < 4:
        return None
    main = cores[-1]
    try:
        with open(f"/sys/devices/system/cpu/cpu{main}/topology/thread_siblings_list") as f:
            sib = set()
            for part in f.read().strip().split(","):
                a, _, b = part.partition("-")
                sib.update(range(int(a), int(b or a) + 1))
    except OSError:
        sib = {main}
    rest = [c for c in cores if c not in sib] or cores
    os.sched_setaffinity(0, rest)
    OTHER_CORES[:] = rest
    return main


def pin_main(core):
    if core is not None:
        os.sched_setaffinity(0, {core})


def call_costs(args, sk, stream, sync, bounce=None, n=2000):
    """CPU us per call outside the model: Channel.capture (immediate / deferred / on the bounce channel) of a
    2 KiB bf16 tensor, the hooks' capture closures (immediate, deferred), and torch's pinned copy_. The closures
    are made first (ferry.hooks lends the core module the tensor reader of ferry.torch_ops, where built, so the
    Channel calls are timed as the hooks' calls run); ``tensor_reader``: whether it was lent."""
    dev = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    t = torch.randn(1024, device=dev).to(torch.bfloat16)
    pinned = torch.empty_like(t, device="cpu", pin_memory=args.device == "cuda")
    cap = sk.capture_fn(False, use_ops(args.capture))
    cap_d = sk.capture_fn(True, use_ops(args.capture))
    out = {}

    def timed(name, fn, ch=None):
        if ch is not None:
            ch.begin_forward(stream)
        c0 = time.thread_time()
        for _ in range(n):
            fn()
        out[name] = (time.thread_time() - c0) / n * 1e6
        if ch is not None:
            ch.end_forward(stream)
        sync()

    h = sk.pts[0].id
    timed("channel_capture_us", lambda: sk.ch.capture(h, t, stream), sk.ch)
    timed("channel_capture_deferred_us", lambda: sk.ch.capture_deferred(h, t, stream), sk.ch)
    if bounce is not None:
        timed("channel_capture_bounce_us", lambda: bounce.ch.capture(h, t, stream), bounce.ch)
    timed("hooks_capture_fn_us", lambda: cap(h, t), sk.ch)
    timed("hooks_capture_fn_deferred_us", lambda: cap_d(h, t), sk.ch)
    timed("torch_pinned_copy_us", lambda: pinned.copy_(t, non_blocking=True))
    out["tensor_reader"] = bool(getattr(ferry._ferry, "_tensor_reader_bound", lambda: False)())
    return out


def sink_dir(args, preset):
    base = args.sink_dir or ("/dev/shm" if os.path.isdir("/dev/shm") else "/tmp")
    return os.path.join(base, f"ferry-eager-{os.getpid()}-{preset}")
