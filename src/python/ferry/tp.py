# SPDX-License-Identifier: Apache-2.0
"""Tensor parallelism: each rank captures what it holds, ``ferry.tp.open`` assembles the ranks' runs at read time.

Under tensor parallelism (TP) a hook's tensor is either replicated (the same on every rank: the all-reduced output
of a row-parallel linear) or sharded (each rank holds a slice of one row dimension: a column-parallel linear's
outputs, attention heads). ferry never gathers in the forward: every rank has its own channel and sink (one run
directory per rank) and declares a sharded hook with its slice, a 4th element of the schema spec (``spec()``):
``{"world", "rank", "dim", "offset", "full"}``, rank ``rank`` of ``world`` holding ``[offset, offset +
row_shape[dim])`` of row dimension ``dim`` (0: the first dimension after the rows), whose whole extent is ``full``.
The C++ core checks each slice when the schema is declared (ferry.LogicError), and the sink writes it into the
run's index.json (``ferry.shards.Run.layout``). A replicated hook is captured on one rank (rank 0) without a slice.

``open(directories)`` reads the ranks' runs (in any order) and checks, before reading any tensor, that they fit
together; ``LayoutError`` naming the run directory otherwise. Rank inference: a run's rank is the rank its sharded
hooks name (they must agree); runs without a sharded hook come after every ranked run, in the order given. For
every sharded hook: the same world size, dim, full extent, dtype and row shape (outside ``dim``) in every run that
declares it, each rank ``0 .. world - 1`` exactly once, and slices that tile ``[0, full)`` with no gap or
overlap when sorted by offset. Every run has the same forward tags, each once (compared with the lowest-rank run;
a forward with no entry writes nothing, so a rank that captured nothing in a forward reads as having skipped it).
``TPRun.forward(tag)`` then concatenates each sharded hook's slices along axis ``dim + 1`` in offset order, checking
that the ranks' tensors have the same rows, and takes each replicated hook from the lowest-rank run that has it
in that forward. docs/api/python.md, "Tensor parallelism".
"""

from __future__ import annotations

import os as _os

import numpy as _np

from . import shards as _shards
from ._ferry import Error

__all__ = ["LayoutError", "TPRun", "check_slices", "open", "shard", "spec"]


def shard(world: int, rank: int, dim: int, extent: int, full: int | None = None, offset: int | None = None) -> dict:
    """The slice of rank `rank` of `world` holding `extent` elements of row dimension `dim`: by default an even
    split (``full = extent * world``, ``offset = rank * extent``); an uneven one gives `full` and `offset`. The
    C++ core checks it when a schema holding it is declared (``ferry.LogicError``)."""
    return {"world": world, "rank": rank, "dim": dim, "offset": rank * extent if offset is None else offset,
            "full": extent * world if full is None else full}


def spec(name: str, dtype, local_row_shape, dim: int, rank: int, world: int, *, full: int | None = None,
         offset: int | None = None) -> tuple:
    """The schema spec ``(name, dtype, local_row_shape, shard(...))`` of a sharded hook: this rank's row shape
    (its slice's extent at `dim`), the slice as ``shard()`` makes it (even split unless `full` / `offset`)."""
    row = (local_row_shape,) if isinstance(local_row_shape, int) else tuple(local_row_shape)
    extent = row[dim] if isinstance(dim, int) and 0 <= dim < len(row) else 0  # the core refuses such a dim
    return (name, dtype, row, shard(world, rank, dim, extent, full, offset))


class LayoutError(Error):
    """Runs that do not assemble: ``path`` names the run directory (or shard file) at fault, ``reason`` what is
    wrong, expected against got."""

    def __init__(self, path, reason: str):
        super().__init__(f"ferry.tp: {path}: {reason}")
        self.path = str(path)
        self.reason = reason


def _rank_of(run) -> int | None:
    """The rank a run's sharded hooks name (None: no sharded hook); LayoutError if they name several."""
    ranks = {(l["rank"], name) for name, l in run.layout.items()}
    if len({r for r, _ in ranks}) > 1:
        (r0, h0), (r1, h1) = sorted(ranks)[0], sorted(ranks)[-1]
        raise LayoutError(run.directory, f"expected one rank for every sharded hook of a run, got hook {h0!r} of "
                                         f"rank {r0} and hook {h1!r} of rank {r1}")
    return next(iter(ranks))[0] if ranks else None


def _base(name: str) -> str:
    """A tensor's hook name: "h#1" (the hook's 2nd capture in its forward) is hook "h"."""
    return name.split("#", 1)[0]


def check_slices(name: str, dim: int, full: int, slices) -> None:
    """The tiling rule of a sharded tensor: `slices` ``[(offset, extent, where)]`` sorted by offset cover ``[0,
    full)`` of row dimension `dim` with no gap or overlap; else LayoutError naming the `where` (a run directory or
    file) at fault."""
    at, prev = 0, None
    for offset, extent, where in slices:
        if offset != at:
            kind = "overlap" if offset < at else "gap"
            before = f"the slice of {prev} ends at {at}" if prev is not None else "the first slice starts at 0"
            raise LayoutError(where, f"hook {name!r}: slices of dim {dim} ({kind}): expected offset {at} ({before}), "
                                     f"got the slice [{offset}, {offset + extent}) of {where}")
        at, prev = offset + extent, where
    if at != full:
        raise LayoutError(prev, f"hook {name!r}: slices of dim {dim} (gap): expected them to end at full {full}, got "
                                f"the last one ending at {at}")


class TPRun:
    """The runs of the ranks of one tensor-parallel job, their layout checked (``open()``). ``runs`` and ``ranks``
    in rank order (None: a run without a sharded hook); ``layout``: {sharded hook: {"world", "dim", "full",
    "slices": [(offset, extent, run index)] in offset order}}; ``tags``: the forward tags, in order."""

    def __init__(self, directories, verify: bool = True):
        if isinstance(directories, (str, bytes, _os.PathLike)) or not directories:
            raise LayoutError(directories, "expected a non-empty list of run directories, one per rank")
        runs = [_shards.open(d, verify=verify) for d in directories]
        keyed = [(_rank_of(r), i, r) for i, r in enumerate(runs)]
        keyed.sort(key=lambda k: (k[0] is None, k[0] or 0, k[1]))
        self.runs = [r for _, _, r in keyed]
        self.ranks = [k for k, _, _ in keyed]
        self.directories = [r.directory for r in self.runs]
        self.complete = all(r.complete for r in self.runs)
        self.layout = {}
        for name in dict.fromkeys(n for r in self.runs for n in r.layout):
            self.layout[name] = self._check_hook(name)
        self.tags = self._check_tags()

    def _dtype_row(self, run, name):
        """(dtype, row_shape) of hook `name` in `run`'s schema (None if the run does not declare it)."""
        return next(((d, tuple(s)) for n, d, s in run.schema.values() if n == name), None)

    def _check_hook(self, name: str) -> dict:
        have = [(i, r, r.layout[name]) for i, r in enumerate(self.runs) if name in r.layout]
        _, r0, l0 = have[0]
        d0, s0 = self._dtype_row(r0, name)
        for r in self.runs:
            if name not in r.layout and self._dtype_row(r, name) is not None:
                raise LayoutError(r.directory, f"hook {name!r}: expected a sharded hook (as in {r0.directory}), got "
                                               f"one without a slice (a whole tensor)")
        for _, r, l in have[1:]:
            for key in ("world", "dim", "full"):
                if l[key] != l0[key]:
                    what = "the world size changed" if key == "world" else f"its {key} differs"
                    raise LayoutError(r.directory, f"hook {name!r}: {what}: expected {key} {l0[key]} (as in "
                                                   f"{r0.directory}), got {l[key]}")
            d, s = self._dtype_row(r, name)
            dim = l0["dim"]
            if d != d0 or len(s) != len(s0) or s[:dim] + s[dim + 1:] != s0[:dim] + s0[dim + 1:]:
                raise LayoutError(r.directory, f"hook {name!r}: expected dtype {d0} and row shape {s0} except at dim "
                                               f"{dim} (as in {r0.directory}), got {d} {s}")
        by_rank = {}
        for i, r, l in have:
            if l["rank"] in by_rank:
                raise LayoutError(r.directory, f"hook {name!r}: rank {l['rank']} appears twice, expected once: in "
                                               f"{self.runs[by_rank[l['rank']]].directory} and in {r.directory}")
            by_rank[l["rank"]] = i
        world = l0["world"]
        missing = [k for k in range(world) if k not in by_rank]
        if missing:
            raise LayoutError(_os.path.commonpath(self.directories), f"hook {name!r}: rank {missing[0]} of world "
                              f"{world} is missing: expected ranks 0..{world - 1}, got ranks {sorted(by_rank)} "
                              f"({', '.join(self.runs[i].directory for i, _, _ in have)})")
        dim, full = l0["dim"], l0["full"]
        slices = sorted((l["offset"], self._dtype_row(r, name)[1][dim], i) for i, r, l in have)
        check_slices(name, dim, full, [(o, e, self.runs[i].directory) for o, e, i in slices])
        return {"world": world, "dim": dim, "full": full, "slices": slices}

    def _check_tags(self) -> list[int]:
        for r in self.runs:
            seen = set()
            for t in r.tags:
                if t in seen:
                    raise LayoutError(r.directory, f"repeated forward tag {t}: expected each tag once, got it twice")
                seen.add(t)
            if r.refused_tags:
                raise LayoutError(r.directory, f"repeated forward tag {r.refused_tags[0]}: expected each tag once, "
                                               f"got it again (its sink refused the repeat: index.json refused_tags "
                                               f"{r.refused_tags})")
        ref = self.runs[0]
        want = set(ref.tags)
        for k, r in zip(self.ranks[1:], self.runs[1:]):
            got = set(r.tags)
            who = f"rank {k}" if k is not None else "a run without a sharded hook"
            for t in ref.tags:
                if t not in got:
                    raise LayoutError(r.directory, f"{who} skipped forward tag {t}: expected the tags of "
                                                   f"{ref.directory}, got a run without tag {t}")
            for t in r.tags:
                if t not in want:
                    raise LayoutError(r.directory, f"{who} has forward tag {t} that {ref.directory} lacks: expected "
                                                   f"the same tags in every run")
        return list(ref.tags)

    def _assemble(self, name: str, parts: list) -> _np.ndarray:
        """Hook `name`'s whole tensor from [(run index, tensor name, array)] of one forward, in offset order."""
        rows = parts[0][2].shape[0]
        for i, key, a in parts:
            if a.shape[0] != rows:
                run = self.runs[i]
                raise LayoutError(_os.path.join(run.directory, run.weight_map[key]),
                                  f"tensor {key!r}: expected {rows} rows (as in {self.runs[parts[0][0]].directory}), "
                                  f"got {a.shape[0]}")
        if len(parts) == 1:
            return parts[0][2]
        return _np.concatenate([a for _, _, a in parts], axis=self.layout[name]["dim"] + 1)

    def _forward(self, tag: int, only: str | None = None) -> dict:
        if tag not in self.tags:
            raise KeyError(f"ferry.tp: no forward tagged {tag} in {self.directories}")
        base = None if only is None else _base(only)
        got = {}  # in order of first appearance: a sharded hook's [(run index, tensor name, array)], else the array
        for i, r in enumerate(self.runs):
            if base in self.layout and base not in r.layout:
                continue  # a sharded hook: only the runs holding a slice of it
            for key, a in r.forward(tag).items():
                if only is not None and key != only:
                    continue
                if _base(key) in self.layout:
                    got.setdefault(key, []).append((i, f"{tag}/{key}", a))
                else:
                    got.setdefault(key, a)  # a replicated hook: the lowest-rank run's
            if only is not None and base not in self.layout and only in got:
                break
        for key, parts in got.items():
            if not isinstance(parts, list):
                continue
            name = _base(key)
            slices = self.layout[name]["slices"]
            if len(parts) != len(slices):
                have = {i for i, _, _ in parts}
                i = next(i for _, _, i in slices if i not in have)
                raise LayoutError(self.runs[i].directory, f"hook {name!r}: expected tensor {tag}/{key} in every "
                                                          f"rank's run, got none in this one")
            order = {i: k for k, (_, _, i) in enumerate(slices)}
            got[key] = self._assemble(name, sorted(parts, key=lambda p: order[p[0]]))
        return got

    def forward(self, tag: int) -> dict:
        """{hook name: whole numpy array} of the forward tagged `tag` (sharded hooks concatenated)."""
        return self._forward(tag)

    def tensor(self, tag: int, name: str) -> _np.ndarray:
        """Hook `name`'s whole tensor in the forward tagged `tag` (only the runs holding it are read)."""
        got = self._forward(tag, name)
        if name not in got:
            raise KeyError(f"ferry.tp: no tensor {tag}/{name} in {self.directories}")
        return got[name]

    def __iter__(self):
        """(tag, hook name, whole array), forward by forward."""
        for tag in self.tags:
            for name, a in self._forward(tag).items():
                yield tag, name, a

    def __repr__(self) -> str:
        return (f"ferry.tp.TPRun({len(self.runs)} runs, {len(self.layout)} sharded hooks, {len(self.tags)} forwards"
                f"{'' if self.complete else ', not all closed'})")


def open(directories, *, verify: bool = True) -> TPRun:  # noqa: A001 (the module's verb, as ferry.shards.open)
    """The runs of the ranks in `directories` (one per rank, any order), their layout checked (LayoutError)."""
    return TPRun(directories, verify)
