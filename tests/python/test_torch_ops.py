# SPDX-License-Identifier: Apache-2.0
# torch.ops.ferry.capture (ferry.torch_ops): eager on CPU tensors (host backend), torch.compile(fullgraph=True)
# with no graph break and exact entries, fake-tensor / meta propagation, bad inputs as ferry's typed errors,
# the C ABI's error mapping, and (CUDA only, skipped here) torch.cuda.graph capture + replay with plan().
import ctypes
import gc
import time

import numpy as np
import pytest
from conftest import _drain

import ferry

torch = pytest.importorskip("torch")
fto = pytest.importorskip("ferry.torch_ops", reason="ferry built without the torch op library")


entries = _drain  # polls until n entries arrived (conftest)


def as_bytes(t):
    return t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()


def test_eager_entries_exact_and_in_order(make_channel, stream):
    ch = make_channel(ring_bytes=1 << 18)
    tok = fto.token()
    xs = [torch.randn(3, 5), torch.arange(7, dtype=torch.int64), torch.randn(4).to(torch.bfloat16)]
    ch.begin_forward(stream)
    for i, x in enumerate(xs):
        torch.ops.ferry.capture(tok, x, ch.handle, 10 + i)
    fto.capture(tok, xs[0], ch, 99)  # the wrapper takes a Channel too
    ch.end_forward(stream)
    got = entries(ch, 4)
    assert [(e.hook, e.seq) for e in got] == [(10, 0), (11, 1), (12, 2), (99, 3)]
    assert [e.tobytes() for e in got] == [as_bytes(x) for x in xs] + [as_bytes(xs[0])]
    assert ch.close()["clean"]


def test_eager_snapshot_at_the_call(make_channel, stream):
    # The host backend copies later on its stream thread: the op snapshots x, so an in-place update after
    # the call (as on CUDA, where stream order makes it so) does not reach the entry.
    ch = make_channel()
    tok = fto.token()
    x = torch.zeros(1024)
    ch.begin_forward(stream)
    for i in range(8):
        torch.ops.ferry.capture(tok, x, ch.handle, i)
        x.add_(1)
    ch.end_forward(stream)
    got = entries(ch, 8)
    for i, e in enumerate(got):
        assert (np.frombuffer(e.tobytes(), np.float32) == i).all()


def test_host_graph_replays_read_the_tensor_at_each_launch(make_channel):
    # A captured forward (host graph): each launch copies x as it is then (no snapshot at capture time).
    ch = make_channel()
    s = ferry.Stream(backend="host")
    tok = fto.token()
    x = torch.zeros(64)
    s.begin_capture()
    ch.begin_forward(s)
    torch.ops.ferry.capture(tok, x, ch.handle, 5)
    plan = ch.end_forward(s)
    graph = s.end_capture()
    assert [h for h, _, _ in plan.entries] == [5]
    for step in range(1, 4):
        x.fill_(step)
        ch.plan(plan)
        graph.launch(s)
        (e,) = entries(ch, 1)
        assert e.hook == 5 and (np.frombuffer(e.tobytes(), np.float32) == step).all()
        e.release()
    s.synchronize()
    assert ch.close()["clean"]


def _model(h):
    def f(tok, x, w):
        y = x @ w
        torch.ops.ferry.capture(tok, y, h, 1)
        z = torch.relu(y) + 1
        torch.ops.ferry.capture(tok, z, h, 2)
        y.mul_(3)  # mutated after its capture: the entry must hold the value before
        torch.ops.ferry.capture(tok, y, h, 3)
        return z.sum() + y.sum()
    return f


def test_torch_compile_fullgraph_no_graph_break_entries_exact(make_channel, stream):
    ch = make_channel(ring_bytes=1 << 18)
    f = _model(ch.handle)
    tok = fto.token()
    x, w = torch.randn(4, 8), torch.randn(8, 16)
    ch.begin_forward(stream)
    ex = torch._dynamo.explain(f)(tok, x, w)
    ch.end_forward(stream)
    assert ex.graph_break_count == 0 and ex.graph_count == 1
    entries(ch, 3)

    compiled = torch.compile(f, fullgraph=True)  # inductor (CPU code through g++)
    want = []
    for step in range(2):
        xi = x + step
        y = xi @ w
        z = torch.relu(y) + 1
        want += [(1, as_bytes(y)), (2, as_bytes(z)), (3, as_bytes(y * 3))]
        ch.begin_forward(stream)
        out = compiled(tok, xi, w)
        ch.end_forward(stream)
        torch.testing.assert_close(out, f_eager_value(xi, w), rtol=1e-4, atol=1e-3)  # a fused sum rounds differently
    got = entries(ch, 6)
    assert [e.hook for e in got] == [1, 2, 3, 1, 2, 3]
    for e, (hook, b) in zip(got, want):
        # inductor may fuse the matmul differently than eager: equal up to rounding, same size
        assert e.size == len(b)
        np.testing.assert_allclose(np.frombuffer(e.tobytes(), np.float32), np.frombuffer(b, np.float32),
                                   rtol=1e-5, atol=1e-5)
    assert ch.close()["clean"]


def f_eager_value(x, w):
    y = x @ w
    return (torch.relu(y) + 1).sum() + (y * 3).sum()


def test_compiled_captures_are_kept_with_a_counting_backend(make_channel, stream):
    # What dynamo hands the backend: every capture, in program order, as a mutating op on the token.
    ch = make_channel()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    f = _model(ch.handle)
    tok = fto.token()
    ch.begin_forward(stream)
    torch.compile(f, backend=backend, fullgraph=True)(tok, torch.randn(2, 8), torch.randn(8, 4))
    ch.end_forward(stream)
    assert len(graphs) == 1
    ops = (torch.ops.ferry.capture, torch.ops.ferry.capture.default)
    calls = [n.args[3] for n in graphs[0].graph.nodes if n.target in ops]
    assert calls == [1, 2, 3]
    assert [e.hook for e in entries(ch, 3)] == [1, 2, 3]


def test_fake_and_meta_propagation(make_channel):
    ch = make_channel()
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():  # nothing runs, nothing is captured: no forward is open and that is fine
        tok = torch.zeros(1, dtype=torch.int64)
        assert torch.ops.ferry.capture(tok, torch.empty(16, 32), ch.handle, 1) is None
        with pytest.raises(ferry.LogicError, match="C-contiguous"):
            torch.ops.ferry.capture(tok, torch.empty(16, 32).t(), ch.handle, 1)
    m = torch.empty(8, device="meta")
    assert torch.ops.ferry.capture(torch.empty(1, device="meta"), m, ch.handle, 1) is None
    assert ch.stats()["entries_reserved"] == 0


def test_bad_inputs_are_typed_errors_and_lose_nothing(make_channel, stream):
    ch = make_channel()
    tok = fto.token()
    x = torch.arange(32, dtype=torch.float32)
    with pytest.raises(ferry.LogicError, match="open forward"):
        torch.ops.ferry.capture(tok, x, ch.handle, 1)  # outside a forward
    ch.begin_forward(stream)
    torch.ops.ferry.capture(tok, x, ch.handle, 1)
    with pytest.raises(ferry.LogicError, match="C-contiguous"):
        torch.ops.ferry.capture(tok, x[::2], ch.handle, 2)
    with pytest.raises(ferry.LogicError, match="C-contiguous"):
        torch.ops.ferry.capture(tok, x.view(4, 8).t(), ch.handle, 2)
    with pytest.raises(ferry.LogicError, match="live ferry.Channel"):
        torch.ops.ferry.capture(tok, x, 1 << 40, 2)  # not a channel handle
    with pytest.raises(ferry.LogicError, match="hook in"):
        torch.ops.ferry.capture(tok, x, ch.handle, -1)
    with pytest.raises((TypeError, RuntimeError), match="int"):
        torch.ops.ferry.capture(tok, x, ch, 2)  # the op takes the handle (fto.capture takes either)
    torch.ops.ferry.capture(tok, x + 1, ch.handle, 3)
    ch.end_forward(stream)
    got = entries(ch, 2)
    assert [(e.hook, e.seq) for e in got] == [(1, 0), (3, 1)]
    assert got[1].tobytes() == as_bytes(x + 1)
    h = ch.handle
    ch.close()
    with pytest.raises(ferry.LogicError, match="closed"):
        torch.ops.ferry.capture(tok, x, h, 4)


def test_destroyed_channel_handle_is_refused():
    ch = ferry.Channel(backend="host", ring_bytes=1 << 16)
    h = ch.handle
    del ch
    import gc

    gc.collect()
    with pytest.raises(ferry.LogicError, match="destroyed"):
        torch.ops.ferry.capture(fto.token(), torch.zeros(4), h, 1)


_CTOR_FAILS_AFTER_OP_CAPTURES = r"""
import ferry, torch, ferry.torch_ops as fto
s = ferry.Stream(backend="host")
ch = ferry.Channel(backend="host", ring_bytes=64 << 20, publish_every=16)
tok = fto.token()
ch.begin_forward(s)
for i in range(48):  # 1 MiB temporaries: the stream thread drops the last reference to each (which needs the GIL)
    torch.ops.ferry.capture_deferred(tok, torch.full((1 << 18,), float(i)), ch.handle, i)
torch.ops.ferry.flush(tok, ch.handle)  # one gather reads them all, then releases them on the stream thread
try:
    ferry.Channel(backend="host", ring_bytes=1 << 16, staging_bytes=2**50)  # fails after allocating
except ferry.OutOfMemory:
    print("refused")
ch.end_forward(s)
got = []
while len(got) < 48:
    got += ch.poll(64, timeout=5.0)
assert [e.hook for e in got] == list(range(48))
print("delivered", ch.close()["clean"])
"""


def test_channel_constructor_failing_after_op_captures_is_an_error_not_a_deadlock():
    # Channel() failing after an allocation waited for the host streams with the GIL held, while a stream thread
    # dropping a torch op's tensor waited for the GIL: a deadlock (found by the fuzzer; a libFuzzer timeout). The
    # constructor now runs without the GIL. In a subprocess, so that a deadlock is a timeout, not a hung suite.
    import os
    import subprocess
    import sys
    env = dict(os.environ, FERRY_PYTHON_BACKEND="host", PYTHONPATH=os.pathsep.join(sys.path))
    try:
        r = subprocess.run([sys.executable, "-c", _CTOR_FAILS_AFTER_OP_CAPTURES], env=env, capture_output=True,
                           text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("Channel(staging_bytes=2**50) after torch op captures deadlocked (no answer within 30 s)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["refused", "delivered", "True"], r.stdout + r.stderr


_LAST_VIEW_DROPPED_AFTER_CLOSE = r"""
import gc
import numpy as np
import ferry, torch, ferry.torch_ops as fto
s = ferry.Stream(backend="host")
a = ferry.Channel(backend="host", ring_bytes=1 << 16)
a.begin_forward(s)
a.capture(1, np.ones(64, np.uint8), s)
a.end_forward(s)
(e,) = a.poll(1, timeout=5.0)
v = e.numpy()
e.release()
a.close()  # v keeps a's pinned staging
ch = ferry.Channel(backend="host", ring_bytes=64 << 20, publish_every=16)
tok = fto.token()
ch.begin_forward(s)
for i in range(48):
    torch.ops.ferry.capture_deferred(tok, torch.full((1 << 18,), float(i)), ch.handle, i)
torch.ops.ferry.flush(tok, ch.handle)
del v  # the last view: frees a's staging while the stream thread releases the op tensors
gc.collect()
ch.end_forward(s)
got = []
while len(got) < 48:
    got += ch.poll(64, timeout=5.0)
print("delivered", ch.close()["clean"])
"""


def test_the_last_view_of_a_closed_channel_dropped_during_op_releases_is_not_a_deadlock():
    # the same deadlock as the failing constructor's: the last Entry / numpy view of a closed channel frees its
    # pinned staging, and the free waited for the host streams with the GIL held; the view now lets it go
    # without the GIL once its channel closed
    import os
    import subprocess
    import sys
    env = dict(os.environ, FERRY_PYTHON_BACKEND="host", PYTHONPATH=os.pathsep.join(sys.path))
    try:
        r = subprocess.run([sys.executable, "-c", _LAST_VIEW_DROPPED_AFTER_CLOSE], env=env, capture_output=True,
                           text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("dropping the last view of a closed channel during op tensor releases deadlocked (30 s)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["delivered", "True"], r.stdout + r.stderr


def test_capi_error_mapping():
    # Every ferry_status becomes the exception Channel.capture raises for it (the torch op's error path).
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    base = get(ferry._ferry._capi, b"ferry._ferry._capi")
    version, size = ctypes.c_uint32.from_address(base).value, ctypes.c_uint32.from_address(base + 4).value
    assert version == 3 and size >= 8 + 6 * ctypes.sizeof(ctypes.c_void_p)  # version 2: + capture_deferred, flush; 3: + capture_rows
    fn_addr = ctypes.c_void_p.from_address(base + 8 + 2 * ctypes.sizeof(ctypes.c_void_p)).value
    set_error = ctypes.PYFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p)(fn_addr)
    for status, cls in [(1, ferry.LogicError), (2, ferry.OutOfMemory), (3, ferry.TimeoutError),
                        (4, ferry.InvalidatedError), (5, ferry.BackendError), (6, ferry.Error)]:
        with pytest.raises(cls, match=f"message {status}") as info:
            set_error(status, f"message {status}".encode())
        assert type(info.value) is cls


cuda = pytest.mark.skipif("cuda" not in ferry.available_backends() or not torch.cuda.is_available(),
                          reason="needs ferry built with FERRY_PYTHON_CUDA=ON, a GPU and torch")


@cuda
def test_cuda_graph_capture_and_replay_with_plan():
    ch = ferry.Channel(0, ring_bytes=8 << 20, publish_every=4, backend="cuda")
    s = torch.cuda.Stream()
    tok = fto.token("cuda")
    x = torch.randn(64, 128, device="cuda")
    w = torch.randn(128, 256, device="cuda")

    def step():
        y = x @ w
        torch.ops.ferry.capture(tok, y, ch.handle, 1)
        z = torch.relu(y)
        torch.ops.ferry.capture(tok, z, ch.handle, 2)
        torch.ops.ferry.capture(tok, z[:3].contiguous(), ch.handle, 3)
        return y, z

    torch.cuda.synchronize()
    with torch.cuda.stream(s):  # warm up (eager forward on the capture stream)
        ch.begin_forward(s)
        step()
        ch.end_forward(s)
    torch.cuda.synchronize()
    entries(ch, 3)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        ch.begin_forward(s)
        y_out, out = step()
        plan = ch.end_forward(s)
    assert [h for h, _, _ in plan.entries] == [1, 2, 3]
    for i in range(3):
        x.copy_(torch.randn_like(x))
        ch.plan(plan)
        g.replay()
        torch.cuda.synchronize()
        got = entries(ch, 3)
        assert [e.hook for e in got] == [1, 2, 3]
        assert got[0].tobytes() == as_bytes(y_out) and got[1].tobytes() == as_bytes(out)
        torch.testing.assert_close(y_out, x @ w)  # the replay computed this step's values
        assert got[2].tobytes() == as_bytes(out[:3])
    assert ch.close()["clean"]


@cuda
def test_cuda_compile_and_wrong_devices():
    ch = ferry.Channel(0, ring_bytes=8 << 20, publish_every=4, backend="cuda")
    tok = fto.token("cuda")
    s = torch.cuda.Stream()  # not the legacy default stream, which ferry refuses
    f = torch.compile(_model(ch.handle), fullgraph=True)
    x, w = torch.randn(4, 8, device="cuda"), torch.randn(8, 16, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        ch.begin_forward(s)
        f(tok, x, w)
        with pytest.raises(ferry.LogicError, match="host tensor where a device tensor"):
            torch.ops.ferry.capture(tok, torch.zeros(4), ch.handle, 9)
        ch.end_forward(s)
    got = entries(ch, 3)
    assert [e.hook for e in got] == [1, 2, 3]
    y = x @ w
    np.testing.assert_allclose(np.frombuffer(got[0].tobytes(), np.float32), y.cpu().numpy().ravel(), rtol=1e-4,
                               atol=1e-4)
    assert ch.close()["clean"]
    host = ferry.Channel(backend="host", ring_bytes=1 << 16)
    with pytest.raises(ferry.LogicError, match="device tensor where the host backend"):
        torch.ops.ferry.capture(fto.token(), torch.zeros(4, device="cuda"), host.handle, 1)
    host.close()


def test_invalidated_channel_through_the_op(make_channel):
    ch = make_channel(publish_every=1, timeout=0.5)
    s = ferry.Stream(backend="host")
    x = torch.arange(16, dtype=torch.float32)
    s.begin_capture()
    ch.begin_forward(s)
    ch.capture(1, x.numpy(), s)
    ch.capture(2, x.numpy(), s)
    ch.end_forward(s)
    g = s.end_capture()
    g.launch(s)  # a captured forward launched without plan(): the drainer invalidates the channel
    s.synchronize()
    deadline = time.monotonic() + 5.0
    while not ch.invalidated and time.monotonic() < deadline:
        time.sleep(0.01)
    ch_handle = ch.handle
    with pytest.raises(ferry.InvalidatedError, match="graph replayed without plan"):
        ch.begin_forward(s)
    with pytest.raises(ferry.InvalidatedError, match="graph replayed without plan"):
        torch.ops.ferry.capture(fto.token(), x, ch_handle, 3)
    with pytest.raises(ferry.InvalidatedError):
        ch.close()


# ---- deferred capture: torch.ops.ferry.capture_deferred / flush

def test_deferred_op_entries_exact(make_channel, stream):
    ch = make_channel(publish_every=4, tuning={"gather_batch": 4})  # batches of 4: the 5th entry is pending
    tok = fto.token()
    xs = [torch.arange(i, i + 6, dtype=torch.float32) for i in range(5)]
    ch.begin_forward(stream)
    for i, x in enumerate(xs):
        fto.capture_deferred(tok, x, ch, i)
    assert ch.deferred_pending == 1
    fto.flush(tok, ch)
    assert ch.deferred_pending == 0
    ch.end_forward(stream)
    got = entries(ch, 5)
    assert [e.hook for e in got] == list(range(5))
    assert [e.tobytes() for e in got] == [as_bytes(x) for x in xs]
    assert ch.close()["clean"]


def test_deferred_in_place_write_before_flush_is_detected(make_channel, stream):
    ch = make_channel(publish_every=8)
    tok = fto.token()
    a, b = torch.ones(4), torch.zeros(4)
    ch.begin_forward(stream)
    fto.capture_deferred(tok, b, ch, 1)
    fto.capture_deferred(tok, a, ch, 7)
    a.add_(1)  # written in place before the flush
    with pytest.raises(ferry.LogicError, match="deferred hook 7 was written in place"):
        ch.end_forward(stream)
    with pytest.raises(ferry.LogicError, match="deferred hook 7"):
        fto.capture(tok, b, ch, 2)  # any flush point checks again
    assert ch.abort_forward(stream) is True
    assert ch.poll(10, timeout=0.3) == []  # nothing of the batch published
    # written AFTER its flush: fine
    ch.begin_forward(stream)
    fto.capture_deferred(tok, a, ch, 7)
    fto.flush(tok, ch)
    a.add_(1)
    ch.end_forward(stream)
    got = entries(ch, 1)
    assert got[0].tobytes() == as_bytes(torch.full((4,), 2.0))
    assert ch.close()["clean"]


def _deferred_model(handle):
    def f(tok, x, w):
        y = x @ w
        torch.ops.ferry.capture_deferred(tok, y, handle, 1)
        z = torch.relu(y) + 1
        torch.ops.ferry.capture_deferred(tok, z, handle, 2)
        torch.ops.ferry.flush(tok, handle)
        return z.sum()
    return f


def test_torch_compile_fullgraph_deferred(make_channel, stream):
    ch = make_channel(ring_bytes=1 << 18, publish_every=8)
    tok = fto.token()
    x, w = torch.randn(4, 8), torch.randn(8, 16)
    compiled = torch.compile(_deferred_model(ch.handle), fullgraph=True)
    ch.begin_forward(stream)
    compiled(tok, x, w)
    ch.end_forward(stream)
    got = entries(ch, 2)
    assert [e.hook for e in got] == [1, 2]
    y = x @ w
    for e, b in zip(got, [as_bytes(y), as_bytes(torch.relu(y) + 1)]):
        assert e.size == len(b)
        np.testing.assert_allclose(np.frombuffer(e.tobytes(), np.float32), np.frombuffer(b, np.float32),
                                   rtol=1e-5, atol=1e-5)
    assert ch.close()["clean"]


def test_deferred_op_tensor_freed_after_capture_still_exact(make_channel, stream):
    # the binding holds each deferred source (the op's owner) until its copy ran: del + gc are fine
    ch = make_channel(publish_every=4, ring_bytes=1 << 20)
    tok = fto.token()
    ch.begin_forward(stream)
    for i in range(6):
        fto.capture_deferred(tok, torch.full((4096,), float(i + 1)), ch, i)
    gc.collect()
    junk = [torch.full((4096,), -1.0) for _ in range(32)]  # would take the freed memory
    ch.end_forward(stream)
    got = entries(ch, 6)
    assert [e.tobytes() for e in got] == [as_bytes(torch.full((4096,), float(i + 1))) for i in range(6)]
    del junk
    assert ch.close()["clean"]


def test_deferred_batch_split_by_ring_bytes_releases_the_flushed_sources(make_channel, stream):
    # ring 4 KiB, 1 KiB entries: the 4th cannot join the batch (it might span the ring), so the channel flushes
    # entries 0-2 first and gives their sources back: writing entry 0 afterwards is legal, not an error.
    ch = make_channel(publish_every=8, ring_bytes=1 << 12)
    tok = fto.token()
    xs = [torch.full((256,), float(i)) for i in range(4)]
    ch.begin_forward(stream)
    for i in range(3):
        fto.capture_deferred(tok, xs[i], ch, i)
    assert ch.deferred_pending == 3
    fto.capture_deferred(tok, xs[3], ch, 3)
    assert ch.deferred_pending == 1
    xs[0].add_(100)  # after its flush: fine
    ch.end_forward(stream)
    got = entries(ch, 4)
    assert [e.tobytes() for e in got] == [as_bytes(torch.full((256,), float(i))) for i in range(4)]
    assert ch.close()["clean"]


@cuda
def test_cuda_deferred_eager_graph_and_in_place_detection():
    ch = ferry.Channel(0, ring_bytes=8 << 20, publish_every=4, backend="cuda")
    s = torch.cuda.Stream()
    tok = fto.token("cuda")
    x = torch.randn(64, 128, device="cuda")
    w = torch.randn(128, 256, device="cuda")

    def step():
        y = x @ w
        torch.ops.ferry.capture_deferred(tok, y, ch.handle, 1)
        z = torch.relu(y)
        torch.ops.ferry.capture_deferred(tok, z, ch.handle, 2)
        torch.ops.ferry.capture_deferred(tok, (z * 2)[:5].contiguous(), ch.handle, 3)  # a temporary: held
        return y, z

    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        ch.begin_forward(s)
        y, z = step()
        ch.end_forward(s)
    torch.cuda.synchronize()
    got = entries(ch, 3)
    assert [e.hook for e in got] == [1, 2, 3]
    assert got[0].tobytes() == as_bytes(y.cpu()) and got[1].tobytes() == as_bytes(z.cpu())
    assert got[2].tobytes() == as_bytes((z * 2)[:5].cpu())

    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        ch.begin_forward(s)
        y_out, z_out = step()
        plan = ch.end_forward(s)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        ch.plan(plan)
        g.replay()
        torch.cuda.synchronize()
        got = entries(ch, 3)
        assert got[0].tobytes() == as_bytes(y_out.cpu()) and got[1].tobytes() == as_bytes(z_out.cpu())

    # an in-place write before the flush: LogicError naming the hook, nothing of the batch published
    a = torch.ones(1024, device="cuda")
    with torch.cuda.stream(s):
        ch.begin_forward(s)
        torch.ops.ferry.capture_deferred(tok, a, ch.handle, 7)
        a.mul_(3)
        with pytest.raises(ferry.LogicError, match="deferred hook 7"):
            ch.end_forward(s)
        assert ch.abort_forward(s)
    torch.cuda.synchronize()
    assert ch.poll(4, timeout=0.3) == []
    assert ch.close()["clean"]
