# SPDX-License-Identifier: Apache-2.0
# Fixtures of the Python tests: they run on the host backend (no GPU needed); a fake CUDA DLPack array
# checks that device/host mix-ups are refused without touching memory.
import gc

import numpy as np
import pytest

import ferry


@pytest.fixture
def stream():
    s = ferry.Stream(backend="host")
    yield s
    s.synchronize()


@pytest.fixture
def make_channel():
    """Channels made by the test; closed (if still open) and collected at the end so the device is free."""
    made = []

    def make(**kw):
        kw.setdefault("ring_bytes", 1 << 16)
        kw.setdefault("publish_every", 4)
        ch = ferry.Channel(backend="host", **kw)
        made.append(ch)
        return ch

    yield make
    for ch in made:
        if not ch.closed:
            try:
                ch.close()
            except ferry.Error:
                pass
    made.clear()
    gc.collect()


def _drain(ch, n, timeout=5.0):
    """Polls until n entries arrived (fails after `timeout`)."""
    out = []
    while len(out) < n:
        got = ch.poll(n - len(out), timeout=timeout)
        assert got, f"expected {n} entries, got {len(out)} before the timeout"
        out += got
    return out


@pytest.fixture
def drain():
    return _drain


from fake_dlpack import FakeCudaArray  # noqa: E402 (tests/python is on sys.path: conftest's directory)


@pytest.fixture
def fake_cuda_array():
    return FakeCudaArray
