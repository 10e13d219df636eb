# SPDX-License-Identifier: Apache-2.0
"""Per-request samples from a channel's row entries, off the engine's path and off the GIL.

The assembling is ferry's C++ sink ``sink::sample_assembler`` (``_ferry.SampleAssembler``, the channel's sink):
each step's forward carries its attribution (``tag`` = the step, ``requests`` = ``(request handle, first_row,
rows)`` in row order, ``meta`` = the int64 first position of each of those requests, ``stream.positions_meta``);
every tap is one row entry of that forward (hook id = the tap's index). The drain thread files each entry's rows
once, in C++; a request is ready once the engine says it finished and every step it ran in was delivered; the
writer thread here takes ready samples (built in C++ with the GIL released) and writes them (``SampleWriter``).
Beyond ``max_queue_bytes`` of ready samples, ``policy="block"`` holds the drain, ``"drop"`` drops the sample and
reports it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from .samples import Sample, SampleWriter

__all__ = ["Assembler", "Request", "dropped_report"]


def dropped_report(sink: Any, ids: dict[int, str]) -> list[dict[str, Any]]:
    """A native sink's policy drops (``dropped_requests()``: the assembler's or a stream's) by the engine's request
    ids: ``[{"request_id", "tokens", "steps"}]``."""
    return [{"request_id": ids.get(h, str(h)), "tokens": int(rows), "steps": int(steps)}
            for h, steps, rows in sink.dropped_requests()]


@dataclass
class Request:
    """One request that asked for capture: its id, integer ``handle`` (the core's request id), the positions
    ``[lo, hi)`` asked for, the taps its sample keeps, and the last step that held rows of it."""

    request_id: str
    handle: int
    lo: int
    hi: int
    keep: list[int]
    prompt: list[int]
    strict: bool = False  # a window: every position of [lo, hi) is due, even past an early stop
    last_tag: int = -1
    finished: bool = False


class Assembler:
    """``Assembler(taps, writer)``: ``native`` is the channel's sink; ``start()``, ``add(request)``,
    ``finish(handle, sequence, reason)`` from the engine's thread; ``close()`` (after the channel's) writes what is
    left and returns the report."""

    def __init__(self, taps: list[str], writer: SampleWriter, *, policy: str = "block",
                 max_queue_bytes: int = 1 << 30, timeout: float = 60.0) -> None:
        from .. import LogicError, _ferry
        if policy not in ("block", "drop"):
            raise LogicError(f"ferry.engine: expected policy 'block' or 'drop', got {policy!r}")
        self.taps, self.writer = list(taps), writer
        self.native = _ferry.SampleAssembler(len(self.taps), policy=policy, max_pending_bytes=int(max_queue_bytes),
                                             timeout=float(timeout))
        self.tap_info: dict[int, tuple] = {}  # hook -> (dtype name, row_shape[, reducer, width])
        self.tp: Any = None  # tensor parallelism (engine/tp.py's TP) and each sharded tap's slice, by hook
        self.tap_slices: dict[int, dict] = {}
        self._by_handle: dict[int, Request] = {}
        self.error: BaseException | None = None
        self.report: dict[str, Any] = {"samples": 0, "complete": 0, "incomplete": [], "dropped": [], "lost": [],
                                       "entries": 0, "failed_entries": 0, "rows": 0, "bytes_written": 0,
                                       "io_errors": []}
        self._writer = threading.Thread(target=self._write_loop, name="ferry-sample-writer", daemon=True)

    def start(self) -> None:
        self._writer.start()

    # ---- the engine's thread ----
    def add(self, r: Request) -> None:
        self._by_handle[r.handle] = r
        self.native.add(r.handle, r.request_id, r.lo, r.hi, r.keep, r.prompt, r.strict)

    def finish(self, handle: int, sequence: list[int] | None, reason: str = "") -> None:
        """The request ended: ``sequence`` its prompt + generated tokens (None: unknown), ``reason`` why it is
        incomplete ("" when it finished normally)."""
        r = self._by_handle.get(handle)
        if r is None or r.finished:
            return
        r.finished = True
        self.native.finish(handle, sequence or [], reason, r.last_tag)

    # ---- the writer thread ----
    def _sample(self, got: tuple) -> Sample:
        handle, rid, keep, hidden, pos, tok, missing, reason, complete = got
        info = [self.tap_info.get(h) for h in keep]
        dtype, row_shape, *red = info[0] if info and info[0] else ("U8", ())
        r = self._by_handle.get(handle)
        tp = None
        if self.tp is not None:
            tp = {"world": self.tp.world, "rank": self.tp.rank,
                  "slices": {self.taps[h]: self.tap_slices[h] for h in keep if h in self.tap_slices}}
        return Sample(rid, hidden, pos, tok, [self.taps[h] for h in keep], dtype, row_shape, complete,
                      [tuple(m) for m in missing], reason, len(r.prompt) if r is not None else 0,
                      *(red or ("", 0)), tp)

    def _write_loop(self) -> None:
        rep = self.report
        try:
            while True:
                got = self.native.next(0.05)
                if got is None:
                    if self.native.done:
                        break
                    self._dropped()  # idle: the report catches up with the assembler's drops
                    continue
                s = self._sample(got)
                try:
                    self.writer.write(s)
                    rep["samples"] += 1
                    if s.complete:
                        rep["complete"] += 1
                    else:
                        rep["incomplete"].append({"request_id": s.request_id, "missing": s.missing,
                                                  "reason": s.reason})
                except Exception as err:  # a full disk (OSError) or anything else: this sample is lost
                    rep["io_errors"].append(f"{s.request_id}: {type(err).__name__}: {err}")
                    rep["lost"].append({"request_id": s.request_id, "tokens": len(s.positions)})
        except BaseException as err:  # reported by close()
            self.error = err
        try:
            self.writer.close()
        except OSError as err:
            rep["io_errors"].append(f"close: {err}")
        rep["bytes_written"] = self.writer.bytes_written

    def _dropped(self) -> None:
        """The native assembler's policy drops, by request id (each with its tokens), when there are new ones."""
        if self.native.stats()["samples_dropped"] != len(self.report["dropped"]):
            ids = {h: r.request_id for h, r in self._by_handle.items()}
            self.report["dropped"] = dropped_report(self.native, ids)

    def close(self, timeout: float = 120.0) -> dict[str, Any]:
        """After the channel closed (every entry delivered): ends every request not finished as incomplete
        (``"not finished when the capture closed"``), writes every sample and returns the report."""
        st = self.native.close()
        self._writer.join(timeout)
        self._dropped()
        for k in ("entries", "failed_entries", "rows"):
            self.report[k] = int(st[k])
        if self.error is not None:
            self.report["error"] = repr(self.error)
        return self.report
