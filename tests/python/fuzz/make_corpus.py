#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes the seed corpus of fuzz_ferry.py (tests/python/fuzz/corpus/): each seed is a short script of operations
that reaches one of ferry's main paths, encoded as the bytes atheris.FuzzedDataProvider decodes back into the same
decisions. The scripts drive the target itself (ScriptSrc answers its decisions and records them), so a seed stays
meaningful as long as the decisions it names exist; the generator then replays every seed through the real decoder
and reports any seed whose decisions came out different (a timing-dependent branch, or a stale key).

  PYTHONPATH=build/test/src/python python tests/python/fuzz/make_corpus.py [--out DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("FERRY_PYTHON_BACKEND", "host")

import fuzz_ferry as T  # noqa: E402


class Seq:
    """An override used once per decision of that key, in order (the default after the last)."""

    def __init__(self, *values):
        self.values = list(values)


LAST = object()  # pick: the last element (the array or channel made just before)


class ScriptSrc(T.Src):
    """Answers the target's decisions from a script of (op name, {key: value}); records (value, range)."""

    def __init__(self, script):
        self.script = list(script)
        self.cur = {}
        self.log = []  # (key, offset from lo, hi - lo)

    def remaining(self):
        return len(self.script)

    def _over(self, key):
        if key not in self.cur:
            return None, False
        v = self.cur[key]
        if isinstance(v, Seq):
            if not v.values:
                return None, False
            return v.values.pop(0), True
        return v, True

    def _log(self, key, off, rng):
        self.log.append((key, off, rng))

    def int(self, lo, hi, key=""):
        v, have = self._over(key)
        v = lo if not have else v
        if not lo <= v <= hi:
            raise ValueError(f"script: {key}={v} outside [{lo}, {hi}]")
        self._log(key, v - lo, hi - lo)
        return v

    def pick(self, seq, key=""):
        if key == "op":
            name, self.cur = self.script.pop(0)
            self.cur = dict(self.cur)
            i = [f.__name__ for f in seq].index(name)
        else:
            v, have = self._over(key)
            i = 0
            if have:
                if v is LAST:
                    i = len(seq) - 1
                else:
                    i = next((j for j, x in enumerate(seq) if x is v or (type(x) is type(v) and x == v)
                              or (isinstance(x, float) and isinstance(v, float) and x != x and v != v)
                              or (isinstance(x, tuple) and x and x[0] == v)), None)
                    if i is None and isinstance(v, int) and not isinstance(v, bool) and 0 <= v < len(seq):
                        i = v  # the world's objects (arrays, channels, streams, entries) by index
                    if i is None:
                        raise ValueError(f"script: {key}={v!r} is not one of {seq!r}")
        self._log(key, i, len(seq) - 1)
        return seq[i]

    def chance(self, n, key=""):
        v, have = self._over(key)
        yes = bool(v) if have else False
        self._log(key, n - 1 if yes else 0, n - 1)
        return yes

    def encode(self) -> bytes:
        """The bytes FuzzedDataProvider decodes into the logged decisions (integers come from the end, the most
        significant byte first; a range r takes ceil(bits(r) / 8) bytes)."""
        tail = []
        for _, off, rng in self.log:
            n = (rng.bit_length() + 7) // 8
            tail += list(off.to_bytes(n, "big")) if n else []
        return bytes(reversed(tail))


class RecordingSrc(T.Src):
    """The real decoder, recording its decisions (to check a seed decodes as scripted)."""

    def __init__(self, data):
        super().__init__(data)
        self.log = []

    def int(self, lo, hi, key=""):
        v = super().int(lo, hi, key)
        self.log.append((key, v - lo, hi - lo))
        return v


# -- the seeds --------------------------------------------------------------------------------------------------
# Keys are the target's decision names (fuzz_ferry.py): op, ring, timeout, knob, sarg, arr.new, np_how, dtype,
# ndim, dim, deferred, hook, pollkind, max, to, entryop, ...

def f32(size=256, **kw):
    """Overrides that make a new float32 array of n elements (C-contiguous, random bytes)."""
    d = {"arr.new": True, "arr.which": LAST, "torch?": False, "np_how": 0, "dtype": T.np.float32, "ndim": 1,
         "dim": size, "fill": 0, "seed": 7}
    d.update(kw)
    return d


def ch(**kw):
    d = {"ring": 1 << 16, "timeout": 0.05, "chan": LAST}
    d.update(kw)
    return d


def knobs(**kv):
    """Channel knobs: {"nknobs": n, "knob": Seq(names), name: value}."""
    d = {"nknobs": len(kv), "knob": Seq(*kv.keys())}
    d.update(kv)
    return d


CHAN = {"chan": LAST}
POLL = {"chan": LAST, "pollkind": 0, "max": 16, "to": 0.1}
LIVE_POLL = {"chan": LAST, "pollkind": 6, "max": 1024, "to": 0.1}


def capture(hook, deferred=False, **arr):
    d = {"chan": LAST, "deferred": deferred, "hook": hook}
    d.update(arr if arr else {"arr.which": LAST})
    return d


SEEDS = {
    "eager_forward": [
        ("op_channel_new", ch()),
        ("op_begin_forward", CHAN),
        ("op_capture", capture(0, **f32(256))),
        ("op_capture", capture(1, **f32(64, dtype=T.np.int64, seed=2))),
        ("op_capture", capture(2, **f32(3, dtype=T.np.uint8))),
        ("op_end_forward", CHAN),
        ("op_poll", LIVE_POLL),
        ("op_entry", {"entry": 0, "entryop": 0}),
        ("op_entry", {"entry": 1, "entryop": 4}),
        ("op_entry", {"entry": 1, "entryop": 0}),
        ("op_views", {}),
        ("op_close", {"chan": LAST, "closeto": 0.5}),
    ],
    "deferred_flush_points": [
        ("op_channel_new", ch(**knobs(publish_every=2))),
        ("op_begin_forward", CHAN),
        ("op_capture", capture(0, True, **f32(16))),
        ("op_capture", capture(1, True, **f32(32, seed=3))),
        ("op_capture", capture(2, True, **f32(48, seed=4))),
        ("op_flush", CHAN),
        ("op_capture", capture(3, True, **f32(8, seed=5))),
        ("op_capture", capture(4, False, **f32(8, seed=6))),
        ("op_capture", capture(5, True, **f32(1000, seed=7))),
        ("op_end_forward", CHAN),
        ("op_poll", LIVE_POLL),
        ("op_poll", LIVE_POLL),
    ],
    "graph_replays": [
        ("op_channel_new", ch(**knobs(publish_every=1))),
        ("op_stream", {"streamop": 4}),
        ("op_begin_forward", CHAN),
        ("op_capture", capture(7, **f32(64))),
        ("op_capture", capture(8, True, **f32(16, seed=9))),
        ("op_end_forward", CHAN),
        ("op_stream", {"streamop": 5}),
        ("op_launch", {"autoplan": True}),
        ("op_poll", LIVE_POLL),
        ("op_array", {"arrop": 2, "which": 0, "at": 3, "xor": 255}),
        ("op_launch", {"autoplan": True}),
        ("op_poll", LIVE_POLL),
        ("op_launch", {"autoplan": False}),
        ("op_poll", POLL),
    ],
    "abort_forward_pending_deferred": [
        ("op_channel_new", ch(**knobs(publish_every=16))),
        ("op_begin_forward", CHAN),
        ("op_capture", capture(1, False, **f32(32))),
        ("op_capture", capture(2, True, **f32(32, seed=1))),
        ("op_array", {"arrop": 3, "which": LAST}),
        ("op_abort_forward", CHAN),
        ("op_begin_forward", CHAN),
        ("op_capture", capture(3, True, **f32(8))),
        ("op_end_forward", CHAN),
        ("op_poll", LIVE_POLL),
        ("op_poll", LIVE_POLL),
    ],
    "fail_fast_full_ring": [
        ("op_channel_new", ch(ring=1 << 12, **knobs(on_full="fail_fast", publish_every=64))),
        ("op_begin_forward", CHAN),
        ("op_capture", capture(1, **f32(512))),
        ("op_capture", capture(2, **{"arr.which": 0})),
        ("op_capture", capture(3, **{"arr.which": 0})),
        ("op_capture", capture(4, True, **{"arr.which": 0})),
        ("op_end_forward", CHAN),
        ("op_poll", LIVE_POLL),
    ],
    "held_views_block_then_timeout": [
        ("op_channel_new", ch(ring=1 << 12, **knobs(staging_bytes=1 << 12, publish_every=1))),
        ("op_begin_forward", CHAN),
        ("op_capture", capture(1, **f32(1024))),
        ("op_end_forward", CHAN),
        ("op_poll", LIVE_POLL),
        ("op_entry", {"entry": 0, "entryop": 0}),
        ("op_entry", {"entry": 0, "entryop": 3}),
        ("op_begin_forward", CHAN),
        ("op_capture", capture(2, **{"arr.which": 0})),
        ("op_capture", capture(3, **{"arr.which": 0})),
        ("op_end_forward", CHAN),
        ("op_poll", POLL),
        ("op_views", {"dropview": True, "view": 0}),
        ("op_gc", {}),
        ("op_poll", POLL),
    ],
    "refused_sources": [
        ("op_channel_new", ch()),
        ("op_begin_forward", CHAN),
        ("op_capture", capture(1, **f32(64, np_how=1, ndim=2, dim=Seq(8, 8)))),
        ("op_capture", capture(1, **f32(64, np_how=2, ndim=2, dim=Seq(4, 16)))),
        ("op_capture", capture(1, **{"arr.new": True, "arr.which": LAST, "np_how": 10, "junk": [1, 2, 3]})),
        ("op_capture", capture(1, **{"arr.new": True, "arr.which": LAST, "np_how": 11})),
        ("op_capture", capture(1, **{"arr.new": True, "arr.which": LAST, "np_how": 6, "exotic": "object"})),
        ("op_capture", capture(1, **{"arr.new": True, "arr.which": LAST, "np_how": 12, "mode": 0})),
        ("op_capture", capture(1, **f32(0))),
        ("op_capture", capture(-1, **f32(4))),
        ("op_capture", capture("1", **{"arr.which": 0})),
        ("op_capture", {"chan": LAST, "hook": 5, "arr.which": 0, "sarg": 15, "sarg.junk": 12345}),
        ("op_end_forward", CHAN),
        ("op_poll", LIVE_POLL),
    ],
    "odd_but_valid_sources": [
        ("op_channel_new", ch()),
        ("op_begin_forward", CHAN),
        ("op_capture", capture(1, **f32(3, np_how=5, n=1000))),
        ("op_capture", capture(2, **f32(3, np_how=6, exotic=">i4", n=4))),
        ("op_capture", capture(3, **{"arr.new": True, "arr.which": LAST, "np_how": 9, "n": 300, "buf": 0})),
        ("op_capture", capture(4, **{"arr.new": True, "arr.which": LAST, "np_how": 9, "n": 16, "buf": 4})),
        ("op_capture", capture(5, **f32(1, np_how=8, dtype=T.np.float16))),
        ("op_capture", capture(6, **f32(5, dtype=T.np.bool_, ndim=3, dim=Seq(1, 5, 1)))),
        ("op_capture", capture(7, **f32(16, np_how=13, dtype=T.np.complex64))),
        ("op_end_forward", CHAN),
        ("op_poll", LIVE_POLL),
    ],
    "close_with_open_forward": [
        ("op_channel_new", ch(**knobs(publish_every=16))),
        ("op_begin_forward", CHAN),
        ("op_capture", capture(7, **f32(16))),
        ("op_capture", capture(8, True, **f32(16, seed=8))),
        ("op_close", {"chan": LAST, "closeto": 0.1}),
        ("op_poll", POLL),
        ("op_poll", POLL),
        ("op_close", {"chan": LAST}),
    ],
    "views_outlive_release_close_and_channel": [
        ("op_channel_new", ch()),
        ("op_begin_forward", CHAN),
        ("op_capture", capture(1, **f32(4096))),
        ("op_capture", capture(2, **f32(100, dtype=T.np.uint8))),
        ("op_end_forward", CHAN),
        ("op_poll", LIVE_POLL),
        ("op_entry", {"entry": 0, "entryop": 0}),
        ("op_entry", {"entry": 1, "entryop": 0}),
        ("op_entry", {"entry": 0, "entryop": 4}),
        ("op_entry", {"entry": 0, "entryop": 1}),
        ("op_entry", {"entry": 1, "entryop": 6}),
        ("op_close", {"chan": LAST, "closeto": 0.5}),
        ("op_views", {}),
        ("op_channel_drop", {"chan": LAST}),
        ("op_views", {}),
    ],
    "bounce_and_knobs": [
        ("op_channel_new", ch(**knobs(bounce_capture_max_bytes=4096, publish_every=4096, copy_vecs_per_thread=8,
                                      lean_copy_kernel=False))),
        ("op_begin_forward", CHAN),
        ("op_capture", capture(1, **f32(16))),
        ("op_capture", capture(2, **f32(2000, seed=1))),
        ("op_capture", capture(3, True, **f32(7, dtype=T.np.uint8))),
        ("op_abort_forward", CHAN),
        ("op_channel_new", ch(**knobs(branch_publish=False, gather_branch_publish=False, fifo_capacity=4))),
        ("op_begin_forward", CHAN),
        ("op_capture", capture(1, **f32(16))),
        ("op_capture", capture(2, True, **{"arr.which": 0})),
        ("op_end_forward", CHAN),
        ("op_poll", LIVE_POLL),
    ],
    "capture_rows": [
        ("op_channel_new", ch(rowslots=True)),
        ("op_begin_forward", CHAN),
        ("op_capture_rows", {"chan": LAST, "nrows": 12, "rowshape": (4,), "rdtype": T.np.float32, "idt": T.np.int32,
                             "form": 0, "nsel": 3, "row": Seq(4, 0, 11), "rhook": 1}),
        ("op_capture_rows", {"chan": LAST, "nrows": 12, "rowshape": (4,), "idt": T.np.int64, "form": 0, "nsel": 2,
                             "row": Seq(1, 13), "rhook": 2}),
        ("op_capture_rows", {"chan": LAST, "nrows": 12, "rowshape": (2, 3), "rdtype": T.np.uint8, "form": 1,
                             "nreq": 3, "reqlen": Seq(5, 2, 5), "nsel": 2, "req": Seq(0, 2), "rhook": 3}),
        ("op_capture_rows", {"chan": LAST, "nrows": 12, "rowshape": (4,), "form": 2, "nreq": 3,
                             "reqlen": Seq(5, 2, 5), "nsel": 3, "req": Seq(2, 0, 1), "wa": 1, "wb": 3, "rhook": 4}),
        ("op_capture_rows", {"chan": LAST, "nrows": 12, "rowshape": (4,), "form": 0, "nsel": 4,
                             "row": Seq(3, 2, 1, 0), "countkind": 3, "dcount": 2, "rhook": 5}),
        ("op_capture_rows", {"chan": LAST, "nrows": 12, "rowshape": (4,), "form": 0, "nsel": 4,
                             "row": Seq(3, 2, 1, 0), "countkind": 1, "count": 3, "rhook": 6}),
        ("op_capture", capture(7, True, **f32(16))),
        ("op_end_forward", CHAN),
        ("op_poll", LIVE_POLL),
        ("op_poll", LIVE_POLL),
    ],
    "bad_channel_config": [
        ("op_channel_new", ch(ring=15)),
        ("op_channel_new", ch(timeout=float("nan"))),
        ("op_channel_new", ch(**knobs(copy_vecs_per_thread=3))),
        ("op_channel_new", ch(**knobs(head_memory="nowhere"))),
        ("op_channel_new", ch(**knobs(fifo_capacity=0))),
        ("op_channel_new", ch(ring=2**64)),
        ("op_channel_new", ch(**{"device": 99})),
        ("op_channel_new", ch(**{"backend": "tpu"})),
        ("op_channel_new", ch(**{"bogus": True})),
        ("op_channel_new", ch(**knobs(drain_idle_sleep=-1.0))),
    ],
    "two_channels_two_streams": [
        ("op_channel_new", ch()),
        ("op_channel_new", ch(**knobs(publish_every=1))),
        ("op_stream", {"streamop": 0}),
        ("op_begin_forward", {"chan": 0, "sarg.which": 0}),
        ("op_stream", {"streamop": 0}),
        ("op_begin_forward", {"chan": 1, "sarg.which": 1}),
        ("op_capture", {"chan": 0, "sarg.which": 0, "hook": 1, **f32(64)}),
        ("op_capture", {"chan": 1, "sarg.which": 1, "hook": 2, **f32(64, seed=3)}),
        ("op_capture", {"chan": 1, "sarg.which": 0, "hook": 3, "arr.which": 0}),
        ("op_end_forward", {"chan": 0, "sarg.which": 0}),
        ("op_end_forward", {"chan": 1, "sarg.which": 1}),
        ("op_poll", {"chan": 0, "pollkind": 6, "max": 1024}),
        ("op_poll", {"chan": 1, "pollkind": 6, "max": 1024}),
    ],
    "stream_closed_under_a_forward": [
        ("op_channel_new", ch()),
        ("op_stream", {"streamop": 0}),
        ("op_begin_forward", {"chan": LAST, "sarg.which": 0}),
        ("op_capture", {"chan": LAST, "sarg.which": 0, "hook": 1, **f32(64)}),
        ("op_stream", {"streamop": 2, "stream": 0}),
        ("op_capture", {"chan": LAST, "sarg.which": 0, "hook": 2, "arr.which": 0}),
        ("op_end_forward", {"chan": LAST, "sarg.which": 0}),
        ("op_abort_forward", {"chan": LAST, "sarg.which": 0}),
        ("op_close", {"chan": LAST, "closeto": 0.1}),
        ("op_poll", POLL),
    ],
    "h2d_eager_publications": [
        ("op_pub_new", {}),
        ("op_pub_declare", {"name": "ids", "groups": ["g0"], "pdtype": "int32", "cap": 64}),
        ("op_pub_declare", {"name": "b", "groups": ["g0"], "pdtype": "int64", "cap": 16, "bind": True}),
        ("op_pub_declare", {"name": "c", "groups": "g1", "pdtype": "int32", "cap": 16, "unit": "rows", "row": 8,
                            "bind": True}),
        ("op_pub_initialize", {}),
        ("op_pub_begin", {"slot": 0}),
        ("op_pub_producer", {"prodop": 0, "pgroup": "g0"}),
        ("op_pub_fill", {"buf": 0, "pfill": 1, "wn": 3, "seed": 11}),
        ("op_pub_fill", {"buf": 1, "pfill": 1, "wn": 3, "fill": 2}),
        ("op_pub_publish", {"pubgroup": "g0"}),
        ("op_pub_producer", {"prodop": 0, "pgroup": "g1"}),
        ("op_pub_fill", {"buf": 2, "prod": 1, "pfill": 1, "wn": 3}),
        ("op_pub_producer", {"prodop": 1, "prod": 0}),
        ("op_pub_publish", {"pubgroup": "g1"}),
        ("op_pub_producer", {"prodop": 2, "prod": 0}),
        ("op_pub_slot_end", {"slotend": 0}),
        ("op_pub_begin", {"slot": 1}),
        ("op_pub_producer", {"prodop": 0, "pgroup": "g0"}),
        ("op_pub_fill", {"buf": 0, "pfill": 0, "lo": 2, "len": 4}),
        ("op_pub_fill", {"buf": 0, "pfill": 3, "count": 32}),
        ("op_pub_fill", {"buf": 1, "pfill": 2, "count": 0}),
        ("op_pub_publish", {"pubgroup": "g0"}),
        ("op_pub_slot_end", {"slotend": 2}),
    ],
    "h2d_graph_upload": [
        ("op_pub_new", {}),
        ("op_pub_declare", {"name": "ids", "groups": ["g0"], "pdtype": "int32", "cap": 64, "bind": True}),
        ("op_pub_declare", {"name": "b", "groups": ["g0"], "pdtype": "int64", "cap": 64}),
        ("op_pub_initialize", {"upload": "packed"}),
        ("op_stream", {"streamop": 4}),
        ("op_pub_capture_upload", {"cugroup": "g0", "cuslot": 0}),
        ("op_stream", {"streamop": 5}),
        ("op_pub_begin", {"slot": 0}),
        ("op_pub_producer", {"prodop": 0, "pgroup": "g0"}),
        ("op_pub_fill", {"buf": 0, "pfill": 1, "wn": 32, "seed": 3}),
        ("op_pub_fill", {"buf": 1, "pfill": 1, "wn": 3, "seed": 4}),
        ("op_pub_producer", {"prodop": 1}),
        ("op_pub_publish", {"pubgroup": "g0", "stage": True}),
        ("op_launch", {"graph": 0}),
        ("op_pub_slot_end", {"slotend": 1}),
    ],
    "h2d_bad_input": [
        ("op_pub_new", {}),
        ("op_pub_declare", {"name": "a", "groups": ["g0"], "pdtype": "object", "cap": 8}),
        ("op_pub_declare", {"name": "a", "groups": ["g0"], "pdtype": "int32", "cap": 0}),
        ("op_pub_declare", {"name": "a", "groups": ["g0"], "pdtype": "int32", "cap": 2**62}),
        ("op_pub_declare", {"name": "a", "groups": ["g0"], "pdtype": "int32", "cap": 8, "unit": "pages"}),
        ("op_pub_declare", {"name": "a", "groups": ["g0"], "pdtype": "int32", "cap": 8, "bind": True,
                            "dstextra": -1}),
        ("op_pub_declare", {"name": "a", "suffix": True, "groups": ["g0"], "pdtype": "int32", "cap": 8}),
        ("op_pub_declare", {"name": "a", "suffix": True, "groups": ["g0"], "pdtype": "int32", "cap": 8}),
        ("op_pub_initialize", {"upload": "teleport"}),
        ("op_pub_initialize", {"sarg": 15}),
        ("op_pub_initialize", {}),
        ("op_pub_producer", {"prodop": 0, "pgroup": "g0"}),
        ("op_pub_begin", {"slot": 2}),
        ("op_pub_begin", {"slot": 0}),
        ("op_pub_publish", {"pubgroup": "g0"}),
        ("op_pub_producer", {"prodop": 0, "pgroup": "g0"}),
        ("op_pub_fill", {"buf": 0, "pfill": 1, "wn": 9}),
        ("op_pub_fill", {"buf": 0, "pfill": 1, "wdt": True, "wdt2": T.np.float32}),
        ("op_pub_fill", {"buf": 0, "pfill": 2, "count": 9}),
        ("op_pub_publish", {"pubgroup": "nope"}),
        ("op_pub_fill", {"buf": 0, "pfill": 1, "wn": 3}),
        ("op_pub_publish", {"pubgroup": "g0"}),
        ("op_pub_fill", {"buf": 0, "pfill": 2, "count": 1}),
    ],
    # the findings of issue 26, replayed by the CI stage: close() timeouts out of range (nan, 1e300: refused,
    # the channel stays open), a graph launched after its channel closed or was destroyed (refused, nothing
    # written), another publisher's Buffer (refused by every call that takes one)
    "close_timeouts_out_of_range": [
        ("op_channel_new", ch()),
        ("op_close", {"chan": LAST, "closeto": float("nan")}),
        ("op_close", {"chan": LAST, "closeto": 1e300}),
        ("op_close", {"chan": LAST, "closeto": -1.0}),
        ("op_close", {"chan": LAST, "closeto": 0.5}),
    ],
    "graph_launch_after_close_or_drop": [
        ("op_channel_new", ch(**knobs(publish_every=1))),
        ("op_stream", {"streamop": 4}),
        ("op_begin_forward", CHAN),
        ("op_capture", capture(7, **f32(64))),
        ("op_end_forward", CHAN),
        ("op_stream", {"streamop": 5}),
        ("op_launch", {"autoplan": True}),
        ("op_poll", LIVE_POLL),
        ("op_close", {"chan": LAST, "closeto": 0.5}),
        ("op_launch", {"autoplan": True}),
        ("op_channel_new", ch()),
        ("op_stream", {"streamop": 4}),
        ("op_begin_forward", CHAN),
        ("op_capture", capture(8, **f32(32, seed=2))),
        ("op_end_forward", CHAN),
        ("op_stream", {"streamop": 5}),
        ("op_channel_drop", {"chan": LAST}),
        ("op_launch", {"graph": 1}),
        ("op_launch", {"graph": 0}),
    ],
    "h2d_foreign_buffer": [
        ("op_pub_new", {}),
        ("op_pub_new", {}),
        ("op_pub_declare", {"pub": 0, "name": "ids", "groups": ["g0"], "pdtype": "int32", "cap": 64}),
        ("op_pub_declare", {"pub": 1, "name": "ids", "groups": ["g0"], "pdtype": "int32", "cap": 64}),
        ("op_pub_declare", {"pub": 1, "name": "b", "groups": ["g0"], "pdtype": "int32", "cap": 8}),
        ("op_pub_initialize", {"pub": 0}),
        ("op_pub_initialize", {"pub": 1}),
        ("op_pub_misc", {"pub": 0, "pmisc": 0, "foreign": True, "fbuf": 0}),
        ("op_pub_misc", {"pub": 0, "pmisc": 0, "foreign": True, "fbuf": 1}),
        ("op_pub_begin", {"pub": 0, "slot": 0}),
        ("op_pub_fill", {"pub": 0, "foreign": True, "fbuf": 0, "pfill": 3, "count": 1}),
        ("op_pub_producer", {"pub": 0, "prodop": 0, "pgroup": "g0"}),
        ("op_pub_fill", {"pub": 0, "foreign": True, "fbuf": 1, "pfill": 2, "count": 1}),
        ("op_pub_fill", {"pub": 0, "foreign": True, "fbuf": 1, "pfill": 1, "wn": 3}),
        ("op_pub_fill", {"pub": 0, "pfill": 1, "wn": 3}),
    ],
}

if T.torch is not None:
    def t32(size=64, **kw):
        d = {"arr.new": True, "arr.which": LAST, "torch?": True, "t_how": 0, "tdtype": "float32", "ndim": 1,
             "dim": size, "fill": 0, "seed": 5}
        d.update(kw)
        return d

    def top(hook, via=0, deferred=False, **arr):
        d = {"chan": LAST, "deferred": deferred, "thook": hook, "via": via}
        d.update(arr if arr else {"arr.which": LAST})
        return d

    SEEDS.update({
        "torch_ops_eager_and_deferred": [
            ("op_channel_new", ch(**knobs(publish_every=2))),
            ("op_begin_forward", CHAN),
            ("op_torch_capture", top(0, **t32(64))),
            ("op_torch_capture", top(1, 0, True, **t32(16, tdtype="bfloat16"))),
            ("op_torch_capture", top(2, 0, True, **t32(7, tdtype="bool"))),
            ("op_torch_capture", top(3, 3)),
            ("op_torch_capture", top(4, 2, **t32(5, tdtype="int64"))),
            ("op_torch_capture", top(5, 1, **t32(4, t_how=1))),
            ("op_torch_capture", top(2**32, 0, **{"arr.which": 0})),
            ("op_end_forward", CHAN),
            ("op_poll", LIVE_POLL),
        ],
        "torch_deferred_written_in_place": [
            ("op_channel_new", ch(**knobs(publish_every=16))),
            ("op_begin_forward", CHAN),
            ("op_torch_capture", top(9, 0, True, **t32(4))),
            ("op_array", {"arrop": 2, "which": LAST}),
            ("op_end_forward", CHAN),
            ("op_abort_forward", CHAN),
            ("op_begin_forward", CHAN),
            ("op_capture", capture(9, True, **{"arr.which": 0})),
            ("op_array", {"arrop": 2, "which": 0}),
            ("op_flush", CHAN),
            ("op_close", {"chan": LAST, "closeto": 0.5}),
            ("op_poll", POLL),
        ],
        "torch_hooks_closures_and_odd_tensors": [
            ("op_channel_new", ch()),
            ("op_begin_forward", CHAN),
            ("op_torch_capture", top(1, 4, **t32(8, t_how=1), use_ops=False)),
            ("op_torch_capture", top(2, 4, True, **t32(8, t_how=5), use_ops=True)),
            ("op_torch_capture", top(3, 4, **t32(8, t_how=7), use_ops="auto")),
            ("op_capture", capture(4, **t32(8, t_how=6))),
            ("op_capture", capture(5, **t32(8, t_how=8))),
            ("op_capture", capture(6, **t32(8, t_how=10))),
            ("op_torch_capture", top(7, 0, **t32(8, t_how=9))),
            ("op_end_forward", CHAN),
            ("op_poll", LIVE_POLL),
        ],
        "torch_capture_rows": [
            ("op_channel_new", ch(rowslots=True)),
            ("op_begin_forward", CHAN),
            ("op_capture_rows", {"chan": LAST, "rows_op": True, "nrows": 12, "rowshape": (4,), "form": 0,
                                 "nsel": 2, "row": Seq(11, 3)}),
            ("op_capture_rows", {"chan": LAST, "rows_op": True, "nrows": 12, "rowshape": (4,), "form": 1, "nreq": 2,
                                 "reqlen": Seq(4, 5), "nsel": 2, "req": Seq(1, 0), "countkind": 3, "dcount": 1}),
            ("op_end_forward", CHAN),
            ("op_poll", LIVE_POLL),
        ],
        # issue 26: a sparse tensor through the ferry.hooks closures (refused, LogicError), and a Channel() that
        # fails after allocating (staging 2^50) while a stream thread releases torch op tensors (no deadlock)
        "torch_hooks_closure_sparse": [
            ("op_channel_new", ch()),
            ("op_begin_forward", CHAN),
            ("op_torch_capture", top(1, 4, **t32(8, t_how=10), use_ops=False)),
            ("op_torch_capture", top(2, 4, True, **{"arr.which": LAST}, use_ops=True)),
            ("op_torch_capture", top(3, 4, **t32(8), use_ops="auto")),
            ("op_end_forward", CHAN),
            ("op_poll", LIVE_POLL),
        ],
        "channel_ctor_oom_after_torch_ops": [
            ("op_channel_new", ch(ring=1 << 20)),
            ("op_begin_forward", CHAN),
            ("op_torch_capture", top(0, 0, True, **t32(16384))),
            ("op_torch_capture", top(1, 0, True, **t32(16384, seed=6))),
            ("op_torch_capture", top(2, 0, True, **t32(16384, seed=7))),
            ("op_torch_capture", top(3, 3)),
            ("op_channel_new", ch(**knobs(staging_bytes=2**50))),
            ("op_end_forward", {"chan": 0}),
            ("op_poll", {"chan": 0, "pollkind": 6, "max": 1024, "to": 0.1}),
        ],
        "torch_graph_replay": [
            ("op_channel_new", ch()),
            ("op_stream", {"streamop": 4}),
            ("op_begin_forward", CHAN),
            ("op_torch_capture", top(5, 0, **t32(64))),
            ("op_end_forward", CHAN),
            ("op_stream", {"streamop": 5}),
            ("op_launch", {"autoplan": True}),
            ("op_array", {"arrop": 2, "which": 0}),
            ("op_launch", {"autoplan": True}),
            ("op_poll", LIVE_POLL),
        ],
    })

if T.SINK is not None:
    SEEDS["native_sink"] = [
        ("op_channel_new", ch(sink=14)),
        ("op_begin_forward", CHAN),
        ("op_capture", capture(1, **f32(64))),
        ("op_capture", capture(2, True, **f32(16, seed=3))),
        ("op_end_forward", CHAN),
        ("op_poll", {"chan": LAST}),
        ("op_close", {"chan": LAST, "closeto": 0.5}),
        ("op_poll", {"chan": LAST}),
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(HERE / "corpus"))
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("seed-*"):
        old.unlink()
    drift = 0
    for name, script in SEEDS.items():
        s = ScriptSrc(script)
        T.run_input(s)
        data = s.encode()
        r = RecordingSrc(data)
        T.run_input(r)
        want = [(k, o, g) for k, o, g in s.log]
        if r.log != want:
            drift += 1
            i = next((i for i, (a, b) in enumerate(zip(r.log, want)) if a != b), min(len(r.log), len(want)))
            print(f"make_corpus: {name}: decodes differently from decision {i} "
                  f"({want[i] if i < len(want) else None} scripted, {r.log[i] if i < len(r.log) else None} decoded)")
        path = out / f"seed-{name}"
        path.write_bytes(data)
        print(f"make_corpus: {path.name}: {len(script)} ops, {len(data)} bytes, "
              f"sha1 {hashlib.sha1(data).hexdigest()[:12]}")
    print(f"make_corpus: {len(SEEDS)} seeds in {out}" + (f" ({drift} drifted)" if drift else ""))


if __name__ == "__main__":
    main()
