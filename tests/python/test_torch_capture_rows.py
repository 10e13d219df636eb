# SPDX-License-Identifier: Apache-2.0
# torch.ops.ferry.capture_rows (ferry.torch_ops): eager on CPU tensors (host backend) and under
# torch.compile(fullgraph=True) with no graph break; every delivered row compared with the source rows.
import pytest
from conftest import _drain

import ferry

torch = pytest.importorskip("torch")
fto = pytest.importorskip("ferry.torch_ops", reason="ferry built without the torch op library")


def _rows(e, width):
    data = e.tobytes()
    if not data:  # an empty selection: an entry of 0 rows
        return torch.empty(0, width)
    return torch.frombuffer(bytearray(data), dtype=torch.float32).reshape(-1, width)


def test_eager_rows_last_token_window_and_device_count(make_channel, stream):
    ch = make_channel(tuning={"size_slots": 16})
    x = torch.randn(20, 6)
    qsl = torch.tensor([0, 4, 9, 20], dtype=torch.int32)
    req = torch.tensor([2, 0], dtype=torch.int32)
    idx = torch.tensor([19, 3, 3], dtype=torch.int64)
    n = torch.tensor([2], dtype=torch.int32)
    tok = fto.token()
    ch.begin_forward(stream)
    fto.capture_rows(tok, x, ch, 1, idx)
    fto.capture_rows(tok, x, ch, 2, req, query_start_loc=qsl)
    fto.capture_rows(tok, x, ch, 3, req, query_start_loc=qsl, window=(1, 3))
    fto.capture_rows(tok, x, ch, 4, idx, count=n, max_count=3)
    ch.end_forward(stream)
    got = {e.hook: e for e in _drain(ch, 4)}
    want = {1: x[[19, 3, 3]], 2: x[[19, 3]], 3: x[[10, 11, 1, 2]], 4: x[[19, 3]]}
    for hook, rows in want.items():
        assert torch.equal(_rows(got[hook], 6), rows), hook
        got[hook].release()
    assert ch.close()["clean"]


def test_bad_selection_is_a_typed_error(make_channel, stream):
    ch = make_channel(tuning={"size_slots": 16})
    ch.begin_forward(stream)
    with pytest.raises(ferry.LogicError, match="int32 or int64 selection"):
        fto.capture_rows(fto.token(), torch.randn(4, 2), ch, 1, torch.tensor([1.0]))
    ch.end_forward(stream)


def test_torch_compile_fullgraph_keeps_capture_rows(make_channel, stream):
    ch = make_channel(tuning={"size_slots": 16})
    handle = ch.handle

    def f(tok, x, idx):
        h = x * 2
        torch.ops.ferry.capture_rows(tok, h, idx, None, None, handle, 5, 0, 0, 0)
        return h + 1

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    x = torch.randn(8, 4)
    idx = torch.tensor([7, 0], dtype=torch.int32)
    ch.begin_forward(stream)
    out = torch.compile(f, backend=backend, fullgraph=True)(fto.token(), x, idx)
    ch.end_forward(stream)
    assert len(graphs) == 1 and torch.allclose(out, x * 2 + 1)
    ops = (torch.ops.ferry.capture_rows, torch.ops.ferry.capture_rows.default)
    assert sum(n.target in ops for n in graphs[0].graph.nodes) == 1
    (e,) = _drain(ch, 1)
    assert torch.equal(_rows(e, 4), (x * 2)[[7, 0]])
    e.release()


@pytest.mark.skipif("cuda" not in ferry.available_backends() or not torch.cuda.is_available(),
                    reason="needs the CUDA backend and a GPU")
def test_cuda_graph_replays_capture_the_rows_of_their_step():
    # torch.cuda.graph records the op; the selection (indices and a device count) keeps its address and its
    # contents change before every replay; Channel.plan(plan) arms the replay on torch's current stream
    ch = ferry.Channel(0, ring_bytes=4 << 20, backend="cuda", tuning={"size_slots": 64})
    s = torch.cuda.Stream()
    x = torch.randn(256, 128, device="cuda")
    idx = torch.zeros(256, dtype=torch.int32, device="cuda")
    n = torch.zeros(1, dtype=torch.int32, device="cuda")
    tok = fto.token("cuda")
    g = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(g, stream=s):
        h = x * 3
        ch.begin_forward(s)
        fto.capture_rows(tok, h, ch, 7, idx, count=n, max_count=256)
        plan = ch.end_forward(s)
    gen = torch.Generator().manual_seed(5)
    for step, k in enumerate([16, 0, 256, 1, 31]):
        rows = torch.randint(0, 256, (k,), generator=gen, dtype=torch.int32)
        idx[:k].copy_(rows)
        n.fill_(k)
        torch.cuda.synchronize()
        ch.plan(plan)
        g.replay()
        (e,) = _drain(ch, 1)
        assert e.ok, step
        assert torch.equal(_rows(e, 128), (x * 3).cpu()[rows.long()]), step
        e.release()
    assert ch.close()["clean"]
