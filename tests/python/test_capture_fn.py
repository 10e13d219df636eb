# SPDX-License-Identifier: Apache-2.0
# Channel.capture_fn (ferry.hooks.channel_capture's C++ call site) and the tensor reader that ferry.torch_ops
# lends the core module: with and without the reader, every tensor gives the entry Channel.capture gives (dense
# ones read in C++, the others made ready by `prepare` first), a deferred tensor written in place before its
# flush is still refused (the version read by the reader at the capture, checked at the flush by either path),
# and every bad input keeps the error Channel.capture / capture_deferred raise. Host backend; skipped without
# torch.
import gc

import pytest

import ferry
from ferry import _ferry

torch = pytest.importorskip("torch")
import ferry.hooks as fh  # noqa: E402

from test_capture_fast_path import raw, tensors  # noqa: E402


def _reader_address():
    try:
        import ferry.torch_ops  # noqa: F401
    except ImportError:
        return None
    return torch.ops.ferry._tensor_reader()


READER = _reader_address()


@pytest.fixture(params=["reader", "attributes"])
def reader(request):
    """Runs the test with the tensor reader bound (where ferry.torch_ops is built) and without it."""
    if request.param == "reader" and READER is None:
        pytest.skip("ferry.torch_ops not built: no tensor reader")
    _ferry._bind_tensor_reader(READER if request.param == "reader" else 0)
    assert _ferry._tensor_reader_bound() == (request.param == "reader")
    yield request.param
    if READER is not None:
        _ferry._bind_tensor_reader(READER)


def _strided_and_grad():
    w = torch.randn(6, 5, requires_grad=True)
    return [w * 3, torch.randn(5, 6).t(), (w * 2).t(), torch.randn(8)[::2]]


@pytest.mark.parametrize("deferred", [False, True, "mixed"])
def test_capture_fn_entries_exact_for_every_tensor(make_channel, stream, drain, reader, deferred):
    ch = make_channel(ring_bytes=1 << 20, publish_every=4)
    xs = tensors() + _strided_and_grad()
    d = {False: False, True: True, "mixed": [h for h in range(len(xs)) if h % 3 == 1]}[deferred]
    cap = fh.channel_capture(ch, stream, deferred=d)
    if reader == "attributes":
        _ferry._bind_tensor_reader(0)  # channel_capture lent it again
    assert callable(cap) and cap.__name__ == "capture"
    ch.begin_forward(stream)
    for h, x in enumerate(xs):
        cap(h, x)
    ch.end_forward(stream)
    got = drain(ch, len(xs))
    assert [e.hook for e in got] == list(range(len(xs)))  # an immediate capture flushes the pending ones first
    for e, x in zip(got, xs):
        assert e.tobytes() == raw(x), e.hook
    assert ch.close()["clean"]


def test_deferred_tensor_written_in_place_is_refused(make_channel, stream, drain, reader):
    ch = make_channel(ring_bytes=1 << 20, publish_every=64)
    cap = fh.channel_capture(ch, stream, deferred=True)
    if reader == "attributes":
        _ferry._bind_tensor_reader(0)
    keep = torch.arange(64, dtype=torch.float32)
    with torch.inference_mode():
        inf = torch.arange(8, dtype=torch.float32)  # no version counter: not checked
    ch.begin_forward(stream)
    cap(3, keep.clone())
    cap(4, inf)
    cap(9, keep)
    keep.add_(1)  # written in place before its flush
    with pytest.raises(ferry.LogicError, match="deferred hook 9 was written in place"):
        ch.end_forward(stream)
    assert ch.abort_forward(stream) in (True, False)
    ch.begin_forward(stream)  # the channel goes on: the same tensor, not written, is taken
    cap(9, keep)
    ch.end_forward(stream)
    got = drain(ch, 1)
    assert [(e.hook, e.tobytes()) for e in got][-1] == (9, raw(keep))


def test_version_read_by_the_reader_is_checked_without_it(make_channel, stream):
    if READER is None:
        pytest.skip("ferry.torch_ops not built: no tensor reader")
    ch = make_channel(ring_bytes=1 << 20, publish_every=64)
    _ferry._bind_tensor_reader(READER)
    cap = ch.capture_fn(stream, deferred=True)
    x = torch.ones(16)
    ch.begin_forward(stream)
    cap(2, x)  # its version read by the reader
    _ferry._bind_tensor_reader(0)
    try:
        x.mul_(2)
        with pytest.raises(ferry.LogicError, match="deferred hook 2 was written in place"):
            ch.flush(stream)  # checked through the attributes
    finally:
        _ferry._bind_tensor_reader(READER)
    ch.abort_forward(stream)


def test_capture_fn_keeps_the_errors_of_the_channel_calls(make_channel, stream, reader):
    ch = make_channel()
    ok = torch.arange(16, dtype=torch.int32)
    for deferred, name in ((False, "Channel.capture"), (True, "Channel.capture_deferred")):
        cap = ch.capture_fn(stream, deferred=deferred)
        ch.begin_forward(stream)
        with pytest.raises(ferry.LogicError, match=rf"{name}: expected hook an int in \[0, 2\^32\), got -1"):
            cap(-1, ok)
        with pytest.raises(ferry.LogicError, match=r"expected hook an int in \[0, 2\^32\), got 4294967296"):
            cap(1 << 32, ok)
        with pytest.raises(TypeError, match=rf"{name}: expected hook an int, got bool"):
            cap(True, ok)
        with pytest.raises(TypeError, match=rf"{name}: expected hook an int, got str"):
            cap("3", ok)
        with pytest.raises(ferry.LogicError, match=rf"{name} \(hook 5\): expected a C-contiguous array"):
            cap(5, torch.randn(4, 4).t())  # no prepare: the channel call's own refusal
        with pytest.raises(TypeError, match=r"expected an array \(an object with __dlpack__\), got list"):
            cap(5, [1, 2, 3])
        with pytest.raises(ferry.LogicError, match="conjugate or negative bit"):
            cap(5, torch.randn(4, dtype=torch.complex64).conj().imag)
        ch.abort_forward(stream)
    with pytest.raises(TypeError, match="expected a ferry.Stream of the host backend, got NoneType"):
        ch.capture_fn(None)(0, ok)  # the host backend has no default stream: refused at the call, as before
    other = ferry.Stream(backend="host")
    cap = ch.capture_fn(other)
    other.close()
    with pytest.raises(ferry.LogicError, match="expected an open stream, got a closed one"):
        cap(0, ok)
    cap = ch.capture_fn(stream)
    ch.close()
    with pytest.raises(ferry.LogicError, match="expected an open channel, got a closed one"):
        cap(0, ok)


def test_capture_fn_deferred_ids_and_lifetime(make_channel, stream, drain, reader):
    ch = make_channel(ring_bytes=1 << 20, publish_every=64)
    # ids past the bitmap (>= 2^16) and past any hook (>= 2^32, ignored)
    cap = ch.capture_fn(stream, deferred=[7, 70000, 1 << 40])
    xs = {h: torch.full((32,), float(h)) for h in (7, 8, 70000, 70001)}
    ch.begin_forward(stream)
    for h, x in xs.items():
        cap(h, x)
        if h in (7, 70000):
            assert ch.deferred_pending == 1
        else:
            assert ch.deferred_pending == 0  # an immediate capture flushed it
    ch.end_forward(stream)
    assert [(e.hook, e.tobytes()) for e in drain(ch, 4)] == [(h, raw(x)) for h, x in xs.items()]
    # the function holds its channel: a channel whose only reference is the function's still answers (a
    # refusal from the core: no forward is open)
    cap = ferry.Channel(backend="host", ring_bytes=1 << 16).capture_fn(stream)
    gc.collect()
    with pytest.raises(ferry.LogicError, match="open forward"):
        cap(0, torch.ones(4))
    del cap
    gc.collect()


def test_hooks_on_a_model_through_capture_fn(make_channel, stream, drain, reader):
    # ferry.hooks' install with the C++ call site: input / output points, several ids on one module
    ch = make_channel(ring_bytes=1 << 20)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    pts = [fh.HookPoint(0, "in", "0", "input"), fh.HookPoint(1, "h", "0", "output"),
           fh.HookPoint(2, "h_again", "0", "output"), fh.HookPoint(3, "out", "2", "output", True)]
    x = torch.randn(3, 4)
    with torch.no_grad():
        h = model[0](x)
        want = [x, h, h, model(x)]
    cap = fh.capture_fn(ch, stream, use_ops=False, deferred=pts)
    with fh.install(model, pts, cap), torch.no_grad():
        ch.begin_forward(stream)
        model(x)
        ch.end_forward(stream)
    got = drain(ch, 4)
    assert [(e.hook, e.tobytes()) for e in got] == [(i, raw(t)) for i, t in enumerate(want)]
