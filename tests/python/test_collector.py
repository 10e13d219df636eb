# SPDX-License-Identifier: Apache-2.0
# ferry.hooks.Collector and Channel.capture_deferred_many (its hand-over): the collected captures give the
# entries capture_deferred gives, in call order with immediate hooks between them; a tensor written in place
# between its hook and the hand-over is refused (not delivered with other bytes); a forward ended behind the
# collector's back leaves captures that the next begin_forward refuses; a body that raises aborts the forward;
# bad items are typed errors. Host backend, with and without the tensor reader; skipped without torch.
import pytest

import ferry

torch = pytest.importorskip("torch")
import ferry.hooks as fh  # noqa: E402

from test_capture_fast_path import raw, tensors  # noqa: E402
from test_capture_fn import reader  # noqa: E402,F401  (the fixture: with and without the tensor reader)


def _strided_and_grad():
    w = torch.randn(6, 5, requires_grad=True)
    return [w * 3, torch.randn(5, 6).t(), (w * 2).t(), torch.randn(8)[::2]]


@pytest.mark.parametrize("deferred", [True, "mixed"])
def test_collected_entries_exact_in_call_order(make_channel, stream, drain, reader, deferred):
    ch = make_channel(ring_bytes=1 << 20, publish_every=4)
    xs = tensors() + _strided_and_grad()
    d = True if deferred is True else [h for h in range(len(xs)) if h % 3 != 1]
    col = fh.Collector(ch, stream, deferred=d)
    pending = 0
    with col.forward(tag=11):
        for h, x in enumerate(xs):
            col(h, x)
            pending = 0 if deferred == "mixed" and h % 3 == 1 else pending + 1  # an immediate hook hands over first
            assert col.pending() == pending
    got = drain(ch, len(xs))
    assert [e.hook for e in got] == list(range(len(xs)))
    assert all(e.tag == 11 for e in got)
    for e, x in zip(got, xs):
        assert e.tobytes() == raw(x), e.hook
    assert ch.close()["clean"]


def test_written_in_place_after_its_hook_is_refused(make_channel, stream, drain, reader):
    ch = make_channel(ring_bytes=1 << 20, publish_every=64)
    col = fh.Collector(ch, stream)
    keep = torch.arange(64, dtype=torch.float32)
    with torch.inference_mode():
        inf = torch.arange(8, dtype=torch.float32)  # no version counter: not checked
    strided = torch.randn(8, 8).t()  # made contiguous at the hand-over: its original's version is checked
    col.begin_forward()
    col(3, keep.clone())
    col(4, inf)
    col(5, strided)
    col(9, keep)
    keep.add_(1)  # written in place after its hook, before the hand-over
    with pytest.raises(ferry.LogicError, match=r"hook 9 \(item 3\): expected the tensor as it was at its hook "
                                               r"\(version 0\), got it written in place since \(version 1\)"):
        col.end_forward()
    assert col.pending() == 0
    assert ch.deferred_pending == 0  # a refused conversion hands nothing over: no item of the list is recorded
    ch.end_forward(stream)
    assert ch.stats()["entries_reserved"] == 0
    col.begin_forward()
    col(5, strided)
    strided.mul_(2)
    with pytest.raises(ferry.LogicError, match=r"hook 5 \(item 0\).*written in place"):
        col.end_forward()
    ch.abort_forward(stream)
    with col.forward():  # the channel goes on
        col(9, keep)
    assert [(e.hook, e.tobytes()) for e in drain(ch, 1)] == [(9, raw(keep))]
    assert ch.close()["clean"]


def test_written_after_the_hand_over_is_the_deferred_flush_refusal(make_channel, stream, reader):
    ch = make_channel(ring_bytes=1 << 20, publish_every=64)
    col = fh.Collector(ch, stream)
    x = torch.ones(16)
    col.begin_forward()
    col(2, x)
    col.hand_over()  # recorded by the core with the hook's version
    x.mul_(2)
    with pytest.raises(ferry.LogicError, match="deferred hook 2 was written in place"):
        ch.end_forward(stream)
    ch.abort_forward(stream)


def test_leftovers_and_a_failing_body(make_channel, stream, drain):
    ch = make_channel(ring_bytes=1 << 20, publish_every=64)
    col = fh.Collector(ch, stream)
    col.begin_forward()
    col(1, torch.ones(4))
    ch.end_forward(stream)  # behind the collector's back: its capture belongs to no forward
    with pytest.raises(ferry.LogicError, match="expected no collected captures before begin_forward, got 1"):
        col.begin_forward()
    assert col.pending() == 0 and ch.stats()["entries_reserved"] == 0
    with pytest.raises(RuntimeError, match="body"):
        with col.forward():
            col(1, torch.ones(4))
            raise RuntimeError("body")
    assert col.pending() == 0
    with col.forward():  # aborted: a new forward opens
        col(2, torch.full((4,), 2.0))
    assert [e.hook for e in drain(ch, 1)] == [2]
    assert ch.close()["clean"]


def test_bad_items_are_typed_errors(make_channel, stream):
    ch = make_channel()
    ok = torch.arange(16, dtype=torch.int32)
    ch.begin_forward(stream)
    with pytest.raises(TypeError, match=r"capture_deferred_many: expected a list of \(hook, tensor, version\) tuples, got tuple"):
        ch.capture_deferred_many((1, ok, 0), stream)
    for bad in ((-1, ok, 0), (1 << 32, ok, 0), ("3", ok, 0), (1, ok), (1, ok, "v"), (1, ok, -2), [1, ok, 0]):
        with pytest.raises(TypeError, match=r"item 0: expected a \(hook id in \[0, 2\^32\), tensor, version >= -1\) tuple"):
            ch.capture_deferred_many([bad], stream)
    with pytest.raises(TypeError, match=r"expected an array \(an object with __dlpack__\), got list"):
        ch.capture_deferred_many([(5, [1, 2, 3], -1)], stream)
    with pytest.raises(ferry.LogicError, match=r"capture_deferred_many \(hook 5\): expected a C-contiguous array"):
        ch.capture_deferred_many([(5, torch.randn(4, 4).t(), -1)], stream)  # no prepare: refused
    with pytest.raises(TypeError, match="expected a ferry.Stream of the host backend, got NoneType"):
        ch.capture_deferred_many([(1, ok, -1)], None)
    assert ch.deferred_pending == 0
    ch.capture_deferred_many([], stream)
    ch.capture_deferred_many([(1, ok, ok._version), (2, ok, -1)], stream)
    assert ch.deferred_pending == 2
    ch.end_forward(stream)
    ch.close()
    with pytest.raises(ferry.LogicError, match="expected an open channel, got a closed one"):
        ch.capture_deferred_many([(1, ok, -1)], stream)


def test_an_item_the_channel_refuses_keeps_the_ones_before(make_channel, stream, drain):
    ch = make_channel(ring_bytes=1 << 10, on_full="fail_fast", publish_every=64)
    xs = [torch.full((64,), float(h)) for h in range(6)]  # 256 bytes each: the fifth does not fit
    ch.begin_forward(stream)
    with pytest.raises(ferry.OutOfMemory, match="ring full"):
        ch.capture_deferred_many([(h, x, x._version) for h, x in enumerate(xs)], stream)
    # the four before it stay recorded (or flushed), as four capture_deferred calls and a refused fifth leave them
    ch.end_forward(stream)
    got = drain(ch, 4)
    assert [(e.hook, e.tobytes()) for e in got] == [(h, raw(xs[h])) for h in range(4)]
    assert ch.close()["clean"]


def test_the_hand_over_with_end_forward_ends_the_forward_in_the_same_call(make_channel, stream, drain, reader):
    ch = make_channel(ring_bytes=1 << 20, publish_every=64)
    xs = [torch.full((32,), float(h + 1)) for h in range(5)]
    ch.begin_forward(stream, tag=7)
    plan = ch.capture_deferred_many([(h, x, x._version) for h, x in enumerate(xs)], stream, end_forward=True)
    assert isinstance(plan, ferry.Plan) and len(plan) == 0  # an eager forward's plan is empty, as end_forward's
    assert ch.deferred_pending == 0
    with pytest.raises(ferry.LogicError, match="end_forward without begin_forward"):
        ch.end_forward(stream)  # already ended
    assert [(e.hook, e.tag, e.tobytes()) for e in drain(ch, 5)] == [(h, 7, raw(x)) for h, x in enumerate(xs)]
    assert ch.capture_deferred_many([], stream) is None  # without end_forward: nothing returned, nothing ended
    ch.begin_forward(stream)
    assert isinstance(ch.capture_deferred_many([], stream, end_forward=True), ferry.Plan)  # no item: the end alone
    assert ch.close()["clean"]


def test_an_end_that_raises_in_forward_aborts_the_forward(make_channel, stream, drain, reader):
    ch = make_channel(ring_bytes=1 << 20, publish_every=64)
    col = fh.Collector(ch, stream)
    x = torch.ones(16)
    with pytest.raises(ferry.LogicError, match=r"hook 2 \(item 0\).*written in place"):
        with col.forward():
            col(2, x)
            x.mul_(2)
    assert ch.deferred_pending == 0 and ch.stats()["entries_reserved"] == 0
    with col.forward():  # aborted: a new forward opens
        col(3, x)
    assert [(e.hook, e.tobytes()) for e in drain(ch, 1)] == [(3, raw(x))]
    assert ch.close()["clean"]
