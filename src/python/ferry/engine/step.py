# SPDX-License-Identifier: Apache-2.0
"""The engine's step with capture (``Capture``'s half that runs in transformers' generation loop; the design and
its ordering chain: docs/design/engine.md). ``ModelRunner.compute_batch`` dispatches here for a model with a
Capture: the step's selection from the scheduler's batch, its upload through ``ferry.Publisher``, the eager forward
opened with the step's attribution or the graph replay planned with it, the taps as row captures."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from ..capture import _ready, _strided
from .stream import positions_meta

__all__ = ["StepCapture", "runner_patch"]

_GROUP = "ferry_selection"


def _logic(msg: str) -> Exception:
    from .. import LogicError
    return LogicError(msg)


def runner_patch() -> None:
    """``ModelRunner.compute_batch`` dispatches to the model's Capture (installed once; a model without one runs
    the original)."""
    from transformers.generation.continuous_batching import model_runner as mr

    cls = mr.ModelRunner
    if getattr(cls.compute_batch, "_ferry_orig", None) is not None:
        return
    orig = cls.compute_batch

    def compute_batch(self: Any, model: Any, batch_data: dict) -> None:
        cap = model.__dict__.get("_ferry_capture")
        if cap is None:
            return orig(self, model, batch_data)
        return cap._compute_batch(self, model, batch_data, orig)

    compute_batch._ferry_orig = orig  # type: ignore[attr-defined]
    cls.compute_batch = compute_batch


class _Step:
    __slots__ = ("tag", "rows", "requests", "meta", "count")

    def __init__(self, tag: int, rows: np.ndarray, requests: list, firsts: list, ids: list) -> None:
        self.tag, self.rows, self.requests = tag, rows, requests
        self.meta = positions_meta(firsts, ids)
        self.count = int(len(rows))


class StepCapture:
    """The per-step methods of ``Capture`` (a mixin: its state is the Capture's)."""

    # ---- the engine's step ----
    def _setup(self, runner: Any) -> None:
        import torch

        cfg = runner.cb_config
        if cfg.varlen_compile_config is not None or cfg.decode_compile_config is not None:
            raise _logic("ferry.engine: continuous batching with torch.compile (varlen/decode_compile_config) is not "
                         "supported: expected both None (CUDA graphs are)")
        self.cap = int(runner.cache.max_batch_tokens)
        self._strided_layout = _strided()
        self._rows_t = torch.zeros(self.cap, dtype=torch.int32, device=self.device)
        self._count_t = torch.zeros(1, dtype=torch.int32, device=self.device)
        if self.cuda:
            torch.cuda.synchronize(self.device)  # the buffers were made on torch's current stream
        self._pub = {}

    def _publisher(self, stream: Any) -> tuple:
        """This thread's publisher of the step's selection. A publisher is used by one thread (h2d.md: the owner
        thread), and transformers runs steps on two: the warm-up's graph captures on the caller's thread, the
        generation loop on its own. Each (thread, compute stream) gets a publisher over the same device buffers; each
        publishes on the compute stream of the steps that read its uploads (design/engine.md, E4)."""
        import threading

        import ferry

        tid = (threading.get_ident(), id(stream))  # and per stream: a new manager has a new compute stream
        got = self._pub.get(tid)
        if got is None:
            if self.cuda:  # another stream's steps may still read the buffers: they finish first (once per stream)
                import torch
                torch.cuda.synchronize(self.device)
            pub = ferry.Publisher(device=self._ch_args["device"], backend=self.backend)
            rows_b = pub.declare("ferry_rows", [_GROUP], np.int32, self.cap, dst=self._rows_t)
            count_b = pub.declare("ferry_count", [_GROUP], np.int32, 1, dst=self._count_t)
            pub.initialize(slots=2, stream=stream)
            got = self._pub[tid] = [pub, rows_b, count_b, 0]
        return got

    def _stream(self, runner: Any) -> Any:
        return runner.inputs_and_outputs.compute_stream if self.cuda else self._fstream

    def _select(self, requests_in_batch: list, tag: int) -> _Step:
        """The step's rows to keep, in batch order, and their attribution. Runs on the engine's thread every step:
        one pass over the batch without per-request arrays (a decode step's requests keep one row each)."""
        get = self._reqs.get
        starts, reqs, firsts, ids = [], [], [], []
        row0 = n = 0
        for fs in requests_in_batch:
            st, q = fs.state, int(fs.query_length)
            r = get(st.request_id)
            if r is not None and not r.finished:
                past = int(st.position_offset) - q  # prepare_batch_tensors advanced it by this step's tokens
                a = past if past > r.lo else r.lo
                b = past + q if past + q < r.hi else r.hi
                if a < b:
                    starts.append(row0 + a - past)
                    reqs.append((r.handle, n, b - a))
                    firsts.append(a)
                    ids.append(r.request_id)
                    n += b - a
                    r.last_tag = tag
            row0 += q
        if n == len(starts):  # one row per request
            rows = np.array(starts, dtype=np.int32)
        else:  # request k's rows: starts[k] .. starts[k] + len_k - 1, at output rows first_k ..
            k = len(reqs)
            lens = np.fromiter((x[2] for x in reqs), np.int64, k)
            offs = np.fromiter((x[1] for x in reqs), np.int64, k)
            rows = (np.repeat(np.asarray(starts, np.int64) - offs, lens) + np.arange(n)).astype(np.int32)
        return _Step(tag, rows, reqs, firsts, ids)

    @contextlib.contextmanager
    def _upload(self, step: _Step, stream: Any):
        got = self._publisher(stream)
        pub, rows_b, count_b, slot = got
        got[3] = slot + 1
        with pub.begin(slot % 2):
            with pub.producer(_GROUP) as p:
                if step.count:
                    p.source(rows_b)[:step.count] = step.rows
                p.set_count(rows_b, step.count)
                p.source(count_b)[0] = step.count
                p.set_count(count_b, 1)
            pub.publish(_GROUP, stream)
            if not self.cuda:
                stream.synchronize()  # host backend: the eager row capture reads the selection at the call
            yield

    def _compute_batch(self, runner: Any, model: Any, batch_data: dict, orig: Any) -> None:
        if self._disabled:
            return self._run_disabled(runner, model, batch_data, orig)
        try:
            if self._pub is None:
                self._setup(runner)
            if runner.__dict__.get("_ferry_forward") is None:
                self._wrap_forward(runner)
            io = runner.inputs_and_outputs
            host_io = io.io_pairs[io.current_pair].host_io if hasattr(io, "io_pairs") else io
            step = self._select(host_io.requests_in_batch, next(self._tags))
            _, use_graph = runner._get_forward_fn(use_block_table=io.use_block_table)
            stream = self._stream(runner)
        except Exception as err:
            if self.on_error == "raise":
                raise
            self._disable(err)
            return self._run_disabled(runner, model, batch_data, orig)
        try:
            out = self._run_step(runner, model, batch_data, orig, step, use_graph, stream)
        except BaseException:
            self._release(quiet=True)  # the step's own error is the one to report
            raise
        self._release(quiet=False)
        return out

    def _release(self, quiet: bool) -> None:
        """Steps run on two threads (the warm-up's graph captures on the caller's, the generation loop on its own),
        one at a time: after each step the next step's thread may become the channel's producer thread."""
        try:
            self.ch.release_producer_thread()
        except Exception as err:
            if quiet:
                return
            if self.on_error == "raise":
                raise
            self._disable(err)

    def _run_step(self, runner: Any, model: Any, batch_data: dict, orig: Any, step: _Step, use_graph: bool,
                  stream: Any) -> None:
        io = runner.inputs_and_outputs
        if not use_graph:
            if not step.count:
                return orig(runner, model, batch_data)
            self._cur = step
            try:
                with self._upload(step, stream):
                    return orig(runner, model, batch_data)
            finally:
                self._cur = None
        graph = io.get_graph()
        self._cur = step
        try:
            with self._upload(step, stream):
                if graph is not None:
                    plan = self._plans.get(graph)
                    if plan is None:
                        raise _logic("ferry.engine: a CUDA graph captured before the Capture was attached is being "
                                     "replayed: attach the Capture before the manager's warmup")
                    self.ch.plan(plan, stream, tag=step.tag, requests=step.requests, meta=step.meta,
                                 selected=step.count)
                    return orig(runner, model, batch_data)
                self._pending_plan = None
                out = orig(runner, model, batch_data)
                if self._pending_plan is not None:
                    self._plans[io.get_graph()] = self._pending_plan
                return out
        finally:
            self._cur = None

    def _wrap_forward(self, runner: Any) -> None:
        import torch

        real = runner._forward_process_and_sample

        def forward(*args: Any) -> None:
            stream = self._stream(runner)
            ch = self.ch
            if self.cuda and torch.cuda.is_current_stream_capturing():
                ch.begin_forward(stream)
                self._open, self._graph = True, True
                try:
                    real(*args)
                    self._pending_plan = ch.end_forward(stream)
                except BaseException:
                    ch.abort_forward(stream)
                    raise
                finally:
                    self._open = self._graph = False
                return
            step = self._cur
            if step is None or not step.count:
                return real(*args)
            ch.begin_forward(stream, tag=step.tag, requests=step.requests, meta=step.meta)
            self._open = True
            try:
                real(*args)
                ch.end_forward(stream)
            except BaseException:
                ch.abort_forward(stream)
                raise
            finally:
                self._open = False

        runner._forward_process_and_sample = forward
        runner.__dict__["_ferry_forward"] = forward

    def _tap(self, hook: int, t: Any) -> None:
        if not self._open:
            return
        try:
            self._capture(hook, t)
        except Exception as err:
            if self.on_error == "raise":
                raise
            self._disable(err)

    def _capture(self, hook: int, t: Any) -> None:
        t = _ready(hook, t, self._strided_layout)
        n = t.shape[0] * t.shape[1] if t.dim() >= 3 else t.shape[0]
        rows = t.reshape(n, -1)
        a = self.assembler
        if a is not None and hook not in self._seen_taps:
            self._seen_taps.add(hook)
            a.tap_info[hook] = self._tap_info(t, rows, hook)
        kw = {"stream": self._fstream} if self._fstream is not None else {}
        # reduce=: a reducer's record per row; the taps' records one reduce_rows_publish per batch, as rows a gather
        cap = self.ch.capture_rows_deferred
        kw.update({"reduce": self.reduce} if self.reduce else {})
        if self._graph:
            cap(hook, rows, rows=self._rows_t, count=self._count_t, max_count=self.cap, **kw)
        else:
            cap(hook, rows, rows=self._rows_t, count=self._cur.count, **kw)

    def _disable(self, err: BaseException) -> None:
        self._disabled = f"{type(err).__name__}: {err}"

    def _run_disabled(self, runner: Any, model: Any, batch_data: dict, orig: Any) -> None:
        """Capture is off (on_error="disable"): eager steps run untouched; a replay of a graph with ferry's kernels
        is still planned (empty) so that its kernels find a token and write nothing."""
        io = runner.inputs_and_outputs
        plan = None
        if self.cuda:
            _, use_graph = runner._get_forward_fn(use_block_table=io.use_block_table)
            graph = io.get_graph() if use_graph else None
            plan = self._plans.get(graph) if graph is not None else None
        if plan is not None:
            try:
                self.ch.plan(plan, self._stream(runner), selected=0)
            except Exception:  # the channel itself is disabled or invalidated: its replays write nothing
                pass
            self._release(quiet=True)
        return orig(runner, model, batch_data)
