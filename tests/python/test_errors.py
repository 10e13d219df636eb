# SPDX-License-Identifier: Apache-2.0
# Typed errors and bad input on the host backend: each raises a clear exception and loses nothing (the
# channel keeps working and every earlier entry is still delivered).
import time

import numpy as np
import pytest

import ferry


def test_exception_hierarchy():
    for cls in (ferry.LogicError, ferry.OutOfMemory, ferry.TimeoutError, ferry.InvalidatedError,
                ferry.BackendError, ferry.ShutdownError, ferry.SizeOverflowError):
        assert issubclass(cls, ferry.Error)
    assert issubclass(ferry.TimeoutError, TimeoutError)
    assert issubclass(ferry.OutOfMemory, MemoryError)
    assert ferry.LogicError.__module__ == "ferry"


def test_bad_config_is_a_logic_error_with_the_cpp_message():
    with pytest.raises(ferry.LogicError, match="publish_every|K"):
        ferry.Channel(backend="host", ring_bytes=1 << 16, publish_every=0)
    with pytest.raises(ferry.LogicError, match="head_memory"):
        ferry.Channel(backend="host", ring_bytes=1 << 16, tuning={"head_memory": "nowhere"})
    with pytest.raises(ferry.LogicError, match="backend"):
        ferry.Channel(backend="tpu")


def test_backend_error_for_a_device_that_does_not_exist():
    with pytest.raises(ferry.BackendError, match="set_device"):
        ferry.Channel(device=99, backend="host", ring_bytes=1 << 16)


def test_two_channels_on_one_device_are_independent(make_channel, drain):
    # Engines run two models on one device (draft + target): each gets its own channel, ring and drain.
    a, b = make_channel(), make_channel()
    sa, sb = ferry.Stream(backend="host"), ferry.Stream(backend="host")
    xa = [np.full(32 + i, i, dtype=np.uint8) for i in range(6)]
    xb = [np.arange(8 + i, dtype=np.int64) * 7 for i in range(6)]
    a.begin_forward(sa)
    b.begin_forward(sb)
    for i in range(6):  # interleaved forwards on two streams
        a.capture(i, xa[i], sa)
        b.capture(100 + i, xb[i], sb)
    a.end_forward(sa)
    b.end_forward(sb)
    got_a, got_b = drain(a, 6), drain(b, 6)
    assert [e.hook for e in got_a] == list(range(6)) and [e.hook for e in got_b] == [100 + i for i in range(6)]
    assert [e.tobytes() for e in got_a] == [x.tobytes() for x in xa]
    assert [e.tobytes() for e in got_b] == [x.tobytes() for x in xb]
    assert a.close()["clean"] and b.close()["clean"]


def test_bad_tensors_and_streams_lose_nothing(make_channel, stream, drain, fake_cuda_array):
    ch = make_channel()
    x = np.arange(64, dtype=np.float32)
    with pytest.raises(ferry.LogicError, match="forward"):
        ch.capture(1, x, stream)  # capture outside a forward
    ch.begin_forward(stream)
    ch.capture(1, x, stream)
    with pytest.raises(ferry.LogicError, match="C-contiguous"):
        ch.capture(2, x[::2], stream)
    with pytest.raises(ferry.LogicError, match="C-contiguous"):
        ch.capture(2, np.arange(16, dtype=np.int32).reshape(4, 4).T, stream)
    with pytest.raises(ferry.LogicError, match="device tensor where the host backend"):
        ch.capture(2, fake_cuda_array(), stream)
    with pytest.raises(TypeError, match="expected an array"):
        ch.capture(2, [1, 2, 3], stream)
    with pytest.raises(TypeError, match="ferry.Stream"):
        ch.capture(2, x, 12345)
    with pytest.raises(TypeError, match="ferry.Stream"):
        ch.capture(2, x, None)
    with pytest.raises(TypeError, match="ferry.Stream"):
        ch.capture(2, x, object())
    with pytest.raises(TypeError):
        ch.capture("hook", x, stream)
    ch.capture(3, x + 1, stream)
    ch.end_forward(stream)
    got = drain(ch, 2)
    assert [(e.hook, e.seq) for e in got] == [(1, 0), (3, 1)]
    assert got[0].numpy().tobytes() == x.tobytes() and got[1].numpy().tobytes() == (x + 1).tobytes()
    assert ch.close()["clean"]


def test_closed_channel(make_channel, stream):
    ch = make_channel()
    ch.close()
    for call in (lambda: ch.begin_forward(stream), lambda: ch.end_forward(stream),
                 lambda: ch.capture(1, np.zeros(4, np.uint8), stream), lambda: ch.close(), lambda: ch.poll(1)):
        with pytest.raises(ferry.LogicError, match="closed"):
            call()


def test_closed_stream(make_channel):
    ch = make_channel()
    s = ferry.Stream(backend="host")
    s.close()
    with pytest.raises(ferry.LogicError, match="closed"):
        ch.begin_forward(s)


def test_fail_fast_full_ring_is_out_of_memory(make_channel, stream, drain):
    ch = make_channel(ring_bytes=1 << 10, on_full="fail_fast", publish_every=64)
    ch.begin_forward(stream)
    x = np.zeros(512, np.uint8)
    ch.capture(1, x, stream)
    ch.capture(2, x, stream)
    with pytest.raises(ferry.OutOfMemory):
        ch.capture(3, x, stream)
    ch.end_forward(stream)
    assert [e.hook for e in drain(ch, 2)] == [1, 2]


def test_blocked_full_ring_times_out(make_channel, stream, drain):
    # staging for one entry, held by a view: the ring (one entry) cannot be reclaimed, the third capture times out
    ch = make_channel(ring_bytes=1 << 10, staging_bytes=1 << 10, publish_every=1, timeout=0.2)
    x = np.zeros(1024, np.uint8)
    ch.begin_forward(stream)
    ch.capture(1, x, stream)
    ch.end_forward(stream)
    held = drain(ch, 1)[0].numpy()
    ch.begin_forward(stream)
    ch.capture(2, x, stream)
    with pytest.raises(ferry.TimeoutError):
        ch.capture(3, x, stream)
    ch.end_forward(stream)
    del held
    assert [e.hook for e in drain(ch, 1)] == [2]


def test_close_with_an_open_forward_raises_shutdown_error_with_report(make_channel, stream):
    ch = make_channel(publish_every=16, timeout=0.2)
    ch.begin_forward(stream)
    ch.capture(7, np.full(16, 7, np.uint8), stream)  # the forward is never ended
    with pytest.raises(ferry.ShutdownError, match="forward was still open") as info:
        ch.close(timeout=0.2)
    report = info.value.report
    assert report["forward_open"] and not report["clean"]
    assert ch.closed
    # nothing lost: close() published the entry; it is still there for poll()
    (e,) = ch.poll(10)
    assert e.hook == 7 and (e.numpy() == 7).all()


def _invalidate(ch, x):
    """A real invalidation: a captured forward launched without plan() (Graph.launch instead of
    ch.plan(plan) + launch); the drainer sees published_head beyond the entries the CPU planned and
    invalidates the channel ("graph replayed without plan()"). Returns the stream."""
    s = ferry.Stream(backend="host")
    s.begin_capture()
    ch.begin_forward(s)
    for hook in range(3):
        ch.capture(hook, x, s)
    ch.end_forward(s)
    g = s.end_capture()
    g.launch(s)  # the misuse: no ch.plan(plan)
    s.synchronize()
    deadline = time.monotonic() + 5.0
    while not ch.invalidated and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ch.invalidated, "the drainer must see the unplanned replay"
    return s


def test_invalidated_channel_raises_invalidated_error_and_closes(make_channel):
    ch = make_channel(publish_every=1, timeout=0.5)
    x = np.arange(16, dtype=np.float32)
    s1 = _invalidate(ch, x)
    for call in (lambda: ch.begin_forward(s1), lambda: ch.capture(3, x, s1)):
        with pytest.raises(ferry.InvalidatedError, match="graph replayed without plan") as info:
            call()
        assert type(info.value) is ferry.InvalidatedError  # not a LogicError / BackendError
    with pytest.raises(ferry.InvalidatedError, match="without plan"):
        ch.close()
    assert ch.closed  # closed anyway: the device slot is free again
    with pytest.raises(ferry.LogicError, match="closed"):
        ch.begin_forward(s1)


def test_newcomer_inputs_get_a_message_that_names_them():
    # an empty array is an entry of 0 bytes (not "strided"); an object array names its dtype; a hook outside
    # [0, 2^32) names the value (not nanobind's "incompatible function arguments")
    ch = ferry.Channel(backend="host", ring_bytes=1 << 16)
    s = ferry.Stream(backend="host")
    ch.begin_forward(s)
    with pytest.raises(ferry.LogicError, match="expected an entry of > 0 bytes, got 0"):
        ch.capture(1, np.zeros((0, 4), np.float32), s)
    with pytest.raises(TypeError, match="dtype object"):
        ch.capture(1, np.array([object()]), s)
    for hook in (-1, 2**32, 2**70):
        with pytest.raises(ferry.LogicError, match=r"expected hook an int in \[0, 2\^32\), got " + str(hook)):
            ch.capture(hook, np.ones(4, np.uint8), s)
        with pytest.raises(ferry.LogicError, match=r"expected hook an int in \[0, 2\^32\)"):
            ch.capture_deferred(hook, np.ones(4, np.uint8), s)
    with pytest.raises(TypeError, match="expected hook an int, got str"):
        ch.capture("1", np.ones(4, np.uint8), s)
    ch.capture(2**32 - 1, np.ones(4, np.uint8), s)
    ch.end_forward(s)
    got = []
    while not got:
        got = ch.poll(1, timeout=5.0)
    assert got[0].hook == 2**32 - 1
    got[0].release()
    got[0].release()  # idempotent
    assert ch.close()["clean"]


@pytest.mark.parametrize("bad", [-1, 2**64, 2**70])
def test_negative_or_too_large_ints_are_ferry_errors_naming_the_argument_and_its_range(bad):
    # not nanobind's "incompatible function arguments": every count, capacity and slot is range-checked with
    # a ferry.LogicError that names the call, the argument and its range
    ch = ferry.Channel(ring_bytes=1 << 16, backend="host")
    s = ferry.Stream(backend="host")
    p = ferry.Publisher(backend="host")
    buf = p.declare("ids", "step", dtype="int32", capacity=8)
    p.initialize(slots=2, stream=s)
    calls = [
        ("Channel.poll", "max_entries", lambda: ch.poll(bad)),
        ("Publisher.declare('x')", "capacity", lambda: ferry.Publisher(backend="host").declare("x", "g", "int32", bad)),
        ("Publisher.initialize", "slots", lambda: ferry.Publisher(backend="host").initialize(slots=bad, stream=s)),
        ("Publisher.begin", "slot", lambda: p.begin(bad)),
        ("Publisher.producer", "slot", lambda: p.producer("step", slot=bad)),
        ("Publisher.set_count", "count", lambda: p.set_count(buf, bad)),
        ("Publisher.capture_upload", "slot", lambda: p.capture_upload("step", bad, s)),
    ]
    for who, name, call in calls:
        with pytest.raises(ferry.LogicError, match=rf"expected {name} an int in \[0, ") as info:
            call()
        assert who in str(info.value), (who, str(info.value))
    ch.close()


def test_a_torch_tensor_with_the_conjugate_or_negative_bit_is_refused_not_copied(make_channel, stream):
    # its memory holds the un-negated values: copying it would deliver wrong bytes as good (found by the fuzzer)
    torch = pytest.importorskip("torch")
    ch = make_channel()
    ch.begin_forward(stream)
    for t in (torch.randn(8, dtype=torch.complex64).conj(), torch.randn(8, dtype=torch.complex64).conj().imag):
        with pytest.raises(ferry.LogicError, match="conjugate or negative bit"):
            ch.capture(0, t, stream)
    ch.end_forward(stream)


def test_poll_timeout_nan_is_refused_not_a_wait_forever(make_channel):
    # a NaN timeout compared false with every deadline: poll never returned (found by the fuzzer)
    ch = make_channel()
    with pytest.raises(ferry.LogicError, match="expected timeout a number of seconds .* got nan"):
        ch.poll(1, timeout=float("nan"))
    assert ch.poll(1, timeout=-1.0) == []  # <= 0: no wait


def test_an_object_on_emulated_device_1_leaves_device_0_channels_usable():
    # the binding sets the channel's device before each call, on the host backend too (found by the fuzzer)
    ch = ferry.Channel(0, backend="host", ring_bytes=1 << 16)
    s = ferry.Stream(0, backend="host")
    ferry.Stream(1, backend="host")
    ch.begin_forward(s)
    ch.capture(1, np.arange(4, dtype=np.int32), s)
    ch.end_forward(s)
    (e,) = ch.poll(1, timeout=5.0)
    assert (e.numpy().view(np.int32) == np.arange(4)).all()
    e.release()
    assert ch.close()["clean"]


@pytest.mark.parametrize("bad, shown", [(float("nan"), "nan"), (float("inf"), "inf"), (-float("inf"), "-inf"),
                                        (1e300, r"1e\+300"), (1e10, r"1e\+10"), (-0.5, "-0.5")])
def test_seconds_arguments_out_of_range_are_logic_errors_not_undefined_conversions(make_channel, bad, shown):
    # close(timeout=1e300), Channel(timeout=1e300) or Channel(tuning={'drain_idle_sleep': 1e300}) converted a double
    # to an integer duration out of its range (undefined behaviour; found by the fuzzer): one range check for each
    ch = make_channel()
    calls = [
        ("Channel", "timeout", lambda: ferry.Channel(backend="host", ring_bytes=1 << 16, timeout=bad)),
        ("Channel", r"tuning\['drain_idle_sleep'\]",
         lambda: ferry.Channel(backend="host", ring_bytes=1 << 16, tuning={"drain_idle_sleep": bad})),
        ("Channel.close", "timeout", lambda: ch.close(timeout=bad)),
    ]
    for who, name, call in calls:
        with pytest.raises(ferry.LogicError, match=rf"{who}: expected {name} a number of seconds in \[0, 1e\+09\], "
                                                   rf"got {shown} "):
            call()
    assert not ch.closed  # the refused close changed nothing
    assert ch.close(timeout=1e9)["clean"]  # the top of the range


def test_seconds_arguments_in_range_are_accepted(make_channel, stream):
    ch = make_channel(timeout=0.25, tuning={"drain_idle_sleep": 2e-4})
    ch2 = make_channel(timeout=10**9, tuning={"drain_idle_sleep": 0})  # ints too, up to the top of the range
    with pytest.raises(ferry.LogicError, match="expected timeout a number of seconds, got 'a'"):
        make_channel(timeout="a")
    with pytest.raises(ferry.LogicError, match="expected timeout a number of seconds, got 1000"):
        make_channel(timeout=10**400)  # an int past a double's range
    ch.begin_forward(stream)
    ch.capture(3, np.arange(4, dtype=np.int32), stream)
    ch.end_forward(stream)
    (e,) = ch.poll(1, timeout=float("inf"))  # poll: inf waits for the first entry (nan is refused, above)
    assert e.hook == 3
    e.release()
    assert ch.close(timeout=0)["clean"] and ch2.close(timeout=0.5)["clean"]
