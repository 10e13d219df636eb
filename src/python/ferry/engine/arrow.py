# SPDX-License-Identifier: Apache-2.0
"""Per-request samples as a Hugging Face dataset (``Capture(..., format="arrow")``): the directory that
``datasets.load_from_disk`` reads as it is (Arrow IPC stream shards ``data-NNNNN.arrow``, ``state.json``,
``dataset_info.json``), each shard also readable by ``datasets.Dataset.from_file``. Written with pyarrow.

One row per request: ``request_id`` (string), ``positions`` and ``token_ids`` (list<int64>), one column per tap
named as the tap (``layer.2``, ``final``, ...) holding the request's ``[tokens, width]`` rows, as SAELens's cache
keeps one 2-D column per hook (there ``Array2D(context, d_in)``), and ``complete`` / ``missing`` (JSON) /
``reason`` / ``prompt_len``. A tap's values are its dtype (F16, F32) or, for BF16 (which Arrow lacks), its bits as
uint16 (``torch.from_numpy(a).view(torch.bfloat16)``); the field's metadata ``ferry.dtype`` and
``ferry.row_shape`` say which.

Crash consistency: a shard is written under a temporary name and renamed whole, then ``state.json`` (which lists the
shards ``load_from_disk`` reads) is rewritten by rename, so after a SIGKILL the dataset holds the complete shards.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterator

import numpy as np

from .samples import _DT, FORMAT, VERSION, Sample

__all__ = ["ArrowSampleWriter", "open_arrow_samples"]


def _pa() -> Any:
    try:
        import pyarrow
    except ImportError as err:
        from .. import LogicError
        raise LogicError("ferry.engine: format 'arrow' expected pyarrow to import (pip install pyarrow), got "
                         f"{err}") from None
    return pyarrow


class ArrowSampleWriter:
    """``SampleWriter``'s Arrow layout (same calls: ``write``, ``flush``, ``close``, ``bytes_written``, ``files``);
    a shard closes once it holds ``shard_bytes``; ``tuning``: the shards' writer (``ferry.arrow.ContextWriter``'s,
    checked here). Not thread-safe: one writer thread calls it."""

    def __init__(self, directory: str, *, shard_bytes: int = 1 << 30, fsync: bool = False,
                 run_meta: dict | None = None, tuning: dict | None = None) -> None:
        from .._arrow_shards import file_writer
        self.pa = _pa()
        self._writer = file_writer(tuning)
        self.dir, self.shard_bytes, self.fsync = directory, int(shard_bytes), fsync
        self.run_meta = dict(run_meta or {})
        self.bytes_written = 0
        self._set = None  # ferry.arrow's shard set, made with the schema of the first sample
        self._schema = None
        self._taps: list[str] = []
        self._width = 0
        self._np_t = np.dtype("u1")

    @property
    def files(self) -> int:
        return len(self._set.names) if self._set is not None else 0

    def _schema_of(self, s: Sample) -> Any:
        """The run's schema, from its first sample: a column per tap of the run (a request whose spec keeps fewer
        taps has nulls in the others), the taps' dtype and row shape."""
        pa = self.pa
        self._taps = list(self.run_meta.get("taps") or s.taps)
        self._width = int(np.prod(s.row_shape, dtype=np.int64)) if s.row_shape else 0
        self._np_t = np.dtype(_DT.get(s.dtype, "u1"))
        arrow_t = {"BF16": pa.uint16(), "F16": pa.float16(), "F32": pa.float32()}.get(s.dtype, pa.uint8())
        fields = [pa.field("request_id", pa.string()), pa.field("positions", pa.list_(pa.int64())),
                  pa.field("token_ids", pa.list_(pa.int64()))]
        for t in self._taps:
            red = {"ferry.reduce": s.reduce, "ferry.reduce_width": str(s.reduce_width)} if s.reduce else {}
            fields.append(pa.field(t, pa.list_(pa.list_(arrow_t, self._width)),
                                   metadata={"ferry.dtype": s.dtype, "ferry.row_shape": json.dumps(list(s.row_shape)),
                                             **red}))
        fields += [pa.field("complete", pa.bool_()), pa.field("missing", pa.string()),
                   pa.field("reason", pa.string()), pa.field("prompt_len", pa.int64())]
        fields += [pa.field("tp", pa.string())] if "tp" in self.run_meta else []  # each row's slices (tp_samples.py)
        meta = {"ferry.format": FORMAT, "ferry.version": str(VERSION), "ferry.run": json.dumps(self.run_meta)}
        return pa.schema(fields, metadata=meta)

    def _batch(self, s: Sample) -> Any:
        pa = self.pa
        n = len(s.positions)
        row_bytes = self._width * self._np_t.itemsize
        if s.hidden.shape[2:] != (row_bytes,) and n:
            from .. import LogicError
            raise LogicError(f"ferry.engine: arrow sample {s.request_id!r}: expected rows of {row_bytes} bytes (the "
                             f"run's first sample's), got {s.hidden.shape[2:]}")
        cols = [pa.array([s.request_id]), pa.array([s.positions], pa.list_(pa.int64())),
                pa.array([s.token_ids], pa.list_(pa.int64()))]
        offsets = pa.array([0, n], pa.int32())
        kept = {t: k for k, t in enumerate(s.taps)}
        for i, t in enumerate(self._taps):
            ty = self._schema.field(3 + i).type
            if t not in kept:
                cols.append(pa.nulls(1, ty))
                continue
            vals = np.ascontiguousarray(s.hidden[:, kept[t]]).view(self._np_t).reshape(-1)
            rows = pa.FixedSizeListArray.from_arrays(pa.array(vals, ty.value_type.value_type), self._width)
            cols.append(pa.ListArray.from_arrays(offsets, rows))
        cols += [pa.array([bool(s.complete)]), pa.array([json.dumps([list(m) for m in s.missing])]),
                 pa.array([s.reason]), pa.array([int(s.prompt_len)], pa.int64())]
        cols += [pa.array([json.dumps(s.tp)])] if "tp" in self.run_meta else []
        return pa.RecordBatch.from_arrays(cols, schema=self._schema)

    def write(self, s: Sample) -> None:
        """Appends one sample as one row of the open shard; OSError (a full disk) propagates with the shard's
        temporary removed (the samples it held are lost, the dataset keeps the earlier shards)."""
        if self._schema is None:
            from .._arrow_shards import Shards as _Shards
            self._schema = self._schema_of(s)
            info = {"description": f"{FORMAT} v{VERSION}: per-request samples written by ferry.engine",
                    "citation": "", "homepage": "", "license": ""}
            self._set = _Shards(self.dir, self._schema, info, self.shard_bytes, self.fsync, self._writer)
        self._set.write(self._batch(s), s.nbytes)
        self.bytes_written += s.nbytes  # the progress a reader sees (the file holds it once the shard closes)

    def flush(self) -> None:
        """Closes the open shard, renames it into the dataset and rewrites state.json."""
        if self._set is not None:
            self._set.flush()

    def close(self) -> None:
        self.flush()


def open_arrow_samples(directory: str) -> Iterator[tuple[dict[str, str], dict[str, np.ndarray]]]:
    """``open_samples`` for an Arrow dataset: every row of the shards state.json lists, in order, as ``(metadata,
    {"hidden_states" [tokens, taps, *row_shape], "token_ids", "positions"})``."""
    pa = _pa()
    with open(os.path.join(directory, "state.json"), encoding="utf-8") as f:
        files = [d["filename"] for d in json.load(f)["_data_files"]]
    for name in files:
        with pa.OSFile(os.path.join(directory, name), "rb") as f:
            reader = pa.ipc.open_stream(f)
            schema = reader.schema
            taps = [fl.name for fl in schema if fl.metadata and b"ferry.dtype" in fl.metadata]
            for b in reader:
                for i in range(b.num_rows):
                    row = {c: b.column(c)[i] for c in ("request_id", "positions", "token_ids", "complete",
                                                        "missing", "reason", "prompt_len")}
                    pos = np.asarray(row["positions"].values.to_numpy(zero_copy_only=False), np.int64)
                    per_tap, kept = [], []
                    for t in taps:
                        cell = b.column(t)[i]
                        if not cell.is_valid:  # a tap this request's spec did not keep
                            continue
                        shape = json.loads(schema.field(t).metadata[b"ferry.row_shape"])
                        v = cell.values.flatten().to_numpy(zero_copy_only=False)
                        per_tap.append(v.reshape(len(pos), *shape))
                        kept.append(t)
                    hid = np.stack(per_tap, axis=1) if per_tap else np.zeros((len(pos), 0), np.uint8)
                    meta = {"format": FORMAT, "version": str(VERSION), "request_id": row["request_id"].as_py(),
                            "taps": json.dumps(kept), "complete": "true" if row["complete"].as_py() else "false",
                            "missing": row["missing"].as_py(), "reason": row["reason"].as_py(),
                            "prompt_len": str(row["prompt_len"].as_py())}
                    if "tp" in schema.names:
                        meta["tp"] = b.column("tp")[i].as_py()
                    fm = schema.field(taps[0]).metadata if taps else {}
                    if b"ferry.reduce" in fm:  # Capture(reduce=): the rows are records (ferry.engine.decode)
                        meta["reduce"] = fm[b"ferry.reduce"].decode()
                        meta["reduce_width"] = fm[b"ferry.reduce_width"].decode()
                    yield meta, {"hidden_states": hid, "positions": pos,
                                 "token_ids": np.asarray(row["token_ids"].values.to_numpy(zero_copy_only=False),
                                                         np.int64)}
