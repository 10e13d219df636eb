# SPDX-License-Identifier: Apache-2.0
"""The harness qwen3_capture's contestants run on: the channel and its consumer, the count of entries produced
(``expected``: what the consumer must have drained before a generation starts), the streams and the clock."""

from __future__ import annotations

import time

import torch

import ferry
import ferry.hooks as fh

from .drain import Drain
from .meta import log, use_ops
from .timing import timed_ms


class Rig:
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
                                tuning={"branch_publish": args.branch_publish == "on",
                                        "bounce_capture_max_bytes": args.bounce_capture_max,
                                        "gather_batch": min(args.publish_every, 128)})
        self.drain = Drain(self.ch)
        self.drain.start()
        self.expected = 0  # entries produced so far

    def sync(self):
        if self.cuda:
            torch.cuda.current_stream().synchronize()
        else:
            self.fstream.synchronize()

    def timed_ms(self, fn):
        return timed_ms(fn, None if self.cuda else self.fstream)

    def capture_fn(self, deferred=False):
        """The hooks' capture call; ``deferred``: the preset's points (those marked deferred use deferred
        capture: one gather launch per batch of up to min(publish_every, 128) entries), or False."""
        return fh.capture_fn(self.ch, self.fstream, use_ops=use_ops(self.args.capture), device=self.device,
                             deferred=deferred)

    def stream_arg(self):
        return torch.cuda.current_stream() if self.cuda else self.fstream

    def capture_graph(self, dec, body, warm=None, warm_entries=0):
        """torch.cuda.graph capture of one decode step (the engine's graph), after eager warm-up on a side
        stream (``warm_entries``: the entries each warm-up step produces, drained before the capture)."""

        def warmed():
            self.expected += 2 * warm_entries
            self.drain.wait(self.expected)

        return dec.capture_graph(body, self.pool, self.sync, warm=warm, warmed=warmed)

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
