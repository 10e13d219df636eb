# SPDX-License-Identifier: Apache-2.0
"""The check of qwen3_capture's ferry entries: one untimed generation per (mode, ferry contestant, preset),
step by step, every entry compared bit-exact (blake2b of the bytes) with its witness, the synchronous copy of
the same tensor made by the same execution beside its capture (the contestant's ``witnessed``), plus the
diagnostics that tell wrong bytes from a model that is not bit-reproducible."""

from __future__ import annotations

import torch

import ferry.hooks as fh

from .drain import digest
from .meta import log

CHECK_METHOD = ("witness copies: one untimed generation per (mode, ferry contestant, preset), step by step; every "
                "ferry entry is compared (blake2b) with a synchronous copy of the same tensor made by the same "
                "execution beside its capture (eager: t.cpu() at the hook; graph: the same forward captured with a "
                "device copy of each hooked tensor next to its capture, read after the replay). Diagnostic: each "
                "step is also replayed eagerly without capture from the same tok, pos and KV[0..pos-1] (replay_bad; "
                "reference_vs_reference_bad: two uncaptured generations compared), and the generation continues "
                "from the captured step's tok, pos and KV[pos]")


def tensor_digest(t: torch.Tensor) -> bytes:
    """Synchronous reference: the tensor's bytes on the host (.cpu() waits for the device)."""
    c = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
    return digest(c)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN payloads and -0.0 included), on the tensors' device."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


class Checker:
    """The counts of the JSON (entries_checked, entries_bad, first_bad) and its "check" (``diag``), over the
    generations checked on ``rig`` (its drain, entry count and sync)."""

    def __init__(self, rig):
        self.rig, self.tokens = rig, rig.args.tokens
        self.entries_checked = 0
        self.entries_bad = 0
        self.first_bad = None
        self.diag = {"method": CHECK_METHOD, "replay_bad": 0, "reference_vs_reference_bad": 0, "step_token_mismatches": 0,
                     "step_kv_mismatches": 0, "reference_vs_reference": {}, "runs": {}}

    def reference(self, dec, model, pts):
        """One whole uncaptured eager generation from the start state, (step, hook, blake2b of t.cpu()) of every
        hooked tensor: only for the reference-vs-reference determinism diagnostic."""
        ref = []
        step = [0]

        def rec(h, t):
            ref.append((step[0], h, tensor_digest(t)))

        dec.reset()
        with fh.install(model, pts, rec):
            for i in range(self.tokens):
                step[0] = i
                dec.step()
        self.rig.sync()
        return ref

    def reference_vs_reference(self, name, dec, model, preset, pts):
        """Two uncaptured eager generations with the reference hooks, compared with each other: nonzero means
        the model itself is not bit-reproducible run to run (no ferry involved)."""
        a = self.reference(dec, model, pts)
        b = self.reference(dec, model, pts)
        bad = abs(len(a) - len(b))
        first = None
        for (s, h, d), (_, h2, d2) in zip(a, b):
            if h != h2 or d != d2:
                bad += 1
                first = s if first is None else first
        self.diag["reference_vs_reference_bad"] += bad
        self.diag["reference_vs_reference"][name] = {"preset": preset, "entries": len(a), "bad": bad,
                                                     "first_bad_step": first}
        log(f"  reference vs reference ({preset}): {len(a)} captures, {bad} differ"
            + (f" (first at step {first})" if first is not None else ""))

    def checked_generation(self, name, key, dec, model, pts, c):
        """One untimed generation of contestant ``c`` (a ferry one), checked step by step. The reference of a
        step's ferry entries (entries_bad): the witness copies the same execution made of the same tensors
        beside each capture (``c.witnessed``). A diagnostic besides: each captured step is followed by an
        uncaptured eager replay of the same step from the same state, whose hooked tensors' synchronous
        ``.cpu()`` bytes are compared too (a model that is not bit-reproducible shows there, not in
        entries_bad)."""
        rig, ref, step, witness = self.rig, [], [0], []

        def rec(h, t):
            ref.append((step[0], h, tensor_digest(t)))

        kv = dec.kv
        layers = range(len(kv.keys))
        diverged: set[int] = set()  # steps whose replay produced another next token or KV[pos]
        tok_mismatches = kv_mismatches = 0
        rig.drain.wait(rig.expected)
        rig.drain.items, rig.drain.check = [], True
        dec.reset()
        rig.sync()
        for i in range(self.tokens):
            tok0, pos0 = dec.tok.clone(), dec.pos.clone()
            # the captured step (graph replay after plan(), or eager with ferry's hooks) and its witness copies
            witness.extend(c.witnessed(i))
            tok1, pos1 = dec.tok.clone(), dec.pos.clone()
            kv1 = [(kv.keys[j].index_select(2, pos0), kv.values[j].index_select(2, pos0)) for j in layers]
            # The reference: the same step again, eager and uncaptured, from the pre-step state (tok, pos). It
            # rewrites KV[pos] of every layer (its cache update runs before its attention reads the cache), so
            # its inputs are exactly the captured step's: tok, pos and KV[0..pos-1], which nothing changed.
            dec.tok.copy_(tok0)
            dec.pos.copy_(pos0)
            step[0] = i
            with fh.install(model, pts, rec):
                dec.step()
            rig.sync()
            tok_diff = not torch.equal(dec.tok, tok1)
            kv_diff = any(not same_bits(kv.keys[j].index_select(2, pos0), k1)
                          or not same_bits(kv.values[j].index_select(2, pos0), v1) for j, (k1, v1) in zip(layers, kv1))
            tok_mismatches += int(tok_diff)
            kv_mismatches += int(kv_diff)
            if tok_diff or kv_diff:
                diverged.add(i)
            # continue from the captured step's results: its token, position and KV[pos]
            for j, (k1, v1) in zip(layers, kv1):
                kv.keys[j].index_copy_(2, pos0, k1)
                kv.values[j].index_copy_(2, pos0, v1)
            dec.tok.copy_(tok1)
            dec.pos.copy_(pos1)
        rig.sync()
        rig.expected += c.entries * self.tokens
        rig.drain.wait(rig.expected)
        rig.drain.check = False
        items, rig.drain.items = rig.drain.items, []
        label = f"{name} {key}"
        res, _ = self.check(items, witness, label)  # entries_bad: ferry's bytes vs the same execution's copies
        rres, bad_steps = self.check(items, ref, f"{label} (vs the uncaptured replay)", count=False)
        res.update(replay_bad=rres["bad"], replay_bad_steps=rres["bad_steps"], token_mismatches=tok_mismatches,
                   kv_mismatches=kv_mismatches, bad_steps_where_replay_diverged=len(bad_steps & diverged))
        self.diag["replay_bad"] += rres["bad"]
        self.diag["step_token_mismatches"] += tok_mismatches
        self.diag["step_kv_mismatches"] += kv_mismatches
        self.diag["runs"][label] = res
        log(f"  replay vs captured step {label}: next token differs in {tok_mismatches}, KV[pos] in "
            f"{kv_mismatches} of {self.tokens} steps; {res['bad_steps_where_replay_diverged']} of "
            f"{res['bad_steps']} steps with bad entries are among those")

    def check(self, items, ref, label, count=True):
        """ferry's entries (hook, digest) against the reference captures (step, hook, digest), in order: the
        counts for JSON "check" and the set of steps with a bad entry; ``count``: add to entries_checked /
        entries_bad."""
        n = len(ref)
        bad = 0
        if len(items) != n:
            bad += abs(len(items) - n)
        by_hook: dict[int, int] = {}
        bad_steps: set[int] = set()
        for i, ((h, d), (s, rh, rd)) in enumerate(zip(items, ref)):
            if h != rh or d != rd:
                bad += 1
                by_hook[rh] = by_hook.get(rh, 0) + 1
                bad_steps.add(s)
                if count and self.first_bad is None:
                    what = f"hook {h} vs reference hook {rh}" if h != rh else f"hook {h}: bytes differ"
                    self.first_bad = f"{label}: entry {i} (step {s}): {what}"
        if count:
            self.entries_checked += len(items)
            self.entries_bad += bad
        worst = sorted(by_hook.items(), key=lambda kv: -kv[1])[:12]
        log(f"  check {label}: {len(items)} entries against {n} reference captures, {bad} bad"
            + (f" in {len(bad_steps)} steps; bad per hook id (top): {worst}" if bad else ""))
        return {"entries": len(items), "reference": n, "bad": bad, "bad_steps": len(bad_steps),
                "first_bad_step": min(bad_steps) if bad_steps else None}, bad_steps
