# SPDX-License-Identifier: Apache-2.0
"""qwen3_cb's check: one untimed generation per ferry contestant (rows, cpu_select) and preset, step by step.
Every delivered row is compared bit-exact with its witness (the same tensor copied whole by the same execution,
beside its capture; the witness rows are picked on the host with the selection the script drew, so the upload
of the selection is checked too) and its attribution with what the step asked for (the entry's tag is its step;
a row entry's ``requests`` are the step's, and ``rows_of(request)`` is that request's row)."""

from __future__ import annotations

import numpy as np

import ferry

from .meta import log

CHECK_METHOD = ("witness copies: one untimed generation per ferry contestant (rows, cpu_select) and preset, step by "
                "step; the step's forward also copies every hooked tensor whole beside its capture (eager: a "
                "synchronous host copy at the hook; graph: the same forward captured again with a device copy of "
                "each hooked tensor into a static buffer, read after the replay), and the witness rows are those "
                "copies' rows of the selection drawn on the host. rows: Entry.rows_of(request) vs the witness row "
                "of the request's batch slot; cpu_select: the consumer's pick of the same rows from the whole "
                "entry. rows_bad: rows whose bytes differ (and the rows of a missing or failed entry); "
                "misattributed: rows of an entry whose tag is not its step (rows entries: or whose requests / "
                "rows / row_bytes are not the step's), and rows whose bytes are another selected request's "
                "witness row")


class RowChecker:
    """The JSON's rows_checked, rows_bad, misattributed (and "check": per run counts, first_bad)."""

    def __init__(self, rig):
        self.rig = rig
        self.rows_checked = self.rows_bad = self.misattributed = 0
        self.first_bad = None
        self.runs = {}

    def checked_generation(self, key, dec, c, tokens):
        rig = self.rig
        rig.drained()
        res = {"entries": 0, "rows_checked": 0, "rows_bad": 0, "misattributed": 0, "missing_entries": 0,
               "unexpected_entries": 0, "failed_entries": 0}
        rig.consumer.mode = "collect"
        try:
            dec.reset()
            rig.sync()
            for i in range(tokens):
                whole = c.witnessed(i)
                rig.expected += c.entries
                rig.drained()
                self.compare(key, c.kind, i, rig.consumer.take(), whole, res)
        finally:
            for e in rig.consumer.take():
                e.release()
            rig.consumer.mode = "release"
        self.runs[key] = res
        self.rows_checked += res["rows_checked"]
        self.rows_bad += res["rows_bad"]
        self.misattributed += res["misattributed"]
        log(f"  check {key}: {res['entries']} entries, {res['rows_checked']} rows, {res['rows_bad']} bad, "
            f"{res['misattributed']} misattributed"
            + "".join(f", {res[k]} {k.replace('_', ' ')}" for k in ("missing_entries", "unexpected_entries",
                                                                    "failed_entries") if res[k]))
        return res

    def _bad(self, key, step, hook, what):
        if self.first_bad is None:
            self.first_bad = f"{key} step {step} hook {hook}: {what}"

    def compare(self, key, kind, step, items, whole, res):
        sels = self.rig.sels
        idx, rids = sels.idx[step], sels.rids[step]
        k = len(idx)
        want_requests = [(r, j, 1) for j, r in enumerate(rids)]
        seen = set()
        for e in items:
            try:
                res["entries"] += 1
                h = e.hook
                w = whole.get(h)
                if w is None or h in seen:
                    res["unexpected_entries"] += 1
                    self._bad(key, step, h, "an entry of a hook this step did not witness (or a second one)")
                    continue
                seen.add(h)
                want = w[idx]  # [k, row_bytes]: the witness rows of the selected batch slots, in selection order
                attributed = e.tag == step
                if not e.ok:
                    res["failed_entries"] += 1
                    got = [None] * k
                elif kind == "rows":
                    attributed = attributed and e.rows == k and e.row_bytes == w.shape[1] and \
                        list(e.requests) == want_requests
                    got = []
                    for r in rids:
                        try:
                            got.append(np.asarray(e.rows_of(r)).reshape(-1))
                        except ferry.Error:
                            got.append(None)
                else:  # cpu_select: the consumer's pick from the whole entry
                    data = e.numpy()
                    attributed = attributed and e.row_bytes == 0
                    full = data.reshape(w.shape) if data.size == w.size else None
                    got = [full[b] if full is not None else None for b in idx]
                if not attributed:
                    self._bad(key, step, h, f"attribution: tag {e.tag}, rows {e.rows}, row_bytes {e.row_bytes}, "
                                            f"requests {list(e.requests)[:4]}...")
                for j, g in enumerate(got):
                    res["rows_checked"] += 1
                    good = g is not None and g.shape == want[j].shape and np.array_equal(g, want[j])
                    other = not good and g is not None and any(
                        m != j and g.shape == want[m].shape and np.array_equal(g, want[m]) for m in range(k))
                    if not good:
                        res["rows_bad"] += 1
                        self._bad(key, step, h, f"row of request {rids[j]} (slot {idx[j]}) differs from its witness"
                                                + (" (it is another request's row)" if other else ""))
                    if not attributed or other:
                        res["misattributed"] += 1
                del got
            finally:
                e.release()
        missing = set(whole) - seen
        if missing:
            res["missing_entries"] += len(missing)
            res["rows_checked"] += k * len(missing)
            res["rows_bad"] += k * len(missing)
            self._bad(key, step, min(missing), f"{len(missing)} hooks delivered no entry")
