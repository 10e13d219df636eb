# SPDX-License-Identifier: Apache-2.0
"""The hook schema from Python: per hook id a name, a dtype and the shape of one row (an entry of n rows is the
tensor ``[n, *row_shape]``). ``ferry.Channel(..., schema=...)`` declares it on a channel (typed ``Entry.numpy()``,
``Entry.tensor()``, ``EntryBatch`` views; the default of a ``ferry.sinks.safetensors`` sink made without one), and
``ferry.sinks.safetensors(directory, schema)`` on a sink. The rules (names, dimensions, what an entry's shape
is) are the C++ core's (ferry/d2h/hook_schema.hpp): this module only turns dtypes into safetensors' names.

A schema is ``{hook_id: spec}``, a spec being ``(name, dtype, row_shape)``, ``(name, dtype)`` (one element
per row) or ``(name, example)``: a torch tensor or numpy array whose first dimension is its rows
(``row_spec(name, example)``). A reduced hook (``Channel.capture_rows(..., reduce=spec)``) is ``(name, spec,
row_shape)``: the reducer's spec ("topk(64)", "fp8_e4m3", "mean", "stats") and the rows it reduces; its entries
are the reducer's records (ferry.reduce.decode). A tensor-parallel hook adds its slice as a 4th element,
``(name, dtype, row_shape, {"world", "rank", "dim", "offset", "full"})``: rank ``rank`` of ``world`` holds
``[offset, offset + row_shape[dim])`` of row dimension ``dim``, whose whole extent is ``full``; the sinks write it
next to the data and ``ferry.tp`` assembles the ranks' runs.
"""

from __future__ import annotations

from . import _ferry
from ._ferry import LogicError

__all__ = ["dtype_name", "row_spec"]

# safetensors' dtype names by the names numpy, ml_dtypes and torch give their dtypes
_BY_NAME = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
    "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8",
    "uint64": "U64", "uint32": "U32", "uint16": "U16", "uint8": "U8",
    "bool": "BOOL",
}
_NAMES = frozenset(_BY_NAME.values())


def dtype_name(dtype) -> str:
    """safetensors' name ("F32", "BF16", ...) of a torch.dtype, a numpy dtype (or type, or ml_dtypes'
    bfloat16), or a string: a safetensors name as is, or a numpy / torch name ("float32", "torch.bfloat16")."""
    if isinstance(dtype, str):
        if dtype in _NAMES:
            return dtype
        name = dtype[6:] if dtype.startswith("torch.") else dtype
    elif type(dtype).__module__ == "torch":  # a torch.dtype, without importing torch
        name = str(dtype)[6:]
    else:
        import numpy as np

        try:
            name = np.dtype(dtype).name
        except TypeError:
            raise LogicError(f"ferry.sinks: expected a dtype (torch, numpy or a name such as 'BF16'), got "
                             f"{dtype!r}") from None
    if name == "bool_":
        name = "bool"
    if name not in _BY_NAME:
        raise LogicError(f"ferry.sinks: expected a dtype safetensors stores ({', '.join(sorted(_NAMES))}), got "
                         f"{dtype!r}")
    return _BY_NAME[name]


def row_spec(name: str, example) -> tuple[str, str, tuple[int, ...]]:
    """The schema entry ``(name, dtype, row_shape)`` of a hook whose tensors look like `example` (a torch
    tensor or a numpy array): its first dimension is the rows, the rest is one row."""
    shape = tuple(int(d) for d in example.shape)
    if not shape:
        raise LogicError(f"ferry.sinks.row_spec({name!r}): expected a tensor with a row dimension, got a scalar")
    return (name, dtype_name(example.dtype), shape[1:])


def _is_example(x) -> bool:
    """A tensor or an array, not a dtype (numpy's dtypes have a .shape but no .dtype; numpy's scalar types, being
    classes, have both as descriptors)."""
    return not isinstance(x, type) and hasattr(x, "shape") and hasattr(x, "dtype")


_SHARD_KEYS = ("world", "rank", "dim", "offset", "full")


def _shard(spec, hook, who):
    """A spec's 4th element, a tensor-parallel slice {"world", "rank", "dim", "offset", "full"} (ferry/d2h/
    hook_schema.hpp's shard_layout: the core checks it), as the binding's (world, rank, dim, offset, full)."""
    s = spec[3]
    if not isinstance(s, dict) or set(s) != set(_SHARD_KEYS) or not all(
            isinstance(s[k], int) and not isinstance(s[k], bool) and s[k] >= 0 for k in _SHARD_KEYS):
        raise LogicError(f"{who}: hook {hook}: expected the shard a dict of non-negative ints {_SHARD_KEYS}, got "
                         f"{s!r}")
    return tuple(s[k] for k in _SHARD_KEYS)


def tuples(schema, who: str) -> list[tuple[int, str, str, list[int], tuple | None]]:
    """`schema` ({hook_id: spec}) as the binding's (hook, name, dtype name, row_shape, shard) tuples; LogicError
    naming `who` and the hook for a malformed one (the core checks the rest: names, dimensions, the slice)."""
    if not isinstance(schema, dict) or not schema:
        raise LogicError(f"{who}: expected schema a non-empty dict {{hook_id: (name, dtype, row_shape)}}, got "
                         f"{type(schema).__name__}")
    out = []
    for hook, spec in schema.items():
        if not isinstance(hook, int) or isinstance(hook, bool):
            raise LogicError(f"{who}: expected int hook ids, got {hook!r}")
        if not isinstance(spec, (tuple, list)) or len(spec) not in (2, 3, 4):
            raise LogicError(f"{who}: hook {hook}: expected (name, dtype, row_shape[, shard]), (name, dtype) or "
                             f"(name, example tensor), got {spec!r}")
        name = spec[0]
        if not isinstance(name, str):
            raise LogicError(f"{who}: hook {hook}: expected a str name, got {name!r}")
        if len(spec) == 2 and _is_example(spec[1]):
            spec = row_spec(name, spec[1])
        dtype = spec[1]
        shard = _shard(spec, hook, who) if len(spec) == 4 else None
        row = spec[2] if len(spec) >= 3 else ()
        row = (row,) if isinstance(row, int) else tuple(row)
        if not all(isinstance(d, int) and not isinstance(d, bool) for d in row):
            raise LogicError(f"{who}: hook {hook} {name!r}: expected row_shape a tuple of ints, got {spec[2]!r}")
        # a reducer ("topk(64)", ...): a reduced hook, row_shape the rows it reduces (the core's hook_schema::add)
        reduced = isinstance(dtype, str) and _ferry.is_reducer(dtype)
        out.append((hook, name, dtype if reduced else dtype_name(dtype), list(row), shard))
    return out
