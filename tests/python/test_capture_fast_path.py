# SPDX-License-Identifier: Apache-2.0
# The cheap eager capture paths: Channel.capture / capture_deferred read a plain torch.Tensor without
# __dlpack__ (entries byte-exact for every dtype, shape and storage offset; every tensor the fast path leaves
# alone gets the general path's error, unchanged), and the ferry.hooks closures (detach only what requires
# grad, contiguous only what is strided, immediate / deferred / mixed). Host backend; the CUDA default stream
# (torch's raw current stream) where a GPU is present. Skipped without torch.
import gc

import pytest

import ferry

torch = pytest.importorskip("torch")
import ferry.hooks as fh  # noqa: E402


def raw(t):
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    return t.contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes()


def tensors():
    g = torch.Generator().manual_seed(3)
    big = torch.randn(64, generator=g)
    out = [
        torch.randn(1000, generator=g),
        torch.randn(4, 33, generator=g).to(torch.bfloat16),
        torch.arange(77, dtype=torch.int64),
        torch.tensor(2.5),                                   # 0-d
        big[5:13],                                           # a storage offset
        torch.randn(8, 1, generator=g).t(),                  # size-1 dim with a stride torch calls contiguous
        torch.randn(3, 1, 5, generator=g)[:, :, :],
        torch.ones(9, dtype=torch.bool),
        torch.randint(0, 200, (17,), dtype=torch.uint8, generator=g),
        torch.randn(6, generator=g).to(torch.float8_e4m3fn) if hasattr(torch, "float8_e4m3fn") else big[:3],
        torch.randn(5, generator=g, requires_grad=True) * 2,  # requires grad: read as DLPack reads it
        torch.nn.Parameter(torch.randn(7, generator=g)),     # a subclass: the general (DLPack) path
    ]
    with torch.inference_mode():
        out.append(torch.randn(11, generator=g) + 1)       # an inference tensor (no version counter)
    return out


@pytest.mark.parametrize("deferred", [False, True])
def test_torch_tensors_entries_exact(make_channel, stream, drain, deferred):
    ch = make_channel(ring_bytes=1 << 20, publish_every=4)
    xs = tensors()
    call = ch.capture_deferred if deferred else ch.capture
    ch.begin_forward(stream)
    for h, x in enumerate(xs):
        call(h, x, stream)
    ch.end_forward(stream)
    got = drain(ch, len(xs))
    assert [e.hook for e in got] == list(range(len(xs)))
    for e, x in zip(got, xs):
        assert e.tobytes() == raw(x), e.hook
    assert ch.close()["clean"]


def test_tensors_the_fast_path_leaves_alone_keep_their_errors_and_lose_nothing(make_channel, stream, drain):
    ch = make_channel()
    ok = torch.arange(16, dtype=torch.int32)
    ch.begin_forward(stream)
    ch.capture(0, ok, stream)
    for call, name in ((ch.capture, "Channel.capture"), (ch.capture_deferred, "Channel.capture_deferred")):
        with pytest.raises(ferry.LogicError, match=rf"{name} \(hook 5\): expected a C-contiguous array, got a "
                                                   r"strided one \(2-d\)"):
            call(5, torch.randn(4, 4).t(), stream)
        with pytest.raises(ferry.LogicError, match=r"expected a C-contiguous array, got a strided one \(1-d\)"):
            call(5, torch.randn(8)[::2], stream)
        # a negative bit (the imaginary part of a conjugate view): its memory is not its values, refused
        with pytest.raises(ferry.LogicError, match="conjugate or negative bit"):
            call(5, torch.randn(4, dtype=torch.complex64).conj().imag, stream)
        with pytest.raises(TypeError, match=rf"{name}: expected an array \(an object with __dlpack__\), got "
                                            "Tensor"):
            call(5, torch.empty(4, device="meta"), stream)
        with pytest.raises(TypeError, match=r"expected an array \(an object with __dlpack__\), got Tensor"):
            call(5, torch.randn(4).to_sparse(), stream)
        with pytest.raises(TypeError, match=r"expected an array \(an object with __dlpack__\), got list"):
            call(5, [1, 2, 3], stream)
    ch.capture(1, ok + 1, stream)
    ch.end_forward(stream)
    got = drain(ch, 2)
    assert [(e.hook, e.tobytes()) for e in got] == [(0, raw(ok)), (1, raw(ok + 1))]
    with pytest.raises(ferry.LogicError, match="expected an open forward|open forward"):
        ch.capture(2, ok, stream)
    assert ch.close()["clean"]
    with pytest.raises(ferry.LogicError, match="expected an open channel, got a closed one"):
        ch.capture(2, ok, stream)


def test_fast_path_holds_the_tensor_until_the_host_copy(make_channel, stream, drain):
    # host backend: the copy runs later on the stream thread; the binding must hold the torch tensor
    ch = make_channel(ring_bytes=1 << 20)
    expected = []
    ch.begin_forward(stream)
    for h in range(8):
        x = torch.full((4096,), float(h))
        expected.append(raw(x))
        ch.capture(h, x, stream)
        del x
        gc.collect()
        torch.full((4096,), -1.0)  # reuse the freed memory, if it were freed
    ch.end_forward(stream)
    assert [e.tobytes() for e in drain(ch, 8)] == expected
    assert ch.close()["clean"]


@pytest.mark.parametrize("use_ops", [False, True])
@pytest.mark.parametrize("deferred", [False, True, "mixed"])
def test_hook_closures_detach_and_densify_only_when_needed(make_channel, stream, drain, use_ops, deferred):
    if use_ops:
        pytest.importorskip("ferry.torch_ops", exc_type=ImportError)
    ch = make_channel(ring_bytes=1 << 20, publish_every=4)
    d = {False: False, True: True, "mixed": [1, 3, fh.HookPoint(4, "x", "", "output", True),
                                             fh.HookPoint(0, "y", "", "output", False)]}[deferred]
    cap = (fh.ops_capture(ch, deferred=d) if use_ops else fh.channel_capture(ch, stream, deferred=d))
    w = torch.randn(6, 5, requires_grad=True)
    xs = [w * 3,                               # requires grad
          torch.randn(5, 6).t(),               # strided
          (w * 2).t(),                         # both
          torch.arange(10, dtype=torch.int16),
          torch.randn(3, 4).to(torch.bfloat16)]
    ch.begin_forward(stream)
    for h, x in enumerate(xs):
        cap(h, x)
    ch.end_forward(stream)
    got = drain(ch, len(xs))
    assert sorted(e.hook for e in got) == list(range(len(xs)))
    by = {e.hook: e.tobytes() for e in got}
    for h, x in enumerate(xs):
        assert by[h] == raw(x), h
    assert xs[0].requires_grad and xs[0].grad_fn is not None  # the hooked tensor itself is untouched
    if deferred == "mixed":
        # hooks 1 and 3 (ids) and 4 (a deferred HookPoint) are deferred, 0 (not deferred) and 2 immediate:
        # every immediate capture flushes the pending deferred entries first, so seq order is 0, 1, 2, 3, 4
        assert [e.hook for e in got] == [0, 1, 2, 3, 4]
    assert ch.close()["clean"]


@pytest.mark.skipif("cuda" not in ferry.available_backends() or not torch.cuda.is_available(),
                    reason="needs ferry built with FERRY_PYTHON_CUDA=ON, a GPU and torch")
def test_cuda_default_stream_is_torchs_current_stream():
    # Channel.capture(hook, t) with no stream must enqueue on torch's current stream (the side stream here):
    # t is written there after a long sleep, so a capture on any other stream would read the old bytes.
    ch = ferry.Channel(0, ring_bytes=4 << 20, publish_every=4, backend="cuda")
    side = torch.cuda.Stream()
    t = torch.zeros(1 << 16, device="cuda")
    src = torch.arange(1 << 16, device="cuda", dtype=torch.float32)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        ch.begin_forward()
        torch.cuda._sleep(50_000_000)
        t.copy_(src)
        ch.capture(0, t)
        ch.capture_deferred(1, t)
        ch.end_forward()
    got = []
    while len(got) < 2:
        got += ch.poll(2 - len(got), timeout=10.0)
    assert [e.hook for e in got] == [0, 1]
    for e in got:
        assert e.tobytes() == raw(src)
    assert ch.close()["clean"]


class CudaLikeChannel:
    """A host channel that says it is a CUDA one, recording which call ferry.hooks.capture_fn makes."""

    backend = "cuda"

    def __init__(self, ch, stream):
        self.ch, self.stream, self.handle, self.calls = ch, stream, ch.handle, []

    def capture(self, hook, t, stream):
        self.calls.append(("capture", hook))
        self.ch.capture(hook, t, self.stream)

    def capture_deferred(self, hook, t, stream):
        self.calls.append(("capture_deferred", hook))
        self.ch.capture_deferred(hook, t, self.stream)


def test_auto_capture_fn_on_cuda_channels_is_the_core_call_eagerly_and_the_op_when_compiled(make_channel, stream,
                                                                                           drain):
    pytest.importorskip("ferry.torch_ops", exc_type=ImportError)
    ch = make_channel(ring_bytes=1 << 20)
    like = CudaLikeChannel(ch, stream)
    cap = fh.capture_fn(like, None, deferred=[1])
    assert fh.capture_fn(ch, stream) is not cap and hasattr(cap, "token")
    xs = [torch.arange(8, dtype=torch.int32) + 10 * h for h in range(3)]
    ch.begin_forward(stream)
    for h, x in enumerate(xs):
        cap(h, x)
    assert like.calls == [("capture", 0), ("capture_deferred", 1), ("capture", 2)]

    @torch.compile(fullgraph=True, backend="eager")
    def f(x):
        y = x + 1
        cap(3, y)
        return y * 2

    y = f(xs[0])
    assert like.calls == [("capture", 0), ("capture_deferred", 1), ("capture", 2)]  # the op, not the core call
    ch.end_forward(stream)
    got = drain(ch, 4)
    assert [(e.hook, e.tobytes()) for e in got] == [(h, raw(x)) for h, x in enumerate(xs)] + [(3, raw(xs[0] + 1))]
    assert torch.equal(y, (xs[0] + 1) * 2)
    assert ch.close()["clean"]


@pytest.mark.parametrize("use_ops", [False, True])
def test_hook_closures_refuse_sparse_and_other_layouts_naming_the_hook(make_channel, stream, drain, use_ops):
    # a sparse tensor through a closure raised RuntimeError from torch's is_contiguous() / contiguous() (found by
    # the fuzzer): now a ferry.LogicError naming the hook and the layout, as torch.ops.ferry.* refuse it
    if use_ops:
        pytest.importorskip("ferry.torch_ops", exc_type=ImportError)
    ch = make_channel()
    cap = fh.ops_capture(ch) if use_ops else fh.channel_capture(ch, stream)
    dense = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    bad = [dense.to_sparse(), dense.to_sparse_csr(), dense.to_sparse_csc(), dense.to_mkldnn(),
           torch.eye(4).to_sparse_bsr((2, 2))]
    ch.begin_forward(stream)
    for h, t in enumerate(bad):
        with pytest.raises(ferry.LogicError, match=rf"hook {7 + h}\): expected a dense \(strided\) tensor, got a "
                                                   rf"{t.layout} tensor"):
            cap(7 + h, t)
    cap(1, dense)  # nothing lost: the forward goes on
    ch.end_forward(stream)
    (e,) = drain(ch, 1)
    assert e.hook == 1 and e.tobytes() == raw(dense)
    assert ch.close()["clean"]
