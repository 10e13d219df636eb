# SPDX-License-Identifier: Apache-2.0
# Attribution and deferred row capture from Python (C++: tests/d2h/attribution.hpp, gather_rows.hpp): a forward's
# tag / requests / meta (begin_forward, plan per replay) on every entry, per-request row views (Entry.rows_of), and
# Channel.capture_rows_deferred (one gather per batch sharing a selection). Host backend (numpy arrays are its
# device memory).
import numpy as np
import pytest

import ferry


def _source(n=32, width=12, salt=0):
    return (np.arange(n * width, dtype=np.float32).reshape(n, width) * 3 + 1 + salt).copy()


def test_a_tagged_forward_gives_every_entry_its_tag_meta_and_request_rows(make_channel, drain):
    ch = make_channel(tuning={"size_slots": 16})
    s = ferry.Stream(backend="host")
    x = _source()
    qsl = np.array([0, 5, 5, 12, 32], dtype=np.int32)  # 4 requests: 5, 0, 7 and 20 tokens
    req = np.array([3, 0, 2], dtype=np.int32)
    ch.begin_forward(s, tag=1000, requests=[103, 100, 102], meta=b"step 1000")
    ch.capture_rows(1, x, query_start_loc=qsl, requests=req, stream=s)
    ch.capture(2, x, stream=s)
    ch.end_forward(s)
    ch.begin_forward(s)  # untagged
    ch.capture_rows(3, x, query_start_loc=qsl, requests=req, window=(1, 3), stream=s)
    ch.end_forward(s)
    a, whole, b = drain(ch, 3)
    assert (a.tag, a.forward, a.meta, a.rows, a.row_bytes) == (1000, 0, b"step 1000", 3, 48)
    assert a.requests == [(103, 0, 1), (100, 1, 1), (102, 2, 1)]
    for rid, row in ((103, 31), (100, 4), (102, 11)):
        v = a.rows_of(rid)
        assert v.shape == (1, 48) and not v.flags.writeable
        np.testing.assert_array_equal(v.view(np.float32), x[[row]])
    assert (whole.tag, whole.rows, whole.row_bytes) == (1000, 0, 0)
    with pytest.raises(ferry.LogicError, match="captured whole"):
        whole.rows_of(103)
    with pytest.raises(ferry.LogicError, match="got request 7"):
        a.rows_of(7)
    assert (b.tag, b.forward, b.meta, b.requests) == (1, 1, None, [])
    view = a.rows_of(100)
    a.release()  # the view keeps the staging
    np.testing.assert_array_equal(view.view(np.float32), x[[4]])
    with pytest.raises(ferry.LogicError, match="after release"):
        a.rows_of(100)
    for e in (whole, b):
        e.release()
    assert ch.close()["clean"]


def test_requests_as_spans_and_bad_metadata_are_typed_errors(make_channel, drain):
    ch = make_channel(tuning={"size_slots": 16})
    s = ferry.Stream(backend="host")
    x = _source()
    with pytest.raises(ferry.LogicError, match="tag an int in"):
        ch.begin_forward(s, tag=-1)
    with pytest.raises(TypeError, match="expected a ferry.Stream"):  # the stream's type first (a fuzz finding)
        ch.begin_forward(object(), tag=-1)
    with pytest.raises(TypeError, match="expected requests a sequence"):
        ch.begin_forward(s, requests="abc")
    with pytest.raises(TypeError, match="an int or a \\(request, first_row, rows\\) tuple"):
        ch.begin_forward(s, requests=[1.5])
    with pytest.raises(TypeError, match="meta a bytes-like"):
        ch.begin_forward(s, meta=5)
    ch.begin_forward(s, tag=7, requests=[(40, 0, 2), (41, 2, 2)], meta=bytearray(b"\x00\x01"))
    ch.capture_rows(1, x, query_start_loc=np.array([0, 10, 32], np.int32), requests=np.array([1, 0], np.int32),
                    window=(3, 5), stream=s)
    ch.end_forward(s)
    (e,) = drain(ch, 1)
    assert e.meta == b"\x00\x01"
    np.testing.assert_array_equal(e.rows_of(40).view(np.float32), x[[13, 14]])
    np.testing.assert_array_equal(e.rows_of(41).view(np.float32), x[[3, 4]])
    e.release()
    assert ch.close()["clean"]


def test_capture_rows_deferred_batches_share_a_selection(make_channel, drain):
    ch = make_channel(publish_every=4, tuning={"size_slots": 64, "gather_batch": 4})  # batches of K, as before
    s = ferry.Stream(backend="host")
    xs = [_source(salt=h) for h in range(10)]
    rows = np.array([31, 0, 7, 7], dtype=np.int32)
    ch.begin_forward(s, tag=5)
    for h, x in enumerate(xs):
        ch.capture_rows_deferred(h, x, rows=rows, stream=s)
    assert ch.deferred_pending == 2  # batches of 4: two batches flushed, two entries recorded
    ch.end_forward(s)
    got = drain(ch, 10)
    for h, e in enumerate(got):
        assert (e.hook, e.ok, e.tag, e.rows) == (h, True, 5, 4)
        np.testing.assert_array_equal(e.numpy().view(np.float32).reshape(-1, 12), xs[h][[31, 0, 7, 7]])
        e.release()
    assert ch.close()["clean"]


def test_graph_replays_carry_the_tag_of_their_plan(make_channel, drain):
    ch = make_channel(tuning={"size_slots": 64})
    s = ferry.Stream(backend="host")
    xs = [_source(salt=h) for h in range(3)]
    idx = np.zeros(8, dtype=np.int32)
    n = np.zeros(1, dtype=np.int32)
    s.begin_capture()
    ch.begin_forward(s)
    for h, x in enumerate(xs):
        ch.capture_rows_deferred(h, x, rows=idx, count=n, max_count=8, stream=s)
    plan = ch.end_forward(s)
    g = s.end_capture()
    rng = np.random.default_rng(5)
    for step in range(5):
        k = [0, 8, 3, 1, 5][step]
        idx[:k] = rng.integers(0, 32, size=k)
        n[0] = k
        ch.plan(plan, s, tag=100 + step, requests=[500 + i for i in range(k)], selected=k if step % 2 else None)
        g.launch(s)
        got = drain(ch, 3)
        for h, e in enumerate(got):
            assert (e.tag, e.forward, e.rows) == (100 + step, step, k)
            # selected=k: the replay reserves exactly its rows (at least 16 bytes); without it, the bound of 8
            assert e.reserved == (max(k * 48, 16) if step % 2 else 8 * 48)
            np.testing.assert_array_equal(e.numpy().view(np.float32).reshape(-1, 12), xs[h][idx[:k]])
            for i in range(k):
                np.testing.assert_array_equal(e.rows_of(500 + i).view(np.float32), xs[h][[idx[i]]])
            e.release()
        s.synchronize()
    assert ch.close()["clean"]


def test_a_torch_selection_written_before_the_deferred_flush_is_refused(make_channel):
    torch = pytest.importorskip("torch")
    ch = make_channel(tuning={"size_slots": 16})
    s = ferry.Stream(backend="host")
    x = torch.arange(32 * 4, dtype=torch.float32).reshape(32, 4)
    rows = torch.tensor([1, 2], dtype=torch.int32)
    ch.begin_forward(s)
    ch.capture_rows_deferred(1, x, rows=rows, stream=s)
    rows.add_(1)  # in place, before the flush
    with pytest.raises(ferry.LogicError, match="written in place"):
        ch.flush(s)
    ch.abort_forward(s)
    ch.close()


def test_a_torch_count_tensor_is_a_device_count_never_an_int(make_channel, drain):
    """count= a one-element torch tensor is read by the kernel (a device count, bound max_count or the items):
    never converted through __index__ (on a CUDA tensor .item(), a sync that invalidates a graph capture)."""
    torch = pytest.importorskip("torch")

    class NoIndex(torch.Tensor):
        def __index__(self):
            raise AssertionError("count converted as an int")

    ch = make_channel(tuning={"size_slots": 16})
    s = ferry.Stream(backend="host")
    x = _source()
    rows = torch.tensor([5, 6, 7, 8], dtype=torch.int32)
    ch.begin_forward(s)
    ch.capture_rows(1, x, rows=rows, count=torch.tensor([2], dtype=torch.int32), stream=s)
    ch.capture_rows(2, x, rows=rows, count=torch.tensor([3], dtype=torch.int32).as_subclass(NoIndex), stream=s)
    ch.end_forward(s)
    a, b = drain(ch, 2)
    assert (a.rows, a.reserved, b.rows) == (2, 4 * 48, 3)  # the bound reserved: the items given
    np.testing.assert_array_equal(a.numpy().view(np.float32).reshape(-1, 12), x[[5, 6]])
    a.release()
    b.release()
    assert ch.close()["clean"]


def test_plan_selected_reserves_exactly_and_a_device_count_above_it_overflows(make_channel, drain):
    """plan(selected=n) reserves n rows per row entry (immediate and deferred) and the replay places them there; a
    device count above n is delivered as not ok (size_overflow, counted), one below it holds its rows."""
    ch = make_channel(tuning={"size_slots": 64})
    s = ferry.Stream(backend="host")
    xs = [_source(salt=h) for h in range(3)]
    idx = np.zeros(8, dtype=np.int32)
    n = np.zeros(1, dtype=np.int32)
    s.begin_capture()
    ch.begin_forward(s)
    ch.capture_rows(0, xs[0], rows=idx, count=n, max_count=8, stream=s)
    for h in (1, 2):
        ch.capture_rows_deferred(h, xs[h], rows=idx, count=n, max_count=8, stream=s)
    plan = ch.end_forward(s)
    g = s.end_capture()
    for selected, k in ((2, 3), (3, 2), (4, 4), (0, 0)):
        idx[:k] = np.arange(k) * 5 + 1
        n[0] = k
        ch.plan(plan, s, selected=selected)
        g.launch(s)
        for h, e in enumerate(drain(ch, 3)):
            if k > selected:  # its reservation: the planned rows' bytes
                assert (e.ok, e.size, e.reserved) == (False, k * 48, selected * 48)
            else:
                assert e.ok and (e.rows, e.reserved) == (k, max(16, selected * 48))
                np.testing.assert_array_equal(e.numpy().view(np.float32).reshape(-1, 12), xs[h][idx[:k]])
            e.release()
        s.synchronize()
    assert ch.stats()["size_overflows"] == 3
    assert ch.close()["clean"]


def test_plan_selected_above_the_reservation_is_refused(make_channel):
    ch = make_channel(tuning={"size_slots": 64})
    s = ferry.Stream(backend="host")
    x = _source()
    idx = np.zeros(4, dtype=np.int32)
    n = np.zeros(1, dtype=np.int32)
    s.begin_capture()
    ch.begin_forward(s)
    ch.capture_rows_deferred(0, x, rows=idx, count=n, max_count=4, stream=s)
    plan = ch.end_forward(s)
    s.end_capture()
    with pytest.raises(ferry.LogicError, match="at most the 4 items"):
        ch.plan(plan, s, selected=5)
    with pytest.raises(TypeError, match="selected an int"):
        ch.plan(plan, s, selected="5")
    with pytest.raises(ferry.LogicError, match="selected"):
        ch.plan(plan, s, selected=-1)
    ch.close()
