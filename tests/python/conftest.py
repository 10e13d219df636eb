# SPDX-License-Identifier: Apache-2.0
# Fixtures of the Python tests: they run on the host backend (no GPU needed); a fake CUDA DLPack array
# checks that device/host mix-ups are refused without touching memory.
import ctypes
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


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class FakeCudaArray:
    """A 1-d float32 array that claims to live on CUDA device `device` (never dereferenced: ferry must
    refuse it before touching memory)."""

    def __init__(self, n=16, device=0):
        self._shape = (ctypes.c_int64 * 1)(n)
        self._mt = _DLManagedTensor()
        self._mt.dl_tensor.data = 0x1000
        self._mt.dl_tensor.device = _DLDevice(2, device)  # kDLCUDA
        self._mt.dl_tensor.ndim = 1
        self._mt.dl_tensor.dtype = _DLDataType(2, 32, 1)  # float32
        self._mt.dl_tensor.shape = self._shape
        self._device = device

    def __dlpack_device__(self):
        return (2, self._device)

    def __dlpack__(self, stream=None, **kwargs):
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(self._mt), b"dltensor", None)


@pytest.fixture
def fake_cuda_array():
    return FakeCudaArray
