# SPDX-License-Identifier: Apache-2.0
# Channel(on_error="disable"): capture that never takes the engine down (C++: tests/d2h/on_error.hpp, the
# fault sweep under on_error = disable in tests/reliability/sweep). Host backend.
import numpy as np
import pytest

import ferry


def test_on_error_is_a_channel_keyword_with_raise_as_default(make_channel):
    from ferry import _ferry

    assert "on_error" in _ferry.channel_config_fields
    with pytest.raises(ferry.LogicError, match="on_error"):
        make_channel(on_error="ignore")
    ch = make_channel()
    s = ferry.Stream(backend="host")
    ch.begin_forward(s)
    with pytest.raises(ferry.LogicError, match="> 0 bytes"):
        ch.capture(1, np.zeros(0, np.float32), s)  # raise: the misuse is the call's error
    ch.end_forward(s)


def test_a_misuse_disables_capture_until_recover(make_channel, drain):
    ch = make_channel(on_error="disable", publish_every=2)
    s = ferry.Stream(backend="host")
    x = np.arange(64, dtype=np.float32)
    ch.begin_forward(s)
    ch.capture(1, x, s)
    ch.capture(1, x + 1, s)
    ch.capture(1, np.zeros(0, np.float32), s)  # the misuse: no exception
    assert ch.capture_disabled and "> 0 bytes" in ch.capture_error
    ch.capture(1, x + 2, s)  # a no-op
    with pytest.raises(ferry.LogicError, match="forward boundary"):
        ch.recover()
    ch.end_forward(s)
    got = drain(ch, 2)  # what was launched before the error is delivered
    assert [e.numpy().view(np.float32)[0] for e in got] == [0.0, 1.0]
    for e in got:
        e.release()
    st = ch.stats()
    assert st["capture_errors"] == 1 and st["entries_reserved"] == 2
    ch.recover()
    assert not ch.capture_disabled
    ch.begin_forward(s)
    ch.capture(2, x + 3, s)
    ch.end_forward(s)
    (e,) = drain(ch, 1)
    assert e.hook == 2 and (e.numpy().view(np.float32) == x + 3).all()
    e.release()
    with pytest.raises(ferry.ShutdownError, match="capture disabled") as info:
        ch.close()
    assert info.value.report["capture_errors"] == 1
    assert "> 0 bytes" in info.value.report["first_capture_error"]


def test_a_graph_replayed_while_disabled_writes_nothing_and_is_not_unplanned(make_channel, drain):
    ch = make_channel(on_error="disable")
    s = ferry.Stream(backend="host")
    x = np.arange(32, dtype=np.int32)
    s.begin_capture()
    ch.begin_forward(s)
    ch.capture(3, x, s)
    plan = ch.end_forward(s)
    g = s.end_capture()
    ch.plan(plan, s)
    g.launch(s)
    (e,) = drain(ch, 1)
    e.release()
    ch.begin_forward(s)
    ch.capture(3, np.zeros(0, np.int32), s)  # disables capture
    ch.end_forward(s)
    for _ in range(3):  # the engine keeps replaying: quiet tokens, nothing written, nothing reported
        ch.plan(plan, s)
        g.launch(s)
    s.synchronize()
    assert not ch.invalidated
    assert ch.poll(10, timeout=0.2) == []
    ch.recover()
    ch.plan(plan, s)
    g.launch(s)
    (e,) = drain(ch, 1)
    assert (e.numpy().view(np.int32) == x).all()
    e.release()
