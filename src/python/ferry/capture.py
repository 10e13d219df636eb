# SPDX-License-Identifier: Apache-2.0
"""The capture call sites of ``ferry.hooks`` (re-exported there): ``capture(hook, tensor)`` closures over
``Channel.capture`` / ``capture_deferred`` or ``torch.ops.ferry.capture`` / ``capture_deferred``. Each only
converts the tensor (detached when it requires grad, contiguous when it is not; a sparse or other non-strided
tensor is refused, as the torch ops refuse it); what a capture means (when a deferred batch flushes, how long the
tensor is held) is the C++ core's."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

__all__ = ["CaptureFn", "Collector", "capture_fn", "channel_capture", "ops_capture", "rows_capture"]

CaptureFn = Callable[[int, Any], None]


def _strided() -> Any:
    """``torch.strided``, looked up once per closure (None without torch: then no tensor is a torch tensor)."""
    try:
        import torch
    except ImportError:
        return None
    return torch.strided


def _layout_error(hook: int, t: Any) -> Exception:
    from . import LogicError
    return LogicError(f"ferry.hooks capture (hook {hook}): expected a dense (strided) tensor, got a {t.layout} "
                      f"tensor (ferry copies the bytes of a contiguous tensor; .to_dense() it first)")


def _ready(hook: int, t: Any, strided: Any) -> Any:
    """``t`` as a capture takes it: detached when it requires grad, contiguous when it is not. A tensor of
    another layout (sparse COO / CSR / BSR, MKL-DNN, jagged) is a ``ferry.LogicError`` naming the hook and the
    layout, as ``torch.ops.ferry.*`` refuse it (torch's ``.contiguous()`` raised ``RuntimeError``)."""
    if t.layout is not strided and strided is not None:
        raise _layout_error(hook, t)
    if t.requires_grad:
        t = t.detach()
    return t if t.is_contiguous() else t.contiguous()


def _deferred_set(deferred: Any) -> bool | frozenset[int]:
    """``deferred`` as a constant (False / True) or the set of deferred hook ids."""
    if deferred is True or deferred is False or deferred is None:
        return bool(deferred)
    return frozenset(int(p.id) if hasattr(p, "deferred") else int(p)
                     for p in deferred if not hasattr(p, "deferred") or p.deferred)


def _lend_reader() -> None:
    """Imports ``ferry.torch_ops`` where the op library is built: its import lends ``ferry._ferry`` the tensor
    reader (a plain dense torch.Tensor read in C++, no Python attribute call per capture)."""
    try:
        from . import torch_ops  # noqa: F401
    except (ImportError, OSError, RuntimeError, AttributeError):
        pass


def channel_capture(channel: Any, stream: Any = None, *, deferred: Any = False) -> CaptureFn:
    """``capture(hook, t)`` through ``channel.capture(hook, t, stream)`` (the core call). ``stream=None``: torch's
    current stream (CUDA backend); the host backend needs its ``ferry.Stream``. ``deferred``: False, True, or the
    hook ids (or HookPoints, e.g. a preset: those with ``deferred``) captured with ``channel.capture_deferred``.
    On a ferry Channel the closure is ``channel.capture_fn``: one C++ function that reads a plain dense
    torch.Tensor without a Python call (with the tensor reader of ``ferry.torch_ops``, lent here where it is
    built) and resolves a fixed stream and the deferred choice once; any other tensor is made ready here
    (detached when it requires grad, contiguous when it is not, a non-strided layout refused) and given to
    ``channel.capture`` / ``capture_deferred``. Another channel object gets the same as a Python closure."""
    imm = channel.capture
    dfr = channel.capture_deferred
    d = _deferred_set(deferred)
    strided = _strided()
    make = getattr(channel, "capture_fn", None)
    if make is not None:
        _lend_reader()
        return make(stream, deferred=d, prepare=lambda hook, t: _ready(hook, t, strided))
    if d is True or d is False or not d:
        fn = dfr if d is True else imm

        def capture(hook: int, t: Any) -> None:
            fn(hook, _ready(hook, t, strided), stream)

        return capture
    ids = d

    def capture_mixed(hook: int, t: Any) -> None:
        (dfr if hook in ids else imm)(hook, _ready(hook, t, strided), stream)

    return capture_mixed


def ops_capture(channel: Any, token: Any = None, device: Any = None, *, deferred: Any = False) -> CaptureFn:
    """``capture(hook, t)`` through ``torch.ops.ferry.capture(token, t, channel.handle, hook)`` (needs the
    torch extension, ``ferry.torch_ops``; ImportError otherwise). One token serves every capture. The closure
    calls the OpOverloads (``torch.ops.ferry.capture.default``): no overload resolution per call."""
    import torch
    from . import torch_ops  # noqa: F401  (registers torch.ops.ferry)

    if token is None:
        token = torch_ops.token(device if device is not None else "cpu")
    op = torch.ops.ferry.capture.default
    op_d = torch.ops.ferry.capture_deferred.default
    handle = channel.handle
    strided = torch.strided
    d = _deferred_set(deferred)

    if d is True or d is False or not d:
        fn = op_d if d is True else op

        def capture(hook: int, t: Any) -> None:
            fn(token, _ready(hook, t, strided), handle, hook)
    else:
        ids = d

        def capture(hook: int, t: Any) -> None:
            (op_d if hook in ids else op)(token, _ready(hook, t, strided), handle, hook)

    capture.token = token  # type: ignore[attr-defined]
    return capture


def capture_fn(channel: Any, stream: Any = None, *, use_ops: str | bool = "auto", device: Any = None,
               deferred: Any = False) -> CaptureFn:
    """The capture call site. ``use_ops=True``: ``torch.ops.ferry.capture`` (``ops_capture``); False:
    ``Channel.capture`` (``channel_capture``); ``"auto"``: the op where ``ferry.torch_ops`` is built, else
    ``Channel.capture`` -- on a CUDA channel, the op only while torch.compile traces the hook and
    ``Channel.capture(hook, t, stream)`` in eager calls (the cheaper call: no torch dispatch; the same entries,
    on the same stream when ``stream`` is None or torch's current stream). ``deferred``: False (every hook
    immediate), True (every hook deferred), or hook ids / HookPoints (pass the preset's points: those marked
    ``deferred`` use deferred capture, one gather launch per batch of K; the tensor must not be written in
    place before the batch's flush)."""
    if use_ops:
        try:
            traced = ops_capture(channel, device=device, deferred=deferred)
        except (ImportError, AttributeError, OSError):
            if use_ops is True:
                raise
        else:
            if use_ops is True or getattr(channel, "backend", None) != "cuda":
                return traced
            import torch

            eager = channel_capture(channel, stream, deferred=deferred)
            compiling = torch.compiler.is_compiling

            def capture(hook: int, t: Any) -> None:
                if compiling():
                    traced(hook, t)
                else:
                    eager(hook, t)

            capture.token = traced.token  # type: ignore[attr-defined]
            return capture
    return channel_capture(channel, stream, deferred=deferred)


def rows_capture(channel: Any, stream: Any = None, *, deferred: bool = True, **selection: Any) -> CaptureFn:
    """``capture(hook, t)`` of the selected rows only (continuous batching: the requests that want capture this
    step), through ``channel.capture_rows_deferred`` (``deferred=True``: one gather per batch of hooks sharing the
    selection) or ``channel.capture_rows``. A hooked ``[B, S, ...]`` tensor is taken as ``B * S`` token rows of the
    remaining dims (a ``[B, S]`` token-id tensor: one element per row). ``selection``: the keywords of
    ``Channel.capture_rows`` (``rows=`` or ``query_start_loc=`` + ``requests=`` [+ ``window=``], ``count=``,
    ``max_count=``): device tensors at fixed addresses that the engine rewrites every step (e.g. with
    ``ferry.Publisher``), so the closure works eagerly and inside a captured ``torch.cuda.graph``."""
    fn = channel.capture_rows_deferred if deferred else channel.capture_rows
    strided = _strided()
    sel = dict(selection)
    if stream is not None:
        sel["stream"] = stream

    def capture(hook: int, t: Any) -> None:
        t = _ready(hook, t, strided)
        n = t.shape[0] * t.shape[1] if t.dim() >= 2 else t.shape[0]
        fn(hook, t.reshape(n, -1), **sel)

    return capture


class Collector:
    """Batched deferred capture for eager forwards: the capture function given to ``ferry.hooks.install`` only
    appends ``(hook, tensor, tensor._version)`` to the forward's list (no call into ferry per hook: in a real
    forward most of such a call's cost is its cold caches), and ``end_forward`` hands the list to the channel in
    one call that then ends the forward (``Channel.capture_deferred_many(..., end_forward=True)``: each item as
    ``capture_deferred`` takes it, in order, then ``end_forward``). Hooks not in ``deferred`` are captured at their
    call (``capture_fn``), after the collected ones are handed over (entry order). A collected tensor must not be
    written in place before the hand-over: the hand-over refuses one that was (``ferry.LogicError``), as the
    deferred flush does. Eager forwards only (a torch.compile'd or graph-captured forward: ``capture_fn``)::

        col = ferry.hooks.Collector(ch, deferred=points)
        with ferry.hooks.install(model, points, col, via="forward"):
            with col.forward(tag=step):
                model(...)
    """

    def __init__(self, channel: Any, stream: Any = None, *, deferred: Any = True) -> None:
        self.channel, self.stream = channel, stream
        self._deferred = _deferred_set(deferred)
        self._items: list[tuple[int, Any, int]] = []
        self._immediate = channel_capture(channel, stream, deferred=False)
        strided = _strided()
        self._prepare = lambda hook, t: _ready(hook, t, strided)

    def __call__(self, hook: int, t: Any) -> None:
        d = self._deferred
        if d is True or (d is not False and hook in d):
            try:
                v = t._version
            except (AttributeError, RuntimeError):  # not a torch tensor, or an inference tensor: no counter
                v = -1
            self._items.append((hook, t, v))
            return
        self.hand_over()
        self._immediate(hook, t)

    def pending(self) -> int:
        """The captures collected and not yet handed over."""
        return len(self._items)

    def hand_over(self) -> None:
        """Hands the collected captures to the channel now (``end_forward`` does it); the list is emptied
        whatever the call raises."""
        if self._items:
            items, self._items = self._items, []
            self.channel.capture_deferred_many(items, self.stream, prepare=self._prepare)

    def begin_forward(self, **meta: Any) -> None:
        """``channel.begin_forward(stream, **meta)``. Captures left over from a forward ended without this
        collector are dropped and refused (``ferry.LogicError``): they belong to no open forward."""
        if self._items:
            n, self._items = len(self._items), []
            from . import LogicError
            raise LogicError(f"ferry.hooks.Collector: expected no collected captures before begin_forward, got {n} "
                             "left from a forward ended without Collector.end_forward (dropped)")
        self.channel.begin_forward(self.stream, **meta)

    def end_forward(self) -> Any:
        """Hands the collected captures over and ends the forward in one call (its Plan); a hand-over that raises
        leaves the forward open, as ``hand_over()`` then ``channel.end_forward(stream)`` would."""
        items, self._items = self._items, []
        return self.channel.capture_deferred_many(items, self.stream, prepare=self._prepare, end_forward=True)

    def abort_forward(self) -> bool:
        """Drops the collected captures and ``channel.abort_forward(stream)``."""
        self._items = []
        return self.channel.abort_forward(self.stream)

    @contextlib.contextmanager
    def forward(self, **meta: Any) -> Iterator[None]:
        """``begin_forward(**meta)``, the body, ``end_forward()``; a body, a hand-over or an end that raises
        aborts the forward still open (``abort_forward``) and the error propagates."""
        self.begin_forward(**meta)
        try:
            yield
            self.end_forward()
        except BaseException:
            self.abort_forward()
            raise
