# SPDX-License-Identifier: Apache-2.0
"""Per-request samples on disk: vLLM EHS's layout, one safetensors file per request, or packed shards of many
samples plus an index. Pure Python + numpy (the safetensors format is written here: an 8-byte header length, a
JSON header, the data), readable by ``safetensors.safe_open`` and by ``ferry.engine.open_samples``.

A sample is ``hidden_states [tokens, taps, *row_shape]`` (the taps in the run's order) and ``token_ids [tokens]``
(int64, the input token at each position), with ``positions [tokens]`` (int64, absolute) and string metadata:
``request_id``, ``taps`` (JSON list), ``complete`` (``"true"``/``"false"``), ``missing`` (JSON ``[[a, b), ...]``
of positions asked for and not captured) and ``reason``.

Crash consistency: a file is written under a temporary name and renamed whole; ``per-request`` appends one JSON line
per finished file to ``samples.jsonl``, ``shards`` rewrites ``index.json`` (temporary file, rename) after each shard,
so after a SIGKILL the manifest lists only complete files.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from .._files import replace_json

__all__ = ["FORMAT", "Sample", "SampleWriter", "decode", "open_samples", "write_safetensors"]

FORMAT = "ferry.samples"
VERSION = 1
_DT = {"BF16": "<u2", "F16": "<f2", "F32": "<f4", "F64": "<f8", "I64": "<i8", "I32": "<i4", "U8": "u1",
       "F8_E4M3": "u1", "F8_E5M2": "u1"}
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass
class Sample:
    """One request's captured rows: ``hidden`` uint8 ``[tokens, taps, row_bytes]``, ``positions`` / ``token_ids``
    int64 ``[tokens]``, the taps' ``dtype`` (safetensors name) and ``row_shape``, and its metadata."""

    request_id: str
    hidden: np.ndarray
    positions: np.ndarray
    token_ids: np.ndarray
    taps: list[str]
    dtype: str
    row_shape: tuple[int, ...]
    complete: bool = True
    missing: list[tuple[int, int]] = field(default_factory=list)
    reason: str = ""
    prompt_len: int = 0
    reduce: str = ""  # Capture(reduce=): the rows are this reducer's records over rows of reduce_width elements
    reduce_width: int = 0
    tp: dict | None = None  # tensor parallelism: {"world", "rank", "slices": {sharded tap: ferry.tp.shard(...)}}

    @property
    def nbytes(self) -> int:
        return int(self.hidden.nbytes + self.positions.nbytes + self.token_ids.nbytes)

    def tensors(self, prefix: str = "") -> dict[str, tuple[str, tuple[int, ...], np.ndarray]]:
        t = len(self.positions)
        return {prefix + "hidden_states": (self.dtype, (t, len(self.taps), *self.row_shape), self.hidden),
                prefix + "token_ids": ("I64", (t,), self.token_ids),
                prefix + "positions": ("I64", (t,), self.positions)}

    def metadata(self) -> dict[str, str]:
        return {"format": FORMAT, "version": str(VERSION), "request_id": self.request_id,
                "taps": json.dumps(self.taps), "complete": "true" if self.complete else "false",
                "missing": json.dumps([list(m) for m in self.missing]), "reason": self.reason,
                "prompt_len": str(self.prompt_len),
                **({"reduce": self.reduce, "reduce_width": str(self.reduce_width)} if self.reduce else {}),
                **({"tp": json.dumps(self.tp)} if self.tp else {})}


def write_safetensors(path: str, tensors: dict[str, tuple[str, tuple[int, ...], np.ndarray]],
                      metadata: dict[str, str] | None = None, fsync: bool = False) -> int:
    """Writes ``{name: (dtype, shape, array)}`` as one safetensors file at ``path`` (a temporary file renamed
    over it: the file is whole or absent). Returns the bytes written. An OSError (a full disk) removes the
    temporary file and propagates."""
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    off = 0
    for name, (dt, shape, arr) in tensors.items():
        n = int(arr.nbytes)
        if n != int(np.prod(shape, dtype=np.int64)) * np.dtype(_DT[dt]).itemsize:
            from .. import LogicError
            raise LogicError(f"ferry.engine: tensor {name!r}: expected {shape} of {dt}, got {n} bytes")
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(len(raw).to_bytes(8, "little"))
            f.write(raw)
            for _, (_, _, arr) in tensors.items():
                if arr.size:
                    f.write(np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return 8 + len(raw) + off


def file_name(request_id: str) -> str:
    """The per-request file of ``request_id``: its characters outside ``[A-Za-z0-9._-]`` as ``_``."""
    return _SAFE.sub("_", request_id) + ".safetensors"


class SampleWriter:
    """Writes samples into ``directory``: ``layout="per-request"`` (``{request_id}.safetensors`` + samples.jsonl)
    or ``"shards"`` (``shard-NNNNN.safetensors`` of at most ``shard_bytes``, tensors ``{request_id}/hidden_states``
    ..., and index.json) or ``"arrow"`` (arrow.py; ``tuning``: its shards' writer, ``ferry.arrow``'s keywords).
    Not thread-safe: one writer thread calls ``write`` and ``close``."""

    def __init__(self, directory: str, layout: str = "per-request", *, shard_bytes: int = 1 << 30,
                 fsync: bool = False, overwrite: bool = False, run_meta: dict | None = None,
                 tuning: dict | None = None) -> None:
        from .. import LogicError
        if layout not in ("per-request", "shards", "arrow"):
            raise LogicError(f"ferry.engine: expected format 'per-request', 'shards' or 'arrow', got {layout!r}")
        if tuning and layout != "arrow":
            raise LogicError(f"ferry.engine: writer tuning {tuning} is for format 'arrow' (its file writer), got "
                             f"format {layout!r}")
        self.run_meta = dict(run_meta or {})
        self._arrow = None
        if layout == "arrow":  # a Hugging Face dataset (arrow.py); its tuning checked before any file is touched
            from .arrow import ArrowSampleWriter
            self._arrow = ArrowSampleWriter(directory, shard_bytes=shard_bytes, fsync=fsync, run_meta=self.run_meta,
                                            tuning=tuning)
        os.makedirs(directory, exist_ok=True)
        taken = [n for n in os.listdir(directory) if n.endswith((".safetensors", ".json", ".jsonl", ".arrow"))]
        if taken and not overwrite:
            raise LogicError(f"ferry.engine: output directory {directory!r}: expected an empty directory (or "
                             f"overwrite=True), got {len(taken)} sample files such as {taken[0]!r}")
        for n in taken if overwrite else ():
            os.unlink(os.path.join(directory, n))
        self.dir, self.layout, self.shard_bytes, self.fsync = directory, layout, int(shard_bytes), fsync
        self._bytes = 0
        self._files = 0
        self._pending: list[Sample] = []
        self._pending_bytes = 0
        self._index: dict[str, Any] = {"format": FORMAT, "version": VERSION, "metadata": self.run_meta,
                                       "samples": {}, "weight_map": {}}
        self._manifest = None
        if layout == "per-request":
            self._manifest = open(os.path.join(directory, "samples.jsonl"), "a", encoding="utf-8")
            self._manifest.write(json.dumps({"run": self.run_meta}) + "\n")
            self._manifest.flush()

    @property
    def bytes_written(self) -> int:
        return self._arrow.bytes_written if self._arrow is not None else self._bytes

    @property
    def files(self) -> int:
        return self._arrow.files if self._arrow is not None else self._files

    def write(self, s: Sample) -> None:
        """Writes (per-request) or queues for the current shard (shards, arrow) one sample; OSError propagates
        with the sample not listed."""
        if self._arrow is not None:
            return self._arrow.write(s)
        if self.layout == "per-request":
            name = file_name(s.request_id)
            self._bytes += write_safetensors(os.path.join(self.dir, name), s.tensors(), s.metadata(), self.fsync)
            self._files += 1
            self._manifest.write(json.dumps({"request_id": s.request_id, "file": name, "tokens": len(s.positions),
                                             "complete": s.complete, "missing": s.missing}) + "\n")
            self._manifest.flush()
            return
        self._pending.append(s)
        self._pending_bytes += s.nbytes
        if self._pending_bytes >= self.shard_bytes:
            self.flush()

    def flush(self) -> None:
        """Writes the current shard and rewrites index.json (shards; arrow: state.json); nothing to do for
        per-request."""
        if self._arrow is not None:
            return self._arrow.flush()
        if self.layout != "shards" or not self._pending:
            return
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        name = f"shard-{self._files:05d}.safetensors"
        tensors: dict[str, Any] = {}
        for s in pending:
            tensors.update(s.tensors(s.request_id + "/"))
        meta = {"format": FORMAT, "version": str(VERSION),
                "samples": json.dumps({s.request_id: s.metadata() for s in pending})}
        self._bytes += write_safetensors(os.path.join(self.dir, name), tensors, meta, self.fsync)
        self._files += 1
        for s in pending:
            self._index["samples"][s.request_id] = {"shard": name, "tokens": len(s.positions),
                                                    "complete": s.complete, "missing": s.missing}
            for t in s.tensors(s.request_id + "/"):
                self._index["weight_map"][t] = name
        replace_json(os.path.join(self.dir, "index.json"), self._index, fsync=self.fsync)

    def close(self) -> None:
        try:
            self.flush()
        finally:
            if self._manifest is not None:
                self._manifest.close()
                self._manifest = None


def _read_header(path: str) -> tuple[dict, dict, int]:
    """The file's metadata and tensors by name, checked by ``ferry.shards.read_header`` (ShardError naming the
    file when it does not read back)."""
    from ..shards import read_header
    base, meta, tensors = read_header(path)
    return meta, {name: (dt, shape, b, e) for b, e, name, dt, shape in tensors}, base


def _load(path: str, header: tuple[dict, dict, int], name: str) -> np.ndarray:
    from ..shards import ShardError
    _, tensors, base = header
    if name not in tensors:
        raise ShardError(path, f"expected a tensor {name!r}, got {sorted(tensors)}")
    dt, shape, a, b = tensors[name]
    with open(path, "rb") as f:
        f.seek(base + a)
        raw = f.read(b - a)
    return np.frombuffer(raw, dtype=_DT[dt]).reshape(shape)


def open_samples(directory: str) -> Iterator[tuple[dict[str, str], dict[str, np.ndarray]]]:
    """Yields ``(metadata, {"hidden_states", "token_ids", "positions"})`` for every sample the manifest lists
    (samples.jsonl, index.json, or an Arrow dataset's state.json), in write order. BF16 arrays are their bits
    (uint16: ``torch.from_numpy(a).view(torch.bfloat16)``). A run under tensor parallelism (``rank-NNNNN``
    directories) yields whole samples, its ranks' joined (tp_samples.py)."""
    if os.path.exists(os.path.join(directory, "state.json")):
        from .arrow import open_arrow_samples
        yield from open_arrow_samples(directory)
        return
    idx = os.path.join(directory, "index.json")
    if os.path.exists(idx):
        with open(idx, encoding="utf-8") as f:
            index = json.load(f)
        headers: dict[str, tuple[dict, dict, int]] = {}
        for rid, info in index["samples"].items():
            path = os.path.join(directory, info["shard"])
            if path not in headers:
                headers[path] = _read_header(path)
            h = headers[path]
            meta = json.loads(h[0]["samples"])[rid]
            yield meta, {k: _load(path, h, f"{rid}/{k}") for k in ("hidden_states", "token_ids", "positions")}
        return
    manifest = os.path.join(directory, "samples.jsonl")
    if not os.path.exists(manifest):  # a run under tensor parallelism: rank-NNNNN directories, assembled
        from .tp_samples import open_tp_samples, rank_dirs
        ranks = rank_dirs(directory) if os.path.isdir(directory) else None
        if ranks is not None:
            yield from open_tp_samples(directory, ranks)
            return
    with open(manifest, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for line in lines[:-1]:  # the last line is complete only when it ends with a newline
        rec = json.loads(line)
        if "file" not in rec:
            continue
        path = os.path.join(directory, rec["file"])
        h = _read_header(path)
        yield h[0], {k: _load(path, h, k) for k in ("hidden_states", "token_ids", "positions")}


def decode(meta: dict, arrays: dict) -> dict:
    """A sample of ``Capture(reduce=...)`` (``open_samples``' pair) as ``{field: array [tokens, taps, ...]}``, the
    reducer's records split by ``ferry.reduce.decode`` (``values`` / ``indices`` for topk, ``scale`` / ``codes``
    for fp8_e4m3); a sample without a reducer: its ``hidden_states`` as they are."""
    hid = arrays["hidden_states"]
    if not meta.get("reduce"):
        return {"hidden_states": hid}
    from .. import reduce as fr
    t, taps = hid.shape[0], hid.shape[1]
    fields = fr.decode(np.ascontiguousarray(hid).reshape(t * taps, -1), meta["reduce"], int(meta["reduce_width"]))
    return {k: v.reshape(t, taps, *v.shape[1:]) for k, v in fields.items()}
