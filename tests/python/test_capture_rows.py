# SPDX-License-Identifier: Apache-2.0
# Channel.capture_rows (C++: tests/d2h/select_rows.hpp): the rows a selection names, eagerly and in graph
# replays, every delivered row compared with the source rows. Host backend (numpy arrays are its device memory).
import numpy as np
import pytest

import ferry


def _source(n=32, width=12):
    return (np.arange(n * width, dtype=np.float32).reshape(n, width) * 3 + 1).copy()


def test_rows_last_token_and_window_hold_the_selected_rows(make_channel, drain):
    ch = make_channel(tuning={"size_slots": 16})
    s = ferry.Stream(backend="host")
    x = _source()
    rows = np.array([4, 31, 0, 4], dtype=np.int64)
    qsl = np.array([0, 5, 5, 12, 32], dtype=np.int32)  # 4 requests: 5, 0, 7 and 20 tokens
    last = np.array([3, 0, 2], dtype=np.int32)
    win = np.array([2, 3], dtype=np.int32)
    ch.begin_forward(s)
    ch.capture_rows(1, x, rows=rows, stream=s)
    ch.capture_rows(2, x, query_start_loc=qsl, requests=last, stream=s)
    ch.capture_rows(3, x, query_start_loc=qsl, requests=win, window=(1, 4), stream=s)
    ch.capture_rows(4, x, rows=rows, count=2, stream=s)
    ch.capture_rows(5, x, rows=rows, count=np.array([3], dtype=np.int32), stream=s)  # a "device" count
    rows[:] = 7  # after the call: the host backend read the selection at the call, as stream order does on a GPU
    ch.end_forward(s)
    got = {e.hook: e for e in drain(ch, 5)}
    want = {1: x[[4, 31, 0, 4]], 2: x[[31, 4, 11]], 3: x[[6, 7, 8, 13, 14, 15]], 4: x[[4, 31]], 5: x[[4, 31, 0]]}
    for hook, rows_wanted in want.items():
        e = got[hook]
        assert e.ok, hook
        np.testing.assert_array_equal(e.numpy().view(np.float32).reshape(-1, 12), rows_wanted)
        e.release()
    assert ch.close()["clean"]


def test_a_selection_the_kernel_refuses_is_delivered_as_failed_and_counted(make_channel, drain):
    ch = make_channel(tuning={"size_slots": 16})
    s = ferry.Stream(backend="host")
    x = _source()
    ch.begin_forward(s)
    ch.capture_rows(1, x, rows=np.array([1, 40], dtype=np.int32), stream=s)  # 40 is outside [0, 32)
    ch.capture_rows(2, x, rows=np.array([2], dtype=np.int32), stream=s)
    ch.end_forward(s)
    bad, good = drain(ch, 2)
    assert not bad.ok and good.ok
    with pytest.raises(ferry.Error, match="row selection was refused"):
        bad.numpy()
    np.testing.assert_array_equal(good.numpy().view(np.float32).reshape(-1, 12), x[[2]])
    good.release()
    bad.release()
    assert ch.stats()["selection_errors"] == 1


def test_bad_arguments_are_typed_errors(make_channel):
    ch = make_channel(tuning={"size_slots": 16})
    s = ferry.Stream(backend="host")
    x = _source()
    ch.begin_forward(s)
    with pytest.raises(TypeError, match="either rows="):
        ch.capture_rows(1, x, stream=s)
    with pytest.raises(TypeError, match="1-D int32 or int64"):
        ch.capture_rows(1, x, rows=np.array([1.0], dtype=np.float32), stream=s)
    with pytest.raises(TypeError, match="unexpected keyword 'rowz'"):
        ch.capture_rows(1, x, rowz=np.array([1], dtype=np.int32), stream=s)
    with pytest.raises(ferry.LogicError, match="window 0 <= begin < end"):
        ch.capture_rows(1, x, query_start_loc=np.array([0, 4], np.int32), requests=np.array([0], np.int32),
                        window=(3, 3), stream=s)
    ch.end_forward(s)


def test_graph_replays_read_the_selection_of_their_step(make_channel, drain):
    ch = make_channel(tuning={"size_slots": 16})
    s = ferry.Stream(backend="host")
    x = _source()
    idx = np.zeros(32, dtype=np.int32)
    n = np.zeros(1, dtype=np.int32)
    s.begin_capture()
    ch.begin_forward(s)
    ch.capture_rows(9, x, rows=idx, count=n, max_count=32, stream=s)
    plan = ch.end_forward(s)
    g = s.end_capture()
    rng = np.random.default_rng(3)
    for step in range(6):
        k = [0, 32, 5, 1, 17, 9][step]
        idx[:k] = rng.integers(0, 32, size=k)
        n[0] = k
        ch.plan(plan, s)
        g.launch(s)
        (e,) = drain(ch, 1)
        assert e.ok
        np.testing.assert_array_equal(e.numpy().view(np.float32).reshape(-1, 12), x[idx[:k]])
        e.release()
        s.synchronize()


def test_row_capture_needs_no_size_slots_and_gathers_apart_from_k(make_channel, drain):
    # issue 39: the size ring is derived (one slot per FIFO slot), so capture_rows and capture_rows_deferred work
    # with no tuning; the deferred rows are gathered tuning["gather_batch"] at a time (default 128), not per K
    ch = make_channel(publish_every=4)
    s = ferry.Stream(backend="host")
    x = _source()
    rows = np.array([3, 1, 30], dtype=np.int32)
    ch.begin_forward(s)
    ch.capture_rows(1, x, rows=rows, stream=s)
    for hook in range(10, 20):
        ch.capture_rows_deferred(hook, x, rows=rows, stream=s)
    assert ch.deferred_pending == 10  # past K = 4: one batch (the default gather holds 128)
    ch.end_forward(s)
    got = drain(ch, 11)
    assert [e.hook for e in got] == [1] + list(range(10, 20))
    for e in got:
        np.testing.assert_array_equal(e.numpy().view(np.float32).reshape(-1, 12), x[[3, 1, 30]])
        e.release()
    assert ch.close()["clean"]
