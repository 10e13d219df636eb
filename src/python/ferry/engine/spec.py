# SPDX-License-Identifier: Apache-2.0
"""What a request asks to capture: ``Spec(tokens=...)`` per request, and the run's taps (``taps(model, ...)``).

Tokens are absolute positions of the request's sequence (prompt tokens at ``0 .. P-1``, the g-th generated token
at ``P + g``). A token's hidden state exists once the engine has run it through the model, so the last generated
token of a request never has one (nothing reads it back in). Each form names one range ``[lo, hi)``:

==================  ===================================================
``"prompt"``        ``[0, P)``
``"generated"``     ``[P, P + max_new_tokens - 1)``
``"all"``           ``[0, P + max_new_tokens - 1)``
``"last_prompt"``   ``[P - 1, P)``
``(a, b)``          ``[a, b)``, a window of absolute positions (vLLM RFC #56916)
==================  ===================================================

A request that stops early (EOS) captures what its sequence ran through; a window it never reached is reported
missing (the sample is then incomplete, never padded).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

__all__ = ["TOKEN_FORMS", "TAP_PRESETS", "Spec", "Tap", "resolve_taps"]

TOKEN_FORMS = ("prompt", "generated", "all", "last_prompt")
TAP_PRESETS = ("eagle3", "all-layers", "sae")


def _logic(msg: str) -> Exception:
    from .. import LogicError
    return LogicError(msg)


@dataclass(frozen=True)
class Spec:
    """One request's capture: ``tokens`` (a form of ``TOKEN_FORMS`` or an ``(a, b)`` window) and ``taps`` (None:
    every tap of the run; else the names of the run's taps this request's samples keep)."""

    tokens: Any = "all"
    taps: Sequence[str] | None = None

    def __post_init__(self) -> None:
        t = self.tokens
        if isinstance(t, str):
            if t not in TOKEN_FORMS:
                raise _logic(f"ferry.engine.Spec: expected tokens one of {TOKEN_FORMS} or an (a, b) window, got {t!r}")
        elif isinstance(t, (tuple, list)) and len(t) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                                    for x in t):
            a, b = t
            if a < 0 or b <= a:
                raise _logic(f"ferry.engine.Spec: expected a window (a, b) with 0 <= a < b, got ({a}, {b}) "
                             f"({'empty or inverted' if b <= a else 'negative start'})")
            object.__setattr__(self, "tokens", (int(a), int(b)))
        else:
            raise _logic(f"ferry.engine.Spec: expected tokens one of {TOKEN_FORMS} or an (a, b) window of ints, "
                         f"got {t!r}")
        if self.taps is not None:
            object.__setattr__(self, "taps", tuple(str(x) for x in self.taps))

    def positions(self, prompt_len: int, max_new_tokens: int, request: str = "") -> tuple[int, int]:
        """The range ``[lo, hi)`` of positions this spec asks of a request with a ``prompt_len``-token prompt and at
        most ``max_new_tokens`` new tokens; a window past the last position the request can run (``prompt_len +
        max_new_tokens - 2``) is a ``ferry.LogicError``."""
        p, n = int(prompt_len), int(max_new_tokens)
        if p < 1:
            raise _logic(f"ferry.engine: request {request!r}: expected a prompt of at least 1 token, got {p}")
        end = p + max(n, 1) - 1  # one past the last position the model runs
        t = self.tokens
        if t == "prompt":
            return 0, p
        if t == "generated":
            if end <= p:
                raise _logic(f"ferry.engine: request {request!r}: tokens='generated' needs max_new_tokens >= 2 "
                             f"(the last generated token is never run through the model), got {n}")
            return p, end
        if t == "all":
            return 0, end
        if t == "last_prompt":
            return p - 1, p
        a, b = t
        if b > end:
            raise _logic(f"ferry.engine: request {request!r}: expected the window ({a}, {b}) within the positions "
                         f"the request can run, [0, {end}) (prompt {p} + max_new_tokens {n} - 1), got end {b}")
        return a, b


@dataclass(frozen=True)
class Tap:
    """One captured tensor per token: ``name``, the ``module`` (qualified, as in ``named_modules()``) and ``when``
    (``"input"`` | ``"output"``), as ``ferry.hooks.HookPoint`` names a point. ``tp``, under tensor parallelism
    (engine/tp.py): ``"replicated"`` (captured on rank 0), a row dimension (each rank holds a slice of it), or None
    (the model's TP plan tells; the presets' taps are the residual stream, replicated)."""

    name: str
    module: str
    when: str = "output"
    tp: Any = None

    def __post_init__(self) -> None:
        if not (self.tp in (None, "replicated") or (isinstance(self.tp, int) and not isinstance(self.tp, bool))):
            raise _logic(f"ferry.engine.Tap {self.name!r}: expected tp None, 'replicated' or a row dimension (int), "
                         f"got {self.tp!r}")


def _decoder(model: Any) -> tuple[str, int]:
    """The decoder's prefix (``"model"`` for a ``*ForCausalLM``) and its layer count."""
    for prefix in ("model", ""):
        base = getattr(model, prefix, None) if prefix else model
        layers = getattr(base, "layers", None)
        if layers is not None and hasattr(base, "embed_tokens") and hasattr(base, "norm"):
            return prefix, len(layers)
    raise _logic(f"ferry.engine: expected a decoder model with embed_tokens, layers and norm (a transformers "
                 f"*ForCausalLM such as Qwen3 or Llama), got {type(model).__name__}")


def resolve_taps(model: Any, taps: Any = "eagle3") -> list[Tap]:
    """The run's taps. ``taps``: a preset (``"eagle3"``: layers ``[2, N//2, N-3]`` and the final norm's output, the
    target hidden state, as speculators' EAGLE-3 data; ``"all-layers"``: the N + 1 hidden states of
    ``output_hidden_states=True``, the embeddings, layers ``0 .. N-2`` and the final norm's output; ``"sae"`` or
    ``"sae:i"``: layer ``i``'s output, default ``N // 2``), a list of layer indices and ``"final"``, ``Tap``\\ s, or
    ``ferry.hooks.Rule``\\ s. Layer ``i``'s output is the residual stream after decoder layer ``i`` (HF's
    ``hidden_states[i + 1]`` for ``i < N - 1``)."""
    prefix, n = _decoder(model)
    pre = prefix + "." if prefix else ""

    def layer(i: int) -> Tap:
        if not -n <= i < n:
            raise _logic(f"ferry.engine: expected a layer index in [0, {n}) of this {n}-layer model, got {i}")
        i %= n
        return Tap(f"layer.{i}", f"{pre}layers.{i}", tp="replicated")

    final = Tap("final", f"{pre}norm", tp="replicated")
    if isinstance(taps, str):
        if taps == "eagle3":
            if n < 4:
                raise _logic(f"ferry.engine: preset 'eagle3' needs at least 4 layers (layers 2, N//2, N-3), got {n}")
            idx = list(dict.fromkeys((2, n // 2, n - 3)))  # a small model repeats one: kept once, in order
            return [layer(i) for i in idx] + [final]
        if taps == "all-layers":
            emb = Tap("embeddings", f"{pre}embed_tokens", tp="replicated")
            return [emb] + [layer(i) for i in range(n - 1)] + [final]
        if taps == "sae" or taps.startswith("sae:"):
            idx = n // 2 if taps == "sae" else _int(taps[4:], taps)
            return [layer(idx)]
        raise _logic(f"ferry.engine: expected taps a preset {TAP_PRESETS} ('sae:i' for layer i), a list of layer "
                     f"indices / 'final' / Tap / ferry.hooks.Rule, got {taps!r}")
    out: list[Tap] = []
    for t in taps:
        if isinstance(t, Tap):
            model.get_submodule(t.module)  # AttributeError naming the module when it is not there
            out.append(t)
        elif t == "final":
            out.append(final)
        elif isinstance(t, int) and not isinstance(t, bool):
            out.append(layer(t))
        elif hasattr(t, "pattern"):
            from ..hooks import select
            out += [Tap(p.name, p.module, p.when) for p in select(model, [t])]
        else:
            raise _logic(f"ferry.engine: expected a tap as a layer index, 'final', a Tap or a ferry.hooks.Rule, "
                         f"got {t!r}")
    names = [t.name for t in out]
    if not out or len(set(names)) != len(names):
        raise _logic(f"ferry.engine: expected one or more taps with distinct names, got {names}")
    return out


def _int(s: str, whole: str) -> int:
    try:
        return int(s)
    except ValueError:
        raise _logic(f"ferry.engine: expected 'sae:<layer index>', got {whole!r}") from None
