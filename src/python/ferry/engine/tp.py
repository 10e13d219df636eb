# SPDX-License-Identifier: Apache-2.0
"""The engine under tensor parallelism (transformers' ``from_pretrained(..., tp_plan="auto")`` in every process of
``torchrun``): one ``Capture`` per rank, each writing ``{out}/rank-NNNNN`` with its ``tp.json``; nothing gathered in
the forward. ``open_samples(out)`` assembles the ranks' samples (tp_samples.py).

- **The layout of a tap.** A replicated tap (the residual stream: the presets' layers, ``"final"``, the embeddings,
  a row-parallel linear's output) is captured on rank 0 only; the other ranks install no hook for it. A sharded tap
  (a column-parallel linear's output, a row-parallel linear's input: attention's ``z``, the MLP intermediate) is
  captured on every rank, each with its slice (``ferry.tp.shard``) in its samples' metadata. The layout comes from
  ``Tap.tp`` (``"replicated"`` or a row dimension), else from the model's TP plan for a module it names
  (``colwise``: output sharded, input replicated; ``rowwise``: input sharded, output replicated); any other tap is
  a ``ferry.LogicError`` naming it, never a guess.
- **One schedule.** transformers' TP driver (rank 0) owns the requests and broadcasts them to the other ranks
  (``DistributedHelper.tp_broadcast_object_from_rank_0``); ``relay`` rides that broadcast: each new request carries
  its ``Spec``, each cancellation reaches every rank's Capture. No collective of ferry's own.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from typing import Any

from .._files import replace_json

__all__ = ["RANK_DIR", "TP_META", "TP", "layouts", "relay", "setup", "slice_of", "tp_of", "write_meta"]

RANK_DIR = "rank-{:05d}"
TP_META = "tp.json"
_OUT_SHARDED = ("colwise",)  # styles whose output holds a slice of the last dim (input replicated)
_IN_SHARDED = ("rowwise",)  # styles whose input holds a slice of the last dim (output all-reduced: replicated)
_OUT_WHOLE = ("rowwise", "colwise_gather_output", "colwise_rep", "embedding_rowwise")


def _logic(msg: str) -> Exception:
    from .. import LogicError
    return LogicError(msg)


@dataclass(frozen=True)
class TP:
    """This process's place in the tensor-parallel group: ``rank`` of ``world``."""

    world: int
    rank: int


def tp_of(model: Any) -> TP | None:
    """The TP group of a transformers model loaded with a TP plan (its ``_device_mesh``, as transformers'
    ``DistributedHelper`` reads it: the ``"tp"`` dimension, or the whole mesh when it has no names); None without
    one, or with a group of one."""
    mesh = getattr(model, "_device_mesh", None)
    if mesh is None:
        return None
    names = getattr(mesh, "mesh_dim_names", None)
    if names is not None:
        if "tp" not in names:
            return None
        mesh = mesh["tp"]
    world = int(mesh.size())
    return TP(world, int(mesh.get_local_rank())) if world > 1 else None


def _plan_style(model: Any, module: str) -> str | None:
    plan = getattr(model, "tp_plan", None) or getattr(model, "_tp_plan", None) or {}
    if module in plan:
        return plan[module]
    return next((s for pat, s in plan.items() if fnmatch.fnmatchcase(module, pat)), None)


def layouts(model: Any, taps: list, tp: TP) -> list[tuple[int, int | None] | None]:
    """Per tap: None (replicated) or ``(dim, full)``: sharded along row dimension ``dim``, ``full`` the whole extent
    (None: ``extent * world``, an even split, known at the first capture)."""
    out: list[tuple[int, int | None] | None] = []
    for t in taps:
        if t.tp == "replicated":
            out.append(None)
            continue
        if isinstance(t.tp, int) and not isinstance(t.tp, bool):
            out.append((int(t.tp), None))
            continue
        style = _plan_style(model, t.module)
        mod = model.get_submodule(t.module)
        if t.when == "output" and style in _OUT_SHARDED and hasattr(mod, "out_features"):
            out.append((-1, int(mod.out_features)))
        elif t.when == "input" and style in _IN_SHARDED and hasattr(mod, "in_features"):
            out.append((-1, int(mod.in_features)))
        elif (t.when == "output" and style in _OUT_WHOLE) or (t.when == "input" and style in _OUT_SHARDED):
            out.append(None)
        else:
            raise _logic(f"ferry.engine.Capture: tensor parallelism (world {tp.world}): expected tap {t.name!r} "
                         f"replicated or sharded: give Tap(..., tp='replicated' | <row dim>) (module {t.module!r}'s "
                         f"{t.when}, TP plan style {style!r}, tells neither), got tp={t.tp!r}")
    return out


def slice_of(tap: str, layout: tuple[int, int | None], tp: TP, row_shape: tuple[int, ...]) -> dict:
    """The slice this rank holds of a sharded tap whose rows are ``row_shape`` (``ferry.tp.shard``): an even split
    unless ``full`` is known, then torch's chunking (``ceil(full / world)`` per rank, the last ones shorter)."""
    from ..tp import shard
    dim, full = layout
    if not -len(row_shape) <= dim < len(row_shape):
        raise _logic(f"ferry.engine.Capture: tap {tap!r}: expected its shard dim within its row shape {row_shape}, "
                     f"got {dim}")
    dim %= len(row_shape)
    extent = int(row_shape[dim])
    if full is None:
        return shard(tp.world, tp.rank, dim, extent)
    chunk = -(-full // tp.world)
    offset = min(tp.rank * chunk, full)
    if extent != min(chunk, full - offset):
        raise _logic(f"ferry.engine.Capture: tap {tap!r} (rank {tp.rank} of {tp.world}): expected a slice of "
                     f"{min(chunk, full - offset)} of dim {dim}'s {full} (torch's chunking), got rows {row_shape}")
    return shard(tp.world, tp.rank, dim, extent, full, offset)


def write_meta(directory: str, meta: dict) -> None:
    """``tp.json`` of this rank's directory (``setup``'s meta), written whole: a temporary file renamed."""
    os.makedirs(directory, exist_ok=True)
    replace_json(os.path.join(directory, TP_META), meta)


def relay(cap: Any, manager: Any) -> None:
    """Rides transformers' broadcast of new requests and cancellations from the TP driver: on the driver each new
    request's state carries its capture Spec (``_ferry_spec``); on the others each state's Spec is registered with
    this rank's Capture and each cancellation marks its request."""
    helper = getattr(manager, "distributed_helper", None)
    if helper is None or getattr(helper, "tp_size", 1) <= 1:
        return
    orig = helper.tp_broadcast_object_from_rank_0

    def broadcast(obj: Any) -> Any:
        if helper.is_tp_driver:
            for s in obj[0]:
                s.__dict__["_ferry_spec"] = cap._specs.get(s.request_id)
        got = orig(obj)
        if not helper.is_tp_driver:
            states, cancels = got
            for s in states:
                spec = s.__dict__.pop("_ferry_spec", None)
                if spec is not None:
                    cap.register(s.request_id, s.initial_tokens, s.max_new_tokens, spec)
            for rid in cancels:
                cap.cancelled(rid)
        return got

    helper.tp_broadcast_object_from_rank_0 = broadcast


def setup(model: Any, taps: list, out: Any, reduce: str | None) -> tuple[TP | None, list, list, Any, dict]:
    """A Capture's view of tensor parallelism: ``(tp, local taps, their layouts, out, meta)``: without TP, every tap
    and ``out`` as given; under TP, the taps this rank captures (the sharded ones, and the replicated ones on rank
    0), ``out``'s ``rank-NNNNN`` directory (a path is needed: each rank writes its own) and its ``tp.json``: the
    world, the rank, the run's taps in order with each one's kind, the taps this rank captures."""
    tp = tp_of(model)
    if tp is None:
        return None, list(taps), [None] * len(taps), out, {}
    if not (isinstance(out, (str, bytes)) or hasattr(out, "__fspath__")):
        raise _logic(f"ferry.engine.Capture: tensor parallelism (rank {tp.rank} of {tp.world}): expected out a "
                     f"directory (each rank writes its own rank-NNNNN in it), got {type(out).__name__}")
    lay = layouts(model, taps, tp)
    keep = [i for i, lo in enumerate(lay) if lo is not None or tp.rank == 0]
    sharded = [taps[i].name for i in keep if lay[i] is not None]
    if reduce is not None and sharded:
        raise _logic(f"ferry.engine.Capture: tensor parallelism: expected reduce None with sharded taps (a reducer "
                     f"of a slice of each row is not the reducer of the row), got reduce {reduce!r} and sharded "
                     f"taps {sharded}")
    directory = os.path.join(os.fsdecode(out), RANK_DIR.format(tp.rank))
    meta = {"world": tp.world, "rank": tp.rank, "taps": [t.name for t in taps], "local": [taps[i].name for i in keep],
            "kinds": {t.name: "replicated" if lo is None else "sharded" for t, lo in zip(taps, lay)}}
    return tp, [taps[i] for i in keep], [lay[i] for i in keep], directory, meta
