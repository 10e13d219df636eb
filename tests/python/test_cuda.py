# SPDX-License-Identifier: Apache-2.0
# The CUDA backend with torch tensors and streams (skipped without a CUDA build, a GPU or torch):
# entries byte-exact, every stream form, torch.cuda.graph capture with plan(), H2D into a torch tensor,
# and host/device mix-ups refused.
import numpy as np
import pytest
from conftest import _drain

import ferry

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif("cuda" not in ferry.available_backends() or not torch.cuda.is_available(),
                                reason="needs ferry built with FERRY_PYTHON_CUDA=ON, a GPU and torch")


@pytest.fixture
def channel():
    ch = ferry.Channel(0, ring_bytes=4 << 20, publish_every=4, backend="cuda")
    yield ch
    if not ch.closed:
        ch.close()


drain = _drain  # polls until n entries arrived (conftest)


class CudaStreamProtocol:
    def __init__(self, s):
        self.s = s

    def __cuda_stream__(self):
        return (0, self.s.cuda_stream)


def test_entries_exact_with_every_stream_form(channel):
    s = torch.cuda.Stream()
    xs = [torch.randn(1000, device="cuda"), torch.arange(77, device="cuda", dtype=torch.int64),
          torch.randn(4, 33, device="cuda").to(torch.bfloat16)]
    torch.cuda.synchronize()
    forms = [s, s.cuda_stream, CudaStreamProtocol(s), None]
    expected = []
    with torch.cuda.stream(s):
        for form in forms:
            channel.begin_forward(form)
            for h, x in enumerate(xs):
                channel.capture(h, x, form)
                expected.append((h, x.view(torch.uint8).cpu().numpy().tobytes()
                                 if x.dtype != torch.bfloat16 else x.view(torch.int16).cpu().numpy().tobytes()))
            channel.end_forward(form)
    got = drain(channel, len(expected))
    for e, (h, b) in zip(got, expected):
        assert e.hook == h and e.numpy().tobytes() == b
    assert channel.close()["clean"]


@pytest.mark.parametrize("inference", [False, True])
def test_channel_capture_deferred_holds_checks_and_releases_torch_tensors(inference):
    # Channel.capture_deferred with CUDA tensors (the eager path of ferry.hooks' presets): a temporary whose
    # only reference is the binding's is held until its gather was enqueued (entries exact although its memory
    # is reused after), the binding's reference is dropped at the flush (refcount back), a write in place
    # before the flush is refused naming the hook (a tensor with a version counter), and an inference tensor
    # (no counter) is captured unchecked
    import sys

    s = torch.cuda.Stream()
    mode = torch.inference_mode() if inference else torch.no_grad()
    channel = ferry.Channel(0, ring_bytes=4 << 20, publish_every=4, backend="cuda", tuning={"gather_batch": 4})
    with mode, torch.cuda.stream(s):
        keep = torch.randn(256, device="cuda")
        base = sys.getrefcount(keep)
        channel.begin_forward(s)
        want = []
        for h in range(3):  # temporaries: nothing but the binding holds them
            t = torch.full((512,), float(h + 1), device="cuda")
            want.append(t.cpu().numpy().tobytes())
            channel.capture_deferred(h, t, s)
            del t
        channel.capture_deferred(3, keep, s)  # the 4th fills the gather batch (tuning gather_batch 4): flushed
        assert channel.deferred_pending == 0 and sys.getrefcount(keep) == base
        junk = [torch.full((512,), -7.0, device="cuda") for _ in range(8)]  # may reuse the freed memory
        want.append(keep.cpu().numpy().tobytes())
        channel.end_forward(s)
        got = drain(channel, 4)
        assert [e.numpy().tobytes() for e in got] == want
        del junk
        channel.begin_forward(s)
        channel.capture_deferred(9, keep, s)
        assert sys.getrefcount(keep) == base + 1  # held while pending
        keep.add_(1)  # written in place before its flush
        if inference:
            channel.end_forward(s)  # no counter: not checked
            assert drain(channel, 1)[0].hook == 9
        else:
            with pytest.raises(ferry.LogicError, match="deferred hook 9 was written in place"):
                channel.end_forward(s)
            assert channel.abort_forward(s) is True
            assert channel.poll(10, timeout=0.2) == []
        assert sys.getrefcount(keep) == base
    assert channel.close()["clean"]


def test_collector_on_cuda_tensors_exact_and_in_place_writes_refused(channel):
    import ferry.hooks as fh
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        xs = [torch.randn(1000, device="cuda"), torch.randn(4, 33, device="cuda").to(torch.bfloat16),
              torch.randn(8, 8, device="cuda").t(), torch.arange(77, device="cuda")]
        col = fh.Collector(channel, deferred=[0, 1, 2])  # 3: immediate (the collected ones handed over first)
        with col.forward(tag=4):
            for h, x in enumerate(xs):
                col(h, x)
        want = [x.contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes() for x in xs]
        got = drain(channel, len(xs))
        assert [(e.hook, e.tag, e.tobytes()) for e in got] == [(h, 4, w) for h, w in enumerate(want)]
        for e in got:
            e.release()
        y = torch.ones(64, device="cuda")
        col.begin_forward()
        col(2, y)
        y.add_(1)  # written in place after its hook, before the hand-over
        with pytest.raises(ferry.LogicError, match=r"hook 2 \(item 0\): expected the tensor as it was at its hook"):
            col.end_forward()
        assert channel.abort_forward(None) in (True, False)
    assert channel.close()["clean"]


def test_ferry_stream_and_cpu_tensor_refused(channel):
    s = ferry.Stream(0, backend="cuda")
    assert isinstance(s.__cuda_stream__()[1], int)
    channel.begin_forward(s)
    with pytest.raises(ferry.LogicError, match="host array where a device tensor is needed"):
        channel.capture(1, torch.zeros(16), s)
    with pytest.raises(ferry.LogicError, match="C-contiguous"):
        channel.capture(1, torch.zeros(16, 16, device="cuda").t(), s)
    with pytest.raises(ferry.LogicError, match="default stream"):
        channel.capture(1, torch.zeros(16, device="cuda"), 0)
    channel.capture(2, torch.ones(16, device="cuda"), s)
    channel.end_forward(s)
    (e,) = drain(channel, 1)
    assert e.hook == 2 and (e.numpy().view(np.float32) == 1).all()


@pytest.mark.parametrize("programmatic", [True, False])
def test_torch_cuda_graph_replay_with_plan(programmatic):
    # both launch forms of ferry's kernels inside torch's graph: programmatic dependent launches (sm_90+) and
    # plain ones
    channel = ferry.Channel(0, ring_bytes=4 << 20, publish_every=4, backend="cuda", tuning={"programmatic_launch": programmatic})
    sm90 = torch.cuda.get_device_capability()[0] >= 9
    assert channel.programmatic_launch == (programmatic and sm90)
    s = torch.cuda.Stream()
    x = torch.zeros(256, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        x.add_(0)
    torch.cuda.synchronize()
    with torch.cuda.graph(g, stream=s):
        y = x * 2
        channel.begin_forward(s)
        channel.capture(1, x, s)
        channel.capture(2, y, s)
        plan = channel.end_forward(s)
    assert len(plan) == 2
    for step in range(5):
        x.fill_(step)
        torch.cuda.synchronize()
        channel.plan(plan)
        g.replay()
        got = drain(channel, 2)
        assert (got[0].numpy().view(np.float32) == step).all()
        assert (got[1].numpy().view(np.float32) == 2 * step).all()
    assert channel.close()["clean"]


def test_typed_entries_and_poll_batch_over_graph_replays():
    # the channel's schema on CUDA: entries of a replayed torch.cuda.graph come back as typed CPU views of the
    # pinned staging (bf16 as torch.bfloat16, f32 [rows, 2, 8]), popped as one EntryBatch per replay
    x = torch.zeros(4, 2, 8, device="cuda")
    schema = {0: ("resid", x.to(torch.bfloat16)), 1: ("q", x)}
    channel = ferry.Channel(0, ring_bytes=4 << 20, publish_every=4, backend="cuda", schema=schema)
    assert channel.schema == {0: ("resid", "BF16", (2, 8)), 1: ("q", "F32", (2, 8))}
    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        x.add_(0)
    torch.cuda.synchronize()
    with torch.cuda.graph(g, stream=s):
        y = x.to(torch.bfloat16)
        channel.begin_forward(s)
        channel.capture(0, y, s)
        channel.capture(1, x, s)
        plan = channel.end_forward(s)
    for step in range(5):
        x.copy_(torch.randn(4, 2, 8, device="cuda"))
        torch.cuda.synchronize()
        channel.plan(plan, tag=100 + step)
        g.replay()
        torch.cuda.synchronize()
        got = 0
        while got < 2:
            with channel.poll_batch(2 - got, timeout=5.0) as batch:
                assert (batch.tags == 100 + step).all() and batch.ok.all()
                for i in range(len(batch)):
                    t = batch.tensor(i)
                    want = (y if batch.hooks[i] == 0 else x).cpu()
                    assert t.dtype == want.dtype and t.shape == want.shape and torch.equal(t, want)
                    del t
                got += len(batch)
    assert channel.close()["clean"]


def test_publisher_into_a_torch_tensor():
    s = torch.cuda.Stream()
    dst = torch.full((64,), -1, dtype=torch.int32, device="cuda")
    pub = ferry.Publisher(0, backend="cuda")
    ids = pub.declare("input_ids", ["tokens"], np.int32, 64, dst=dst)
    pos = pub.declare("positions", ["tokens"], np.int64, 64)
    with pytest.raises(ferry.LogicError, match="dtype int64, got int32"):
        pub.declare("bad", ["tokens"], np.int64, 64, dst=dst)
    with pytest.raises(ferry.LogicError, match="host array where a device tensor is needed"):
        pub.declare("bad", ["tokens"], np.int32, 64, dst=torch.zeros(64, dtype=torch.int32))
    pub.initialize(2, s)
    for step in range(4):
        n = 5 + step
        with pub.begin(step % 2):
            with pub.producer("tokens") as p:
                p.write(ids, np.arange(n, dtype=np.int32) + step)
                p.write(pos, np.arange(n, dtype=np.int64) * 2)
            pub.publish("tokens", s)
        s.synchronize()
        assert dst[:n].tolist() == list(range(step, step + n)) and (dst[n:] == -1).all()
        assert torch.from_dlpack(pub.device_array(pos))[:n].tolist() == [2 * i for i in range(n)]
