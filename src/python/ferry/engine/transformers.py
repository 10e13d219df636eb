# SPDX-License-Identifier: Apache-2.0
"""ferry as the capture layer of Hugging Face transformers' continuous batching (transformers 5.17 .. 5.25; CI runs
5.25 on CPU): per-request hidden states, eagerly and inside the engine's CUDA graphs, written as training samples.

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

import itertools
import weakref
from typing import Any

from .. import reduce as ferry_reduce
from .assembler import Assembler, Request, dropped_report
from .step import StepCapture, runner_patch
from .samples import SampleWriter
from .spec import Spec, resolve_taps
from .tp import relay as tp_relay, setup as tp_setup, slice_of, write_meta as write_tp_meta

__all__ = ["Capture"]

PREFIX_SHARING = ("ferry.engine: prefix sharing serves cached prompt tokens without running them through the model, "
                  "so their hidden states are never computed: expected ContinuousBatchingConfig("
                  "allow_block_sharing=False)")

def _logic(msg: str) -> Exception:
    from .. import LogicError
    return LogicError(msg)


class Capture(StepCapture):
    """Per-request capture for a transformers model served by continuous batching. ``taps``: see
    ``ferry.engine.resolve_taps``; ``out``: the output directory; ``format``: ``"per-request"`` (one safetensors file
    per request, vLLM EHS's layout), ``"shards"`` or ``"arrow"`` (a Hugging Face dataset, one row per request:
    ``datasets.load_from_disk(out)``; needs pyarrow); or a ``ferry.sinks`` sink such as ``shm_stream(name)``: every
    step's entries (one per tap, the step's rows with its attribution) go to it, and ``ferry.engine.stream_rows``
    reads them in the other process; ``backend``: ferry's (``"auto"``: CUDA for a CUDA model);
    ``on_error``: ``"raise"`` or ``"disable"`` (capture stops, generation goes on, the report says what was lost);
    ``policy``: ``"block"`` or ``"drop"`` when the writer falls behind by ``max_queue_bytes``; ``reduce``: a reducer
    with one record per row (``"fp8_e4m3"``, ``"topk(K)"``: ``ferry.reduce``) computed on the device for every tap,
    whose records the samples hold (``ferry.engine.decode`` splits them); ``writer_tuning``: format "arrow"'s file
    writer (``ferry.arrow``'s ``tuning``: I/O threads and buffers)."""

    def __init__(self, model: Any, taps: Any = "eagle3", out: str = "ferry-samples", *, format: str = "per-request",
                 backend: str = "auto", on_error: str = "raise", policy: str = "block", ring_bytes: int = 256 << 20,
                 shard_bytes: int = 1 << 30, max_queue_bytes: int = 1 << 30, overwrite: bool = False,
                 fsync: bool = False, timeout: float = 30.0, reduce: str | None = None,
                 writer_tuning: dict | None = None) -> None:
        import ferry
        from .. import hooks as fh

        if on_error not in ("raise", "disable"):
            raise _logic(f"ferry.engine.Capture: expected on_error 'raise' or 'disable', got {on_error!r}")
        if model.__dict__.get("_ferry_capture") is not None or model.__dict__.get("_ferry_capture_tp") is not None:
            raise _logic("ferry.engine.Capture: this model already has a Capture attached (close() it first)")
        self.tp, local, self._layout, out, tp_meta = tp_setup(model, resolve_taps(model, taps), out, reduce)
        self.model, self.taps = model, local  # under TP: the taps this rank captures (engine/tp.py)
        self.names = [t.name for t in self.taps]
        self._run_names = tp_meta.get("taps", self.names)
        self._specs: dict[str, Spec] = {}  # under TP: what the driver relays with each request
        dev = next(model.parameters()).device
        self.cuda = dev.type == "cuda"
        self.backend = ("cuda" if self.cuda else "host") if backend == "auto" else backend
        if self.cuda != (self.backend == "cuda"):
            raise _logic(f"ferry.engine.Capture: expected backend 'cuda' for a model on {dev} (or 'host' for a CPU "
                         f"model), got {self.backend!r}")
        self.device, self.on_error, self.timeout = dev, on_error, float(timeout)
        if reduce is not None and (not isinstance(reduce, str) or not ferry._ferry.is_reducer(reduce)
                                   or ferry._ferry.record_unit(reduce) != "row"):
            raise _logic(f"ferry.engine.Capture: expected reduce None or a reducer with one record per row "
                         f"('fp8_e4m3', 'topk(K)'), got {reduce!r}")
        self.reduce = reduce
        self._ch_args = dict(device=dev.index or 0, ring_bytes=int(ring_bytes), publish_every=32,
                             backend=self.backend, fifo_capacity=1 << 14, timeout=float(timeout),
                             on_error=on_error)
        from ..schema import dtype_name
        width = getattr(model.config, "hidden_size", None)
        default = (dtype_name(next(model.parameters()).dtype), (int(width or 0),))  # until a capture tells
        self.ch, self.assembler, self.writer, self._sink = None, None, None, None
        if isinstance(out, (str, bytes)) or hasattr(out, "__fspath__"):
            run_meta = {"taps": self.names, "model": type(model).__name__, "ferry": ferry.__version__,
                        **({"tp": {"world": self.tp.world, "rank": self.tp.rank}} if self.tp else {})}
            self.writer = SampleWriter(str(out), format, shard_bytes=shard_bytes, fsync=fsync, overwrite=overwrite,
                                       run_meta=run_meta, tuning=writer_tuning)
            if self.tp is not None:
                write_tp_meta(str(out), tp_meta)
        if not self.taps:  # under TP, a rank with nothing to capture: no channel, no hook, every step untouched
            self._pub, self._reqs, self._hooks, self.manager, self._batch_ids = None, {}, None, None, 0
            model.__dict__["_ferry_capture_tp"] = self
            return
        if self.writer is not None:
            self.assembler = Assembler(self.names, self.writer, policy=policy, max_queue_bytes=max_queue_bytes,
                                       timeout=float(timeout))
            self.ch = ferry.Channel(**self._ch_args, sink=self.assembler.native)  # entries filed in C++
            self.assembler.tap_info.update({i: default for i in range(len(self.taps))})
            self.assembler.tp = self.tp  # under TP: each sample records its sharded taps' slices
            self.assembler.start()
        else:  # a native sink: the taps' schema travels with the entries
            schema = {i: (t.name, reduce or default[0], default[1]) for i, t in enumerate(self.taps)}
            self.ch = ferry.Channel(**self._ch_args, sink=out, schema=schema)
            self._sink = out
        self._pub = None
        self._seen_taps: set[int] = set()
        self._reqs: dict[str, Request] = {}
        self._handles = itertools.count(1)
        self._tags = itertools.count(0)
        self._plans: Any = weakref.WeakKeyDictionary()
        self._cur = None  # the step being run (step.py)
        self._open = False
        self._graph = False
        self._pending_plan = None
        self._disabled = ""
        self._batch_ids = 0  # generate_batch's next req_<n>
        self._fstream = None if self.cuda else ferry.Stream(backend="host")
        points = [fh.HookPoint(i, t.name, t.module, t.when, deferred=True) for i, t in enumerate(self.taps)]
        self._hooks = fh.install(model, points, self._tap)
        runner_patch()
        model.__dict__["_ferry_capture"] = self

    def _tap_info(self, t: Any, rows: Any, hook: int = 0) -> tuple:
        """A tap's (dtype name, row_shape[, reducer, width]) as its samples hold it (from its first capture), its
        slice under TP; a sample holds one dtype and row shape: a tap that differs from one seen is a LogicError."""
        from ..schema import dtype_name
        row_shape = tuple(int(x) for x in t.shape[2:]) if t.dim() >= 3 else (int(rows.shape[1]),)
        if self.tp is not None and self._layout[hook] is not None:
            self.assembler.tap_slices[hook] = slice_of(self.names[hook], self._layout[hook], self.tp, row_shape)
        info: tuple = (dtype_name(t.dtype), row_shape)
        if self.reduce:
            rec, _ = ferry_reduce.record_layout(self.reduce, int(rows.shape[1]))
            info = ("U8", (rec,), self.reduce, int(rows.shape[1]))
        for h in self._seen_taps - {hook}:
            if self.assembler.tap_info[h][:2] != info[:2]:
                raise _logic(f"ferry.engine.Capture: a sample holds one dtype and row shape for all its taps: "
                             f"expected tap {self.names[hook]!r} like tap {self.names[h]!r}, "
                             f"{self.assembler.tap_info[h][:2]}, got {info[:2]}")
        return info

    # ---- requests ----
    def register(self, request_id: str, input_ids: Any, max_new_tokens: int, spec: Spec | None) -> None:
        """Records what request ``request_id`` captures (before the engine schedules it); ``spec`` None: nothing.
        A second request with the same id, a window it cannot reach or an unknown tap is a ``ferry.LogicError``."""
        if spec is None or not self.taps:  # under TP, a rank with no tap of its own captures nothing
            return
        if not isinstance(spec, Spec):
            raise _logic(f"ferry.engine: request {request_id!r}: expected capture a ferry.engine.Spec or None, got "
                         f"{type(spec).__name__}")
        if request_id in self._reqs:
            raise _logic(f"ferry.engine: expected unique request ids, got {request_id!r} twice")
        prompt = [int(x) for x in input_ids]
        lo, hi = spec.positions(len(prompt), int(max_new_tokens), request_id)
        names = list(spec.taps) if spec.taps is not None else self.names
        run = self._run_names
        unknown = [n for n in names if n not in run]
        if unknown:
            raise _logic(f"ferry.engine: request {request_id!r}: expected taps among the run's {run}, got {unknown}")
        names = [n for n in names if n in self.names]  # under TP: the ones this rank captures
        if not names:
            return
        self._specs[request_id] = spec
        r = Request(request_id, next(self._handles), lo, hi, [self.names.index(n) for n in names], prompt,
                    strict=isinstance(spec.tokens, tuple))
        self._reqs[request_id] = r
        if self.assembler is not None:
            self.assembler.add(r)

    def _finished(self, output: Any) -> None:
        r = self._reqs.get(getattr(output, "request_id", None))
        if r is None or self.assembler is None:
            return
        err = getattr(output, "error", None)
        seq = list(getattr(output, "prompt_ids", r.prompt) or r.prompt) + list(getattr(output, "generated_tokens", []))
        self.assembler.finish(r.handle, seq, f"failed: {err}" if err else "")

    def cancelled(self, request_id: str) -> None:
        """The request was cancelled: its sample is written as incomplete, with what is missing."""
        r = self._reqs.get(request_id)
        if r is not None:
            if self.assembler is not None:
                self.assembler.finish(r.handle, None, "cancelled")
            r.finished = True

    # ---- transformers' entry points ----
    def attach(self, manager: Any) -> Any:
        """Attaches to a ``ContinuousBatchingManager`` (before ``start()``): its finished outputs close their
        requests' samples, its ``cancel_request`` marks them cancelled. Returns the manager."""
        if getattr(manager, "_use_prefix_sharing", False):
            raise _logic(PREFIX_SHARING)
        self.manager = manager
        if not self.taps:  # under TP, a rank with nothing to capture
            return manager
        tp_relay(self, manager)  # under TP: the driver's requests and cancellations reach every rank's Capture
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
        self.manager = manager
        return manager

    def add_request(self, input_ids: Any, request_id: str | None = None, *, capture: Spec | None = None,
                    max_new_tokens: int | None = None, **kwargs: Any) -> str | None:
        """``manager.add_request`` with a capture spec (``request_id`` None: a fresh ``req_<n>``)."""
        m = self.manager
        if max_new_tokens is None:
            max_new_tokens = m.generation_config.max_new_tokens
        if self.tp is not None and self.tp.rank != 0:  # transformers' TP driver takes requests; it relays them
            return m.add_request(input_ids, request_id=request_id, max_new_tokens=max_new_tokens, **kwargs)
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
        if self._hooks is None:  # under TP, a rank with nothing to capture
            self.model.__dict__.pop("_ferry_capture_tp", None)
            self.writer.close()
            return {"samples": 0, "complete": 0, "incomplete": [], "dropped": [], "lost": [], "disabled": "",
                    "requests": 0, "request_ids": {}, "tp": {"world": self.tp.world, "rank": self.tp.rank}}
        self._hooks.remove()
        got: dict = {}
        try:
            err = self.ch.capture_error
            got["capture_errors"] = int(self.ch.stats().get("capture_errors", 0))
            if err is not None and not self._disabled:
                self._disabled = str(err)
        except Exception as err:  # reported, never raised from close
            got["channel_error"] = repr(err)
        try:  # first: every entry reaches the sink (the assembler, or the stream)
            got["channel"] = self.ch.close(timeout=self.timeout)
        except Exception as err:  # reported, never raised from close
            got["channel_error"] = repr(err)
        if self.assembler is not None:
            rep = self.assembler.close(self.timeout * 4)
        else:
            rep = {"samples": 0, "complete": 0, "incomplete": [], "dropped": [], "lost": []}
        rep.update(got)
        if self._sink is not None:  # the stream ends: its reader sees `ended` once it released everything
            try:
                rep["sink"] = self._sink.close()
            except Exception as err:  # reported, never raised from close
                rep["sink_error"] = repr(err)
        ids = self.request_ids()
        if self._sink is not None:  # the stream's policy drop, per request (every entry was delivered)
            rep["dropped"] = dropped_report(self._sink, ids)
        rep["disabled"] = self._disabled
        rep["requests"] = len(self._reqs)
        if self.tp is not None:
            rep["tp"] = {"world": self.tp.world, "rank": self.tp.rank}
        rep["request_ids"] = ids
        return rep

    def request_ids(self) -> dict[int, str]:
        """The core's request handles (``Entry.requests``, ``ShmEntry.requests``) -> transformers' request ids."""
        return {r.handle: r.request_id for r in self._reqs.values()}
