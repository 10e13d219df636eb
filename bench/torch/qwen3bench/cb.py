# SPDX-License-Identifier: Apache-2.0
"""qwen3_cb's harness (selective capture under continuous batching): the steps' seeded selections, their upload
through ferry.Publisher to fixed device addresses, the channel and its consumer thread (which does each
contestant's consumer work: the selected rows out of every entry), the entry count and the clocks."""

from __future__ import annotations

import threading
import time

import numpy as np
import torch

import ferry


class Selections:
    """Per step i of a generation: ``idx[i]`` the int32 row indices (batch slots) of the 4..16 requests that want
    capture, in selection order (a seeded draw without replacement); ``padded[i]`` the same padded with row 0 to
    ``pad`` items (what the device holds); ``rids[i]`` the request ids of those rows (``request_id(slot)``), the
    ``requests=`` of the step's forward. Every generation of every contestant steps through the same list."""

    def __init__(self, steps, batch, lo, hi, pad, seed, request_base=1000):
        if not 1 <= lo <= hi <= min(pad, batch):
            raise ValueError(f"expected 1 <= min-select {lo} <= max-select {hi} <= min(pad {pad}, batch {batch})")
        rng = np.random.default_rng(seed)
        self.batch, self.pad, self.request_base = batch, pad, request_base
        self.idx, self.padded, self.rids = [], [], []
        for _ in range(steps):
            k = int(rng.integers(lo, hi + 1))
            idx = rng.choice(batch, size=k, replace=False).astype(np.int32)
            p = np.zeros(pad, dtype=np.int32)
            p[:k] = idx
            self.idx.append(idx)
            self.padded.append(p)
            self.rids.append([self.request_id(int(b)) for b in idx])

    def request_id(self, slot):
        """The engine's id of the request in batch slot ``slot`` (not the slot itself: attribution must map)."""
        return self.request_base + slot

    def count(self, step):
        return len(self.idx[step])

    def summary(self):
        ks = [len(x) for x in self.idx]
        return {"min": min(ks), "max": max(ks), "mean": sum(ks) / len(ks), "rows_per_generation": sum(ks)}


class SelectionUpload:
    """The step's selection at fixed device addresses: ``rows_t`` (int32 [pad]) and ``count_t`` (int32 [1]),
    one ferry.Publisher group of two buffers, uploaded on the compute stream before the step's forward.
    ``step(i, launch)``: begin(slot i % 2), the producer writes the padded rows and the count, publish, then
    ``launch()`` (the step's plan and replay, or the eager forward) inside the slot's epoch (its finish() after
    the consumer work, as docs/api/h2d.md orders it)."""

    GROUP = "selection"

    def __init__(self, rig, sels, upload):
        self.rig, self.sels = rig, sels
        self.fault_rows = rig.args.fault == "rows"
        dev = rig.device
        self.rows_t = torch.zeros(sels.pad, dtype=torch.int32, device=dev)
        self.count_t = torch.zeros(1, dtype=torch.int32, device=dev)
        self.pub = ferry.Publisher(device=0, backend="cuda" if rig.cuda else "host")
        self.rows_b = self.pub.declare("sel_rows", [self.GROUP], np.int32, sels.pad, dst=self.rows_t)
        self.count_b = self.pub.declare("sel_count", [self.GROUP], np.int32, 1, dst=self.count_t)
        self.stream = rig.main if rig.cuda else rig.fstream  # the owner stream: every publication runs on it
        self.pub.initialize(slots=2, stream=self.stream, upload=upload)

    def step(self, i, launch):
        pub, b = self.pub, self.rows_b
        with pub.begin(i % 2):
            with pub.producer(self.GROUP) as p:
                p.source(b)[:] = self.sels.padded[i]
                if self.fault_rows:  # --fault rows: the device gets the next batch slots (a self-test of the check)
                    k = self.sels.count(i)
                    p.source(b)[:k] = (self.sels.padded[i][:k] + 1) % self.sels.batch
                p.set_count(b, self.sels.pad)
                p.source(self.count_b)[0] = self.sels.count(i)
                p.set_count(self.count_b, 1)
            pub.publish(self.GROUP, self.stream)
            if not self.rig.cuda:
                # host backend: the upload runs on the stream's thread, while an eager forward's torch ops (and
                # ferry's eager row capture, which snapshots the selection at the call) read it on this thread
                self.stream.synchronize()
            launch()

    def info(self):
        try:
            return self.pub.info(self.GROUP)
        except Exception as err:  # diagnostic only
            return {"error": str(err)}


class Consumer(threading.Thread):
    """The consumer: polls the channel in batches. Per ``mode``: "release" (warm-ups), "rows" (ferry's row
    entries: one copy of the entry's rows, the requests' rows in selection order), "cpu_select" (whole entries:
    the selected rows fancy-indexed out on the CPU, one copy), "collect" (the checked generation: entries are
    kept, unreleased, for ``take()``). ``count``: entries handled; ``wait(n)`` until ``count >= n``."""

    def __init__(self, ch, sels):
        super().__init__(daemon=True)
        self.ch, self.sels = ch, sels
        self.count, self.error, self.mode, self.rows_out = 0, None, "release", 0
        self._items, self._lock = [], threading.Lock()
        self._halt = threading.Event()

    def run(self):
        try:
            while not self._halt.is_set():
                got = self.ch.poll(256, 0.02)  # small batches: short GIL holds
                mode = self.mode
                if mode == "collect":
                    with self._lock:
                        self._items.extend(got)
                elif mode == "rows":
                    for e in got:
                        out = e.numpy().copy()  # the selected rows, in selection order
                        self.rows_out += e.rows
                        del out
                        e.release()
                elif mode == "cpu_select":
                    for e in got:
                        idx = self.sels.idx[e.tag]
                        out = e.numpy().reshape(self.sels.batch, -1)[idx]  # fancy index: a copy
                        self.rows_out += len(out)
                        del out
                        e.release()
                else:
                    for e in got:
                        e.release()
                self.count += len(got)
                del got
        except Exception as err:  # reported by wait()
            self.error = err

    def take(self):
        with self._lock:
            items, self._items = self._items, []
        return items

    def wait(self, n, timeout=120.0):
        end = time.perf_counter() + timeout
        while self.count < n:
            if self.error is not None:
                raise self.error
            if time.perf_counter() > end:
                raise RuntimeError(f"consumer: expected {n} entries, got {self.count} after {timeout} s")
            time.sleep(0.0005)
        if self.error is not None:
            raise self.error

    def stop(self):
        self._halt.set()
        self.join()


class CbRig:
    """The channel (``size_slots``: row entries are dynamic), its consumer, the selection upload, the streams
    (CUDA: ``main``, torch's current stream of the whole run, never the legacy default stream; host: ferry's
    ``fstream``), the graph memory pool (one, shared by every graph of the run) and ``expected``: the entries
    produced so far (what the consumer must have handled before a generation starts)."""

    def __init__(self, args, sels):
        self.args, self.sels = args, sels
        self.cuda = args.device == "cuda"
        self.device = torch.device("cuda", 0) if self.cuda else torch.device("cpu")
        if self.cuda:
            self.main = torch.cuda.Stream()
            self.fstream = None  # ferry: torch's current stream
        else:
            self.main = None
            self.fstream = ferry.Stream(backend="host")
        self.ch = ferry.Channel(device=0, ring_bytes=args.ring_mib << 20, publish_every=args.publish_every,
                                backend="cuda" if self.cuda else "host", fifo_capacity=1 << 16, timeout=30.0,
                                tuning={"size_slots": args.size_slots})
        self.consumer = Consumer(self.ch, sels)
        self.consumer.start()
        self.upload = SelectionUpload(self, sels, args.upload)
        self.pool = torch.cuda.graph_pool_handle() if self.cuda else None
        self.expected = 0
        if self.cuda:  # the model and the selection buffers were made on the legacy default stream
            torch.cuda.synchronize()

    def stream_arg(self):
        """The stream of ferry's eager calls: torch's current stream (CUDA), the host stream (host)."""
        return torch.cuda.current_stream() if self.cuda else self.fstream

    def sync(self):
        if self.cuda:
            torch.cuda.current_stream().synchronize()
        else:
            self.fstream.synchronize()

    def drained(self):
        """Waits until the consumer handled every entry produced so far."""
        self.consumer.wait(self.expected)

    def capture_graph(self, dec, body, warm=None, warm_entries=0):
        """torch.cuda.graph capture of one decode step into the run's shared pool, after two eager warm-up
        steps (``warm_entries``: the entries each produces, handled before the capture)."""

        def warmed():
            self.expected += 2 * warm_entries
            self.drained()

        return dec.capture_graph(body, self.pool, self.sync, warm=warm, warmed=warmed)

    def close(self):
        try:
            self.consumer.wait(self.expected, timeout=30.0)
        except Exception as err:
            print(f"consumer at close: {err}", flush=True)
        self.consumer.stop()
        try:
            return self.ch.close(timeout=30.0)
        except ferry.Error as err:
            print(f"channel close: {err}", flush=True)
            return {"clean": False}
