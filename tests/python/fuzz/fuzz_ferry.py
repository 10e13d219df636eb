#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""atheris fuzz target of ferry's Python surface on the host backend (docs/testing.md, "Python fuzzing").

One input is a sequence of at most FERRY_FUZZ_MAX_OPS (40) operations decoded with
atheris.FuzzedDataProvider: Channel (fuzzed keyword arguments, inside and outside their ranges), Stream,
begin_forward / capture / capture_deferred (/ _many) / flush / end_forward / abort_forward, poll, entries and their numpy
views (released once, twice, or never; views kept past release, close and the channel's death), close, graph
capture (Stream.begin_capture / end_capture, plan, Graph.launch), Publisher declare / initialize / begin /
producer / source / write / set_count / publish / stage / capture_upload, and, where torch imports,
torch.ops.ferry.capture / capture_deferred / flush and the ferry.hooks capture closures. Sources are fuzzed in
kind (numpy, torch, buffer-protocol objects, fake DLPack objects, junk), dtype (bool, float16, bfloat16,
complex, big-endian, object, datetime, structured), shape (0-d, empty, up to 64 KiB), strides (slices,
transposes, broadcasts, unaligned) and lifetime (dropped at random points).

Oracles (a violation raises Finding, which atheris reports and saves as a crash-* input):
  * every exception ferry raises is a ferry.Error, TypeError or ValueError with a non-empty message;
  * every delivered entry (poll, or a native sink where the test sink is built) arrives in seq order 0, 1, 2...
    with its hook and exactly the bytes of its capture (the source at the call in an eager forward, at the launch
    for a captured one); a view taken before release keeps those bytes until it dies, past close() and the
    channel's destruction; a channel that closed cleanly delivered every entry it accepted;
  * a source ferry must refuse (strided, empty, object dtype, a device array, not an array) is refused;
  * H2D: after publish (or stage + a captured upload's launch) the destination's published prefix equals what was
    written into the slot's source and every byte past the longest prefix published so far is untouched;
  * no hang: blocking calls get small timeouts, atheris' -timeout bounds an input, and a faulthandler watchdog
    (FERRY_FUZZ_HANG_S, 25 s) dumps every thread and exits should that fail; crashes are atheris' own.

Run: tests/python/fuzz/run.sh --build build/test (corpus, then a bounded random run), or directly
  PYTHONPATH=build/test/src/python python tests/python/fuzz/fuzz_ferry.py [libFuzzer flags] [corpus dirs/files]
"""

from __future__ import annotations

import array as _array
import ctypes
import faulthandler
import gc
import importlib
import os
import pathlib
import sys

import numpy as np

import ferry
from ferry import _ferry

try:
    import atheris
except ImportError:  # make_corpus.py drives the target without atheris (ScriptSrc)
    atheris = None

torch = fto = None
TORCH_NOTE = "torch disabled (FERRY_FUZZ_TORCH=0)"
if os.environ.get("FERRY_FUZZ_TORCH", "1") != "0":
    try:
        import torch
    except ImportError as err:
        TORCH_NOTE = f"torch not importable ({err})"
    else:
        try:
            import ferry.torch_ops as fto
            TORCH_NOTE = f"torch {torch.__version__}, torch.ops.ferry loaded"
        except (ImportError, OSError) as err:
            TORCH_NOTE = f"torch {torch.__version__}; ferry.torch_ops not importable ({err})"
from ferry import capture as fcapture

MAX_OPS = int(os.environ.get("FERRY_FUZZ_MAX_OPS", "40"))
# Known findings to step around while their fix is pending, to explore past them (comma-separated tags of KNOWN;
# empty in CI: nothing is silenced there). None is open: add {"tag": "what"} here and `if "tag" in AVOID:` where
# the target steps around it (docs/testing.md, "Findings").
KNOWN: dict[str, str] = {}
AVOID = frozenset(t for t in os.environ.get("FERRY_FUZZ_AVOID", "").split(",") if t)
if AVOID - set(KNOWN):
    raise SystemExit(f"fuzz_ferry: FERRY_FUZZ_AVOID: unknown tags {sorted(AVOID - set(KNOWN))}, "
                     f"expected some of {sorted(KNOWN)}")
HANG_S = float(os.environ.get("FERRY_FUZZ_HANG_S", "25"))
TRACE = os.environ.get("FERRY_FUZZ_TRACE", "0") != "0"  # print every operation and call (to read a crash-* input)
MAX_BYTES = 64 << 10
BACKEND = "host"


class Finding(AssertionError):
    """An oracle violation: atheris reports it as an uncaught exception and saves the input."""


class HarnessRaised(Exception):
    """Raised by the harness's own objects (a __dlpack__ that fails): ferry may pass it through."""


ALLOWED = (ferry.Error, TypeError, ValueError)


# ---------------------------------------------------------------------------------------------------------------
# Decoding: every decision is one Src call (make_corpus.py's ScriptSrc answers the same calls from a script).

class Src:
    """The fuzzer's bytes as decisions (FuzzedDataProvider: integers from the end, exhausted -> the lowest)."""

    def __init__(self, data: bytes):
        self._f = atheris.FuzzedDataProvider(data)

    def remaining(self) -> int:
        return self._f.remaining_bytes()

    def int(self, lo: int, hi: int, key: str = "") -> int:
        return self._f.ConsumeIntInRange(lo, hi)

    def pick(self, seq, key: str = ""):
        """An element of seq; the first one is the ordinary choice (what exhausted input decodes to)."""
        return seq[self.int(0, len(seq) - 1, key)]

    def chance(self, n: int, key: str = "") -> bool:
        return self.int(0, n - 1, key) == n - 1


# ---------------------------------------------------------------------------------------------------------------
# The oracle on exceptions.

def _kind(e: BaseException) -> int:
    # One branch per ferry error type: atheris' coverage of this function tells the outcomes apart.
    if isinstance(e, ferry.ShutdownError):
        return 1
    if isinstance(e, ferry.InvalidatedError):
        return 2
    if isinstance(e, ferry.TimeoutError):
        return 3
    if isinstance(e, ferry.OutOfMemory):
        return 4
    if isinstance(e, ferry.BackendError):
        return 5
    if isinstance(e, ferry.LogicError):
        return 6
    if isinstance(e, ferry.Error):
        return 7
    if isinstance(e, TypeError):
        return 8
    if isinstance(e, HarnessRaised):
        return 9
    return 10


def attempt(what: str, fn, *args, extra: tuple = (), **kw):
    """(True, result) or (False, exception) for an allowed exception; Finding for any other, or for an
    allowed one with an empty message."""
    try:
        r = fn(*args, **kw)
        if TRACE:
            print(f"    {what}: ok -> {_short(r)}", flush=True)
        return True, r
    except Finding:
        raise
    except ALLOWED + extra as e:
        if TRACE:
            print(f"    {what}: {type(e).__name__}: {_short(e)}", flush=True)
        if not str(e).strip():
            raise Finding(f"{what}: {type(e).__name__} with an empty message") from e
        _kind(e)
        return False, e
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 - the oracle
        raise Finding(f"{what}: expected ferry.Error, TypeError or ValueError, got "
                      f"{type(e).__module__}.{type(e).__qualname__}: {e}") from e


def _short(x) -> str:
    r = repr(x)
    return r if len(r) <= 160 else r[:157] + "..."


def expect_error(what: str, ok: bool, why: str) -> None:
    if ok:
        raise Finding(f"{what}: expected an error ({why}), got success")


def expect_type_error(what: str, ok: bool, r) -> None:
    if ok or not isinstance(r, TypeError):
        raise Finding(f"{what}: expected TypeError for a wrong argument type, got "
                      f"{'success' if ok else type(r).__name__ + ': ' + str(r)}")


# ---------------------------------------------------------------------------------------------------------------
# The C ABI's channel_info: a channel's forward state (open, capturing) without changing it.

class _Capi(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("struct_size", ctypes.c_uint32), ("capture", ctypes.c_void_p),
                ("channel_info", ctypes.c_void_p)]


_INFO_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int),
                            ctypes.POINTER(ctypes.c_uint32), ctypes.c_char_p, ctypes.c_size_t)


def _channel_info_fn():
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    table = _Capi.from_address(get(_ferry._capi, b"ferry._ferry._capi"))
    return _INFO_FN(table.channel_info)


_channel_info = _channel_info_fn()


def forward_flags(handle: int):
    """FERRY_INFO_* flags of the channel's open forward (1 open, 2 capturing), None for an unknown handle."""
    flags = ctypes.c_uint32(0)
    err = ctypes.create_string_buffer(512)
    rc = _channel_info(handle, None, None, ctypes.byref(flags), err, 512)
    return flags.value if rc == 0 else None


# ---------------------------------------------------------------------------------------------------------------
# Sources (arrays): what ferry must accept, may accept, or must refuse, and their bytes.

ACCEPT, MAYBE, REFUSE = "accept", "maybe", "refuse"


class Arr:
    """A capture source. `verdict`: ACCEPT (C-contiguous numeric host data of > 0 bytes: its capture may fail
    only for the channel's reasons), MAYBE (unspecified: if accepted, its bytes must be exact), REFUSE."""

    def __init__(self, obj, verdict: str, how: str, torch_tensor: bool = False, logical: bool = False):
        self.obj = obj
        self.verdict = verdict
        self.how = how
        self.is_torch = torch_tensor
        self.logical = logical  # conj/neg bit: the entry must be the logical value, not the raw memory
        self.on_meta = torch_tensor and getattr(obj, "is_meta", False)

    def witness(self) -> bytes:
        o = self.obj
        if self.is_torch:
            t = o.detach()
            if t.is_conj():
                t = t.resolve_conj()
            if t.is_neg():
                t = t.resolve_neg()
            t = t.contiguous()
            return ctypes.string_at(t.data_ptr(), t.nbytes) if t.nbytes else b""
        if isinstance(o, np.ndarray):
            return o.tobytes()
        return memoryview(o).tobytes()

    def nbytes(self) -> int:
        o = self.obj
        if self.is_torch:
            return int(o.nbytes)
        if isinstance(o, np.ndarray):
            return int(o.nbytes)
        return memoryview(o).nbytes

    def versioned(self) -> bool:
        return self.is_torch and not self.obj.is_inference()


NP_DTYPES = [np.float32, np.uint8, np.int32, np.int64, np.float16, np.bool_, np.int8, np.uint16, np.int16,
             np.uint32, np.uint64, np.float64, np.complex64, np.complex128]
DIMS = [16, 1, 2, 3, 4, 8, 5, 0, 64, 7, 128, 256, 1024, 32, 48, 100, 512, 1000, 2000, 4096, 16384]


def fill_bytes(src: Src, n: int) -> bytes:
    mode = src.int(0, 3, "fill")
    if mode == 0:
        return np.random.default_rng(src.int(0, 2**32 - 1, "seed")).integers(0, 256, n, dtype=np.uint8).tobytes()
    if mode == 1:
        return bytes(n)
    if mode == 2:
        return (np.arange(n, dtype=np.uint32) % 251).astype(np.uint8).tobytes()
    return bytes([src.int(0, 255, "byte")]) * n


def shape_for(src: Src, itemsize: int):
    ndim = src.pick([1, 2, 3, 0, 4], "ndim")
    if ndim == 0:
        return ()
    dims = [src.pick(DIMS, "dim") for _ in range(ndim)]
    while int(np.prod(dims)) * itemsize > MAX_BYTES:
        dims[dims.index(max(dims))] //= 2
    return tuple(dims)


def np_array(src: Src, dtype=None, shape=None) -> np.ndarray:
    dt = np.dtype(dtype if dtype is not None else src.pick(NP_DTYPES, "dtype"))
    shp = shape if shape is not None else shape_for(src, dt.itemsize)
    n = int(np.prod(shp, dtype=np.int64)) if shp else 1
    return np.frombuffer(bytearray(fill_bytes(src, n * dt.itemsize)), np.uint8).view(dt).reshape(shp).copy()


def _np_verdict(a: np.ndarray) -> str:
    if a.dtype.kind not in "biufc" or a.dtype.hasobject:
        return REFUSE if a.dtype.hasobject else MAYBE
    if a.nbytes == 0 or not a.flags.c_contiguous:
        return REFUSE
    return ACCEPT if a.dtype.isnative else MAYBE


class _FakeDlpack:
    """An object whose __dlpack__ raises or returns junk."""

    def __init__(self, mode: int):
        self.mode = mode

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, stream=None, **kw):
        if self.mode == 0:
            raise HarnessRaised("the harness's __dlpack__ refuses")
        return 5 if self.mode == 1 else "not a capsule"


sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # tests/python: the shared fakes
from fake_dlpack import FakeCudaArray  # noqa: E402


class _NpSub(np.ndarray):
    pass


EXOTIC = ["M8[s]", "m8[ms]", "U2", "S3", "V4", [("a", "<i4"), ("b", "<f4")], ">i4", ">f8", "<c8", "object"]


def make_numpy_source(src: Src) -> Arr:
    how = src.int(0, 13, "np_how")
    if how == 0:  # C-contiguous
        a = np_array(src)
        return Arr(a, _np_verdict(a), "contiguous")
    if how == 1:  # every other row / element
        a = np_array(src)
        v = a[::2] if a.ndim else a
        return Arr(v, _np_verdict(v), "[::2]")
    if how == 2:
        a = np_array(src)
        v = a.T
        return Arr(v, _np_verdict(v), "T")
    if how == 3:
        a = np_array(src)
        v = a[::-1] if a.ndim else a
        return Arr(v, _np_verdict(v), "[::-1]")
    if how == 4:  # stride 0
        a = np_array(src, shape=(1,))
        v = np.broadcast_to(a, (src.pick([4, 1, 64], "rows"), src.pick([8, 1, 3], "cols")))
        return Arr(v, _np_verdict(v), "broadcast")
    if how == 5:  # unaligned, read-only
        dt = np.dtype(src.pick([np.float32, np.float64, np.int64, np.int16], "dtype"))
        n = src.pick([16, 1, 3, 1000], "n")
        v = np.frombuffer(fill_bytes(src, 1 + n * dt.itemsize), dt, count=n, offset=1)
        return Arr(v, _np_verdict(v), "unaligned")
    if how == 6:  # exotic dtypes
        spec = src.pick(EXOTIC, "exotic")
        n = src.pick([4, 1, 0], "n")
        if spec == "object":
            v = np.array([object() for _ in range(n)] or [None], dtype=object)
        else:
            dt = np.dtype(spec)
            v = np.frombuffer(bytearray(fill_bytes(src, n * dt.itemsize)), np.uint8).view(dt).copy()
        return Arr(v, _np_verdict(v), f"dtype {spec}")
    if how == 7:  # read-only
        a = np_array(src)
        a.setflags(write=False)
        return Arr(a, _np_verdict(a), "read-only")
    if how == 8:  # 0-d
        a = np.array(np_array(src, shape=(1,))[0])
        return Arr(a, _np_verdict(a), "0-d")
    if how == 9:  # buffer protocol
        n = src.pick([16, 1, 0, 300], "n")
        data = fill_bytes(src, n)
        kind = src.int(0, 4, "buf")
        if kind == 0:
            return Arr(data, MAYBE if n else REFUSE, "bytes")
        if kind == 1:
            return Arr(bytearray(data), MAYBE if n else REFUSE, "bytearray")
        if kind == 2:
            return Arr(memoryview(bytearray(data)), MAYBE if n else REFUSE, "memoryview")
        if kind == 3:
            mv = memoryview(bytearray(data))[::2]
            return Arr(mv, MAYBE if len(mv) <= 1 and n > 0 else REFUSE, "memoryview[::2]")
        return Arr(_array.array("i", range(n // 4)), MAYBE if n >= 4 else REFUSE, "array.array")
    if how == 10:  # not an array
        return Arr(src.pick([None, 5, "abc", [1, 2, 3], 1.5, object(), {"a": 1}], "junk"), REFUSE, "junk")
    if how == 11:
        return Arr(FakeCudaArray(src.pick([16, 0], "n")), REFUSE, "fake cuda")
    if how == 12:
        return Arr(_FakeDlpack(src.int(0, 2, "mode")), REFUSE, "fake __dlpack__")
    a = np_array(src).view(_NpSub)  # an ndarray subclass
    return Arr(a, _np_verdict(a), "ndarray subclass")


TORCH_DTYPES = ["float32", "uint8", "int64", "bfloat16", "float16", "bool", "int32", "int8", "int16", "float64",
                "complex64"]


def torch_tensor(src: Src, dtype=None, shape=None):
    dt = getattr(torch, dtype or src.pick(TORCH_DTYPES, "tdtype"))
    size = torch.empty((), dtype=dt).element_size()
    shp = shape if shape is not None else shape_for(src, size)
    n = int(np.prod(shp, dtype=np.int64)) if shp else 1
    raw = torch.frombuffer(bytearray(fill_bytes(src, n * size)) or bytearray(1), dtype=torch.uint8)[: n * size]
    return raw.view(dt).reshape(shp).clone()


def _torch_verdict(t) -> str:
    if t.layout != torch.strided or t.device.type != "cpu" or t.nbytes == 0 or not t.is_contiguous():
        return REFUSE
    if t.is_conj() or t.is_neg():
        return MAYBE
    return ACCEPT if type(t) is torch.Tensor else MAYBE


class _TSub(torch.Tensor if torch is not None else object):
    pass


def make_torch_source(src: Src) -> Arr:
    how = src.int(0, 12, "t_how")
    if how == 0:
        t = torch_tensor(src)
    elif how == 1:
        t = torch_tensor(src, shape=(src.pick([4, 1, 3], "r"), src.pick([8, 1, 5], "c"))).t()
    elif how == 2:
        base = torch_tensor(src)
        t = base[::2] if base.dim() else base
    elif how == 3:
        t = torch_tensor(src, shape=(1,)).expand(src.pick([16, 1], "n"))
    elif how == 4:  # a storage offset
        base = torch_tensor(src, shape=(src.pick([64, 2], "n"),))
        t = base[1:]
    elif how == 5:
        t = torch_tensor(src, dtype=src.pick(["float32", "float16", "float64", "bfloat16"], "tdtype"))
        t.requires_grad_(True)
    elif how == 6:
        t = torch.nn.Parameter(torch_tensor(src, dtype="float32"))
    elif how == 7:
        with torch.inference_mode():
            t = torch_tensor(src)
    elif how == 8:  # conjugate / negative bit
        c = torch_tensor(src, dtype="complex64", shape=(src.pick([8, 1], "n"),))
        t = c.conj() if src.chance(2, "neg") else c.conj().imag
        return Arr(t, _torch_verdict(t), "conj/neg bit", torch_tensor=True, logical=True)
    elif how == 9:
        t = torch.empty(src.pick([16, 0], "n"), device="meta")
    elif how == 10:
        t = torch_tensor(src, dtype="float32", shape=(4, 4)).to_sparse()
    elif how == 11:
        t = torch_tensor(src, dtype="float32", shape=(2, 3, 4, 5)).to(memory_format=torch.channels_last)
    else:
        t = torch_tensor(src).as_subclass(_TSub)
    return Arr(t, _torch_verdict(t), f"torch how={how}", torch_tensor=True)


def make_source(src: Src) -> Arr:
    if torch is not None and src.chance(3, "torch?"):
        return make_torch_source(src)
    return make_numpy_source(src)


def mutate(src: Src, a: Arr) -> bool:
    """Writes into a source in place (what a model does to its activations between forwards); whether it did."""
    o = a.obj
    if a.is_torch:
        if o.layout != torch.strided or o.is_meta or o.nbytes == 0 or o.requires_grad or o.is_conj() or o.is_neg():
            return False
        if 0 in o.stride():
            return False  # an expanded tensor cannot be written in place
        with torch.inference_mode() if o.is_inference() else torch.no_grad():
            if o.dtype == torch.bool:
                o.logical_not_()
            else:
                o.add_(1)
        return True
    if isinstance(o, np.ndarray):
        if o.flags.writeable and o.dtype.kind in "biufc" and o.size:
            flat = np.frombuffer(o.data, np.uint8) if o.flags.c_contiguous and o.ndim else None
            if flat is not None:
                i = src.int(0, flat.size - 1, "at")
                flat[i:i + src.pick([1, 16, 4096], "len")] ^= np.uint8(src.int(1, 255, "xor"))
            else:
                o[...] = 0
            return True
        return False
    if isinstance(o, (bytearray, memoryview)) and not (isinstance(o, memoryview) and o.readonly) and len(o):
        o[0] = (o[0] + 1) % 256
        return True
    return False


# ---------------------------------------------------------------------------------------------------------------
# The model of what ferry must deliver.

def fnv1a(b: bytes) -> int:
    h = 1469598103934665603
    for c in b:
        h = ((h ^ c) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


class Exp:
    """One expected entry: hook, bytes (None until its graph launch), state."""

    __slots__ = ("hook", "data", "state", "bounced", "src", "version", "dirty", "expect")

    def __init__(self, hook, data, state, bounced=False, src=None, expect="bytes"):
        self.hook, self.data, self.state, self.bounced = hook, data, state, bounced
        self.src = src  # the deferred source (torch: its version is checked before the flush)
        self.dirty = False  # a versioned source written in place while pending
        # "bytes": ok with exactly `data`; "fail": a refused row selection (ok False); "any": a row selection
        # whose outcome the docs leave open (an empty one, a window a >= b, a device count past max_count)
        self.expect = expect

    def __repr__(self):
        return f"<hook {self.hook}, {None if self.data is None else len(self.data)} bytes, {self.state}>"


class StreamM:
    def __init__(self, obj):
        self.obj = obj
        self.closed = False
        self.capturing = False
        self.rec = []  # what a capture on it recorded: ("d2h", chan, plan, recording), ("partial", chan), ...


class GraphM:
    def __init__(self, obj, rec):
        self.obj = obj
        self.rec = rec


class ChanM:
    def __init__(self, ch, kw, sink):
        self.ch = ch
        self.handle = ch.handle
        self.kw = kw
        self.sink = sink  # the test sink capsule, or None
        self.sink_seen = 0
        self.exp: list[Exp] = []
        self.p = 0  # the next expected entry
        self.pending: list[Exp] = []  # eager deferred batch (not flushed)
        self.fwd: StreamM | None = None
        self.capturing = False
        self.recording = []  # captured forward: [(hook, Arr)]
        self.planned = []  # [(plan, [Exp])] reserved by plan(), not launched yet
        self.plans = []  # plans of this channel (end_forward of captured forwards)
        self.tainted = ""
        self.last_seq = -1
        b = kw.get("tuning", {}).get("bounce_capture_max_bytes", 0)
        self.bounce = b if isinstance(b, int) and not isinstance(b, bool) else 0

    # -- state
    def taint(self, why: str) -> None:
        if not self.tainted:
            self.tainted = why

    @property
    def open(self) -> bool:
        return not self.ch.closed

    def sync(self, what: str) -> None:
        """Reads the channel's forward state and deferred count (the C ABI's channel_info, deferred_pending)."""
        if self.ch.closed:
            self.fwd = None
            self.capturing = False
            return
        if self.ch.invalidated:
            self.taint("invalidated")
        flags = forward_flags(self.handle)
        if flags is None:
            raise Finding(f"{what}: the C ABI's channel_info refused the handle of an open channel")
        if not flags & 1:
            self.fwd = None
            self.capturing = False
            self.recording = []
        elif self.fwd is None:
            self.taint("a forward open that the model did not see begin")
        if self.capturing:
            return
        n = self.ch.deferred_pending
        if n > len(self.pending):
            if not self.tainted:
                raise Finding(f"{what}: deferred_pending {n}, but only {len(self.pending)} deferred entries "
                              "were recorded since the last flush")
            n = len(self.pending)
        for e in self.pending[:len(self.pending) - n]:
            if e.dirty and not self.tainted:
                raise Finding(f"{what}: deferred hook {e.hook} was written in place before its flush, and the "
                              "flush took it (expected a LogicError naming the hook)")
            e.state = "certain"
        self.pending = self.pending[len(self.pending) - n:]

    # -- delivery
    def deliver(self, hook: int, seq: int, size: int, ok: bool, data: bytes | None, fnv: int | None = None):
        if seq <= self.last_seq:
            raise Finding(f"entry seq {seq} (hook {hook}) after seq {self.last_seq}: expected increasing seqs")
        if self.tainted:
            self.last_seq = seq
            return None
        if seq != self.last_seq + 1:
            raise Finding(f"entry seq {seq} (hook {hook}) after seq {self.last_seq}: a seq was skipped")
        self.last_seq = seq
        while self.p < len(self.exp):
            x = self.exp[self.p]
            if x.state == "dropped":
                self.p += 1
                continue
            self.p += 1
            if x.expect != "bytes":
                if x.hook != hook or (x.expect == "fail" and ok):
                    raise Finding(f"entry seq {seq}: expected hook {x.hook} (a row selection ferry must refuse: "
                                  f"ok False), got hook {hook}, ok {ok}, {size} bytes")
                if ok and x.data is not None and data is not None and data != x.data:
                    raise Finding(f"entry seq {seq} (hook {hook}): a row selection delivered {size} bytes "
                                  f"{data[:32].hex()}..., expected {len(x.data)} bytes {x.data[:32].hex()}...")
                return x
            if ok is False:
                raise Finding(f"entry seq {seq} (hook {hook}): ok=False for a static entry")
            if x.data is None:
                raise Finding(f"entry seq {seq} (hook {hook}): delivered for a planned replay never launched")
            same = x.hook == hook and size == len(x.data) and (
                (data is not None and data == x.data) or (data is None and fnv == fnv1a(x.data)))
            if same:
                return x
            raise Finding(f"entry seq {seq}: expected hook {x.hook} with {len(x.data)} bytes "
                          f"{x.data[:32].hex()}..., got hook {hook} with {size} bytes "
                          f"{(data or b'')[:32].hex()}... (first difference at "
                          f"{_first_diff(data, x.data) if data is not None else '?'})")
        raise Finding(f"entry seq {seq} (hook {hook}, {size} bytes): delivered, but nothing was captured for it")

    def undelivered(self) -> list[Exp]:
        return [x for x in self.exp[self.p:] if x.state == "certain"]


def _first_diff(a: bytes, b: bytes):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


class EntryM:
    def __init__(self, chan, entry, data):
        self.chan = chan
        self.entry = entry
        self.data = data  # the witness of its capture


class BufM:
    def __init__(self, handle, name, groups, dtype, cap, unit, row, dst):
        self.h = handle
        self.name = name
        self.groups = groups
        self.dtype = dtype
        self.cap = cap
        self.unit = unit
        self.row = row or 0
        self.unit_bytes = dtype.itemsize * (self.row if unit == "rows" else 1) if unit != "bytes" else 1
        self.nbytes = cap * self.unit_bytes
        self.dst = dst  # the bound destination (numpy), or None
        self.init = None  # the destination's bytes after initialize()
        self.high = 0  # the longest prefix published so far (bytes)
        self.unknown = False  # a publication the model cannot follow touched it: no more checks


class PubM:
    def __init__(self, obj):
        self.obj = obj
        self.bufs: list[BufM] = []
        self.initialized = False
        self.nslots = 0
        self.stream: StreamM | None = None
        self.active = None  # (slot index, epoch)
        self.epoch = 0
        self.slot_objs = []  # [(Slot, slot index, epoch)]
        self.prods = []  # [(Producer, group, (slot, epoch))]
        self.counts = {}  # buffer name -> count set in the active epoch
        self.published = set()  # buffer names published in the active epoch
        self.shadow = {}  # (slot, name) -> (bytearray, known mask)
        self.staged = {}  # group -> (slot, epoch, {name: count})
        self.views = []  # [(numpy view, BufM, slot)]

    def members(self, group):
        return [b for b in self.bufs if group in b.groups]

    def shadow_of(self, slot, b: BufM):
        k = (slot, b.name)
        if k not in self.shadow:
            self.shadow[k] = (bytearray(b.nbytes), bytearray(b.nbytes))
        return self.shadow[k]


# ---------------------------------------------------------------------------------------------------------------
# The test sink (tests/python/native_sink, built with the tests), if importable.

def _load_sink():
    where = os.environ.get("FERRY_TEST_SINK_DIR")
    if not where:
        where = str(pathlib.Path(ferry.__file__).resolve().parents[3] / "tests" / "python" / "native_sink")
    if not pathlib.Path(where).is_dir():
        return None
    sys.path.insert(0, where)
    try:
        return importlib.import_module("ferry_test_sink")
    except ImportError:
        return None
    finally:
        sys.path.remove(where)


SINK = _load_sink()


# ---------------------------------------------------------------------------------------------------------------
# One input.

HOOKS = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 100, 2**32 - 1, -1, 2**32, 2**70, "1", 1.0, True, None]
RING = [1 << 16, 1 << 12, 1 << 14, 1 << 18, 1 << 20, 4096 + 16, 16, 0, 15, 2**64, -1, 2**50, "1024", 1024.0]
TIMEOUTS = [0.05, 0.0, 0.01, 0.2, -1.0, float("nan"), float("inf"), 1e300, "1", None, True]
POLL_TIMEOUTS = [0.0, 0.001, 0.02, 0.1, 0.05]  # valid ones (odd ones: the odd-arguments branch of op_poll)
OMIT = object()
KNOBS = [
    ("staging_bytes", [OMIT, 0, 16, 1 << 10, 1 << 12, 1 << 16, 8, 2**50]),
    ("publish_every", [OMIT, 4, 1, 2, 16, 32, 64, 128, 4096, 0, 2**32, -3]),
    ("on_full", [OMIT, "block", "fail_fast", "drop", 1]),
    ("head_memory", [OMIT, "managed", "pinned_mapped", "nowhere"]),
    ("fifo_capacity", [OMIT, 1, 2, 4, 64, 8192, 0, 2**30 + 1]),
    ("size_slots", [OMIT, 0, 1, 16, 2**30 + 1]),
    ("max_copies_in_flight", [OMIT, 1, 2, 64, 0]),
    ("fused_copy_max_bytes", [OMIT, 0, 16, 4096, 2**64 - 1]),
    ("single_block_copy_max_bytes", [OMIT, 0, 16, 4096, 2**64 - 1]),
    ("copy_block_threads", [OMIT, 32, 128, 1024, 0, 1, 33, 2048, 2**32 - 1]),
    ("copy_vecs_per_thread", [OMIT, 1, 2, 4, 8, 3, 0]),
    ("lean_copy_kernel", [OMIT, True, False, 1]),
    ("programmatic_launch", [OMIT, True, False]),
    ("branch_publish", [OMIT, True, False]),
    ("gather_branch_publish", [OMIT, True, False]),
    ("bounce_capture_max_bytes", [OMIT, 0, 16, 256, 4096, 1 << 20]),
    ("drain_idle_sleep", [OMIT, 0.0, 1e-6, 1e-4, 0.001, -1.0, float("nan")]),
    ("gather_batch", [OMIT, 1, 2, 4, 128, 200, 0, 1.5]),
]
TUNING = set(ferry._ferry.channel_tuning_fields)  # the knobs that go in Channel(tuning={...})


class World:
    MAX_CH, MAX_ST, MAX_ARR, MAX_ENT, MAX_VIEWS, MAX_PUB, MAX_GRAPH = 3, 3, 8, 24, 24, 2, 4

    def __init__(self, src: Src):
        self.src = src
        self.chans: list[ChanM] = []
        self.dead_handles: list[int] = []
        self.streams: list[StreamM] = []
        self.arrays: list[Arr] = []
        self.entries: list[EntryM] = []
        self.views = []  # [(view, bytes)]
        self.graphs: list[GraphM] = []
        self.pubs: list[PubM] = []
        self.keep = []  # objects kept to the end of the input (lifetimes past their users)

    # -- choosing -------------------------------------------------------------------------------------
    def pick(self, seq, key):
        return self.src.pick(seq, key) if seq else None

    def chan(self, key="chan") -> ChanM | None:
        return self.pick(self.chans, key)

    def stream(self, key="stream") -> StreamM:
        if not self.streams:
            self.new_stream(0)
        return self.pick(self.streams, key)

    def stream_arg(self, key="sarg"):
        """(object, StreamM or None): mostly one of the world's streams, sometimes something else."""
        k = self.src.int(0, 15, key)
        if k < 12 or not self.streams:
            sm = self.stream(key + ".which")
            return sm.obj, sm
        return self.src.pick([None, 0, 12345, object(), _CudaStreamLike(), "stream"], key + ".junk"), None

    def array(self, key="arr") -> Arr:
        if not self.arrays or self.src.chance(4, key + ".new"):
            self.add_array(make_source(self.src))
        return self.pick(self.arrays, key + ".which")

    def add_array(self, a: Arr):
        if len(self.arrays) >= self.MAX_ARR:
            self.arrays.pop(self.src.int(0, len(self.arrays) - 1, "evict"))
        self.arrays.append(a)

    def new_stream(self, device=0):
        ok, s = attempt("ferry.Stream", ferry.Stream, device, backend=BACKEND)
        if ok:
            if len(self.streams) >= self.MAX_ST:
                self.keep.append(self.streams.pop(0))
            self.streams.append(StreamM(s))
        return ok, s

    # -- entries --------------------------------------------------------------------------------------
    def take(self, c: ChanM, got, what: str):
        for e in got:
            if not isinstance(e, ferry.Entry):
                raise Finding(f"{what}: expected ferry.Entry objects, got {type(e).__name__}")
            ok, data = attempt("Entry.tobytes", e.tobytes)
            if not e.ok:  # a refused row selection: no bytes
                if ok or not isinstance(data, ferry.Error):
                    raise Finding(f"{what}: tobytes() of a failed entry (ok False): expected ferry.Error, got "
                                  f"{'bytes' if ok else type(data).__name__}")
                c.deliver(e.hook, e.seq, e.size, False, None)
                e.release()
                continue
            if not ok:
                raise Finding(f"{what}: tobytes() of a fresh entry failed: {data}")
            if len(e) != e.size or len(data) != e.size:
                raise Finding(f"{what}: entry seq {e.seq}: size {e.size}, len {len(e)}, {len(data)} bytes")
            x = c.deliver(e.hook, e.seq, e.size, e.ok, data)
            self.entries.append(EntryM(c, e, data if x is None else x.data))
            if len(self.entries) > self.MAX_ENT:
                self.entries.pop(0).entry.release()

    def check_sink(self, c: ChanM, what: str):
        if c.sink is None:
            return
        got = SINK.entries(c.sink)
        for hook, seq, size, h in got[c.sink_seen:]:
            c.deliver(hook, seq, size, None, None, fnv=h)  # the test sink does not record ok
        c.sink_seen = len(got)

    def check_view(self, v, data, what):
        if v.tobytes() != data:
            raise Finding(f"{what}: a numpy view of an entry changed: expected {data[:32].hex()}..., got "
                          f"{v.tobytes()[:32].hex()}... ({len(data)} bytes)")

    # -- teardown (every input ends here: nothing outlives it) -----------------------------------------
    def teardown(self):
        for sm in self.streams:
            if sm.capturing and not sm.closed:
                attempt("teardown end_capture", sm.obj.end_capture)
                sm.capturing = False
        for c in self.chans:
            if not c.open:
                self.drain_closed(c, "teardown poll")
                continue
            if c.fwd is not None and c.fwd.obj is not None and not c.fwd.closed:
                c.sync("teardown before abort_forward")
                ok, r = attempt("teardown abort_forward", c.ch.abort_forward, c.fwd.obj)
                if ok and r and not c.capturing:
                    for e in c.pending:
                        e.state = "certain" if e.bounced else "dropped"
                    c.pending = []
                c.sync("teardown abort_forward")
        # entries and views stop the drain: keep a few to check past close and the channel's death
        survivors = self.views[-2:]
        for v, data in self.views:
            self.check_view(v, data, "teardown")
        self.views = []
        for em in self.entries:
            em.entry.release()
        self.entries = []
        for c in self.chans:
            if c.open:
                pend = list(c.pending)
                ok, rep = attempt("teardown close", c.ch.close, 2.0)
                for e in pend:  # close flushes an open forward's deferred batch
                    e.state = "certain"
                c.pending = []
                clean = ok and isinstance(rep, dict) and rep.get("clean") is True
                if not ok and isinstance(rep, ferry.ShutdownError):
                    if not isinstance(getattr(rep, "report", None), dict):
                        raise Finding("ShutdownError without a .report dict")
                if not c.ch.closed:
                    raise Finding("Channel.close() returned (or raised) and the channel is still open")
                self.drain_closed(c, "teardown poll")
                left = c.undelivered()
                if clean and not c.tainted and not survivors and left:
                    raise Finding(f"close() reported clean, but {len(left)} accepted entries were never "
                                  f"delivered: {left[:4]}")
        for pm in self.pubs:
            for p, _, _ in pm.prods:
                attempt("teardown Producer.close", p.close)
            for s, _, _ in pm.slot_objs:
                if s.active:
                    attempt("teardown Slot.finish", s.finish)
        self.chans.clear()
        self.pubs.clear()
        self.graphs.clear()
        self.arrays.clear()
        self.keep.clear()
        self.streams.clear()
        gc.collect()
        for v, data in survivors:  # their channels are gone: the views still hold the bytes
            self.check_view(v, data, "teardown (after the channel died)")
        del survivors

    def drain_closed(self, c: ChanM, what):
        if c.sink is not None:
            self.check_sink(c, what)
            return
        for _ in range(64):
            ok, got = attempt(what, c.ch.poll, 1024, 0.0)
            if not ok:
                if not isinstance(got, ferry.LogicError):
                    raise Finding(f"{what}: poll() of a closed channel: expected LogicError once it is empty, "
                                  f"got {type(got).__name__}: {got}")
                return
            if not got:
                raise Finding(f"{what}: poll() of a closed channel returned [] (expected entries or LogicError)")
            self.take(c, got, what)
            for em in self.entries:
                em.entry.release()
            self.entries = []


class _CudaStreamLike:
    def __cuda_stream__(self):
        return (0, 1234)


# ---------------------------------------------------------------------------------------------------------------
# D2H operations.

def _device(d):
    # the host backend emulates two devices; "host-device-1" steps around objects on device 1
    return 0 if d == 1 and "host-device-1" in AVOID else d


def op_channel_new(w: World):
    src = w.src
    kw = {"ring_bytes": src.pick(RING, "ring"), "timeout": src.pick(TIMEOUTS, "timeout")}
    if src.chance(3, "rowslots"):
        kw["size_slots"] = 16  # a size ring smaller than the derived one (row-selected entries are dynamic)
    if kw["timeout"] is not None and not isinstance(kw["timeout"], (str, bool)) and kw["timeout"] > 0.3:
        kw["timeout"] = float("nan") if src.chance(2, "nan") else 0.05  # never a long blocking wait
    for _ in range(src.int(0, 4, "nknobs")):
        name, values = src.pick(KNOBS, "knob")
        v = src.pick(values, name)
        if v is not OMIT:
            kw[name] = v
    if src.chance(16, "bogus"):
        kw["bogus_knob"] = 1
    tuning = {k: kw.pop(k) for k in list(kw) if k in TUNING}
    if tuning:
        kw["tuning"] = tuning
    sink = None
    k = src.int(0, 15, "sink")
    if k == 15:
        kw["sink"] = src.pick([1, "sink", ctypes.pythonapi.PyCapsule_New], "sinkjunk")
    elif k == 14 and SINK is not None:
        sink = kw["sink"] = SINK.make()
    elif k == 13 and SINK is not None:
        kw["sink"] = SINK.make_bad_version()
    device = _device(src.pick([0, 0, 0, 1, -1, 99, 2**40], "device"))
    backend = src.pick([BACKEND] * 6 + ["auto", "tpu", None, 3] + ([] if "cuda" in ferry.available_backends()
                                                                    else ["cuda"]), "backend")
    if backend == "auto" and ferry.default_backend() != BACKEND:
        backend = BACKEND
    ok, ch = attempt("ferry.Channel", ferry.Channel, device, backend=backend, **kw)
    if not ok:
        return
    if not isinstance(ch, ferry.Channel) or ch.backend != BACKEND or ch.closed:
        raise Finding(f"ferry.Channel({kw}) returned {ch!r}")
    if len(w.chans) >= w.MAX_CH:
        old = w.chans.pop(0)
        w.dead_handles.append(old.handle)
        w.keep.append(old)
    w.chans.append(ChanM(ch, kw, sink))


def op_begin_forward(w: World):
    c = w.chan()
    if c is None:
        return
    obj, sm = w.stream_arg()
    meta = {}  # a forward's attribution (tag, requests, meta bytes), in and out of range
    if w.src.chance(3, "fwd_meta"):
        meta["tag"] = w.src.pick([0, 7, 2**64 - 1, -1, 2**64, "t", None], "tag")
        meta["requests"] = w.src.pick([None, [1, 2], [(5, 0, 1)], [(5, 0)], "ab", [-1], [2**70]], "requests")
        meta["meta"] = w.src.pick([None, b"x", bytearray(3), memoryview(b"ab"), 5, "s"], "meta")
    ok, r = attempt("Channel.begin_forward", c.ch.begin_forward, obj, **meta)
    if sm is None and obj is not None:
        expect_type_error("Channel.begin_forward(junk stream)", ok, r)
    if ok:
        c.fwd = sm
        c.capturing = sm.capturing
        c.recording = []
        if c.capturing:
            sm.rec.append(("open", c))
        elif c.planned:
            c.taint("an eager forward began while a plan() waited for its launch")
        elif sm.capturing:
            c.taint("the model lost a stream's capture state")
    c.sync("begin_forward")


def _capture_outcome(w: World, c: ChanM, what, ok, r, a: Arr, hook, deferred, sm, data, nbytes, logical_ok=True):
    """Model update (and the acceptance oracle) after one capture call."""
    if ok:
        if a.verdict == REFUSE:
            raise Finding(f"{what}: accepted a source ferry must refuse ({a.how}: {type(a.obj).__name__})")
        if c.capturing:
            c.recording.append((hook, a))
        elif c.fwd is not None:
            bounced = (not deferred) and c.bounce > 0 and nbytes <= c.bounce
            e = Exp(hook, data, "pending", bounced=bounced, src=a if (deferred and a.versioned()) else None)
            c.exp.append(e)
            c.pending.append(e)
        else:
            c.taint(f"{what} succeeded outside a forward")
    c.sync(what)


def _trace_source(a: Arr, hook, more=""):
    if TRACE:
        o = a.obj
        print(f"    source {a.how}: {type(o).__name__} {getattr(o, 'dtype', '')} {tuple(getattr(o, 'shape', ()))} "
              f"{a.verdict}, hook {hook!r} {more}", flush=True)


def op_capture(w: World):
    c = w.chan()
    if c is None:
        return
    src = w.src
    a = w.array()
    deferred = src.chance(3, "deferred")
    hook = src.pick(HOOKS, "hook")
    obj, sm = w.stream_arg()
    what = "Channel.capture_deferred" if deferred else "Channel.capture"
    data = a.witness() if a.verdict != REFUSE else None
    nbytes = a.nbytes() if a.verdict != REFUSE else 0
    fn = c.ch.capture_deferred if deferred else c.ch.capture
    if deferred and src.chance(4, "many"):  # the Collector's hand-over of one item: capture_deferred's outcome
        what = "Channel.capture_deferred_many"
        try:
            ver = a.obj._version if src.chance(2, "ver") else -1  # the version now, or none
        except Exception:  # noqa: BLE001  (not a tensor, an inference tensor: no counter)
            ver = -1
        ver = ver if isinstance(ver, int) and not isinstance(ver, bool) else -1

        def fn(h, o, s, ver=ver):
            return c.ch.capture_deferred_many([(h, o, ver)], s)
    _trace_source(a, hook)
    ok, r = attempt(what, fn, hook, a.obj, obj, extra=(HarnessRaised,))
    hook_ok = isinstance(hook, int) and not isinstance(hook, bool) and 0 <= hook < 2**32
    if ok and not hook_ok:
        raise Finding(f"{what}: accepted hook {hook!r}")
    if not ok and isinstance(r, TypeError) and a.verdict == ACCEPT and hook_ok and sm is not None:
        raise Finding(f"{what}: TypeError for a valid source ({a.how}): {r}")
    _capture_outcome(w, c, what, ok, r, a, hook, deferred, sm, data, nbytes)


def op_torch_capture(w: World):
    """torch.ops.ferry.capture / capture_deferred, ferry.torch_ops wrappers, or a ferry.hooks closure."""
    if fto is None:
        return op_capture(w)
    c = w.chan()
    if c is None:
        return
    src = w.src
    a = w.array()
    if not a.is_torch:
        a = make_torch_source(src)
        w.add_array(a)
    t = a.obj
    deferred = src.chance(3, "deferred")
    via = src.int(0, 4, "via")
    hook = src.pick(HOOKS[:11] + [2**32 - 1, -1, 2**32, 2**63 - 1], "thook")
    handle = c.handle
    k = src.int(0, 15, "handle")
    if k == 15:
        handle = src.pick([0, 1 << 40, -1, 2**63 - 1], "junkhandle")
    elif k == 14 and w.dead_handles:
        handle = src.pick(w.dead_handles, "dead")
    token = fto.token() if not src.chance(6, "tok") else src.pick(
        [torch.zeros(3), torch.ones(1, dtype=torch.bool), torch.empty(0, device="meta")], "tokkind")
    _trace_source(a, hook, f"via {via}")
    meta = a.on_meta or token.is_meta
    data = a.witness() if a.verdict != REFUSE and not meta else None
    hook_ok = 0 <= hook < 2**32
    if via == 4 and fcapture is not None and c.fwd is not None:  # ferry.hooks' closures
        use_ops = src.pick([False, True, "auto"], "use_ops")
        ok, fn = attempt("ferry.hooks.capture_fn", fcapture.capture_fn, c.ch, c.fwd.obj, use_ops=use_ops,
                         deferred=deferred)
        if not ok:
            raise Finding(f"ferry.hooks.capture_fn: {fn}")
        # the closure detaches and densifies: a strided tensor is captured contiguous
        dense = t.layout == torch.strided and not t.is_meta and t.device.type == "cpu"
        verdict = (MAYBE if (t.is_conj() or t.is_neg() or type(t) is not torch.Tensor) else ACCEPT) \
            if dense and t.nbytes else REFUSE
        b = Arr(t.detach().contiguous() if dense else t, verdict, "hooks closure", torch_tensor=True,
                logical=a.logical)
        b.obj_keep = t
        data = b.witness() if verdict != REFUSE else None
        ok, r = attempt("ferry.hooks capture", fn, hook, t)
        if t.is_meta:  # the op's fake kernel takes it (nothing captured, nothing checked); Channel.capture refuses it
            if ok and use_ops is False:
                raise Finding("ferry.hooks capture (Channel.capture): accepted a meta tensor")
            c.sync("ferry.hooks capture")
            return
        if ok and not hook_ok:
            raise Finding(f"ferry.hooks capture: accepted hook {hook}")
        return _capture_outcome(w, c, "ferry.hooks capture", ok, r, b, hook, deferred, c.fwd, data,
                                b.nbytes() if data is not None else 0)
    if via == 3:
        what = "ferry.torch_ops.flush"
        ok, r = attempt(what, fto.flush, token, c.ch if src.chance(2, "obj") else handle)
        c.sync(what)
        return
    if via == 2:
        what = "ferry.torch_ops.capture" + ("_deferred" if deferred else "")
        fn = fto.capture_deferred if deferred else fto.capture
        ok, r = attempt(what, fn, token, t, c.ch if handle == c.handle else handle, hook)
    else:
        what = "torch.ops.ferry.capture" + ("_deferred" if deferred else "")
        fn = torch.ops.ferry.capture_deferred if deferred else torch.ops.ferry.capture
        ok, r = attempt(what, fn, token, t, handle, hook)
    if handle != c.handle:
        # a handle of a channel the world let go of may still be live (kept to the end of the input, unmodelled)
        if ok and not meta and forward_flags(handle) is None:
            raise Finding(f"{what}: accepted handle {handle} (not a live channel's)")
        for other in w.chans:
            if other.handle == handle:
                other.sync(what)
        return
    if meta:  # the fake kernel: nothing captured
        c.sync(what)
        return
    if ok and not hook_ok:
        raise Finding(f"{what}: accepted hook {hook}")
    if a.logical and t.layout == torch.strided:
        # torch's Conjugate / Negative fallbacks materialize the tensor before the op's kernel runs: the op sees
        # (and must deliver) the logical value
        # (a copy, frozen: a captured forward's graph reads that copy at each launch)
        a = Arr(t.detach().resolve_conj().resolve_neg().clone(), MAYBE, a.how + " (materialized by torch)",
                torch_tensor=True, logical=True)
        data = a.witness()
    if ok and a.verdict == REFUSE:
        raise Finding(f"{what}: accepted a source ferry must refuse ({a.how})")
    _capture_outcome(w, c, what, ok, r, a, hook, deferred, c.fwd, data, a.nbytes() if data is not None else 0)


def _rows_expect(sel, n, count):
    """(expect, rows) of a row selection: "bytes" with the selected row indices, "fail", or "any"."""
    form, a, b = sel[:3]
    if form == "rows":
        items = [int(r) for r in a]
    else:  # query_start_loc a, requests b (+ window)
        qsl, req, win = a, b, sel[3] if len(sel) > 3 else None
        n_req = len(qsl) - 1
        items = []
        for q in (int(x) for x in req):
            if not 0 <= q < n_req:
                items.append(None)
                continue
            lo, hi = int(qsl[q]), int(qsl[q + 1])
            if win is None:
                if hi <= lo:
                    return "any", None  # the last token of an empty request: not specified
                items.append([hi - 1])
            else:
                wa, wb = win
                if not 0 <= wa < wb:
                    return "any", None
                items.append(list(range(lo + wa, lo + wb)) if lo + wb <= hi else None)
    if count is not None:
        items = items[:count]
    if not items:
        return "any", None
    rows = []
    for it in items:
        if it is None:
            return "fail", None
        for r in (it if isinstance(it, list) else [it]):
            if not 0 <= r < n:
                return "fail", None
            rows.append(r)
    return "bytes", rows


def op_capture_rows(w: World):
    """Channel.capture_rows / torch.ops.ferry.capture_rows: rows of a private [N, ...] source (never written)."""
    c = w.chan()
    if c is None:
        return
    src = w.src
    n = src.pick([12, 1, 4, 64, 0, 3], "nrows")
    row = src.pick([(4,), (), (2, 3), (0,)], "rowshape")
    t = np_array(src, src.pick([np.float32, np.uint8, np.int64, np.float16], "rdtype"), (n,) + row)
    refuse = False
    if src.chance(8, "rstrided") and n > 1:
        t, refuse = t[::2], t[::2].size > 0 and not t[::2].flags.c_contiguous
    n_eff = t.shape[0] if t.ndim else 0
    idt = src.pick([np.int32, np.int64, np.int16], "idt")
    form = src.int(0, 2, "form")
    kw = {}
    if form == 0:
        rows = np.array([src.int(-2, max(n_eff, 1) + 1, "row") for _ in range(src.int(0, 5, "nsel"))], idt)
        kw["rows"] = rows
        sel = ("rows", rows, None)
    else:
        lens = [src.int(0, 5, "reqlen") for _ in range(src.int(1, 4, "nreq"))]
        qsl = np.concatenate([[0], np.cumsum(lens)]).astype(idt if src.chance(8, "qdt") else np.int32)
        req = np.array([src.int(-1, len(lens), "req") for _ in range(src.int(0, 4, "nsel"))], np.int32)
        kw["query_start_loc"], kw["requests"] = qsl, req
        sel = ("qsl", qsl, req)
        if form == 2:
            win = (src.int(-1, 4, "wa"), src.int(0, 5, "wb"))
            if src.chance(12, "winjunk"):
                win = src.pick([(1, "a"), (2**70, 0), (1,), [0, 1]], "winjunk2")
            kw["window"] = win
            sel = ("qsl", qsl, req, win if isinstance(win, tuple) and len(win) == 2 else None)
    items = len(sel[1]) if form == 0 else len(sel[2])
    count = None
    k = src.int(0, 5, "countkind")
    if k == 1:
        count = kw["count"] = src.int(0, items, "count")
    elif k == 2:
        kw["count"] = src.pick([-1, items + 1, 2**70], "badcount")
    elif k == 3:  # a device count
        dc = src.int(0, items + 1, "dcount")
        kw["count"] = np.array([dc], np.int32)
        mc = src.pick([None, items, 1, -1], "maxcount")
        if mc is not None:
            kw["max_count"] = mc
        count = dc if dc <= (items if mc is None else mc) else None
        if count is None or (mc is not None and mc < 0):
            count = "any"
    obj, sm = w.stream_arg()
    expect, rows = _rows_expect(sel, n_eff, None if count == "any" else count)
    if count == "any" or idt is np.int16 or sel[-1] is None and form == 2:
        expect = "any"
    data = b"".join(t[r].tobytes() for r in rows) if expect == "bytes" else None
    via_op = fto is not None and src.chance(4, "rows_op")
    if via_op:
        what = "torch.ops.ferry.capture_rows"
        if form == 0:
            args = (torch.from_numpy(t.copy()), torch.from_numpy(kw["rows"].copy()), None)
        else:
            args = (torch.from_numpy(t.copy()), torch.from_numpy(kw["requests"].copy()),
                    torch.from_numpy(kw["query_start_loc"].copy()))
        refuse = False  # the op gets contiguous copies (t.copy()): a strided numpy source is not what it sees
        cnt = kw.get("count")
        cnt = torch.from_numpy(cnt.copy()) if isinstance(cnt, np.ndarray) else None
        win = kw.get("window") if isinstance(kw.get("window"), tuple) and len(kw["window"]) == 2 else (0, 0)
        win = tuple(int(x) if isinstance(x, int) and -2**63 <= x < 2**63 else 0 for x in win)
        mc = kw.get("max_count") or 0
        ok, r = attempt(what, torch.ops.ferry.capture_rows, fto.token(), args[0], args[1], args[2], cnt, c.handle,
                        3, win[0], win[1], mc)
        hook = 3
        if isinstance(kw.get("count"), int):
            expect = "any"  # the op takes a device count only
    else:
        deferred = src.chance(3, "rows_deferred")  # one gather per batch sharing the selection
        what = "Channel.capture_rows_deferred" if deferred else "Channel.capture_rows"
        hook = src.pick(HOOKS[:11], "rhook")
        ok, r = attempt(what, c.ch.capture_rows_deferred if deferred else c.ch.capture_rows, hook, t, stream=obj, **kw)
        if sm is None and obj is not None and ok:
            raise Finding(f"{what}: accepted stream {obj!r}")
    if ok:
        if refuse:
            raise Finding(f"{what}: accepted a strided source")
        if c.capturing:
            c.taint("capture_rows in a captured forward (not modelled)")
        elif c.fwd is not None:
            e = Exp(hook, data, "pending", expect=expect)
            c.exp.append(e)
            c.pending.append(e)
    c.sync(what)


def op_flush(w: World):
    c = w.chan()
    if c is None:
        return
    obj, sm = w.stream_arg()
    ok, r = attempt("Channel.flush", c.ch.flush, obj)
    if sm is None and obj is not None:
        expect_type_error("Channel.flush(junk stream)", ok, r)
    c.sync("flush")


def op_end_forward(w: World):
    c = w.chan()
    if c is None:
        return
    obj, sm = w.stream_arg()
    was_capturing, rec, fwd = c.capturing, list(c.recording), c.fwd
    ok, plan = attempt("Channel.end_forward", c.ch.end_forward, obj)
    if sm is None and obj is not None:
        expect_type_error("Channel.end_forward(junk stream)", ok, plan)
    if ok:
        if not isinstance(plan, ferry.Plan):
            raise Finding(f"end_forward returned {type(plan).__name__}, expected ferry.Plan")
        if fwd is None:
            c.taint("end_forward succeeded without a forward the model saw")
        elif was_capturing:
            got = [(h, n) for h, n, _ in plan.entries]
            want = [(h, a.nbytes()) for h, a in rec]
            if got != want and not c.tainted:
                raise Finding(f"end_forward's plan {got} differs from the captured forward's captures {want}")
            c.plans.append(plan)
            for i, r in enumerate(fwd.rec):
                if r == ("open", c):
                    fwd.rec[i] = ("d2h", c, plan, rec)
        elif len(plan) != 0:
            raise Finding(f"end_forward of an eager forward returned a plan of {len(plan)} entries")
        c.fwd = None
        c.capturing = False
        c.recording = []
    c.sync("end_forward")
    if ok and c.pending and not c.tainted:
        raise Finding(f"end_forward returned with {len(c.pending)} deferred entries not flushed")


def op_abort_forward(w: World):
    c = w.chan()
    if c is None:
        return
    obj, sm = w.stream_arg()
    c.sync("before abort_forward")
    pend, fwd, capturing = list(c.pending), c.fwd, c.capturing
    ok, r = attempt("Channel.abort_forward", c.ch.abort_forward, obj)
    if sm is None and obj is not None:
        expect_type_error("Channel.abort_forward(junk stream)", ok, r)
    if ok:
        if r is not (fwd is not None) and not c.tainted:
            raise Finding(f"abort_forward returned {r} with {'an' if fwd else 'no'} open forward")
        if r and capturing and fwd is not None:
            fwd.rec = [("partial", c) if x == ("open", c) else x for x in fwd.rec]
        if r and not capturing:
            for e in pend:
                e.state = "certain" if e.bounced else "dropped"
            c.pending = []
        c.fwd = None
        c.capturing = False
        c.recording = []
    c.sync("abort_forward")


def op_poll(w: World):
    c = w.chan()
    if c is None:
        return
    src = w.src
    if c.sink is not None:
        ok, r = attempt("Channel.poll (sink)", c.ch.poll, 1, 0.0)
        if ok:
            raise Finding("poll() on a channel with a native sink returned")
        w.check_sink(c, "sink entries")
        return
    k = src.int(0, 7, "pollkind")
    if k == 7:  # bad arguments
        mx = src.pick([0, -1, 2**64, "1", 1.5, 1], "max")
        to = src.pick([0.0, 0.001, 0.02, 0.1, -1.0, "0", float("nan")], "to")
        ok, r = attempt("Channel.poll(odd arguments)", c.ch.poll, mx, to)
        if ok:
            if not (isinstance(mx, int) and not isinstance(mx, bool) and 1 <= mx < 2**64) or isinstance(to, str):
                raise Finding(f"poll({mx!r}, {to!r}) accepted")
            w.take(c, r, "poll")
        return
    mx = src.pick([16, 1, 2, 1024], "max")
    live = (k == 6 and not c.tainted and c.fwd is None and not c.planned and not w.entries and not w.views
            and c.undelivered() and c.open)
    to = 3.0 if live else src.pick(POLL_TIMEOUTS, "to")
    ok, got = attempt("Channel.poll", c.ch.poll, mx, to)
    if not ok:
        if c.open:
            raise Finding(f"poll() of an open channel raised {type(got).__name__}: {got}")
        if not isinstance(got, ferry.LogicError):
            raise Finding(f"poll() of a closed channel raised {type(got).__name__}: {got}")
        return
    if not isinstance(got, list) or len(got) > mx:
        raise Finding(f"poll({mx}) returned {type(got).__name__} of {len(got)}")
    if live and not got:
        raise Finding(f"poll(timeout=3) returned nothing with {len(c.undelivered())} entries published "
                      "and nothing holding staging")
    w.take(c, got, "poll")


def op_entry(w: World):
    if not w.entries:
        return op_poll(w)
    src = w.src
    i = src.int(0, len(w.entries) - 1, "entry")
    em = w.entries[i]
    e = em.entry
    k = src.int(0, 7, "entryop")
    if k == 0 or k == 1:  # a view (kept, or not)
        ok, v = attempt("Entry.numpy", e.numpy)
        if e.released:
            expect_error("Entry.numpy() after release()", ok, "released")
            if not isinstance(v, ferry.LogicError):
                raise Finding(f"Entry.numpy() after release: expected LogicError, got {type(v).__name__}")
            return
        if not ok:
            raise Finding(f"Entry.numpy() of a live entry: {v}")
        if v.dtype != np.uint8 or v.ndim != 1 or v.flags.writeable:
            raise Finding(f"Entry.numpy(): expected a read-only 1-d uint8 view, got {v.dtype} {v.shape} "
                          f"writeable={v.flags.writeable}")
        w.check_view(v, em.data, "Entry.numpy()")
        if v.size and src.chance(4, "write"):
            ok2, r2 = attempt("write into an entry's view", v.__setitem__, 0, 1)
            expect_error("writing into Entry.numpy()", ok2, "a read-only view")
        if k == 0:
            w.views.append((v, em.data))
            if len(w.views) > w.MAX_VIEWS:
                w.views.pop(0)
        return
    if k == 2:
        ok, b = attempt("Entry.tobytes", e.tobytes)
        if e.released:
            expect_error("Entry.tobytes() after release()", ok, "released")
        elif not ok or b != em.data:
            raise Finding(f"Entry.tobytes() of a live entry: {b if not ok else 'different bytes'}")
        return
    if k == 3 or k == 4:  # release (twice with k == 4)
        for _ in range(k - 2):
            ok, r = attempt("Entry.release", e.release)
            if not ok:
                raise Finding(f"Entry.release(): {r}")
        if not e.released or e.views != 0:
            raise Finding(f"Entry after release(): released={e.released}, views={e.views}")
        return
    if k == 5:  # as a context manager
        with e:
            if not e.released:
                w.check_view(e.numpy(), em.data, "with entry")
        if not e.released:
            raise Finding("an entry still held after its with block")
        return
    if k == 6:  # drop it (the Entry object dies; views keep the staging)
        w.entries.pop(i)
        return
    repr(e)
    if e.reserved < e.size:
        raise Finding(f"Entry seq {e.seq}: reserved {e.reserved} < size {e.size}")


def op_views(w: World):
    for v, data in w.views:
        w.check_view(v, data, "a kept view")
    if w.views and w.src.chance(2, "dropview"):
        w.views.pop(w.src.int(0, len(w.views) - 1, "view"))


def op_close(w: World):
    c = w.chan()
    if c is None:
        return
    to = w.src.pick([0.5, 0.1, 0.0, None, -1.0, float("nan"), 1e300, "1"], "closeto")
    if to is None and (c.fwd is not None or w.entries or w.views):
        to = 0.5  # close() without a timeout waits for the drain: never with staging held
    was_open = c.open
    pend = list(c.pending)
    ok, rep = attempt("Channel.close", c.ch.close, to)
    if not was_open:
        expect_error("close() of a closed channel", ok, "closed")
        return
    if ok or isinstance(rep, (ferry.ShutdownError, ferry.InvalidatedError, ferry.TimeoutError)):
        if not c.ch.closed:
            raise Finding(f"close() -> {rep!r}, and the channel is still open")
    if c.ch.closed:
        for e in pend:
            e.state = "certain"
        c.pending = []
        c.fwd = None
        if not ok:
            c.taint(f"close raised {type(rep).__name__}")
        elif not rep.get("clean"):
            c.taint("close was not clean")
    else:
        c.sync("close")


def op_channel_drop(w: World):
    c = w.chan()
    if c is None:
        return
    w.chans.remove(c)
    w.dead_handles.append(c.handle)
    if w.src.chance(2, "keepdropped"):
        w.keep.append(c)  # a model ref only: the Channel object dies with the input
        return
    if c.open and (c.fwd is not None or w.entries or w.views):
        pend = list(c.pending)
        attempt("Channel.close before drop", c.ch.close, 0.5)  # the destructor's close has no timeout
        for e in pend:
            e.state = "certain"
    c.ch = None
    gc.collect()


def op_channel_misc(w: World):
    c = w.chan()
    if c is None:
        return
    k = w.src.int(0, 4, "misc")
    if k == 0:
        ok, st = attempt("Channel.stats", c.ch.stats)
        if not ok or not isinstance(st, dict) or set(st) != set(_ferry.channel_counters):
            raise Finding(f"Channel.stats(): {st!r}")
        if any(not isinstance(v, int) or v < 0 for v in st.values()):
            raise Finding(f"Channel.stats(): {st!r}")
    elif k == 1:
        for name in ("closed", "handle", "has_sink", "device", "invalidated", "programmatic_launch",
                     "deferred_pending", "backend"):
            getattr(c.ch, name)
        if c.ch.handle != c.handle:
            raise Finding("Channel.handle changed")
    elif k == 2:  # the with statement
        if c.fwd is None and not w.entries and not w.views:
            pend = list(c.pending)
            with c.ch:
                pass
            for e in pend:
                e.state = "certain"
            c.pending = []
            if not c.ch.closed:
                raise Finding("a channel still open after its with block")
    elif k == 3:
        c.sync("misc")
    else:
        f = forward_flags(c.handle)
        if (f is None) != c.ch.closed and not c.ch.closed:
            raise Finding(f"channel_info of a live handle: {f}")


# ---------------------------------------------------------------------------------------------------------------
# Streams and graphs.

def op_stream(w: World):
    src = w.src
    k = src.int(0, 5, "streamop")
    if k == 0:
        dev = _device(src.pick([0, 0, 0, 1, -1, 99, 2**40, "0"], "sdev"))
        ok, s = w.new_stream(dev)
        if ok and dev not in (0,) and not isinstance(dev, int):
            raise Finding(f"ferry.Stream({dev!r}) accepted")
        return
    sm = w.stream()
    if k == 1:
        ok, r = attempt("Stream.synchronize", sm.obj.synchronize)
        if not ok and not sm.closed and not sm.capturing:
            raise Finding(f"Stream.synchronize(): {r}")
    elif k == 2:  # close (channels or publishers may still use it)
        ok, r = attempt("Stream.close", sm.obj.close)
        if ok:
            sm.closed = True
            sm.capturing = False
            for c in w.chans:
                if c.fwd is sm:
                    c.taint("its forward's stream was closed")
            for pm in w.pubs:
                if pm.stream is sm:
                    pm.stream = None
    elif k == 3:  # drop the Stream object (the world's reference)
        w.streams.remove(sm)
        for c in w.chans:
            if c.fwd is sm:
                c.taint("its forward's stream was dropped")
        sm.obj = None
        gc.collect()
    elif k == 4:
        ok, r = attempt("Stream.begin_capture", sm.obj.begin_capture)
        if ok:
            sm.capturing = True
            sm.rec = []
            for c in w.chans:
                if c.fwd is sm and not c.capturing:
                    c.taint("its eager forward's stream began a capture")
    else:
        ok, g = attempt("Stream.end_capture", sm.obj.end_capture)
        if ok:
            if not sm.capturing:
                raise Finding("Stream.end_capture() without begin_capture returned a graph")
            if len(w.graphs) >= w.MAX_GRAPH:
                w.graphs.pop(0)
            w.graphs.append(GraphM(g, list(sm.rec)))
        if ok or sm.capturing:
            sm.capturing = False
            sm.rec = []
        for c in w.chans:
            c.sync("end_capture") if c.open else None


def op_plan(w: World):
    c = w.chan()
    if c is None:
        return
    plans = c.plans + [p for o in w.chans if o is not c for p in o.plans[:1]]
    if not plans:
        return
    p = w.pick(plans, "plan")
    ok, r = attempt("Channel.plan", c.ch.plan, p)
    if ok:
        if p not in c.plans:
            c.taint("plan() of another channel's plan")
        exps = [Exp(h, None, "planned") for h, _, _ in p.entries]
        c.exp += exps
        c.planned.append((p, exps))
    c.sync("plan")


def op_launch(w: World):
    g = w.pick(w.graphs, "graph")
    if g is None:
        return
    obj, sm = w.stream_arg()
    src = w.src
    if src.chance(4, "autoplan"):  # the documented pattern: plan() every channel, then launch
        for r in g.rec:
            if r[0] == "d2h" and r[1].ch is not None and r[1].open:
                ok, _ = attempt("Channel.plan", r[1].ch.plan, r[2])
                if ok:
                    exps = [Exp(h, None, "planned") for h, _, _ in r[2].entries]
                    r[1].exp += exps
                    r[1].planned.append((r[2], exps))
    # a graph whose channel closed (or was destroyed) is refused: its kernels would write the freed channel state
    dead = [r[1] for r in g.rec if r[0] in ("d2h", "open", "partial") and (r[1].ch is None or not r[1].open)]
    ok, res = attempt("Graph.launch", g.obj.launch, obj)
    if sm is None and obj is not None:
        expect_type_error("Graph.launch(junk stream)", ok, res)
    if dead and ok:
        raise Finding(f"Graph.launch of a graph captured through a channel since closed or destroyed (handle "
                      f"{dead[0].handle}) was enqueued: it writes the freed channel state")
    if not ok:
        return
    attempt("Stream.synchronize after launch", sm.obj.synchronize)
    for r in g.rec:
        if r[0] == "d2h":
            c, p, rec = r[1], r[2], r[3]
            if c.ch is None or not c.open:
                continue
            if sm.capturing:
                c.taint("a graph launched into a capture")
            elif c.planned and c.planned[0][0] is p:
                _, exps = c.planned.pop(0)
                for x, (h, a) in zip(exps, rec):
                    x.data = a.witness()
                    x.state = "certain"
            else:
                c.taint("a graph launched without plan()")
        elif r[0] in ("partial", "open"):
            r[1].taint("a graph with a forward that never ended launched")
        elif r[0] == "h2d":
            _launched_upload(w, r[1], r[2], r[3], sm)
        elif r[0] == "h2d?":
            for b in r[1].members(r[2]):
                b.unknown = True
    for c in w.chans:
        if c.open:
            c.sync("launch")


def op_graph_drop(w: World):
    if w.graphs:
        w.graphs.pop(w.src.int(0, len(w.graphs) - 1, "graph"))
        gc.collect()


# ---------------------------------------------------------------------------------------------------------------
# Arrays.

def op_array(w: World):
    k = w.src.int(0, 3, "arrop")
    if k <= 1:
        w.add_array(make_source(w.src))
        return
    if not w.arrays:
        return
    a = w.pick(w.arrays, "which")
    if k == 2:
        if mutate(w.src, a) and a.is_torch:
            for c in w.chans:
                for e in c.pending:
                    if e.src is a:
                        e.dirty = True
    else:
        w.arrays.remove(a)
        gc.collect()


def op_gc(w: World):
    gc.collect()


# ---------------------------------------------------------------------------------------------------------------
# H2D.

H2D_DTYPES = ["int32", "uint8", "int64", "float32", "float16", "bool", "int8", "uint64", "float64", ">i4",
              "complex64", "object", "M8[s]", "not-a-dtype", "U2", None]
NAMES = ["a", "b", "c", "ids", "", "a"]
GROUPS = [["g0"], "g1", ["g0", "g1"], ["g2"], [], [""], "g0", [1], b"g0"]


def op_pub_new(w: World):
    ok, p = attempt("ferry.Publisher", ferry.Publisher, _device(w.src.pick([0, 0, 1, -1, 99], "pdev")),
                    backend=BACKEND)
    if ok:
        if len(w.pubs) >= w.MAX_PUB:
            w.keep.append(w.pubs.pop(0))
        w.pubs.append(PubM(p))


def _pub(w: World):
    if not w.pubs:
        op_pub_new(w)
    return w.pick(w.pubs, "pub")


def op_pub_declare(w: World):
    pm = _pub(w)
    if pm is None:
        return
    src = w.src
    name = src.pick(NAMES, "name") + ("" if src.chance(2, "suffix") else str(len(pm.bufs)))
    groups = src.pick(GROUPS, "groups")
    dtype = src.pick(H2D_DTYPES, "pdtype")
    cap = src.pick([64, 1, 8, 16, 256, 0, 2**62, 2**64 - 1, -1, 3], "cap")
    unit = src.pick(["elements", "rows", "bytes", "pages"], "unit")
    row = src.pick([None, 8, 1, 3, 0], "row") if unit == "rows" else src.pick([None, None, 4], "row")
    dst = None
    try:
        npdt = np.dtype(dtype) if dtype != "not-a-dtype" else None
    except TypeError:
        npdt = None
    if src.chance(3, "bind") and npdt is not None and npdt.kind in "biuf" and isinstance(cap, int) and 0 < cap <= 4096:
        ub = (row or 1) if unit == "rows" else 1
        n = cap * ub if unit != "bytes" else max(1, cap // npdt.itemsize)
        n += src.pick([0, 0, 5, -1], "dstextra")
        dst_dt = npdt if not src.chance(6, "dstdt") else np.dtype(np.int16)
        base = np.zeros(max(n, 0) * (2 if src.chance(6, "strided") else 1), dst_dt)
        base.view(np.uint8)[:] = 0xA5  # a sentinel the tail keeps
        dst = base[::2] if base.size > max(n, 0) else base
    kw = {"unit": unit, "row": row, "dst": dst}
    if src.chance(8, "posargs"):
        ok, h = attempt("Publisher.declare", pm.obj.declare, name, groups, dtype, cap, **kw)
    else:
        ok, h = attempt("Publisher.declare", pm.obj.declare, name, groups, dtype=dtype, capacity=cap, **kw)
    if not ok:
        return
    if pm.initialized:
        raise Finding("Publisher.declare() after initialize() succeeded")
    if npdt is None or npdt.kind not in "biuf" or cap <= 0:
        raise Finding(f"Publisher.declare({name!r}, dtype={dtype!r}, capacity={cap}) accepted")
    gl = [groups] if isinstance(groups, str) else list(groups)
    b = BufM(h, name, gl, npdt, cap, unit, row, dst)
    if h.capacity != cap or h.unit != unit or h.nbytes != b.nbytes or h.name != name:
        raise Finding(f"Buffer {h!r}: expected capacity {cap}, unit {unit}, {b.nbytes} bytes")
    pm.bufs.append(b)


def op_pub_initialize(w: World):
    pm = _pub(w)
    if pm is None:
        return
    src = w.src
    obj, sm = w.stream_arg()
    slots = src.pick([2, 1, 3, 0, -1, 2**64], "slots")
    upload = src.pick([None, "packed", "direct", "zerocopy", "batch", "auto", "teleport"], "upload")
    ok, r = attempt("Publisher.initialize", pm.obj.initialize, slots, obj, upload)
    if not ok:
        return
    if pm.initialized:
        raise Finding("Publisher.initialize() twice succeeded")
    pm.initialized, pm.nslots, pm.stream = True, slots, sm
    for b in pm.bufs:
        b.init = _dev_bytes(pm, b)


def _dev_bytes(pm: PubM, b: BufM) -> bytes:
    if b.dst is not None:
        return b.dst.tobytes()[: b.nbytes]
    ok, v = attempt("Publisher.device_array", pm.obj.device_array, b.h)
    if not ok:
        raise Finding(f"device_array({b.name}) after initialize: {v}")
    if v.ctypes.data != pm.obj.device_pointer(b.h):
        raise Finding("device_array() and device_pointer() disagree")
    return np.ascontiguousarray(v).reshape(-1).view(np.uint8).tobytes()[: b.nbytes]


def op_pub_begin(w: World):
    pm = _pub(w)
    if pm is None:
        return
    slot = w.src.pick([0, 1, 2, 3, -1], "slot")
    ok, s = attempt("Publisher.begin", pm.obj.begin, slot)
    if not ok:
        return
    if not pm.initialized or not (0 <= slot < pm.nslots) or pm.active is not None:
        raise Finding(f"Publisher.begin({slot}) accepted (initialized={pm.initialized}, slots={pm.nslots}, "
                      f"active={pm.active})")
    pm.epoch += 1
    pm.active = (slot, pm.epoch)
    pm.counts, pm.published = {}, set()
    pm.slot_objs.append((s, slot, pm.epoch))


def _end_slot(pm: PubM, key):
    if pm.active == key:
        pm.active = None  # its producers are stale now (the model checks their scope against pm.active)


def op_pub_slot_end(w: World):
    pm = _pub(w)
    if pm is None or not pm.slot_objs:
        return
    i = w.src.int(0, len(pm.slot_objs) - 1, "slotobj")
    s, slot, epoch = pm.slot_objs[i]
    k = w.src.int(0, 2, "slotend")
    if k == 0:
        ok, r = attempt("Slot.finish", s.finish)
        if ok:
            _end_slot(pm, (slot, epoch))
    elif k == 1:
        with s:
            pass
        _end_slot(pm, (slot, epoch))
    else:  # drop the Slot object: its guard finishes
        pm.slot_objs.pop(i)
        was_active = s.active
        del s
        gc.collect()
        if was_active:
            _end_slot(pm, (slot, epoch))
        return
    if not s.active:
        pm.slot_objs.pop(i)


def op_pub_producer(w: World):
    pm = _pub(w)
    if pm is None:
        return
    k = w.src.int(0, 3, "prodop")
    if k == 0 or not pm.prods:
        group = w.src.pick(["g0", "g1", "g2", "nope"], "pgroup")
        ok, p = attempt("Publisher.producer", pm.obj.producer, group)
        if ok:
            if pm.active is None:
                raise Finding("Publisher.producer() without an active slot succeeded")
            pm.prods.append((p, group, pm.active))
        return
    i = w.src.int(0, len(pm.prods) - 1, "prod")
    p = pm.prods[i][0]
    if k == 1:
        attempt("Producer.close", p.close)
    elif k == 2:
        with p:
            pass
    pm.prods.pop(i)
    del p
    gc.collect()


def _h2d_array(src: Src, b: BufM):
    n = src.pick([b.cap, 1, 0, max(1, b.cap // 2), b.cap + 1, 3], "wn")
    if b.unit == "bytes":
        n = max(0, n // b.dtype.itemsize)
    dt = b.dtype if not src.chance(6, "wdt") else np.dtype(src.pick([np.float32, np.int64, np.uint8], "wdt2"))
    shape = (n, b.row) if b.unit == "rows" and not src.chance(8, "wshape") else (n,)
    n_el = int(np.prod(shape))
    if n_el * dt.itemsize > MAX_BYTES:
        shape = (0,) + shape[1:]
    a = np_array(src, dt, shape)
    if src.chance(8, "wstrided") and a.ndim and a.shape[0] > 1:
        a = np.concatenate([a, a])[::2]
    return a if not src.chance(12, "wjunk") else src.pick(["1234", [1, 2], FakeCudaArray(4)], "wjunk2")


def op_pub_fill(w: World):
    pm = _pub(w)
    if pm is None or not pm.bufs:
        return
    src = w.src
    b = w.pick(pm.bufs, "buf")
    other = [x for o in w.pubs if o is not pm for x in o.bufs]
    foreign = src.chance(12, "foreign") and other
    h = w.pick(other, "fbuf").h if foreign else b.h
    k = src.int(0, 3, "pfill")
    prod = pm.prods[src.int(0, len(pm.prods) - 1, "prod")] if pm.prods else None
    if k == 3:  # Publisher.set_count
        n = src.pick([b.cap, 0, 1, max(0, b.cap // 2), b.cap + 1, -1], "count")
        ok, r = attempt("Publisher.set_count", pm.obj.set_count, h, n)
        if ok:
            if foreign:
                raise Finding("Publisher.set_count() accepted a buffer declared by another publisher")
            if not isinstance(n, int) or n > b.cap or pm.active is None:
                raise Finding(f"Publisher.set_count({b.name}, {n}) accepted (capacity {b.cap}, active {pm.active})")
            pm.counts[b.name] = n
        return
    if prod is None:
        return
    p, group, key = prod
    live = pm.active == key and group in b.groups
    if k == 0:  # the zero-copy source view
        ok, v = attempt("Producer.source", p.source, h)
        if not ok:
            return
        if foreign:
            raise Finding("Producer.source() accepted a buffer of another publisher")
        want = (b.cap, b.row) if b.unit == "rows" else ((b.cap // b.dtype.itemsize,) if b.unit == "bytes" else (b.cap,))
        if v.shape != want or v.dtype != b.dtype or not v.flags.writeable:
            raise Finding(f"Producer.source({b.name}): {v.dtype} {v.shape}, expected {b.dtype} {want} writable")
        flat = v.reshape(-1).view(np.uint8)
        if flat.size:
            lo = src.int(0, flat.size - 1, "lo")
            hi = min(flat.size, lo + src.pick([flat.size, 1, 4, 64], "len"))
            data = fill_bytes(src, hi - lo)
            flat[lo:hi] = np.frombuffer(data, np.uint8)
            buf, mask = pm.shadow_of(key[0], b)
            buf[lo:hi] = data
            mask[lo:hi] = b"\x01" * (hi - lo)
        pm.views.append((v, b, key[0]))
        if len(pm.views) > 8:
            pm.views.pop(0)
        return
    if k == 1:
        a = _h2d_array(src, b)
        ok, r = attempt("Producer.write", p.write, h, a)
        if not ok:
            return
        if foreign:
            raise Finding("Producer.write() accepted a buffer of another publisher")
        if not isinstance(a, np.ndarray) or a.dtype != b.dtype or not a.flags.c_contiguous or a.nbytes > b.nbytes:
            raise Finding(f"Producer.write({b.name}: {b.dtype} x {b.cap} {b.unit}) accepted "
                          f"{type(a).__name__} {getattr(a, 'dtype', '')} {getattr(a, 'shape', '')}")
        buf, mask = pm.shadow_of(key[0], b)
        raw = a.tobytes()
        buf[: len(raw)] = raw
        mask[: len(raw)] = b"\x01" * len(raw)
        pm.counts[b.name] = a.shape[0] if b.unit == "rows" else (a.nbytes if b.unit == "bytes" else a.size)
        if not live:
            raise Finding(f"Producer.write() on a closed or stale producer scope ({group}, {key}) succeeded")
        return
    n = src.pick([b.cap, 0, 1, max(0, b.cap // 2), b.cap + 1], "count")
    ok, r = attempt("Producer.set_count", p.set_count, h, n)
    if ok:
        if foreign:
            raise Finding("Producer.set_count() accepted a buffer declared by another publisher")
        if n > b.cap:
            raise Finding(f"Producer.set_count({b.name}, {n}) accepted (capacity {b.cap})")
        pm.counts[b.name] = n


def _check_published(pm: PubM, b: BufM, slot: int, count: int, what: str):
    if b.unknown or b.init is None:
        return
    n = count * b.unit_bytes
    dev = _dev_bytes(pm, b)
    buf, mask = pm.shadow_of(slot, b)
    for i in range(n):
        if mask[i] and dev[i] != buf[i]:
            raise Finding(f"{what}: buffer {b.name!r} byte {i} of the published prefix ({n} bytes): expected "
                          f"{buf[i]:#04x}, got {dev[i]:#04x}")
    b.high = max(b.high, n)
    if dev[b.high:] != b.init[b.high:]:
        i = b.high + _first_diff(dev[b.high:], b.init[b.high:])
        raise Finding(f"{what}: buffer {b.name!r}: byte {i} past the longest published prefix ({b.high} bytes) "
                      "was written")


def op_pub_publish(w: World):
    pm = _pub(w)
    if pm is None:
        return
    src = w.src
    group = src.pick(["g0", "g1", "g2", "nope"], "pubgroup")
    obj, sm = w.stream_arg()
    if src.chance(2, "stage"):
        ok, r = attempt("Publisher.stage", pm.obj.stage, group)
        if ok:
            if pm.active is None:
                raise Finding("Publisher.stage() without an active slot succeeded")
            pm.staged[group] = (pm.active[0], pm.active[1], {b.name: pm.counts.get(b.name) for b in pm.members(group)})
            pm.published |= {b.name for b in pm.members(group)}
        return
    ok, r = attempt("Publisher.publish", pm.obj.publish, group, obj)
    if sm is None and obj is not None:
        expect_type_error("Publisher.publish(junk stream)", ok, r)
    if not ok:
        return
    if pm.active is None or sm is not pm.stream or sm.capturing:
        raise Finding(f"Publisher.publish({group}) accepted (active {pm.active}, owner stream: {sm is pm.stream})")
    attempt("Stream.synchronize after publish", sm.obj.synchronize)
    for b in pm.members(group):
        if b.name not in pm.counts:
            raise Finding(f"publish({group}) accepted without a count for {b.name!r}")
        _check_published(pm, b, pm.active[0], pm.counts[b.name], f"publish({group})")
        pm.published.add(b.name)


def op_pub_capture_upload(w: World):
    pm = _pub(w)
    if pm is None:
        return
    src = w.src
    group = src.pick(["g0", "g1", "g2"], "cugroup")
    slot = src.pick([0, 1, 2, -1], "cuslot")
    obj, sm = w.stream_arg()
    ok, r = attempt("Publisher.capture_upload", pm.obj.capture_upload, group, slot, obj)
    if not ok:
        return
    if sm is not None and sm.capturing:
        sm.rec.append(("h2d", pm, group, slot))
    else:  # enqueued eagerly: the model does not follow it
        for b in pm.members(group):
            b.unknown = True


def _launched_upload(w: World, pm: PubM, group, slot, sm: StreamM):
    st = pm.staged.get(group)
    if st is None or pm.active is None or st[:2] != (slot, pm.active[1]) or pm.active[0] != slot or sm.capturing:
        for b in pm.members(group):
            b.unknown = True
        return
    for b in pm.members(group):
        c = st[2].get(b.name)
        if c is None:
            b.unknown = True
            continue
        _check_published(pm, b, slot, c, f"graph launch of the upload of {group} (slot {slot})")


def op_pub_misc(w: World):
    pm = _pub(w)
    if pm is None:
        return
    k = w.src.int(0, 4, "pmisc")
    if k == 0 and pm.bufs:
        b = w.pick(pm.bufs, "buf")
        other = [x for o in w.pubs if o is not pm for x in o.bufs]
        if other and w.src.chance(3, "foreign"):
            ok, v = attempt("Publisher.device_pointer(a buffer of another publisher)", pm.obj.device_pointer,
                            w.pick(other, "fbuf").h)
            if ok:
                raise Finding("Publisher.device_pointer() accepted a buffer declared by another publisher "
                              "(device_array() refuses it)")
            return
        okp, ptr = attempt("Publisher.device_pointer", pm.obj.device_pointer, b.h)
        ok, v = attempt("Publisher.device_array", pm.obj.device_array, b.h)
        if ok:
            if not okp or v.ctypes.data != ptr:
                raise Finding(f"Publisher.device_array({b.name!r}) {'before initialize ' if not pm.initialized else ''}"
                              f"is not a view of device_pointer() ({v.ctypes.data:#x} vs "
                              f"{ptr if not okp else hex(ptr)})")
            if pm.initialized:
                np.asarray(v).tobytes()  # readable
    elif k == 1:
        attempt("Publisher.info", pm.obj.info, w.src.pick(["g0", "g1", "g2", "nope"], "ig"))
    elif k == 2:
        ok, r = attempt("Publisher.recover", pm.obj.recover)
    elif k == 3:
        _ = pm.obj.invalidated, pm.obj.invalidation_reason, pm.obj.device, pm.obj.backend
        for b in pm.bufs:
            repr(b.h)
            _ = b.h.shape, b.h.dtype, b.h.nbytes
    else:  # drop the publisher (slots and producers keep it alive)
        w.pubs.remove(pm)
        gc.collect()


# ---------------------------------------------------------------------------------------------------------------

OPS = [
    op_channel_new, op_channel_new,
    op_begin_forward, op_begin_forward, op_begin_forward,
    op_capture, op_capture, op_capture, op_capture, op_capture,
    op_torch_capture, op_torch_capture,
    op_capture_rows,
    op_flush,
    op_end_forward, op_end_forward, op_end_forward,
    op_abort_forward,
    op_poll, op_poll, op_poll, op_poll,
    op_entry, op_entry, op_entry,
    op_views,
    op_close,
    op_channel_drop,
    op_channel_misc,
    op_stream, op_stream, op_stream,
    op_plan, op_launch, op_launch, op_graph_drop,
    op_array, op_array,
    op_gc,
    op_pub_new, op_pub_declare, op_pub_declare, op_pub_declare, op_pub_initialize, op_pub_begin, op_pub_begin,
    op_pub_slot_end, op_pub_producer, op_pub_producer, op_pub_fill, op_pub_fill, op_pub_fill, op_pub_fill,
    op_pub_publish, op_pub_publish, op_pub_capture_upload, op_pub_misc,
]


def run_input(src: Src) -> None:
    w = World(src)
    try:
        for _ in range(MAX_OPS):
            if src.remaining() <= 0:
                break
            op = src.pick(OPS, "op")
            if TRACE:
                print(f"  {op.__name__}", flush=True)
            op(w)
    except BaseException:
        try:
            w.teardown()
        except BaseException:  # noqa: BLE001 - the first failure is the finding
            pass
        raise
    w.teardown()


def TestOneInput(data: bytes) -> None:  # noqa: N802 - atheris' name
    faulthandler.dump_traceback_later(HANG_S, exit=True)
    try:
        run_input(Src(data))
    finally:
        faulthandler.cancel_dump_traceback_later()


def main(argv):
    faulthandler.enable()
    print(f"fuzz_ferry: ferry {getattr(ferry, '__file__', '?')}; {TORCH_NOTE}; native sink "
          f"{'loaded' if SINK is not None else 'not built'}; {MAX_OPS} ops per input", flush=True)
    with atheris.instrument_imports(include=["fuzz_ferry", "ferry"]):
        import fuzz_ferry as target  # this file again, as a module, with atheris' coverage instrumentation
    gc.collect()
    gc.freeze()  # torch's and numpy's objects: the per-input collections scan only what an input made
    atheris.Setup(argv, target.TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
