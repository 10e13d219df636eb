# SPDX-License-Identifier: Apache-2.0
"""ferry as the capture layer of Hugging Face transformers' continuous batching (tested with transformers 5.17 and
5.25): per-request hidden states, eagerly and inside the engine's CUDA graphs, written as training samples.

    cap = ferry.engine.Capture(model, taps="eagle3", out="dataset/")          # hooks, channel, sample writer
    outputs = cap.generate_batch(prompts, generation_config=gc, capture=ferry.engine.Spec(tokens="all"))
    report = cap.close()                                                      # samples written, what was lost

or with a manager: ``cap.attach(manager)``, then ``cap.add_request(input_ids, capture=Spec(...), ...)``.

Each step (``ModelRunner.compute_batch``, wrapped for the models a Capture is attached to; others run untouched):
the scheduler's batch (its requests in batch order, each ``query_length`` rows from ``position_offset -
query_length``) gives the rows each capturing request wants; they go up with ONE ``ferry.Publisher`` publication
(two runner slots: a slot's pinned source is rewritten only after its last upload read it, and the device buffers
are rewritten in stream order after the previous step's kernels) into fixed device buffers (row indices, count);
every tap is ``Channel.capture_rows_deferred`` of those rows (one gather per forward). Eager steps open the forward
with the step's tag, request layout and first positions; a CUDA graph is captured once per shape with a ferry plan
of its own, and every replay is planned (``Channel.plan(..., selected=n)``) with the step's tag and layout. Nothing
waits for the GPU. A step with no capturing request runs eagerly without ferry, or replays with ``selected=0``.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from typing import Any

import numpy as np

from .assembler import Assembler, Request
from .samples import SampleWriter
from .spec import Spec, resolve_taps

__all__ = ["Capture"]

_GROUP = "ferry_selection"


def _logic(msg: str) -> Exception:
    from .. import LogicError
    return LogicError(msg)


def _runner_patch() -> None:
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

    def __init__(self, tag: int, rows: np.ndarray, requests: list, firsts: list) -> None:
        self.tag, self.rows, self.requests = tag, rows, requests
        self.meta = np.asarray(firsts, dtype="<i8").tobytes()
        self.count = int(len(rows))


class Capture:
    """Per-request capture for a transformers model served by continuous batching. ``taps``: see
    ``ferry.engine.resolve_taps``; ``out``: the output directory; ``format``: ``"per-request"`` (one safetensors file
    per request, vLLM EHS's layout) or ``"shards"``; ``backend``: ferry's (``"auto"``: CUDA for a CUDA model);
    ``on_error``: ``"raise"`` or ``"disable"`` (capture stops, generation goes on, the report says what was lost);
    ``policy``: ``"block"`` or ``"drop"`` when the writer falls behind by ``max_queue_bytes``."""

    def __init__(self, model: Any, taps: Any = "eagle3", out: str = "ferry-samples", *, format: str = "per-request",
                 backend: str = "auto", on_error: str = "raise", policy: str = "block", ring_bytes: int = 256 << 20,
                 shard_bytes: int = 1 << 30, max_queue_bytes: int = 1 << 30, overwrite: bool = False,
                 fsync: bool = False, timeout: float = 30.0) -> None:
        import ferry
        from .. import hooks as fh

        if on_error not in ("raise", "disable"):
            raise _logic(f"ferry.engine.Capture: expected on_error 'raise' or 'disable', got {on_error!r}")
        if model.__dict__.get("_ferry_capture") is not None:
            raise _logic("ferry.engine.Capture: this model already has a Capture attached (close() it first)")
        self.model, self.taps = model, resolve_taps(model, taps)
        self.names = [t.name for t in self.taps]
        dev = next(model.parameters()).device
        self.cuda = dev.type == "cuda"
        self.backend = ("cuda" if self.cuda else "host") if backend == "auto" else backend
        if self.cuda != (self.backend == "cuda"):
            raise _logic(f"ferry.engine.Capture: expected backend 'cuda' for a model on {dev} (or 'host' for a CPU "
                         f"model), got {self.backend!r}")
        self.device, self.on_error, self.timeout = dev, on_error, float(timeout)
        self._ch_args = dict(device=dev.index or 0, ring_bytes=int(ring_bytes), publish_every=32,
                             backend=self.backend, fifo_capacity=1 << 14, timeout=float(timeout), size_slots=1 << 14,
                             on_error=on_error)
        run_meta = {"taps": self.names, "model": type(model).__name__, "ferry": ferry.__version__}
        self.writer = SampleWriter(out, format, shard_bytes=shard_bytes, fsync=fsync, overwrite=overwrite,
                                   run_meta=run_meta)
        self.ch = ferry.Channel(**self._ch_args)
        self.assembler = Assembler(self.ch, self.names, self.writer, policy=policy, max_queue_bytes=max_queue_bytes)
        from ..schema import dtype_name
        width = getattr(model.config, "hidden_size", None)
        for i in range(len(self.taps)):  # until a capture tells: the model's dtype and hidden size
            self.assembler.tap_info[i] = (dtype_name(next(model.parameters()).dtype), (int(width or 0),))
        self.assembler.start()
        self._pub = None
        self._seen_taps: set[int] = set()
        self._reqs: dict[str, Request] = {}
        self._handles = itertools.count(1)
        self._tags = itertools.count(0)
        self._plans: Any = weakref.WeakKeyDictionary()
        self._cur: _Step | None = None
        self._open = False
        self._graph = False
        self._pending_plan = None
        self._disabled = ""
        self._slot = 0
        self._fstream = None if self.cuda else ferry.Stream(backend="host")
        points = [fh.HookPoint(i, t.name, t.module, t.when, deferred=True) for i, t in enumerate(self.taps)]
        self._hooks = fh.install(model, points, self._tap)
        _runner_patch()
        model.__dict__["_ferry_capture"] = self

    # ---- requests ----
    def register(self, request_id: str, input_ids: Any, max_new_tokens: int, spec: Spec | None) -> None:
        """Records what request ``request_id`` captures (before the engine schedules it); ``spec`` None: nothing.
        A second request with the same id, a window it cannot reach or an unknown tap is a ``ferry.LogicError``."""
        if spec is None:
            return
        if not isinstance(spec, Spec):
            raise _logic(f"ferry.engine: request {request_id!r}: expected capture a ferry.engine.Spec or None, got "
                         f"{type(spec).__name__}")
        if request_id in self._reqs:
            raise _logic(f"ferry.engine: expected unique request ids, got {request_id!r} twice")
        prompt = [int(x) for x in input_ids]
        lo, hi = spec.positions(len(prompt), int(max_new_tokens), request_id)
        names = list(spec.taps) if spec.taps is not None else self.names
        unknown = [n for n in names if n not in self.names]
        if unknown:
            raise _logic(f"ferry.engine: request {request_id!r}: expected taps among the run's {self.names}, got "
                         f"{unknown}")
        r = Request(request_id, next(self._handles), lo, hi, [self.names.index(n) for n in names], prompt,
                    strict=isinstance(spec.tokens, tuple))
        self._reqs[request_id] = r
        self.assembler.add(r)

    def _finished(self, output: Any) -> None:
        r = self._reqs.get(getattr(output, "request_id", None))
        if r is None:
            return
        err = getattr(output, "error", None)
        seq = list(getattr(output, "prompt_ids", r.prompt) or r.prompt) + list(getattr(output, "generated_tokens", []))
        self.assembler.finish(r.handle, seq, f"failed: {err}" if err else "")

    def cancelled(self, request_id: str) -> None:
        """The request was cancelled: its sample is written as incomplete, with what is missing."""
        r = self._reqs.get(request_id)
        if r is not None:
            self.assembler.finish(r.handle, None, "cancelled")
            r.finished = True

    # ---- the engine's step ----
    def _setup(self, runner: Any) -> None:
        import ferry
        import torch

        cfg = runner.cb_config
        if cfg.varlen_compile_config is not None or cfg.decode_compile_config is not None:
            raise _logic("ferry.engine: continuous batching with torch.compile (varlen/decode_compile_config) is not "
                         "supported: expected both None (CUDA graphs are)")
        self.cap = int(runner.cache.max_batch_tokens)
        self._rows_t = torch.zeros(self.cap, dtype=torch.int32, device=self.device)
        self._count_t = torch.zeros(1, dtype=torch.int32, device=self.device)
        self._pub = ferry.Publisher(device=self._ch_args["device"], backend=self.backend)
        self._rows_b = self._pub.declare("ferry_rows", [_GROUP], np.int32, self.cap, dst=self._rows_t)
        self._count_b = self._pub.declare("ferry_count", [_GROUP], np.int32, 1, dst=self._count_t)
        if self.cuda:
            torch.cuda.synchronize(self.device)  # the buffers were made on torch's current stream
        self._stream0 = self._stream(runner)
        self._pub.initialize(slots=2, stream=self._stream0)

    def _stream(self, runner: Any) -> Any:
        return runner.inputs_and_outputs.compute_stream if self.cuda else self._fstream

    def _select(self, requests_in_batch: list, tag: int) -> _Step:
        parts, reqs, firsts, row0, n = [], [], [], 0, 0
        for fs in requests_in_batch:
            st, q = fs.state, int(fs.query_length)
            r = self._reqs.get(st.request_id)
            if r is not None and not r.finished:
                past = int(st.position_offset) - q  # prepare_batch_tensors advanced it by this step's tokens
                a, b = max(past, r.lo), min(past + q, r.hi)
                if a < b:
                    parts.append(np.arange(row0 + a - past, row0 + b - past, dtype=np.int32))
                    reqs.append((r.handle, n, b - a))
                    firsts.append(a)
                    n += b - a
                    r.last_tag = tag
            row0 += q
        rows = np.concatenate(parts) if parts else np.zeros(0, np.int32)
        return _Step(tag, rows, reqs, firsts)

    @contextlib.contextmanager
    def _upload(self, step: _Step, stream: Any):
        pub = self._pub
        with pub.begin(self._slot % 2):
            self._slot += 1
            with pub.producer(_GROUP) as p:
                if step.count:
                    p.source(self._rows_b)[:step.count] = step.rows
                p.set_count(self._rows_b, step.count)
                p.source(self._count_b)[0] = step.count
                p.set_count(self._count_b, 1)
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
        if t.requires_grad:
            t = t.detach()
        if not t.is_contiguous():
            t = t.contiguous()
        n = t.shape[0] * t.shape[1] if t.dim() >= 3 else t.shape[0]
        rows = t.reshape(n, -1)
        a = self.assembler
        if hook not in self._seen_taps:
            self._seen_taps.add(hook)
            from ..schema import dtype_name
            a.tap_info[hook] = (dtype_name(t.dtype), tuple(int(x) for x in t.shape[2:] if t.dim() >= 3)
                                or (int(rows.shape[1]),))
        kw = {"stream": self._fstream} if self._fstream is not None else {}
        if self._graph:
            self.ch.capture_rows_deferred(hook, rows, rows=self._rows_t, count=self._count_t, max_count=self.cap, **kw)
        else:
            self.ch.capture_rows_deferred(hook, rows, rows=self._rows_t, count=self._cur.count, **kw)

    def _disable(self, err: BaseException) -> None:
        self._disabled = f"{type(err).__name__}: {err}"

    def _run_disabled(self, runner: Any, model: Any, batch_data: dict, orig: Any) -> None:
        """Capture is off (on_error="disable"): eager steps run untouched; a replay of a graph with ferry's kernels
        is still planned (empty) so that its kernels find a token and write nothing."""
        io = runner.inputs_and_outputs
        plan = None
        if self.ch is not None and self.cuda:
            _, use_graph = runner._get_forward_fn(use_block_table=io.use_block_table)
            graph = io.get_graph() if use_graph else None
            plan = self._plans.get(graph) if graph is not None else None
        if plan is not None:
            try:
                self.ch.plan(plan, self._stream(runner), selected=0)
            except Exception:  # the channel itself is disabled or invalidated: its replays write nothing
                pass
        return orig(runner, model, batch_data)

    # ---- transformers' entry points ----
    def attach(self, manager: Any) -> Any:
        """Attaches to a ``ContinuousBatchingManager`` (before ``start()``): its finished outputs close their
        requests' samples, its ``cancel_request`` marks them cancelled. Returns the manager."""
        router = manager.output_router
        for name in ("deliver", "deliver_batch"):
            orig = getattr(router, name)

            def wrapped(outputs: Any, _orig: Any = orig, _many: bool = name == "deliver_batch") -> Any:
                for o in (outputs if _many else [outputs]):
                    if o.is_finished():
                        self._finished(o)
                return _orig(outputs)

            setattr(router, name, wrapped)
        cancel = manager.cancel_request

        def cancel_request(request_id: str) -> None:
            self.cancelled(request_id)
            cancel(request_id)

        manager.cancel_request = cancel_request
        if getattr(manager, "_use_prefix_sharing", False):
            raise _logic("ferry.engine: prefix sharing skips the forward of cached prompt tokens, so their hidden "
                         "states are never computed: expected ContinuousBatchingConfig(allow_block_sharing=False)")
        self.manager = manager
        return manager

    def add_request(self, input_ids: Any, request_id: str | None = None, *, capture: Spec | None = None,
                    max_new_tokens: int | None = None, **kwargs: Any) -> str | None:
        """``manager.add_request`` with a capture spec (``request_id`` None: a fresh ``req_<n>``)."""
        m = self.manager
        if max_new_tokens is None:
            max_new_tokens = m.generation_config.max_new_tokens
        if request_id is None:
            request_id = f"req_ferry_{len(self._reqs)}_{next(self._handles)}"
        self.register(request_id, input_ids, max_new_tokens, capture)
        return m.add_request(input_ids, request_id=request_id, max_new_tokens=max_new_tokens, **kwargs)

    def generate_batch(self, inputs: list, generation_config: Any = None, *, capture: Any = None,
                       continuous_batching_config: Any = None, max_new_tokens: int | None = None,
                       warmup: bool = True, progress: Any = None) -> dict:
        """``model.generate_batch`` with capture: ``capture`` one Spec for every input, a list (a Spec or None per
        input), or None. Returns ``{request_id: GenerationOutput}`` in input order (ids ``req_0, req_1, ...``)."""
        from .transformers_run import generate_batch
        return generate_batch(self, inputs, generation_config, capture, continuous_batching_config, max_new_tokens,
                              warmup, progress)

    def close(self) -> dict:
        """Removes the hooks and the dispatch, drains the channel, writes every sample and returns the report:
        samples written, complete, incomplete (with what is missing), dropped, lost, and why capture was
        disabled."""
        self.model.__dict__.pop("_ferry_capture", None)
        self._hooks.remove()
        rep = self.assembler.close(self.timeout * 4)
        try:
            err = self.ch.capture_error
            rep["capture_errors"] = int(self.ch.stats().get("capture_errors", 0))
            if err is not None and not self._disabled:
                self._disabled = str(err)
        except Exception as err:  # reported, never raised from close
            rep["channel_error"] = repr(err)
        try:
            rep["channel"] = self.ch.close(timeout=self.timeout)
        except Exception as err:  # reported, never raised from close
            rep["channel_error"] = repr(err)
        rep["disabled"] = self._disabled
        rep["requests"] = len(self._reqs)
        return rep
