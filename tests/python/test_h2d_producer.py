# SPDX-License-Identifier: Apache-2.0
# ferry.h2d_producer (ATOM's @h2d_producer("group", ...)) on the host backend: the decorated function runs
# inside its group's producer scope; the core refuses a wrong slot and a reentry (directly, or through a
# combined group sharing a buffer) before the body runs, leaving the earlier scope's sources intact; an
# exception inside the body closes the scope and rolls nothing back; functools.wraps metadata is kept.
import numpy as np
import pytest

import ferry

SENTINEL = -7


class Setup:
    """`step` (input_ids, positions, temperature) combines `tokens` (input_ids) and `sampling` (temperature):
    a buffer in two groups. Every destination is bound and starts as SENTINEL."""

    def __init__(self, stream):
        self.stream = stream
        self.pub = ferry.Publisher(backend="host")
        self.dst = {"ids": np.full(16, SENTINEL, np.int32), "pos": np.full(16, SENTINEL, np.int64),
                    "temp": np.full(8, SENTINEL, np.float32)}
        self.ids = self.pub.declare("input_ids", ["step", "tokens"], np.int32, 16, dst=self.dst["ids"])
        self.pos = self.pub.declare("positions", ["step"], np.int64, 16, dst=self.dst["pos"])
        self.temp = self.pub.declare("temperature", ["step", "sampling"], np.float32, 8, dst=self.dst["temp"])
        self.pub.initialize(slots=2, stream=stream)

    def published(self):
        self.stream.synchronize()
        return {k: v.tolist() for k, v in self.dst.items()}


def data(n):
    return (np.arange(n, dtype=np.int32) + 100 * n, np.arange(n, dtype=np.int64) * 3 + n,
            np.full(min(n, 8), 0.5 * n, np.float32))


def expected(n, ids_len=16, pos_len=16, temp_len=8):
    ids, pos, temp = data(n)
    return {"ids": ids.tolist() + [SENTINEL] * (ids_len - n), "pos": pos.tolist() + [SENTINEL] * (pos_len - n),
            "temp": temp.tolist() + [SENTINEL] * (temp_len - len(temp))}


@pytest.fixture
def h(stream):
    return Setup(stream)


def test_decorated_producer_publishes_the_right_bytes(h):
    @ferry.h2d_producer(h.pub, "step")
    def fill(p, n, *, tag):
        assert isinstance(p, ferry.Producer) and p.group == "step"
        ids, pos, temp = data(n)
        p.source(h.ids)[:n] = ids  # zero-copy view of the slot's pinned source
        p.set_count(h.ids, n)
        p.write(h.pos, pos)
        p.write(h.temp, temp)
        return tag

    for step, n in enumerate([5, 9, 3, 12]):
        with h.pub.begin(step % 2):
            assert fill(n, tag=step) == step
            h.pub.publish("step", h.stream)
        got, (ids, pos, temp) = h.published(), data(n)
        assert got["ids"][:n] == ids.tolist() and got["pos"][:n] == pos.tolist()
        assert got["temp"][: len(temp)] == temp.tolist()
    got = h.published()
    assert got["ids"][12:] == [SENTINEL] * 4 and got["pos"][12:] == [SENTINEL] * 4  # never published: untouched


def test_functools_wraps_metadata_is_kept(h):
    def fill(p, batch):
        """Fills the step group."""

    wrapped = ferry.h2d_producer(h.pub, "step", slot=0)(fill)
    assert wrapped.__name__ == "fill" and wrapped.__doc__ == "Fills the step group."
    assert wrapped.__qualname__ == fill.__qualname__ and wrapped.__module__ == fill.__module__
    assert wrapped.__wrapped__ is fill and wrapped.h2d_group == "step"


def test_bad_decorator_arguments_are_type_errors(h):
    with pytest.raises(TypeError, match="expected group to be a str"):
        ferry.h2d_producer(h.pub, ["step"])
    with pytest.raises(TypeError, match="expected slot None, an int or a callable, got str"):
        ferry.h2d_producer(h.pub, "step", slot="0")
    with pytest.raises(TypeError, match="expected a ferry.Publisher, got int"):
        ferry.h2d_producer(3, "step")
    with pytest.raises(TypeError, match="expected a function"):
        ferry.h2d_producer(h.pub, "step")(42)


def test_reentry_is_refused_and_earlier_sources_stay_intact(h):
    ran = []

    @ferry.h2d_producer(h.pub, "tokens")
    def fill_tokens(p, n):
        ran.append(("tokens", n))
        p.write(h.ids, data(n)[0])

    @ferry.h2d_producer(h.pub, "step")
    def fill(p, n, reenter=None):
        ran.append(("step", n))
        ids, pos, temp = data(n)
        p.write(h.ids, ids)  # written before the rejected reentries: must be what gets published
        if reenter == "itself":
            with pytest.raises(ferry.LogicError, match="h2d producer 'step': reentry rejected: buffer 'input_ids' is "
                                                       "held by the open producer of group 'step'"):
                fill(3)
        elif reenter == "same group":
            with pytest.raises(ferry.LogicError, match="reentry rejected: buffer 'input_ids' is held by the open "
                                                       "producer of group 'step'"):
                h.pub.producer("step")
        elif reenter == "combined group":
            with pytest.raises(ferry.LogicError, match="h2d producer 'tokens': reentry rejected: buffer 'input_ids' "
                                                       "is held by the open producer of group 'step'"):
                fill_tokens(2)
        p.write(h.pos, pos)
        p.write(h.temp, temp)

    for slot, how in enumerate(["itself", "same group", "combined group"]):
        ran.clear()
        n = 5 + slot
        with h.pub.begin(slot % 2):
            fill(n, reenter=how)
            assert ran == [("step", n)], f"{how}: a refused reentry ran its body"
            h.pub.publish("step", h.stream)
            # after the publication, a reentry in the same epoch is refused too (directly and through tokens)
            with pytest.raises(ferry.LogicError, match=r"reentry rejected: buffer 'input_ids' was already "
                                                       r"published in epoch \d+ by group 'step'"):
                fill(2)
            with pytest.raises(ferry.LogicError, match="already published"):
                fill_tokens(2)
            assert ran == [("step", n)]
        assert h.published() == expected(n), how


def test_uncaught_reentry_closes_the_outer_scope_and_publishes_nothing(h):
    @ferry.h2d_producer(h.pub, "step")
    def fill(p, depth):
        p.write(h.ids, data(4)[0])
        if depth:
            fill(depth - 1)

    with h.pub.begin(0):
        with pytest.raises(ferry.LogicError, match="reentry rejected"):
            fill(1)
        with h.pub.producer("step"):  # the outer scope was closed by the propagating error
            pass
    assert h.published() == {k: [SENTINEL] * len(v) for k, v in h.dst.items()}


def test_wrong_slot_is_refused_before_the_body_runs(h):
    ran = []

    @ferry.h2d_producer(h.pub, "step", slot=0)
    def fill(p, n):
        ran.append(n)
        for b, a in zip((h.ids, h.pos, h.temp), data(n)):
            p.write(b, a)

    @ferry.h2d_producer(h.pub, "step", slot=lambda batch: batch["slot"])
    def fill_batch(p, batch):
        ran.append(batch)
        for b, a in zip((h.ids, h.pos, h.temp), data(batch["n"])):
            p.write(b, a)

    with pytest.raises(ferry.LogicError, match=r"h2d producer 'step': expected slot 0, got no active slot "
                                               r"\(call begin\(0\) first\)"):
        fill(3)
    with h.pub.begin(1):
        with pytest.raises(ferry.LogicError, match=r"h2d producer 'step': expected slot 0, got active slot 1"):
            fill(3)
        with pytest.raises(ferry.LogicError, match="expected slot 0, got active slot 1"):
            fill_batch({"slot": 0, "n": 3})
        assert ran == [], "the body ran although the slot was wrong"
        fill_batch({"slot": 1, "n": 6})  # nothing was held by the refused calls
        h.pub.publish("step", h.stream)
    assert h.published() == expected(6)
    with h.pub.begin(0):
        fill(4)
        h.pub.publish("step", h.stream)
    got = h.published()
    assert got["ids"][:4] == expected(4)["ids"][:4] and got["ids"][4:6] == expected(6)["ids"][4:6]


def test_combined_group_is_checked(h):
    ran = []

    @ferry.h2d_producer(h.pub, "tokens", slot=0)
    def fill_tokens(p, n):
        ran.append(n)
        p.write(h.ids, data(n)[0])

    @ferry.h2d_producer(h.pub, "step", slot=0)
    def fill_rest(p, n):  # the combined group's upload carries the tokens producer's input_ids
        _, pos, temp = data(n)
        p.write(h.pos, pos)
        p.write(h.temp, temp)

    with h.pub.begin(1):  # wrong slot, for the covered group as for the combined one
        with pytest.raises(ferry.LogicError, match=r"h2d producer 'tokens': expected slot 0, got active slot 1"):
            fill_tokens(3)
        with pytest.raises(ferry.LogicError, match=r"h2d producer 'step': expected slot 0, got active slot 1"):
            fill_rest(3)
    assert ran == []
    with h.pub.begin(0):
        fill_tokens(7)
        fill_rest(7)
        h.pub.publish("step", h.stream)  # one upload of the combined group
        with pytest.raises(ferry.LogicError, match=r"h2d producer 'tokens': reentry rejected: buffer 'input_ids' "
                                                   r"was already published in epoch \d+ by group 'step'"):
            fill_tokens(2)
        assert ran == [7]
    assert h.published() == expected(7)


def test_exception_inside_the_body_closes_the_scope_and_rolls_nothing_back(h):
    views = []

    @ferry.h2d_producer(h.pub, "step")
    def fill(p, n, fail):
        ids, pos, temp = data(n)
        p.write(h.ids, ids)
        views.append(p.source(h.pos))
        if fail:
            raise RuntimeError("producer failed half way")
        p.write(h.pos, pos)
        p.write(h.temp, temp)

    with h.pub.begin(0):
        with pytest.raises(RuntimeError, match="producer failed half way"):
            fill(4, fail=True)
        assert not views[0].flags.writeable, "the scope's views are read-only once it closed"
        # The group was not published; its members without a count in this epoch refuse a publication.
        with pytest.raises(ferry.LogicError, match="buffer 'positions' has no count in epoch"):
            h.pub.publish("step", h.stream)
        # Nothing was rolled back: input_ids' bytes and count stand (the core's guard only releases the
        # members), so a scope that sets only the other members publishes the failed producer's input_ids.
        with h.pub.producer("step") as p:
            _, pos, temp = data(4)
            p.write(h.pos, pos)
            p.write(h.temp, temp)
        h.pub.publish("step", h.stream)
    assert h.published() == expected(4)
    with h.pub.begin(1):  # the usual recovery: run the producer again
        with pytest.raises(RuntimeError):
            fill(6, fail=True)
        fill(6, fail=False)
        h.pub.publish("step", h.stream)
    assert h.published() == expected(6)
