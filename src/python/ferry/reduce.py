# SPDX-License-Identifier: Apache-2.0
"""Reduced capture (docs/api/python.md, "Reducers"): ``Channel.capture_rows(hook, t, rows=..., reduce=spec)``
holds the records of a reducer computed on the device instead of the rows. The record layout is the C++ core's
(ferry/d2h/reducer.hpp, read through ``_ferry.record_layout``); this module only names the specs and splits records
into arrays.

    ch.capture_rows(0, logits, rows=idx, reduce=ferry.reduce.topk(64))
    fields = ferry.reduce.decode(entry.numpy(), ferry.reduce.topk(64), width=logits.shape[1])
    fields["values"], fields["indices"]          # float32 [n, 64], int32 [n, 64]
"""
import numpy as np

from . import _ferry

FP8_E4M3 = "fp8_e4m3"
MEAN = "mean"
STATS = "stats"

# safetensors dtype names of record fields -> numpy (F8_E4M3 stays its raw codes: numpy has no float8)
_NUMPY = {"F32": np.float32, "I32": np.int32, "U32": np.uint32, "F8_E4M3": np.uint8}


def topk(k):
    """The spec of the k largest values per row (values float32, then int32 indices; ties: lower index first)."""
    return f"topk({int(k)})"


def record_layout(spec, width):
    """(record_bytes, [(name, dtype, offset, count, scalar)]) of one record of `spec` over rows of `width` elements
    (scalar: one value per record, a scale or a count)."""
    return _ferry.record_layout(spec, int(width))


def decode(records, spec, width):
    """The records of a reduced entry (bytes, or a uint8 array of n x record_bytes) as {field: array [n, count]}
    (a scalar field, scale or count: [n]); fp8 codes are uint8 (``dequantize`` turns them into float32)."""
    rec, fields = record_layout(spec, width)
    raw = np.frombuffer(records, dtype=np.uint8) if isinstance(records, (bytes, bytearray, memoryview)) else \
        np.ascontiguousarray(records).view(np.uint8).reshape(-1)
    if raw.size % rec:
        raise ValueError(f"ferry.reduce.decode: {spec} over width {width}: expected a multiple of {rec} bytes "
                         f"(one record), got {raw.size}")
    rows = raw.reshape(-1, rec)
    out = {}
    for name, dtype, offset, count, scalar in fields:
        t = _NUMPY[dtype]
        size = np.dtype(t).itemsize * count
        a = np.ascontiguousarray(rows[:, offset:offset + size]).view(t)
        out[name] = a[:, 0] if scalar else a
    return out


def decode_entry(entry, schema):
    """The records of a delivered reduced entry (``Entry`` or ``ShmEntry``) of a hook the schema names by its
    reducer (``{hook: (name, spec, (width,))}``: ``Channel.schema``, ``ShmReader.schema``); LogicError for a hook the
    schema does not name as reduced."""
    from . import LogicError
    spec = (schema or {}).get(entry.hook)
    if spec is None or not isinstance(spec[1], str) or not _ferry.is_reducer(spec[1]):
        raise LogicError(f"ferry.reduce.decode_entry: hook {entry.hook}: expected a reduced hook of the schema "
                         f"(name, 'topk(K)' | 'fp8_e4m3' | 'mean' | 'stats', (width,)), got {spec!r}")
    width = 1
    for d in spec[2]:
        width *= int(d)
    return decode(entry.numpy(), spec[1], width)


def dequantize(fields):
    """fp8_e4m3 records (decode's dict) as float32 [n, width]: codes x scale (needs torch's float8_e4m3fn)."""
    import torch
    codes = torch.from_numpy(np.ascontiguousarray(fields["codes"])).view(torch.float8_e4m3fn).float()
    return (codes * torch.from_numpy(fields["scale"]).unsqueeze(1)).numpy()
