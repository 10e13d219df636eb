# SPDX-License-Identifier: Apache-2.0
"""Capture hooks on a torch ``nn.Module``: forward pre/post hooks chosen by module-name pattern, and the two
presets for transformers' Qwen3 models (``hidden-states`` and ``vllm-full``).

A hook only enqueues a capture (``Channel.capture`` or ``torch.ops.ferry.capture``) on the current stream: no
host synchronisation, no allocation unless the tensor is not contiguous. It works eagerly and while the forward
is being captured into a ``torch.cuda.graph`` (the engine owns the graph: ``ch.plan(plan)`` before each replay).

```python
points = ferry.hooks.preset(model, "vllm-full")          # 12 * layers + 5 HookPoints, ids 0, 1, 2, ...
with ferry.hooks.install(model, points, ferry.hooks.channel_capture(ch, stream)) as hooks:
    ch.begin_forward(stream); model(...); ch.end_forward(stream)
hooks.names[e.hook]                                        # "layers.3.q"
```

Hook ids are the position of the hook in the forward's execution order (so, in an eager forward, entry ``seq``
order equals hook id order), and depend only on the preset and the number of decoder layers L:

- ``hidden-states`` (L hooks): id ``l`` = ``layers.{l}.resid_pre``, the input of decoder layer ``l``.
- ``vllm-full`` (12 L + 5 hooks): ``0`` token_ids, ``1`` embeddings, ``2 + 12 l + k`` = ``layers.{l}.<k-th of
  LAYER_POINTS>``, ``12 L + 2`` final_residual, ``12 L + 3`` final_norm, ``12 L + 4`` logits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from .capture import (  # noqa: F401  (re-exported)
    CaptureFn, Collector, capture_fn, channel_capture, ops_capture, rows_capture)
from ._wrap import Wrapped

__all__ = [
    "GLOBAL_POINTS", "LAYER_POINTS", "PRESETS", "Collector", "HookPoint", "Hooks", "Rule", "capture_fn",
    "channel_capture", "deferred_ids", "install", "names", "ops_capture", "preset", "rows_capture", "select",
]

#: ``(name, submodule of the decoder layer, "input" | "output")`` per layer of ``vllm-full``, in execution
#: order; ``k`` in the id formula is the index in this tuple.
LAYER_POINTS: tuple[tuple[str, str, str], ...] = (
    ("resid_pre", "", "input"),                        # the decoder layer's input (residual stream)
    ("ln1", "input_layernorm", "output"),
    ("q", "self_attn.q_norm", "output"),               # after q_norm, before RoPE: [B, S, heads, head_dim]
    ("k", "self_attn.k_norm", "output"),               # after k_norm, before RoPE: [B, S, kv_heads, head_dim]
    ("v", "self_attn.v_proj", "output"),
    ("attn_out", "self_attn.o_proj", "input"),         # attention output before o_proj
    ("o_proj", "self_attn.o_proj", "output"),
    ("resid_mid", "post_attention_layernorm", "input"),  # residual + attention
    ("ln2", "post_attention_layernorm", "output"),
    ("mlp_in", "mlp", "input"),
    ("act_mul", "mlp.down_proj", "input"),             # act(gate) * up
    ("mlp_out", "mlp", "output"),
)

#: ``(name, module relative to the CausalLM, "input" | "output", where)`` of ``vllm-full`` outside the layers;
#: ``where`` is "pre" (ids 0, 1) or "post" (ids 12 L + 2 ...).
GLOBAL_POINTS: tuple[tuple[str, str, str, str], ...] = (
    ("token_ids", "model.embed_tokens", "input", "pre"),
    ("embeddings", "model.embed_tokens", "output", "pre"),
    ("final_residual", "model.norm", "input", "post"),
    ("final_norm", "model.norm", "output", "post"),
    ("logits", "lm_head", "output", "post"),
)

PRESETS = ("hidden-states", "vllm-full")


@dataclass(frozen=True)
class HookPoint:
    """One capture point: ``id`` (the ferry hook id), ``name``, the qualified ``module`` name (as in
    ``model.named_modules()``) and ``when``: ``"input"`` (the module's first input, a forward pre-hook) or
    ``"output"`` (its output, or the first element of a tuple output, a forward hook)."""

    id: int
    name: str
    module: str
    when: str
    #: whether the hooked tensor may be captured deferred (``Channel.capture_deferred``): it is not written in
    #: place between the hook and the end of the forward. Every point of the presets is: in transformers'
    #: Qwen3DecoderLayer ``hidden_states = residual + hidden_states`` makes a new tensor, RoPE makes new q/k,
    #: and the KV cache update copies v (the v_proj output itself is not written). ``select`` leaves it False.
    deferred: bool = False


@dataclass(frozen=True)
class Rule:
    """A module-name pattern for ``select``: ``pattern`` is a regular expression matched in full against the
    qualified module names; ``name`` is formatted with ``module`` (the qualified name), ``when`` and the
    pattern's numbered groups (``{1}``...) and named groups."""

    pattern: str
    when: str = "output"
    name: str = "{module}.{when}"


def _check_when(when: str) -> None:
    if when not in ("input", "output"):
        from . import LogicError
        raise LogicError(f"ferry.hooks: expected when 'input' or 'output', got {when!r}")


def select(model: Any, rules: Iterable[Rule], first_id: int = 0) -> list[HookPoint]:
    """HookPoints for every (module, rule) pair whose pattern matches the module's qualified name. Ids are
    ``first_id, first_id + 1, ...`` in ``model.named_modules()`` order, then rule order within a module."""
    rules = list(rules)
    compiled = []
    for r in rules:
        _check_when(r.when)
        compiled.append((re.compile(r.pattern), r))
    out: list[HookPoint] = []
    for qual, _ in model.named_modules():
        for rx, r in compiled:
            m = rx.fullmatch(qual)
            if m is None:
                continue
            label = r.name.format(*(("",) + m.groups()), module=qual, when=r.when, **m.groupdict())
            out.append(HookPoint(first_id + len(out), label, qual, r.when))
    return out


def _layers(model: Any) -> tuple[str, int]:
    """The qualified-name prefix of the decoder layers ("model.layers") and their number."""
    for prefix, owner in (("model.", getattr(model, "model", None)), ("", model)):
        layers = getattr(owner, "layers", None) if owner is not None else None
        if layers is not None:
            return prefix + "layers", len(layers)
    from . import LogicError
    raise LogicError(f"ferry.hooks: expected a Qwen3ForCausalLM-like model (with .model.layers), "
                     f"got {type(model).__name__} without decoder layers")


def names(preset_name: str, num_layers: int) -> dict[int, str]:
    """The preset's map hook id -> name for ``num_layers`` decoder layers (no model needed: for consumers)."""
    if preset_name == "hidden-states":
        return {l: f"layers.{l}.resid_pre" for l in range(num_layers)}
    if preset_name == "vllm-full":
        out = {0: "token_ids", 1: "embeddings"}
        for l in range(num_layers):
            for k, (n, _, _) in enumerate(LAYER_POINTS):
                out[2 + 12 * l + k] = f"layers.{l}.{n}"
        for j, (n, _, _, _) in enumerate(GLOBAL_POINTS[2:]):
            out[12 * num_layers + 2 + j] = n
        return out
    from . import LogicError
    raise LogicError(f"ferry.hooks: expected a preset in {PRESETS}, got {preset_name!r}")


def preset(model: Any, preset_name: str) -> list[HookPoint]:
    """The preset's HookPoints on a transformers Qwen3ForCausalLM (``hidden-states``: L; ``vllm-full``:
    12 L + 5), ids as in the module docstring."""
    layers, n = _layers(model)
    base = layers[: -len("layers")]  # "model." or ""
    if preset_name == "hidden-states":
        return [HookPoint(l, f"layers.{l}.resid_pre", f"{layers}.{l}", "input", True) for l in range(n)]
    if preset_name != "vllm-full":
        names(preset_name, n)  # raises
    if not base or getattr(model, "lm_head", None) is None:
        from . import LogicError
        raise LogicError(f"ferry.hooks: preset 'vllm-full' expects a CausalLM with model.layers and lm_head, "
                         f"got {type(model).__name__}")
    pts = [HookPoint(j, n_, mod, when, True) for j, (n_, mod, when, _) in enumerate(GLOBAL_POINTS[:2])]
    for l in range(n):
        for k, (n_, sub, when) in enumerate(LAYER_POINTS):
            mod = f"{layers}.{l}" + (f".{sub}" if sub else "")
            pts.append(HookPoint(2 + 12 * l + k, f"layers.{l}.{n_}", mod, when, True))
    for j, (n_, mod, when, _) in enumerate(GLOBAL_POINTS[2:]):
        pts.append(HookPoint(12 * n + 2 + j, n_, mod, when, True))
    return pts


def deferred_ids(points: Sequence[HookPoint]) -> frozenset[int]:
    """The ids of the points that may be captured deferred (``HookPoint.deferred``)."""
    return frozenset(p.id for p in points if p.deferred)


# --------------------------------------------------------------------------------------------------- install

def _first_input(args: tuple, kwargs: dict) -> Any:
    if args:
        return args[0]
    for key in ("hidden_states", "input", "input_ids", "x"):
        if kwargs.get(key) is not None:
            return kwargs[key]
    for v in kwargs.values():
        if hasattr(v, "data_ptr"):
            return v
    return None


class Hooks:
    """The installed hooks: ``remove()`` (or leaving a ``with`` block) unregisters every one. ``points`` (in id
    order), ``names`` (hook id -> name), ``len()``."""

    def __init__(self, points: Sequence[HookPoint], handles: list) -> None:
        self.points = sorted(points, key=lambda p: p.id)
        self.names = {p.id: p.name for p in self.points}
        self._handles = handles

    def __len__(self) -> int:
        return len(self.points)

    def remove(self) -> None:
        """Unregisters every hook (idempotent)."""
        while self._handles:
            self._handles[-1].remove()  # a handle that refuses (a forward wrapped again since) stays listed
            self._handles.pop()

    @property
    def installed(self) -> bool:
        return bool(self._handles)

    def __enter__(self) -> "Hooks":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


def install(model: Any, points: Sequence[HookPoint], capture: CaptureFn, *, via: str = "hooks") -> Hooks:
    """Registers one forward pre-hook ("input") or forward hook ("output") per (module, when) that captures each
    of its points' tensor with ``capture(hook_id, tensor)``. ``via="forward"``: each such module's ``forward`` is
    wrapped instead (an instance attribute, restored by ``remove()``), so a call skips torch's hook dispatch
    (most of a hook's CPU cost in eager mode); its captures then run inside the module's forward, before any
    forward hook of the module, and two installs wrapping one module must be removed in reverse order. Unknown
    module names, duplicate ids and another ``via`` raise ``ferry.LogicError`` before anything is registered."""
    from . import LogicError

    if via not in ("hooks", "forward"):
        raise LogicError(f"ferry.hooks.install: expected via 'hooks' or 'forward', got {via!r}")

    modules = dict(model.named_modules())
    seen: set[int] = set()
    groups: dict[tuple[str, str], list[int]] = {}
    for p in points:
        _check_when(p.when)
        if p.module not in modules:
            raise LogicError(f"ferry.hooks.install: hook {p.id} ({p.name}): expected a module named "
                             f"{p.module!r} in {type(model).__name__}, got none")
        if p.id in seen:
            raise LogicError(f"ferry.hooks.install: expected unique hook ids, got {p.id} twice")
        seen.add(p.id)
        groups.setdefault((p.module, p.when), []).append(p.id)

    handles = []
    for (mod, when), ids in groups.items():
        fn = _hook_fn(when, tuple(ids), capture)
        if via == "forward":
            handles.append(Wrapped(modules[mod], mod, when, fn))
            continue
        hook = modules[mod].register_forward_pre_hook if when == "input" else modules[mod].register_forward_hook
        handles.append(hook(fn, **({"with_kwargs": True} if when == "input" else {})))
    return Hooks(points, handles)


def _hook_fn(when: str, ids: tuple[int, ...], capture: CaptureFn) -> Any:
    """The torch hook of one (module, when): a pre-hook taking the module's first input, or a forward hook taking
    its output (the first element of a tuple or list). This runs once per hooked module per forward: one id (every
    point of the presets) is captured without a loop, the first positional input without a helper call."""
    if when == "input":
        if len(ids) == 1:
            (h,) = ids

            def pre1(_m, args, kwargs):
                capture(h, args[0] if args else _first_input(args, kwargs))
            return pre1

        def pre(_m, args, kwargs):
            t = args[0] if args else _first_input(args, kwargs)
            for h in ids:
                capture(h, t)
        return pre
    if len(ids) == 1:
        (h,) = ids

        def post1(_m, _args, out):
            capture(h, out[0] if isinstance(out, (tuple, list)) else out)
        return post1

    def post(_m, _args, out):
        t = out[0] if isinstance(out, (tuple, list)) else out
        for h in ids:
            capture(h, t)
    return post
