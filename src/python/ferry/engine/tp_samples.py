# SPDX-License-Identifier: Apache-2.0
"""Reading a tensor-parallel engine run: ``open_samples(out)`` on a directory of ``rank-NNNNN`` directories (each a
rank's samples, in any of the three formats, with its ``tp.json``) yields whole samples, as a run on one GPU would.

The layout is checked before any sample is read; ``ferry.tp.LayoutError`` names the directory at fault: each rank
``0 .. world - 1`` exactly once (its directory's name is its rank), one world size, the same taps of the same kinds.
Then the ranks' samples are joined by request id as they are read (memory: the samples one rank is ahead of
another): a request twice in one rank is a LayoutError, as are token ids that differ between ranks at a position.
Each sharded tap's slices (each sample's ``tp`` metadata) must agree on world, dim and full and tile ``[0, full)``
(``ferry.tp.check_slices``); they are concatenated in offset order. A replicated tap is rank 0's.

Nothing is delivered as whole that is not: positions held by some ranks only are left out and listed in
``missing``, a tap without every rank's slice is left out (``reason`` says which rank), and the sample is then
``complete: "false"``. A request some rank has no sample of (dropped or lost there) comes last, so marked.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Iterator

import numpy as np

from ..tp import LayoutError, check_slices
from .tp import RANK_DIR, TP_META

__all__ = ["open_tp_samples", "rank_dirs"]


def rank_dirs(directory: str) -> list[tuple[str, dict]] | None:
    """``[(rank directory, its tp.json)]`` in rank order, the layout checked; None when ``directory`` holds no rank
    directory (not a TP run)."""
    found: dict[int, tuple[str, dict]] = {}
    for name in sorted(os.listdir(directory)):
        m = re.fullmatch(r"rank-(\d+)", name)
        path = os.path.join(directory, name)
        if not m or not os.path.isfile(os.path.join(path, TP_META)):
            continue
        with open(os.path.join(path, TP_META), encoding="utf-8") as f:
            meta = json.load(f)
        if meta.get("rank") != int(m.group(1)):
            raise LayoutError(path, f"expected rank {int(m.group(1))} (the directory's name) in {TP_META}, got rank "
                                    f"{meta.get('rank')}")
        found[meta["rank"]] = (path, meta)
    if not found:
        return None
    p0, m0 = found[min(found)]
    for r, (path, meta) in sorted(found.items()):
        if meta["world"] != m0["world"]:
            raise LayoutError(path, f"the world size changed: expected world {m0['world']} (as in {p0}), got "
                                    f"{meta['world']}")
        for key in ("taps", "kinds"):
            if meta[key] != m0[key]:
                raise LayoutError(path, f"expected the run's {key} {m0[key]} (as in {p0}), got {meta[key]}")
    world = m0["world"]
    extra = [r for r in found if r >= world]
    if extra:
        raise LayoutError(found[extra[0]][0], f"rank {extra[0]} is outside world {world}: expected ranks "
                                              f"0..{world - 1}")
    missing = [r for r in range(world) if r not in found]
    if missing:
        raise LayoutError(os.path.join(directory, RANK_DIR.format(missing[0])),
                          f"rank {missing[0]} of world {world} is missing: expected ranks 0..{world - 1}, got "
                          f"{sorted(found)}")
    return [found[r] for r in range(world)]


def _ranges(pos: np.ndarray) -> list[list[int]]:
    """Sorted positions as ``[[a, b), ...]``."""
    out: list[list[int]] = []
    for p in (int(x) for x in pos):
        if out and out[-1][1] == p:
            out[-1][1] = p + 1
        else:
            out.append([p, p + 1])
    return out


class _Join:
    def __init__(self, ranks: list[tuple[str, dict]]) -> None:
        self.ranks = ranks
        self.world = ranks[0][1]["world"]
        self.taps, self.kinds = ranks[0][1]["taps"], ranks[0][1]["kinds"]

    def expected(self, parts: dict) -> set[int]:
        """The ranks that hold a sample of this request: rank 0, and every rank with a sharded tap rank 0 kept."""
        if 0 not in parts:
            return set(range(self.world))
        kept = json.loads(parts[0][0]["taps"])
        if any(self.kinds[t] == "sharded" for t in kept):
            return {r for r, (_, m) in enumerate(self.ranks) if any(t in m["local"] for t in kept)} | {0}
        return {0}

    def assemble(self, rid: str, parts: dict, absent: list[int]) -> tuple[dict, dict]:
        pos = {r: np.asarray(a["positions"], np.int64) for r, (_, a) in parts.items()}
        common = None
        for p in pos.values():
            common = p if common is None else np.intersect1d(common, p)
        common = np.unique(common)
        r0 = min(parts)
        reasons = [f"rank {r} has no sample of this request (dropped or lost there: see its report)" for r in absent]
        missing = set()
        for r, (m, a) in parts.items():
            missing.update(tuple(x) for x in json.loads(m.get("missing", "[]")))
            if m.get("reason"):
                reasons.append(f"rank {r}: {m['reason']}")
        extra = np.setdiff1d(np.unique(np.concatenate(list(pos.values()))), common)
        missing.update(tuple(x) for x in _ranges(extra))
        rows, toks = {}, None
        for r, (m, a) in parts.items():
            order = np.argsort(pos[r], kind="stable")
            rows[r] = order[np.searchsorted(pos[r][order], common)]
            t = np.asarray(a["token_ids"], np.int64)[rows[r]]
            if toks is None:
                toks = t
            elif not np.array_equal(t, toks):
                at = int(common[np.flatnonzero(t != toks)[0]])
                raise LayoutError(self.ranks[r][0], f"request {rid!r}: expected the token ids of "
                                                    f"{self.ranks[r0][0]} at every position, got another at {at}")
        kept = {r: json.loads(m["taps"]) for r, (m, _) in parts.items()}  # each rank's taps and slices, parsed once
        slices = {r: json.loads(m["tp"])["slices"] if "tp" in m else {} for r, (m, _) in parts.items()}

        def tap_rows(r: int, tap: str) -> np.ndarray:
            return parts[r][1]["hidden_states"][rows[r], kept[r].index(tap)]

        taps, arrays = [], []
        for tap in self.taps:
            have = [r for r in sorted(parts) if tap in kept[r]]
            if not have:
                continue
            if self.kinds[tap] == "replicated":
                taps.append(tap)
                arrays.append(tap_rows(0 if 0 in have else have[0], tap))
                continue
            if len(have) < self.world:
                lack = next(r for r in range(self.world) if r not in have)
                reasons.append(f"tap {tap!r} left out: rank {lack}'s slice is missing")
                continue
            sl = {r: slices[r].get(tap) for r in have}
            s0 = sl[have[0]]
            for r in have:
                s = sl[r]
                if s is None or any(s[k] != s0[k] for k in ("world", "dim", "full")):
                    raise LayoutError(self.ranks[r][0], f"request {rid!r}: tap {tap!r}: expected a slice of world "
                                                        f"{s0['world']}, dim {s0['dim']}, full {s0['full']} (as "
                                                        f"in {self.ranks[have[0]][0]}), got {s}")
            parts_t = sorted((sl[r]["offset"], r, tap_rows(r, tap)) for r in have)
            check_slices(tap, s0["dim"], s0["full"],
                         [(o, a.shape[1 + s0["dim"]], self.ranks[r][0]) for o, r, a in parts_t])
            taps.append(tap)
            arrays.append(np.concatenate([a for _, _, a in parts_t], axis=1 + s0["dim"]))
        m0 = parts[r0][0]
        complete = not absent and not missing and all(m.get("complete") == "true" for m, _ in parts.values()) \
            and len(taps) == len(kept[r0])
        meta = {"format": m0.get("format", ""), "version": m0.get("version", ""), "request_id": rid,
                "taps": json.dumps(taps), "complete": "true" if complete else "false",
                "missing": json.dumps(sorted(list(x) for x in missing)), "reason": "; ".join(reasons),
                "prompt_len": m0.get("prompt_len", "0"), "tp": json.dumps({"world": self.world})}
        meta.update({k: m0[k] for k in ("reduce", "reduce_width") if k in m0})
        out: dict[str, Any] = {"token_ids": toks, "positions": common}
        if len({(a.dtype, a.shape[1:]) for a in arrays}) <= 1:
            out["hidden_states"] = np.stack(arrays, axis=1) if arrays else np.zeros((len(common), 0), np.uint8)
        else:  # taps of different whole shapes (e.g. the residual stream beside the MLP intermediate)
            out.update({f"hidden_states.{t}": a for t, a in zip(taps, arrays)})
        return meta, out


def open_tp_samples(directory: str, ranks: list[tuple[str, dict]] | None = None) -> Iterator[tuple[dict, dict]]:
    """Whole samples of a TP run (module docstring), ``(metadata, arrays)`` as ``open_samples`` yields them: the
    ranks' samples joined by request id, in the order they complete; ``hidden_states`` ``[tokens, taps,
    *whole row]`` when every tap has one whole row shape, else ``hidden_states.<tap>`` per tap."""
    from .samples import open_samples
    ranks = ranks or rank_dirs(directory)
    if ranks is None:
        raise LayoutError(directory, "expected rank-NNNNN directories with tp.json (a Capture under tensor "
                                     "parallelism), got none")
    join = _Join(ranks)
    its = {r: open_samples(p) for r, (p, m) in enumerate(ranks) if m["local"]}
    pending: dict[str, dict[int, tuple]] = {}
    seen: list[set[str]] = [set() for _ in ranks]
    while its:
        for r in list(its):
            got = next(its[r], None)
            if got is None:
                del its[r]
                continue
            rid = got[0]["request_id"]
            if rid in seen[r]:
                raise LayoutError(ranks[r][0], f"request {rid!r} twice: expected each request once per rank")
            seen[r].add(rid)
            parts = pending.setdefault(rid, {})
            parts[r] = got
            if join.expected(parts) <= set(parts):
                del pending[rid]
                yield join.assemble(rid, parts, [])
    for rid, parts in pending.items():
        yield join.assemble(rid, parts, sorted(join.expected(parts) - set(parts)))
