# SPDX-License-Identifier: Apache-2.0
# torch.ops.ferry.capture_rows (ferry.torch_ops): eager on CPU tensors (host backend) and under
# torch.compile(fullgraph=True) with no graph break; every delivered row compared with the source rows.
import pytest
from conftest import _drain

import ferry

torch = pytest.importorskip("torch")
fto = pytest.importorskip("ferry.torch_ops", reason="ferry built without the torch op library")


def _rows(e, width):
    return torch.frombuffer(bytearray(e.tobytes()), dtype=torch.float32).reshape(-1, width)


def test_eager_rows_last_token_window_and_device_count(make_channel, stream):
    ch = make_channel(size_slots=16)
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
    ch = make_channel(size_slots=16)
    ch.begin_forward(stream)
    with pytest.raises(ferry.LogicError, match="int32 or int64 selection"):
        fto.capture_rows(fto.token(), torch.randn(4, 2), ch, 1, torch.tensor([1.0]))
    ch.end_forward(stream)


def test_torch_compile_fullgraph_keeps_capture_rows(make_channel, stream):
    ch = make_channel(size_slots=16)
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
