# SPDX-License-Identifier: Apache-2.0
"""Reads a run that ``ferry.sinks.safetensors`` wrote (pure Python, numpy): index.json and the shards it
names, each checked before use. docs/api/sinks.md.

    run = ferry.shards.open(directory)
    for tag, hook, array in run:          # in delivery order: shard by shard, forward by forward
        ...
    run.tensor(tag, "layers.0.resid_pre")  # one tensor by its forward's tag and its hook's name

Only files the index names are read (a temporary ``.shard-*.tmp`` never is). A missing, truncated or corrupted
index or shard raises ``ShardError`` (a ``ferry.Error``) naming the file and what is wrong: headers and
sizes are checked by ``open()``; each forward's bytes against the CRC-32 the writer recorded when they are
read (``verify=False`` skips that). BF16 arrays have ml_dtypes' bfloat16 where ml_dtypes is installed, else
uint16 (the raw bits: ``torch.from_numpy(a).view(torch.bfloat16)``); F8 likewise (else uint8).
"""

from __future__ import annotations

import builtins as _builtins
import json as _json
import os as _os
import re as _re
import zlib as _zlib

import numpy as _np

from ._ferry import Error

__all__ = ["Run", "ShardError", "open", "read_header"]

FORMAT = "ferry.shards"
FORMAT_VERSION = 1
_SHARD_NAME = _re.compile(r"shard-\d{5,}\.safetensors")
_MAX_HEADER = 100 << 20
_NUMPY = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
          "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?"}
_ML = {"BF16": ("bfloat16", "<u2"), "F8_E4M3": ("float8_e4m3fn", "u1"), "F8_E5M2": ("float8_e5m2", "u1")}


class ShardError(Error):
    """A run that does not read back: ``path`` names the file (index.json or a shard), ``reason`` what is wrong."""

    def __init__(self, path, reason: str):
        super().__init__(f"ferry.shards: {path}: {reason}")
        self.path = str(path)
        self.reason = reason


def _dtype(name: str):
    if name in _NUMPY:
        return _np.dtype(_NUMPY[name])
    ml, raw = _ML[name]
    try:
        import ml_dtypes

        return _np.dtype(getattr(ml_dtypes, ml))
    except (ImportError, AttributeError):
        return _np.dtype(raw)


def _itemsize(name: str) -> int:
    return _np.dtype(_NUMPY[name]).itemsize if name in _NUMPY else _np.dtype(_ML[name][1]).itemsize


def read_header(path) -> tuple[int, dict, list]:
    """A safetensors file's header, checked (sizes, offsets, holes, overlaps, the data's length): ``(data_start,
    metadata, tensors)``, the tensors as ``(begin, end, name, dtype, shape)`` in data order; ``ShardError`` naming
    the file and what is wrong otherwise. ``ferry.engine.open_samples`` reads its files through it too."""
    try:
        size = _os.path.getsize(path)
        with _builtins.open(path, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            raw = f.read(n) if 0 <= n <= min(size - 8, _MAX_HEADER) else b""
    except OSError as err:
        raise ShardError(path, f"missing or unreadable: {err.strerror or err}") from None
    if n < 0:
        raise ShardError(path, f"truncated: {size} bytes, expected at least the 8-byte header size")
    if n > _MAX_HEADER:
        raise ShardError(path, f"corrupted: a header of {n} bytes (over 100 MB)")
    if n > size - 8:
        raise ShardError(path, f"truncated: a header of {n} bytes past the end of its {size} bytes")
    try:
        header = _json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise ShardError(path, f"corrupted header: not JSON ({err})") from None
    if not isinstance(header, dict):
        raise ShardError(path, "corrupted header: expected a JSON object")
    data_start = 8 + n
    data = size - data_start
    metadata = header.pop("__metadata__", {})
    tensors = []
    for name, t in header.items():
        try:
            dt, shape, (b, e) = t["dtype"], [int(d) for d in t["shape"]], t["data_offsets"]
            want = _itemsize(dt)
            for d in shape:
                want *= d
        except (KeyError, TypeError, ValueError) as err:
            raise ShardError(path, f"corrupted header: tensor {name!r}: {err!r}") from None
        if not (0 <= b <= e) or e - b != want:
            raise ShardError(path, f"corrupted header: tensor {name!r}: data_offsets [{b}, {e}] do not hold "
                                   f"{shape} x {dt} ({want} bytes)")
        tensors.append((b, e, name, dt, tuple(shape)))
    tensors.sort()
    at = 0
    for b, e, name, _, _ in tensors:
        if b != at:
            raise ShardError(path, f"corrupted header: tensor {name!r} starts at {b}, expected {at} (a hole or "
                                   f"an overlap)")
        at = e
    if at > data:
        raise ShardError(path, f"truncated: its tensors need {at} bytes of data, the file holds {data}")
    if at < data:
        raise ShardError(path, f"corrupted: {data - at} bytes past its last tensor")
    return data_start, metadata, tensors


class _Shard:
    """One shard's header, checked: its tensors in data order and its forwards [tag, begin, end, crc32, tensors]."""

    def __init__(self, path: str):
        self.path = path
        self.data_start, self.metadata, self.tensors = read_header(path)
        tensors = self.tensors
        try:
            self.forwards = [tuple(int(x) for x in f) for f in _json.loads(self.metadata["ferry.forwards"])]
        except (KeyError, TypeError, ValueError) as err:
            raise ShardError(path, f"corrupted header: metadata ferry.forwards ({err!r})") from None
        at, k = 0, 0
        for tag, b, e, _, count in self.forwards:
            if b != at or k + count > len(tensors) or (
                    count and (tensors[k][0] != b or tensors[k + count - 1][1] != e)):
                raise ShardError(path, f"corrupted header: forward tag {tag} ([{b}, {e}), {count} tensors) does not "
                                       f"match its tensors")
            at, k = e, k + count
        if k != len(tensors):
            raise ShardError(path, f"corrupted header: {len(tensors) - k} tensors outside its forwards")

    def read(self, begin: int, end: int, crc: int | None) -> bytes:
        with _builtins.open(self.path, "rb") as f:
            f.seek(self.data_start + begin)
            b = f.read(end - begin)
        if len(b) != end - begin:
            raise ShardError(self.path, f"truncated: bytes [{begin}, {end}) of its data are past the end")
        if crc is not None and _zlib.crc32(b) != crc:
            raise ShardError(self.path, f"corrupted data: bytes [{begin}, {end}) have CRC-32 {_zlib.crc32(b):#010x}, "
                                        f"expected {crc:#010x}")
        return b


class Run:
    """A run directory, its index checked (``open()``). Iterating yields ``(tag, hook_name, array)`` in forward order
    (index.json's ``order``: shards written at once, as on tmpfs, hold interleaved forwards)."""

    def __init__(self, directory, verify: bool = True):
        self.directory = _os.fspath(directory)
        self.verify = verify
        path = _os.path.join(self.directory, "index.json")
        try:
            with _builtins.open(path, "rb") as f:
                index = _json.loads(f.read().decode("utf-8"))
        except FileNotFoundError:
            raise ShardError(path, "missing: not a run directory") from None
        except (OSError, UnicodeDecodeError, ValueError) as err:
            raise ShardError(path, f"corrupted: not JSON ({err})") from None
        try:
            meta, weight_map = index["metadata"], index["weight_map"]
            if meta["format"] != FORMAT or int(meta["format_version"]) != FORMAT_VERSION:
                raise ShardError(path, f"expected format {FORMAT} version {FORMAT_VERSION}, got {meta['format']} "
                                       f"version {meta['format_version']}")
            listed = [(s["file"], [int(t) for t in s["tags"]], int(s["tensors"]), int(s["bytes"]),
                       [int(o) for o in s.get("order", [])]) for s in meta["shards"]]
            self.schema = {int(h): (v["name"], v["dtype"], tuple(v["row_shape"])) for h, v in meta["schema"].items()}
            # reduced hooks (Channel.capture_rows(..., reduce=)): name -> (reducer spec, row width)
            self.reduced = {v["name"]: (v["reduce"], int(v["width"])) for v in meta["schema"].values() if "reduce" in v}
            # tensor-parallel slices: name -> {"world", "rank", "dim", "offset", "full"} (ferry.tp assembles ranks)
            self.layout = {v["name"]: {k: int(x) for k, x in v["shard"].items()} for v in meta["schema"].values()
                           if "shard" in v}
        except (KeyError, TypeError, ValueError) as err:
            raise ShardError(path, f"corrupted: {err!r} missing or malformed") from None
        self.metadata = meta
        self.complete = bool(meta.get("complete", False))
        # forwards the sink refused for repeating an earlier tag (their entries not written), in order
        self.refused_tags = [int(t) for t in meta.get("refused_tags", [])]
        self.error = meta.get("error")
        self.weight_map = dict(weight_map)
        self._shards = []
        self._forwards = []  # (ordinal, shard, its forward, its first tensor): shards written at once interleave
        named = 0
        for file, tags, count, nbytes, order in listed:
            if not isinstance(file, str) or not _SHARD_NAME.fullmatch(file):
                raise ShardError(path, f"expected shard files named shard-NNNNN.safetensors, got {file!r} (a "
                                       f"temporary file is never read)")
            s = _Shard(_os.path.join(self.directory, file))
            if ([f[0] for f in s.forwards] != tags or len(s.tensors) != count
                    or s.tensors and s.tensors[-1][1] != nbytes):
                raise ShardError(s.path, "does not match index.json (its tags, tensor count or bytes differ)")
            for t in s.tensors:
                if self.weight_map.get(t[2]) != file:
                    raise ShardError(s.path, f"tensor {t[2]!r} is not in index.json's weight_map for this file")
            if order and len(order) != len(tags):
                raise ShardError(path, f"corrupted: {file}'s order lists {len(order)} forwards, its tags {len(tags)}")
            named += len(s.tensors)
            self._shards.append(s)
            k = 0
            for i, fwd in enumerate(s.forwards):  # a run without "order" (one shard at a time): as listed
                self._forwards.append((order[i] if order else len(self._forwards), s, fwd, k))
                k += fwd[4]
        if named != len(self.weight_map):
            raise ShardError(path, f"weight_map names {len(self.weight_map) - named} tensors of no listed shard")
        self._forwards.sort(key=lambda f: f[0])
        self.tags = [fwd[0] for _, _, fwd, _ in self._forwards]  # in forward order
        self._where = None

    @property
    def shards(self) -> list[str]:
        """The shard files, in order."""
        return [_os.path.basename(s.path) for s in self._shards]

    def __len__(self) -> int:
        return len(self.weight_map)

    def _arrays(self, shard: _Shard, fwd, k: int):
        tag, b, e, crc, count = fwd
        data = shard.read(b, e, crc if self.verify else None)
        for tb, te, name, dt, shape in shard.tensors[k:k + count]:
            a = _np.frombuffer(data, dtype=_dtype(dt), count=(te - tb) // _itemsize(dt), offset=tb - b).reshape(shape)
            yield tag, name.split("/", 1)[1], a

    def __iter__(self):
        for _, s, fwd, k in self._forwards:
            yield from self._arrays(s, fwd, k)

    def forward(self, tag: int) -> dict:
        """{hook_name: array} of the forward tagged `tag`."""
        if self._where is None:
            self._where = {fwd[0]: (s, fwd, k) for _, s, fwd, k in self._forwards}
        if tag not in self._where:
            raise KeyError(f"ferry.shards: no forward tagged {tag} in {self.directory}")
        return {name: a for _, name, a in self._arrays(*self._where[tag])}

    def tensor(self, tag: int, name: str):
        """The tensor of hook `name` in the forward tagged `tag` (a numpy array, read-only)."""
        key = f"{tag}/{name}"
        if key not in self.weight_map:
            raise KeyError(f"ferry.shards: no tensor {key!r} in {self.directory}")
        return self.forward(tag)[name]

    def records(self, tag: int, name: str) -> dict:
        """The records of reduced hook `name` in the forward tagged `tag`, decoded ({field: array},
        ferry.reduce.decode); KeyError for a hook that is not reduced."""
        if name not in self.reduced:
            raise KeyError(f"ferry.shards: hook {name!r} of {self.directory} is not a reduced hook")
        from . import reduce as _reduce
        spec, width = self.reduced[name]
        return _reduce.decode(self.tensor(tag, name), spec, width)

    def __repr__(self) -> str:
        return (f"ferry.shards.Run({self.directory!r}: {len(self._shards)} shards, {len(self.tags)} forwards, "
                f"{len(self)} tensors{'' if self.complete else ', not closed'})")


def open(directory, *, verify: bool = True) -> Run:  # noqa: A001 (the module's verb: ferry.shards.open)
    """The run in `directory` (its index and every shard header checked; ShardError otherwise)."""
    return Run(directory, verify)
