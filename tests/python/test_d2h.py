# SPDX-License-Identifier: Apache-2.0
# ferry.Channel on the host backend: every call, entries byte-exact against numpy, poll batching,
# view lifetime, graph plans, and staging reuse over 10^5 entries.
import gc
import time

import numpy as np
import pytest

import ferry


def test_channel_is_a_host_channel_and_reports_its_config(make_channel):
    ch = make_channel(ring_bytes=1 << 16, publish_every=4)
    assert isinstance(ch, ferry.Channel)
    assert ch.backend == "host" and ch.device == 0 and not ch.closed and not ch.invalidated
    st = ch.stats()
    assert st["entries_reserved"] == 0 and st["entries_drained"] == 0


def test_entries_are_byte_exact_in_order(make_channel, stream, drain):
    ch = make_channel(ring_bytes=1 << 16, publish_every=3)
    rng = np.random.default_rng(7)
    arrays = [
        rng.integers(0, 255, size=1, dtype=np.uint8),
        rng.standard_normal(15).astype(np.float32),
        rng.integers(-(1 << 40), 1 << 40, size=(4, 5), dtype=np.int64),
        rng.standard_normal((3, 7, 2)).astype(np.float16),
        np.arange(1000, dtype=np.int32),
        np.full(16, 3, dtype=np.uint8),
    ]
    expected = []
    for f in range(4):
        ch.begin_forward(stream)
        for h, a in enumerate(arrays):
            a = a + f if a.dtype != np.uint8 else a ^ np.uint8(f)
            ch.capture(h, a, stream)
            expected.append((h, a.tobytes()))
        plan = ch.end_forward(stream)
        assert len(plan) == 0  # eager forward: no plan
    got = drain(ch, len(expected))
    assert [e.seq for e in got] == list(range(len(expected)))
    for e, (h, b) in zip(got, expected):
        assert e.hook == h and e.size == len(b) and e.ok
        assert e.numpy().tobytes() == b
        assert e.tobytes() == b
        assert e.numpy().dtype == np.uint8 and not e.numpy().flags.writeable
    report = ch.close()
    assert report["clean"] and report["delivered"] == len(expected)


def test_typed_view_of_an_entry(make_channel, stream, drain):
    ch = make_channel()
    x = np.linspace(0, 1, 64, dtype=np.float32).reshape(8, 8)
    ch.begin_forward(stream)
    ch.capture(9, x, stream)
    ch.end_forward(stream)
    (e,) = drain(ch, 1)
    np.testing.assert_array_equal(e.numpy().view(np.float32).reshape(8, 8), x)


def test_poll_batches(make_channel, stream):
    ch = make_channel(publish_every=2)
    x = np.arange(32, dtype=np.uint8)
    ch.begin_forward(stream)
    for h in range(10):
        ch.capture(h, x, stream)
    ch.end_forward(stream)
    deadline = time.monotonic() + 5
    while ch.stats()["entries_drained"] < 10:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    sizes = []
    while sum(sizes) < 10:
        sizes.append(len(ch.poll(max_entries=3, timeout=1.0)))
    assert sizes == [3, 3, 3, 1]
    t0 = time.monotonic()
    assert ch.poll(5, timeout=0.0) == []
    assert time.monotonic() - t0 < 0.5
    t0 = time.monotonic()
    assert ch.poll(5, timeout=0.05) == []
    assert time.monotonic() - t0 >= 0.05


def test_views_outliving_release(make_channel, stream, drain):
    ch = make_channel()
    x = np.arange(256, dtype=np.uint8)
    ch.begin_forward(stream)
    ch.capture(1, x, stream)
    ch.end_forward(stream)
    (e,) = drain(ch, 1)
    v = e.numpy()
    assert e.views == 1
    e.release()
    assert e.released
    # the view holds the staging: still the entry's bytes
    assert v.tobytes() == x.tobytes()
    with pytest.raises(ferry.LogicError, match="released"):
        e.numpy()
    with pytest.raises(ferry.LogicError, match="released"):
        e.tobytes()
    e.release()  # idempotent
    del v


def test_entry_as_context_manager_releases(make_channel, stream, drain):
    ch = make_channel()
    ch.begin_forward(stream)
    ch.capture(1, np.zeros(8, np.uint8), stream)
    ch.end_forward(stream)
    (e,) = drain(ch, 1)
    with e:
        assert e.numpy().sum() == 0
    assert e.released


def test_held_views_hold_staging_and_gc_gives_it_back(make_channel, stream, drain):
    # staging for exactly 4 entries of 1 KiB: views kept alive stop the drain, dropping them resumes it
    ch = make_channel(ring_bytes=8 << 10, staging_bytes=4 << 10, publish_every=1)
    x = np.arange(1024, dtype=np.uint16).astype(np.uint8)
    ch.begin_forward(stream)
    for h in range(4):
        ch.capture(h, x, stream)
    ch.end_forward(stream)
    held = [e.numpy() for e in drain(ch, 4)]  # the entries die here; their views hold staging
    ch.begin_forward(stream)
    for h in range(4):
        ch.capture(10 + h, x, stream)
    ch.end_forward(stream)
    time.sleep(0.05)
    assert ch.poll(8, timeout=0.05) == []  # staging full: nothing copied
    assert ch.stats()["entries_drained"] == 4
    del held
    gc.collect()
    more = drain(ch, 4)
    assert [e.hook for e in more] == [10, 11, 12, 13]
    assert all(e.numpy().tobytes() == x.tobytes() for e in more)


def test_no_staging_leak_over_1e5_entries(make_channel, stream):
    # ring and staging hold 256 entries of 64 bytes: 10^5 entries reuse them about 400 times, so one
    # leaked view per entry would stop the drain (TimeoutError) within the first few forwards
    ch = make_channel(ring_bytes=16 << 10, staging_bytes=16 << 10, publish_every=16, timeout=10.0)
    x = np.arange(64, dtype=np.uint8)
    total, per_forward, seen = 100_000, 100, 0
    for f in range(total // per_forward):
        ch.begin_forward(stream)
        for h in range(per_forward):
            ch.capture(h, x, stream)
        ch.end_forward(stream)
        while seen < f * per_forward:  # at most two forwards in flight
            for e in ch.poll(1024, timeout=5.0):
                v = e.numpy()  # a view, dropped with the entry at the end of the iteration
                if e.seq % 997 == 0:
                    assert v.tobytes() == x.tobytes()
                seen += 1
    while seen < total:
        got = ch.poll(4096, timeout=5.0)
        assert got
        seen += len(got)
    report = ch.close()
    assert report["clean"] and report["delivered"] == total


def test_graph_plan_replays(make_channel, stream, drain):
    ch = make_channel(publish_every=2)
    a = np.zeros(40, dtype=np.int32)
    b = np.zeros(7, dtype=np.float64)
    stream.begin_capture()
    ch.begin_forward(stream)
    ch.capture(1, a, stream)
    ch.capture(2, b, stream)
    ch.capture(3, a, stream)
    plan = ch.end_forward(stream)
    graph = stream.end_capture()
    assert isinstance(plan, ferry.Plan) and isinstance(graph, ferry.Graph)
    assert len(plan) == 3 and [h for h, _, _ in plan.entries] == [1, 2, 3]
    for r in range(3):
        a[:] = np.arange(40) * (r + 1)
        b[:] = r + 0.5
        ch.plan(plan)
        graph.launch(stream)
        got = drain(ch, 3)
        assert [e.hook for e in got] == [1, 2, 3]
        assert got[0].numpy().tobytes() == a.tobytes() and got[2].numpy().tobytes() == a.tobytes()
        assert got[1].numpy().tobytes() == b.tobytes()
        stream.synchronize()
    assert ch.close()["clean"]


@pytest.mark.parametrize("end", ["close", "drop"])
def test_graph_launch_after_its_channel_closed_is_refused_not_a_write_into_freed_memory(make_channel, stream, drain,
                                                                                         end):
    # Graph.launch after its channel closed (or was dropped) wrote the freed channel state (claim_replay_body;
    # valgrind: invalid writes; found by the fuzzer): the graph knows the channels whose work it captured, and a
    # launch after one of them closed is a LogicError naming it, with nothing enqueued
    ch = ferry.Channel(backend="host", ring_bytes=1 << 16, publish_every=2)  # not the fixture's: dropped below
    other = make_channel()  # a channel the graph did not capture: closing it changes nothing
    a = np.arange(40, dtype=np.int32)
    stream.begin_capture()
    ch.begin_forward(stream)
    ch.capture(1, a, stream)
    plan = ch.end_forward(stream)
    graph = stream.end_capture()
    other.close()
    ch.plan(plan)
    graph.launch(stream)
    (e,) = drain(ch, 1)
    assert e.tobytes() == a.tobytes()
    e.release()
    name = f"Channel\\(host, device 0, handle {ch.handle}\\)"
    if end == "close":
        assert ch.close()["clean"]
        how = "closed"
    else:
        del ch  # the last reference: the channel is destroyed (its destructor closes it)
        gc.collect()
        how = "destroyed"
    for _ in range(2):
        with pytest.raises(ferry.LogicError, match=rf"Graph.launch: expected every channel and publisher whose work "
                                                   rf"the graph captured alive, got {name} ({how})"):
            graph.launch(stream)
    stream.synchronize()


def test_graph_of_an_eager_forward_whose_stream_began_a_capture_is_refused_after_close(make_channel, stream):
    # the documented misuse (an eager forward whose stream began a capture) records the channel's kernels into
    # the graph too: that graph is refused after the close as well
    ch = make_channel(publish_every=16)
    ch.begin_forward(stream)
    stream.begin_capture()
    ch.capture(1, np.ones(8, np.uint8), stream)
    with pytest.raises(ferry.LogicError, match="capture state"):
        ch.end_forward(stream)
    graph = stream.end_capture()
    ch.abort_forward(stream)
    try:
        ch.close(timeout=0.5)
    except ferry.Error:
        pass
    with pytest.raises(ferry.LogicError, match=r"Graph.launch: .* got Channel\(host, device 0, handle \d+\) closed"):
        graph.launch(stream)
    stream.synchronize()


def test_a_refused_second_begin_capture_keeps_the_graph_ties(stream):
    # found by the fuzzer in the fix above: a begin_capture refused (already capturing) dropped the ties of the
    # capture in progress, and the graph then launched after its channel was destroyed
    ch = ferry.Channel(backend="host", ring_bytes=1 << 16)
    stream.begin_capture()
    with pytest.raises(ferry.BackendError, match="already capturing"):
        stream.begin_capture()
    ch.begin_forward(stream)
    ch.capture(1, np.ones(16, np.uint8), stream)
    ch.end_forward(stream)
    graph = stream.end_capture()
    del ch
    gc.collect()
    with pytest.raises(ferry.LogicError, match=r"Graph.launch: .* got Channel\(host, device 0, handle \d+\) destroyed"):
        graph.launch(stream)
    stream.synchronize()


def test_close_keeps_undelivered_entries_for_poll(make_channel, stream):
    ch = make_channel()
    ch.begin_forward(stream)
    for h in range(5):
        ch.capture(h, np.full(10, h, np.uint8), stream)
    ch.end_forward(stream)
    report = ch.close()
    assert ch.closed and report["delivered"] == 5
    got = ch.poll(100, timeout=0)
    assert [e.hook for e in got] == list(range(5))
    assert all((e.numpy() == e.hook).all() for e in got)
    assert ch.stats()["entries_drained"] == 5  # the final counters
    with pytest.raises(ferry.LogicError, match="closed"):
        ch.poll(1)


def test_close_waits_for_a_consumer_thread_that_is_still_polling(make_channel, stream):
    """close() waits for the drain while another thread polls and releases: the consumer is not held out of poll()
    (close() once held the channel's lock for its whole wait, so a slow consumer's poll() blocked until close() timed
    out with the entries not taken: ShutdownError, those entries lost). 24 entries of 16 KiB through 64 KiB of
    staging, a consumer taking 40 ms per entry: close() returns once every entry is delivered (those not taken yet stay
    pollable), and the consumer gets every one."""
    import threading
    ch = make_channel(ring_bytes=1 << 20, staging_bytes=1 << 16)
    got = []

    def consume():
        while True:
            try:
                es = ch.poll(1, timeout=0.05)
            except ferry.LogicError:  # closed, nothing left
                return
            for e in es:
                time.sleep(0.04)
                got.append((e.hook, int(e.numpy()[0])))
                e.release()

    t = threading.Thread(target=consume)
    t.start()
    ch.begin_forward(stream)
    for h in range(24):
        ch.capture(h, np.full(16 << 10, h, np.uint8), stream)
    ch.end_forward(stream)
    t0 = time.perf_counter()
    report = ch.close(timeout=5.0)
    waited = time.perf_counter() - t0
    t.join(30)
    assert report["delivered"] == 24 and sorted(got) == [(h, h) for h in range(24)], (report, got)
    assert waited < 4.0, f"close() took {waited:.1f} s"


def test_close_frees_the_device_and_with_closes(make_channel, stream, drain):
    ch = make_channel()
    ch.close()
    with ferry.Channel(backend="host", ring_bytes=1 << 16) as ch2:  # the device slot is free again
        ch2.begin_forward(stream)
        ch2.capture(5, np.ones(8, np.uint8), stream)
        ch2.end_forward(stream)
        (e,) = drain(ch2, 1)
        assert e.hook == 5
    assert ch2.closed
    with pytest.raises(RuntimeError, match="body"):
        with ferry.Channel(backend="host", ring_bytes=1 << 16) as ch3:
            raise RuntimeError("body")
    assert ch3.closed


def test_abort_forward_delivers_what_was_captured_and_the_next_forward_works(make_channel, stream, drain):
    ch = make_channel(ring_bytes=1 << 12, publish_every=16)  # no batch release: only abort publishes
    a = np.arange(64, dtype=np.uint8)
    b = np.arange(100, dtype=np.int32)
    assert ch.abort_forward(stream) is False  # no forward open: nothing to do
    ch.begin_forward(stream)
    ch.capture(1, a, stream)
    ch.capture(2, b, stream)
    with pytest.raises(ferry.LogicError, match="ring"):  # a failure mid-way: an entry larger than the ring
        ch.capture(3, np.zeros(1 << 13, np.uint8), stream)
    with pytest.raises(ferry.LogicError, match="begin_forward"):
        ch.begin_forward(stream)  # the forward is still open
    assert ch.abort_forward(stream) is True
    assert ch.abort_forward(stream) is False
    got = drain(ch, 2)
    assert [(e.hook, e.seq) for e in got] == [(1, 0), (2, 1)]
    assert got[0].numpy().tobytes() == a.tobytes() and got[1].numpy().tobytes() == b.tobytes()
    ch.begin_forward(stream)  # the next forward works and continues the sequence
    ch.capture(4, a[::-1].copy(), stream)
    ch.end_forward(stream)
    (e,) = drain(ch, 1)
    assert (e.hook, e.seq) == (4, 2) and e.numpy().tobytes() == a[::-1].tobytes()
    report = ch.close()
    assert report["clean"] and report["delivered"] == 3 and not report["forward_open"]


@pytest.mark.parametrize("publish_every", [2, 16])
def test_abort_forward_after_a_capture_ended_without_end_forward(make_channel, stream, drain, publish_every):
    ch = make_channel(publish_every=publish_every)
    a = np.full(32, 7, np.uint8)
    stream.begin_capture()
    ch.begin_forward(stream)
    ch.capture(1, a, stream)
    ch.capture(2, a, stream)
    try:  # the capture ends without end_forward (it fails when a batch release's branch was left unjoined)
        stream.end_capture()
    except ferry.BackendError:
        pass
    with pytest.raises(ferry.LogicError, match="abort_forward"):
        ch.begin_forward(stream)
    assert ch.abort_forward(stream) is True  # the recording is forgotten; nothing was reserved
    ch.begin_forward(stream)
    ch.capture(3, a, stream)
    ch.end_forward(stream)
    (e,) = drain(ch, 1)
    assert (e.hook, e.seq) == (3, 0) and (e.numpy() == 7).all()
    assert ch.stats()["entries_reserved"] == 1
    assert ch.close()["clean"]


# ---- deferred capture (Channel.capture_deferred / flush / abort_forward)

@pytest.mark.parametrize("v", [1, 2, 4, 8])
def test_copy_vecs_per_thread_knob_keeps_entries_exact(make_channel, stream, drain, v):
    # every vector width copies every size exactly (tails, several passes), immediate and deferred
    ch = make_channel(ring_bytes=1 << 20, publish_every=4, tuning={"copy_vecs_per_thread": v})
    rng = np.random.default_rng(v)
    xs = [rng.integers(1, 255, size=n, dtype=np.uint8) for n in (1, 15, 16, 17, 4104, 70001)]
    ch.begin_forward(stream)
    for i, x in enumerate(xs):
        ch.capture(i, x, stream)
        ch.capture_deferred(100 + i, x, stream)
    ch.end_forward(stream)
    got = drain(ch, 2 * len(xs))
    assert [e.tobytes() for e in got] == [x.tobytes() for x in xs for _ in range(2)]
    assert ch.close()["clean"]


def test_bounce_capture_joins_the_deferred_batch_and_keeps_every_byte(make_channel, stream, drain):
    # bounce_capture_max_bytes: capture() of an array up to that size is copied into the channel's staging and
    # joins the deferred batch (deferred_pending, the core's count, includes it; nothing is flushed by it);
    # larger ones take the copy kernel and flush the batch first. Entry order and bytes exact.
    ch = make_channel(ring_bytes=1 << 20, publish_every=4, tuning={"bounce_capture_max_bytes": 4096, "gather_batch": 4})
    rng = np.random.default_rng(3)
    xs = [rng.integers(1, 255, size=n, dtype=np.uint8) for n in (100, 4096, 17, 5000, 64, 4097, 33, 2048, 1, 999)]
    expect = []
    for f in range(3):
        ch.begin_forward(stream)
        ch.capture(1, xs[0], stream)            # bounce
        ch.capture_deferred(2, xs[1], stream)   # deferred
        ch.capture(3, xs[2], stream)            # bounce
        assert ch.deferred_pending == 3
        ch.capture(4, xs[3], stream)            # above the limit: flushes the batch, then its own copy kernel
        assert ch.deferred_pending == 0
        for i in range(4, len(xs)):
            ch.capture(5 + i, xs[i], stream)     # 4097 bytes: the kernel; the others bounce (batches of 4)
        ch.end_forward(stream)
        expect += [(1, xs[0]), (2, xs[1]), (3, xs[2]), (4, xs[3])] + [(5 + i, xs[i]) for i in range(4, len(xs))]
    got = drain(ch, len(expect))
    assert [(e.hook, e.tobytes()) for e in got] == [(h, x.tobytes()) for h, x in expect]
    assert ch.close()["clean"]


def test_copy_vecs_per_thread_knob_refuses_other_widths(make_channel):
    with pytest.raises(ferry.LogicError, match="expected copy_vecs_per_thread 1, 2, 4 or 8, got 3"):
        make_channel(tuning={"copy_vecs_per_thread": 3})


def test_programmatic_launch_knob_on_the_host_backend(make_channel):
    # the knob is accepted on every backend; the host backend never launches programmatically
    assert make_channel(tuning={"programmatic_launch": True}).programmatic_launch is False
    assert make_channel(tuning={"programmatic_launch": False}).programmatic_launch is False


@pytest.mark.parametrize("branch_publish,gather_branch_publish", [(True, True), (True, False), (False, True)])
def test_deferred_entries_exact_and_flush_points(make_channel, stream, drain, branch_publish, gather_branch_publish):
    # every place a batch release can run: the branch (the defaults), the gather's last block, the stream
    # (gather_batch = K: the batch that flushes at the K-th entry; the default gathers 128 whatever K)
    ch = make_channel(publish_every=4, tuning={"branch_publish": branch_publish,
                                               "gather_branch_publish": gather_branch_publish, "gather_batch": 4})
    xs = [np.arange(i * 10, i * 10 + 5, dtype=np.int32) for i in range(6)]
    ch.begin_forward(stream)
    for i, x in enumerate(xs[:3]):
        ch.capture_deferred(i, x, stream)
    assert ch.deferred_pending == 3
    ch.capture_deferred(3, xs[3], stream)
    assert ch.deferred_pending == 0  # the gather_batch-th (here K-th) deferred entry flushes its batch
    ch.capture_deferred(4, xs[4], stream)
    assert ch.deferred_pending == 1
    ch.capture(9, xs[5], stream)  # an immediate capture flushes first (entry order kept)
    assert ch.deferred_pending == 0
    ch.capture_deferred(5, xs[5], stream)
    ch.flush(stream)
    assert ch.deferred_pending == 0
    ch.capture_deferred(6, xs[0], stream)
    ch.end_forward(stream)  # flushes the partial batch
    assert ch.deferred_pending == 0
    got = drain(ch, 8)
    assert [e.hook for e in got] == [0, 1, 2, 3, 4, 9, 5, 6]
    want = [xs[0], xs[1], xs[2], xs[3], xs[4], xs[5], xs[5], xs[0]]
    for e, w in zip(got, want):
        assert e.tobytes() == w.tobytes()
    # releases (wherever they ran): entries 0-3 (the K-th deferred entry's gather) and entries 4, 9, 5, 6 (the
    # gather end_forward flushes does the forward boundary's release itself: no separate boundary release)
    assert ch.stats()["publishes"] == 2
    assert ch.close()["clean"]


class _Versioned:
    """A DLPack array with a torch-like version counter (``_version``, ``is_inference()``) that counts reads."""

    def __init__(self, a, inference=False):
        self.a, self.reads, self.inference, self.version = a, 0, inference, 0

    def __dlpack__(self, *args, **kwargs):
        return self.a.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()

    def is_inference(self):
        return self.inference

    @property
    def _version(self):
        if self.inference:
            raise RuntimeError("Inference tensors do not track version counter.")
        self.reads += 1
        return self.version


def test_deferred_version_read_at_capture_and_at_its_flush_only(make_channel, stream, drain):
    # a deferred source's version counter is read when it is captured and once more by the call that flushes
    # it, not by every capture in between (each read takes the GIL: a consumer thread holding it stalled every
    # capture); an inference tensor's counter is never asked for (asking raises, which costs ~10 us in torch)
    ch = make_channel(publish_every=8, tuning={"gather_batch": 8})  # the 8th capture flushes
    xs = [_Versioned(np.full(64, i, np.uint8)) for i in range(7)] + [_Versioned(np.full(64, 7, np.uint8), True)]
    ch.begin_forward(stream)
    for i, x in enumerate(xs[:7]):
        ch.capture_deferred(i, x, stream)
    assert [x.reads for x in xs[:7]] == [1] * 7
    ch.capture_deferred(7, xs[7], stream)  # fills the batch: each pending source checked once, then flushed
    assert ch.deferred_pending == 0
    assert [x.reads for x in xs] == [2] * 7 + [0]
    # a write before the flush is still caught by the call that flushes (here the K-th capture)
    ys = [_Versioned(np.full(64, 10 + i, np.uint8)) for i in range(8)]
    for i, y in enumerate(ys[:7]):
        ch.capture_deferred(10 + i, y, stream)
    ys[3].version += 1  # written in place
    with pytest.raises(ferry.LogicError, match="deferred hook 13 was written in place"):
        ch.capture_deferred(17, ys[7], stream)
    assert ch.abort_forward(stream) is True
    got = drain(ch, 8)
    assert [e.tobytes() for e in got] == [bytes([i]) * 64 for i in range(8)]
    assert ch.poll(10, timeout=0.2) == []  # nothing of the second batch
    assert ch.close()["clean"]


def test_deferred_source_freed_after_capture_is_still_exact(make_channel, stream, drain):
    ch = make_channel(publish_every=8)
    ch.begin_forward(stream)
    for i in range(3):
        ch.capture_deferred(i, np.full(64, i + 1, dtype=np.uint8), stream)  # no reference left but the binding's
    gc.collect()
    junk = [np.full(64, 0xEE, dtype=np.uint8) for _ in range(16)]  # reuse freed memory if it was freed
    ch.end_forward(stream)
    got = drain(ch, 3)
    assert [e.tobytes() for e in got] == [bytes([i + 1]) * 64 for i in range(3)]
    del junk
    assert ch.close()["clean"]


def test_host_eager_captures_copy_the_bytes_of_the_call(make_channel, stream, drain):
    # The host backend copies later on its stream thread, which the caller's own writes (numpy, torch's CPU
    # ops) do not wait for: in an eager forward Channel.capture and capture_deferred snapshot the bytes, so a
    # write in place after the capture call (immediate) or after the flush was enqueued (deferred) does not
    # reach the entry, as stream order makes it so on CUDA. A 16 MiB entry first keeps the stream thread busy
    # while the writes below run.
    ch = make_channel(ring_bytes=1 << 26, publish_every=64)
    busy = np.full(16 << 20, 7, dtype=np.uint8)
    x = np.zeros(4096, dtype=np.float32)
    y = np.zeros(4096, dtype=np.float32)
    ch.begin_forward(stream)
    ch.capture(0, busy, stream)
    for i in range(4):
        ch.capture(1 + i, x, stream)
        x += 1  # after the call: not in the entry of hook 1 + i
    ch.capture_deferred(9, y, stream)
    ch.end_forward(stream)  # enqueues hook 9's gather
    y += 1  # after the flush: not in the entry
    busy[:] = 0
    got = drain(ch, 6)
    assert [e.hook for e in got] == [0, 1, 2, 3, 4, 9]
    assert got[0].tobytes() == bytes([7]) * (16 << 20)
    for i, e in enumerate(got[1:5]):
        assert (np.frombuffer(e.tobytes(), np.float32) == i).all(), e.hook
    assert (np.frombuffer(got[5].tobytes(), np.float32) == 0).all()
    for e in got:
        e.release()
    assert ch.close()["clean"]


def test_abort_forward_drops_pending_deferred(make_channel, stream, drain):
    ch = make_channel(publish_every=8)
    ch.begin_forward(stream)
    ch.capture(0, np.ones(4, np.int32), stream)
    ch.capture_deferred(1, np.ones(4, np.int32), stream)
    assert ch.abort_forward(stream) is True
    assert ch.deferred_pending == 0
    got = drain(ch, 1)
    assert [e.hook for e in got] == [0]
    assert ch.poll(10, timeout=0.2) == []


def test_release_producer_thread_hands_the_role_over_between_forwards():
    """One producer thread at a time: another thread is refused until the producer thread released its role between
    forwards; releasing with a forward open is refused."""
    import threading

    s = ferry.Stream(backend="host")
    ch = ferry.Channel(backend="host", ring_bytes=1 << 16)
    x = np.arange(64, dtype=np.uint8)

    def forward():
        ch.begin_forward(s)
        ch.capture(1, x, s)
        ch.end_forward(s)

    forward()
    err = []
    t = threading.Thread(target=lambda: err.append(pytest.raises(ferry.LogicError, forward)))
    t.start()
    t.join()
    assert "expected the producer thread" in str(err[0].value)
    ch.begin_forward(s)
    with pytest.raises(ferry.LogicError, match="expected no open forward"):
        ch.release_producer_thread()
    ch.abort_forward(s)
    ch.release_producer_thread()
    t = threading.Thread(target=forward)
    t.start()
    t.join()
    with pytest.raises(ferry.LogicError, match="expected the producer thread"):
        forward()
    got = []
    while len(got) < 2:
        got += ch.poll(2, timeout=5.0)
    for e in got:
        e.release()
    assert ch.close()["clean"]
