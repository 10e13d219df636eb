# SPDX-License-Identifier: Apache-2.0
# A DLPack array that claims to live on CUDA, never dereferenced: ferry must refuse it before touching memory.
# Shared by the pytest fixtures (conftest.py: fake_cuda_array) and the atheris target (fuzz/fuzz_ferry.py).
import ctypes


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
