# SPDX-License-Identifier: Apache-2.0
"""Assembles per-request samples from a channel's row entries, off the engine's path.

Each step's forward carries its attribution in the core (``Channel.begin_forward`` / ``plan``: ``tag`` = the step,
``requests`` = ``(request handle, first_row, rows)`` in row order, ``meta`` = the int64 first position of each of
those requests); every tap is one row entry of that forward (hook id = the tap's index). The consumer thread copies
each entry's rows out of staging once and files them under the step; a request's sample is built when the engine
says it finished and every forward it ran in has been delivered (a forward's entries arrive consecutively, so a
later tag completes the earlier ones). The writer thread writes it (``SampleWriter``); a bounded queue between
them blocks, or with ``policy="drop"`` drops the sample and reports it.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .samples import Sample, SampleWriter
from .stream import read_meta

__all__ = ["Assembler", "Request"]


@dataclass
class Request:
    """One request that asked for capture: its id, integer ``handle`` (the core's request id), the positions
    ``[lo, hi)`` asked for, the taps its sample keeps, and what the engine and the drain saw of it."""

    request_id: str
    handle: int
    lo: int
    hi: int
    keep: list[int]
    prompt: list[int]
    strict: bool = False  # a window: every position of [lo, hi) is due, even past an early stop
    segments: list[tuple[int, int, int, int]] = field(default_factory=list)  # (tag, first_row, rows, first_pos)
    last_tag: int = -1
    finished: bool = False
    sequence: list[int] | None = None
    reason: str = ""
    errors: list[str] = field(default_factory=list)


class Assembler:
    """``Assembler(channel, taps, writer)``: ``start()``, ``add(request)``, ``finish(request_id, sequence, reason)``
    from the engine's thread; ``close()`` drains, writes what finished and returns the report."""

    def __init__(self, channel: Any, taps: list[str], writer: SampleWriter, *, policy: str = "block",
                 max_queue_bytes: int = 1 << 30, timeout: float = 60.0) -> None:
        from .. import LogicError
        if policy not in ("block", "drop"):
            raise LogicError(f"ferry.engine: expected policy 'block' or 'drop', got {policy!r}")
        self.ch, self.taps, self.writer, self.policy = channel, list(taps), writer, policy
        self.max_queue_bytes, self.timeout = int(max_queue_bytes), float(timeout)
        self.tap_info: dict[int, tuple[str, tuple[int, ...]]] = {}  # hook -> (dtype name, row_shape)
        self._by_handle: dict[int, Request] = {}
        self._lock = threading.Lock()
        self._finished: list[Request] = []
        self._steps: dict[int, tuple[np.ndarray, set]] = {}  # tag -> ([rows, taps, row_bytes] uint8, taps filled)
        self._refs: dict[int, int] = {}
        self._seen: dict[int, int] = {}
        self._done_upto = -1
        self._q: queue.Queue = queue.Queue()
        self._q_bytes = 0
        self._q_cv = threading.Condition()
        self._halt = threading.Event()
        self.error: BaseException | None = None
        self.report: dict[str, Any] = {"samples": 0, "complete": 0, "incomplete": [], "dropped": [], "lost": [],
                                       "entries": 0, "failed_entries": 0, "rows": 0, "bytes_written": 0,
                                       "io_errors": []}
        self._consumer = threading.Thread(target=self._consume, name="ferry-assembler", daemon=True)
        self._writer = threading.Thread(target=self._write_loop, name="ferry-sample-writer", daemon=True)

    def start(self) -> None:
        self._consumer.start()
        self._writer.start()

    # ---- the engine's thread ----
    def add(self, r: Request) -> None:
        with self._lock:
            self._by_handle[r.handle] = r

    def finish(self, handle: int, sequence: list[int] | None, reason: str = "") -> None:
        """The request ended: ``sequence`` its prompt + generated tokens (None: unknown), ``reason`` why it is
        incomplete ("" when it finished normally)."""
        with self._lock:
            r = self._by_handle.get(handle)
            if r is None or r.finished:
                return
            r.finished, r.sequence, r.reason = True, sequence, reason
            self._finished.append(r)

    # ---- the consumer thread ----
    def _consume(self) -> None:
        try:
            while True:
                halting = self._halt.is_set()
                got = self.ch.poll(512, 0.02)
                for e in got:
                    self._entry(e)
                    e.release()
                del got
                self._complete_ready(final=False)
                if halting and not self._idle_drain():
                    break
        except BaseException as err:  # reported by close()
            self.error = err

    def _idle_drain(self) -> bool:
        """After halt: keep polling while the channel still has entries to deliver."""
        st = self.ch.stats()
        return st.get("entries_drained", 0) < st.get("entries_reserved", 0)

    def _entry(self, e: Any) -> None:
        rep = self.report
        rep["entries"] += 1
        tag, hook = int(e.tag), int(e.hook)
        n = self._seen.get(tag, 0) + 1
        self._seen[tag] = n
        if tag - 1 > self._done_upto:
            self._done_upto = tag - 1
        if n == len(self.taps):
            self._done_upto = max(self._done_upto, tag)
            self._seen.pop(tag, None)
        reqs = e.requests or []
        if not reqs:
            return
        if n == 1:
            firsts, _ = read_meta(e.meta, len(reqs))
            with self._lock:
                for k, (h, first, rows) in enumerate(reqs):
                    r = self._by_handle.get(int(h))
                    if r is not None and k < len(firsts):
                        r.segments.append((tag, int(first), int(rows), int(firsts[k])))
                        self._refs[tag] = self._refs.get(tag, 0) + 1
        if not e.ok:
            rep["failed_entries"] += 1
            with self._lock:
                for h, _, _ in reqs:
                    r = self._by_handle.get(int(h))
                    if r is not None:
                        r.errors.append(f"step {tag} tap {self.taps[hook]}: entry failed ({e.size} bytes)")
            return
        rows = int(e.rows)
        rep["rows"] += rows
        if not rows:
            return
        data = e.numpy().reshape(rows, -1).view(np.uint8)
        st = self._steps.get(tag)
        if st is None:  # one array per step: [rows, taps, row_bytes], each tap's entry fills its column
            st = self._steps[tag] = (np.empty((rows, len(self.taps), data.shape[1]), np.uint8), set())
        if st[0].shape[0] != rows or st[0].shape[2] != data.shape[1]:
            with self._lock:
                for h, _, _ in reqs:
                    r = self._by_handle.get(int(h))
                    if r is not None:
                        r.errors.append(f"step {tag} tap {self.taps[hook]}: expected every tap's rows of one shape "
                                        f"{st[0].shape[0]} x {st[0].shape[2]} bytes, got {rows} x {data.shape[1]}")
            return
        st[0][:, hook, :] = data
        st[1].add(hook)

    def _complete_ready(self, final: bool) -> None:
        with self._lock:
            ready = [r for r in self._finished if final or r.last_tag <= self._done_upto]
            self._finished = [r for r in self._finished if r not in ready]
            for r in ready:
                self._by_handle.pop(r.handle, None)
        for r in ready:
            s = self._build(r)
            for tag, *_ in r.segments:
                left = self._refs.get(tag, 1) - 1
                if left <= 0:
                    self._refs.pop(tag, None)
                    self._steps.pop(tag, None)
                else:
                    self._refs[tag] = left
            if s is not None:
                self._enqueue(s)

    def _build(self, r: Request) -> Sample | None:
        """The request's sample: its segments in position order (a position run twice keeps the last run)."""
        seq = r.sequence if r.sequence is not None else r.prompt
        end = min(r.hi, len(seq) - 1)  # the model ran every position of the sequence but its last token
        pos_l, hid_l = [], []
        for tag, first, rows, p0 in sorted(r.segments, key=lambda s: (s[3], s[0])):
            st = self._steps.get(tag)
            if st is None or any(h not in st[1] for h in r.keep):
                continue  # a failed entry of that step: its positions are reported missing
            pos_l.append(np.arange(p0, p0 + rows, dtype=np.int64))
            hid_l.append(st[0][first:first + rows])
        info = [self.tap_info.get(h) for h in r.keep]
        dtype, row_shape = info[0] if info and info[0] else ("U8", ())
        if pos_l:
            pos = np.concatenate(pos_l)
            hid = np.concatenate(hid_l)
            if r.keep != list(range(len(self.taps))):
                hid = np.ascontiguousarray(hid[:, r.keep])
            if np.any(np.diff(pos) <= 0):  # a position run twice (a recomputed step): the last run wins
                last = {int(p): i for i, p in enumerate(pos)}
                order = np.array(sorted(last.values(), key=lambda i: pos[i]), dtype=np.int64)
                pos, hid = pos[order], hid[order]
        else:
            row_bytes = int(np.prod(row_shape, dtype=np.int64)) * (2 if dtype in ("BF16", "F16") else 4)
            pos, hid = np.zeros(0, np.int64), np.zeros((0, len(r.keep), row_bytes), np.uint8)
        # the positions the sample holds: a window all of [lo, hi); a form what the request ran of it (the async
        # mode may run a finished request's last token once more: it is not the sample's)
        target_end = r.hi if (r.strict or r.reason) else max(r.lo, end)
        keep_mask = (pos >= r.lo) & (pos < target_end)
        pos, hid = pos[keep_mask], hid[keep_mask]
        missing = _gaps(pos, r.lo, target_end)
        seq_arr = np.asarray(seq, dtype=np.int64)
        tok = seq_arr[pos] if pos.size and pos.max() < len(seq_arr) else np.full(pos.shape, -1, np.int64)
        reason = "; ".join([x for x in [r.reason] + r.errors if x])
        complete = not missing and not reason
        return Sample(r.request_id, hid, pos, tok, [self.taps[h] for h in r.keep], dtype, row_shape, complete,
                      missing, reason, len(r.prompt))

    def _enqueue(self, s: Sample) -> None:
        n = s.nbytes
        with self._q_cv:
            if self._q_bytes + n > self.max_queue_bytes and self._q_bytes > 0:
                if self.policy == "drop":
                    self.report["dropped"].append({"request_id": s.request_id, "tokens": len(s.positions)})
                    return
                end = time.monotonic() + self.timeout
                while self._q_bytes + n > self.max_queue_bytes and self._q_bytes > 0:
                    if not self._q_cv.wait(max(0.0, end - time.monotonic())):
                        break
            self._q_bytes += n
        self._q.put(s)

    # ---- the writer thread ----
    def _write_loop(self) -> None:
        rep = self.report
        while True:
            s = self._q.get()
            if s is None:
                break
            try:
                self.writer.write(s)
                rep["samples"] += 1
                if s.complete:
                    rep["complete"] += 1
                else:
                    rep["incomplete"].append({"request_id": s.request_id, "missing": s.missing, "reason": s.reason})
            except Exception as err:  # a full disk (OSError) or anything else: this sample is lost, the rest go on
                rep["io_errors"].append(f"{s.request_id}: {type(err).__name__}: {err}")
                rep["lost"].append({"request_id": s.request_id, "tokens": len(s.positions)})
            finally:
                with self._q_cv:
                    self._q_bytes -= s.nbytes
                    self._q_cv.notify_all()
        try:
            self.writer.close()
        except OSError as err:
            rep["io_errors"].append(f"close: {err}")
        rep["bytes_written"] = self.writer.bytes_written

    def close(self, timeout: float = 120.0) -> dict[str, Any]:
        """Drains the channel, builds every finished request's sample (the unfinished ones too, as incomplete:
        ``"not finished when the capture closed"``), writes them and returns the report."""
        with self._lock:
            for r in list(self._by_handle.values()):
                if not r.finished:
                    r.finished, r.reason = True, "not finished when the capture closed"
                    self._finished.append(r)
        self._halt.set()
        self._consumer.join(timeout)
        self._complete_ready(final=True)
        self._q.put(None)
        self._writer.join(timeout)
        if self.error is not None:
            self.report["error"] = repr(self.error)
        return self.report


def _gaps(pos: np.ndarray, lo: int, hi: int) -> list[tuple[int, int]]:
    """The ranges of ``[lo, hi)`` that the sorted positions ``pos`` do not cover."""
    out, at = [], lo
    for p in pos.tolist():
        if p >= hi:
            break
        if p > at:
            out.append((at, p))
        at = max(at, p + 1)
    if at < hi:
        out.append((at, hi))
    return out
