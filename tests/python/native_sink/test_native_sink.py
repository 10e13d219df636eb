# SPDX-License-Identifier: Apache-2.0
# A native sink (ferry_capi.h): ferry.Channel(..., sink=capsule) delivers every entry to a C function on the
# drain thread, without the GIL and without running Python per entry. The sink here (sink.cpp, built with
# the tests) records (hook, seq, size, FNV-1a of the bytes) per entry.
import gc
import importlib
import os
import pathlib
import sys
import time

import numpy as np
import pytest

import ferry


def _sink_module():
    where = os.environ.get("FERRY_TEST_SINK_DIR")
    if not where:  # a build tree: <build>/src/python/ferry/__init__.py -> <build>/tests/python/native_sink
        where = str(pathlib.Path(ferry.__file__).resolve().parents[3] / "tests" / "python" / "native_sink")
    if not pathlib.Path(where).is_dir():
        pytest.skip("the native sink test extension was not built (FERRY_BUILD_TESTS with FERRY_BUILD_PYTHON)", allow_module_level=True)
    sys.path.insert(0, where)
    try:
        return importlib.import_module("ferry_test_sink")
    except ImportError as err:
        pytest.skip(f"the native sink test extension is not importable: {err}", allow_module_level=True)
    finally:
        sys.path.remove(where)


ts = _sink_module()


def fnv1a(b):
    h = 1469598103934665603
    for c in b:
        h = ((h ^ c) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def wait_for(cap, n, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = ts.entries(cap)
        if len(got) >= n:
            return got
        time.sleep(0.002)
    pytest.fail(f"expected {n} entries at the sink, got {len(ts.entries(cap))}")


def test_sink_gets_every_entry_exact_in_order_without_the_gil(stream):
    cap = ts.make()
    # a small ring and staging: the entries only fit because the sink releases each one as it returns
    ch = ferry.Channel(backend="host", ring_bytes=1 << 12, staging_bytes=1 << 12, publish_every=4, sink=cap)
    assert ch.has_sink
    rng = np.random.default_rng(3)
    xs = [rng.integers(0, 255, size=16 + (i % 7) * 40, dtype=np.uint8) for i in range(600)]
    for f in range(6):
        ch.begin_forward(stream)
        for i in range(100):
            ch.capture(f * 1000 + i, xs[f * 100 + i], stream)
        ch.end_forward(stream)
    got = wait_for(cap, 600)
    want = [(f * 1000 + i, f * 100 + i, xs[f * 100 + i].size, fnv1a(xs[f * 100 + i].tobytes()))
            for f in range(6) for i in range(100)]
    assert got == want
    assert ts.gil_calls(cap) == 0
    with pytest.raises(ferry.LogicError, match="native sink"):
        ch.poll(1)
    rep = ch.close()
    assert rep["clean"] and rep["delivered"] == 600
    assert ch.stats()["entries_drained"] == 600 and ch.stats()["callback_errors"] == 0
    assert not ch.has_sink  # close() lets the capsule go
    del ch
    gc.collect()
    assert len(ts.entries(cap)) == 600  # the capsule outlives the channel; nothing more arrives


def test_sink_with_the_torch_op(stream):
    torch = pytest.importorskip("torch")
    fto = pytest.importorskip("ferry.torch_ops", reason="ferry built without the torch op library")
    cap = ts.make()
    ch = ferry.Channel(backend="host", ring_bytes=1 << 16, publish_every=8, sink=cap)
    tok = fto.token()
    xs = [torch.randn(5, 3 + i) for i in range(20)]
    ch.begin_forward(stream)
    for i, x in enumerate(xs):
        torch.ops.ferry.capture(tok, x, ch.handle, i)
    ch.end_forward(stream)
    got = wait_for(cap, 20)
    assert got == [(i, i, x.numel() * 4, fnv1a(x.numpy().tobytes())) for i, x in enumerate(xs)]
    assert ch.close()["clean"]


def test_bad_sinks_are_refused():
    with pytest.raises(ferry.LogicError, match="PyCapsule named 'ferry.sink'"):
        ferry.Channel(backend="host", ring_bytes=1 << 12, sink=object())
    with pytest.raises(ferry.LogicError, match="PyCapsule named 'ferry.sink'"):
        ferry.Channel(backend="host", ring_bytes=1 << 12, sink=ferry._ferry._capi)  # another capsule
    with pytest.raises(ferry.LogicError, match="version"):
        ferry.Channel(backend="host", ring_bytes=1 << 12, sink=ts.make_bad_version())
