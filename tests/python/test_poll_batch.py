# SPDX-License-Identifier: Apache-2.0
# Channel.poll_batch and ferry.EntryBatch (the batch consumer), host backend: columns and zero-copy views
# byte-exact against the captured arrays (typed by the channel's schema), one release() for all the staging
# (a capture that could not get ring space gets it), use after release, the timeout, the wait without the GIL,
# a channel closed while a batch is held, and a consumer loop of 10^5 entries that leaks nothing.
import gc
import threading
import time
import tracemalloc

import numpy as np
import pytest

import ferry


def _batch(ch, n, timeout=5.0):
    """One EntryBatch of exactly n entries, taken once every captured entry was delivered."""
    deadline = time.monotonic() + timeout
    while ch.stats()["entries_drained"] < ch.stats()["entries_reserved"] and time.monotonic() < deadline:
        time.sleep(0.001)
    b = ch.poll_batch(n, timeout=max(0.0, deadline - time.monotonic()))
    assert len(b) == n, f"expected {n} entries, got {len(b)}"
    return b


def test_columns_and_views_are_byte_exact(make_channel, stream):
    ch = make_channel(ring_bytes=1 << 20, schema={0: ("embed", np.float32, (4,)), 2: ("ids", np.int64, ())})
    want = []
    for f in range(3):
        ch.begin_forward(stream, tag=500 + f)
        for hook, x in ((0, np.arange(8, dtype=np.float32).reshape(2, 4) + f),
                        (1, np.arange(5 + f, dtype=np.uint8)),  # undeclared: bytes
                        (2, np.arange(3, dtype=np.int64) * (f + 1))):
            ch.capture(hook, x, stream)
            want.append((f, hook, x))
        ch.end_forward(stream)
    b = _batch(ch, 9)
    assert isinstance(b, ferry.EntryBatch) and len(b) == 9
    np.testing.assert_array_equal(b.hooks, [h for _, h, _ in want])
    assert b.hooks.dtype == np.uint32 and b.seqs.dtype == np.uint64 and b.ok.dtype == np.bool_
    np.testing.assert_array_equal(b.seqs, np.arange(9))
    np.testing.assert_array_equal(b.sizes, [x.nbytes for _, _, x in want])
    np.testing.assert_array_equal(b.tags, [500 + f for f, _, _ in want])
    np.testing.assert_array_equal(b.forwards, [f for f, _, _ in want])
    np.testing.assert_array_equal(b.rows, np.zeros(9))
    assert b.ok.all()
    assert not b.hooks.flags.writeable
    for i, (v, (_, hook, x)) in enumerate(zip(b, want)):  # iteration: the views, in order
        assert v.dtype == (np.uint8 if hook == 1 else x.dtype) and not v.flags.writeable
        np.testing.assert_array_equal(v if hook != 1 else v.view(x.dtype), x)
        assert b[i].__array_interface__["data"][0] == v.__array_interface__["data"][0], "views, not copies"
        assert b.view(i).tobytes() == x.tobytes()
    np.testing.assert_array_equal(b[-1], want[-1][2])
    with pytest.raises(IndexError, match="index 9 outside a batch of 9 entries"):
        b[9]
    torch = pytest.importorskip("torch")
    t = b.tensor(0)
    assert t.dtype == torch.float32 and tuple(t.shape) == (2, 4) and t.data_ptr() == b[0].__array_interface__["data"][0]
    del t, v
    b.release()


def test_release_gives_all_the_staging_back_at_once(make_channel, stream):
    ring = 1 << 16
    ch = make_channel(ring_bytes=ring, staging_bytes=ring, on_full="fail_fast")
    x = np.arange(ring // 4 // 8, dtype=np.float64)  # a quarter of the ring

    def forward(step):
        ch.begin_forward(stream)
        for h in range(4):
            ch.capture(h, x + step, stream)
        ch.end_forward(stream)

    forward(0)
    held = _batch(ch, 4)  # holds the whole staging
    forward(1)  # the ring fills: the drain has no staging to copy it into
    time.sleep(0.05)
    assert ch.stats()["entries_drained"] == 4
    ch.begin_forward(stream)
    with pytest.raises(ferry.OutOfMemory):
        ch.capture(0, x, stream)  # no ring space while the batch holds the staging
    ch.abort_forward(stream)
    view = held[3]
    held.release()  # one call: the four entries' staging
    assert held.released
    np.testing.assert_array_equal(view.view(np.float64), x)  # a view taken before stays valid (it holds the staging)
    del view
    second = _batch(ch, 4)
    np.testing.assert_array_equal(second[0].view(np.float64), x + 1)
    second.release()
    forward(2)  # ring space again
    third = _batch(ch, 4)
    np.testing.assert_array_equal(third.seqs, [8, 9, 10, 11])
    third.release()


def test_a_released_batch_raises_a_logic_error_not_a_crash(make_channel, stream):
    ch = make_channel()
    ch.begin_forward(stream)
    ch.capture(3, np.arange(4, dtype=np.int32), stream)
    ch.end_forward(stream)
    with _batch(ch, 1) as b:  # the with block releases it
        assert b[0].view(np.int32).tolist() == [0, 1, 2, 3]
    assert b.released
    for f in (lambda: b[0], lambda: b.view(0), lambda: b.tensor(0), lambda: list(b)):
        with pytest.raises(ferry.LogicError, match=r"EntryBatch of 1 entries: expected a live batch, got a released one"):
            f()
    assert len(b) == 1 and b.hooks.tolist() == [3] and b.sizes.tolist() == [16], "the columns stay"
    b.release()  # idempotent
    assert "released" in repr(b)


def test_a_timeout_returns_an_empty_batch(make_channel):
    ch = make_channel()
    t0 = time.monotonic()
    b = ch.poll_batch(8, timeout=0.05)
    assert time.monotonic() - t0 >= 0.05
    assert len(b) == 0 and list(b) == [] and b.hooks.shape == (0,) and b.ok.shape == (0,)
    b.release()
    assert len(ch.poll_batch(8, timeout=0.0)) == 0
    with pytest.raises(ferry.LogicError, match="Channel.poll_batch: expected max_entries >= 1, got 0"):
        ch.poll_batch(0)
    with pytest.raises(ferry.LogicError, match="Channel.poll_batch: expected timeout a number of seconds"):
        ch.poll_batch(1, timeout=float("nan"))


def test_the_wait_releases_the_gil(make_channel, stream):
    ch = make_channel()
    got = []
    t = threading.Thread(target=lambda: got.append(ch.poll_batch(4, timeout=None)))  # waits forever
    t.start()
    time.sleep(0.05)  # this thread runs Python meanwhile: the waiting one does not hold the GIL
    ch.begin_forward(stream)
    ch.capture(1, np.ones(4, np.float32), stream)
    ch.end_forward(stream)
    t.join(10.0)
    assert not t.is_alive() and len(got[0]) == 1 and got[0].hooks.tolist() == [1]
    got[0].release()


def test_a_channel_closed_while_a_batch_is_held(make_channel, stream):
    ch = make_channel()
    ch.begin_forward(stream)
    for h in range(3):
        ch.capture(h, np.full(8, h, np.int16), stream)
    ch.end_forward(stream)
    b = _batch(ch, 2)
    ch.close()  # delivered and not polled: one entry left
    np.testing.assert_array_equal(b[1].view(np.int16), np.full(8, 1, np.int16))  # still readable
    rest = ch.poll_batch(8, timeout=1.0)  # the leftovers of a closed channel
    assert rest.hooks.tolist() == [2]
    with pytest.raises(ferry.LogicError, match="Channel.poll_batch: expected an open channel, got a closed one"):
        ch.poll_batch(8, timeout=1.0)
    view = rest[0]
    rest.release()
    del b  # collected after close: its staging goes back without a deadlock
    gc.collect()
    assert view.view(np.int16).tolist() == [2] * 8
    del view


def test_a_channel_with_a_sink_refuses_poll_batch(tmp_path):
    with ferry.sinks.safetensors(tmp_path / "run", {0: ("a", "F32")}) as sink, \
            ferry.Channel(backend="host", ring_bytes=1 << 16, sink=sink) as ch:
        with pytest.raises(ferry.LogicError, match="Channel.poll_batch: expected a channel without a native sink"):
            ch.poll_batch(1)


def test_a_consumer_loop_of_100k_entries_leaks_nothing(make_channel, stream):
    ch = make_channel(ring_bytes=1 << 20, publish_every=256, fifo_capacity=4096,
                      schema={h: (f"h{h}", np.float32, (4,)) for h in range(8)})
    src = [np.full((1, 4), h, np.float32) for h in range(8)]
    per_forward, forwards = 1000, 100
    total = 0

    def one_forward(f):
        nonlocal total
        ch.begin_forward(stream, tag=f)
        for i in range(per_forward):
            ch.capture(i % 8, src[i % 8], stream)
        ch.end_forward(stream)
        got = 0
        while got < per_forward:
            with ch.poll_batch(4096, timeout=5.0) as b:
                assert len(b) > 0
                assert (b.tags == f).all() and (b.sizes == 16).all()
                k = int(b.seqs[0]) % 8  # entry j of the forward is hook j % 8
                assert b.view(0)[0, 0] == k and b.view(len(b) - 1)[0, 0] == (k + len(b) - 1) % 8
                got += len(b)
        total += got

    for f in range(10):  # warm-up: caches, free lists
        one_forward(f)
    gc.collect()
    tracemalloc.start()
    objects = len(gc.get_objects())
    before = tracemalloc.get_traced_memory()[0]
    for f in range(10, forwards):
        one_forward(f)
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert total == per_forward * forwards == 100_000
    assert grown < 256 << 10, f"{grown} bytes of Python memory kept over 90k entries"
    assert len(gc.get_objects()) - objects < 100, "Python objects kept"
    st = ch.stats()
    assert st["entries_reserved"] == st["entries_drained"] == 100_000, "the FIFO is back to empty"
    rep = ch.close()
    assert rep["clean"] and rep["delivered"] == 100_000
    assert rep["pending_pop"] == 0 and rep["views_held"] == 0, "every batch gave its staging back"
