# SPDX-License-Identifier: Apache-2.0
# ferry.Publisher on the host backend: typed buffers, zero-copy pinned sources, exact published prefixes
# with untouched tails (eager and graph replays), and bad input that changes nothing.
import re

import numpy as np
import pytest

import ferry

SENTINEL = -7


def make_publisher(stream, upload=None):
    """input_ids/positions (group tokens, bound destinations filled with SENTINEL), temperature (group
    sampling, ferry-allocated), block_table rows (group blocks)."""
    pub = ferry.Publisher(backend="host")
    dst = {"ids": np.full(64, SENTINEL, np.int32), "pos": np.full(64, SENTINEL, np.int64),
           "bt": np.full((16, 8), SENTINEL, np.int32)}
    bufs = {
        "ids": pub.declare("input_ids", ["tokens"], np.int32, 64, dst=dst["ids"]),
        "pos": pub.declare("positions", ["tokens"], "int64", 64, dst=dst["pos"]),
        "temp": pub.declare("temperature", "sampling", np.float32, 32),
        "bt": pub.declare("block_table", ["blocks"], np.int32, 16, unit="rows", row=8, dst=dst["bt"]),
    }
    pub.initialize(slots=2, stream=stream, upload=upload)
    return pub, bufs, dst


def step_data(step):
    n = (step * 13) % 60 + 1
    rows = step % 16 + 1
    return (np.arange(n, dtype=np.int32) + 1000 * step, np.arange(n, dtype=np.int64) * 3 + step,
            np.linspace(0.1, 1.0, n % 32 + 1, dtype=np.float32) * step,
            np.arange(rows * 8, dtype=np.int32).reshape(rows, 8) + step)


def check(dst, pub, bufs, data):
    ids, pos, temp, bt = data
    np.testing.assert_array_equal(dst["ids"][: len(ids)], ids)
    np.testing.assert_array_equal(dst["pos"][: len(pos)], pos)
    np.testing.assert_array_equal(pub.device_array(bufs["temp"])[: len(temp)], temp)
    np.testing.assert_array_equal(dst["bt"][: len(bt)], bt)


def test_declared_buffers(stream):
    pub, bufs, dst = make_publisher(stream)
    assert isinstance(pub, ferry.Publisher) and pub.backend == "host"
    assert bufs["ids"].shape == (64,) and bufs["ids"].dtype == np.int32 and bufs["ids"].nbytes == 256
    assert bufs["bt"].shape == (16, 8) and bufs["bt"].unit == "rows" and bufs["bt"].nbytes == 512
    assert pub.device_pointer(bufs["ids"]) == dst["ids"].ctypes.data
    assert pub.device_array(bufs["temp"]).ctypes.data == pub.device_pointer(bufs["temp"])
    assert set(pub.info("tokens")["members"]) == {"input_ids", "positions"}


@pytest.mark.parametrize("upload", ["packed", "direct", "zerocopy"])
def test_publications_exact_and_tails_untouched(stream, upload):
    pub, bufs, dst = make_publisher(stream, upload)
    high = {"ids": 0, "pos": 0, "bt": 0}  # longest prefix written so far: beyond it nothing was touched
    for step in range(8):
        data = step_data(step)
        ids, pos, temp, bt = data
        with pub.begin(step % 2) as slot:
            assert isinstance(slot, ferry.Slot) and slot.active
            with pub.producer("tokens") as p:
                assert isinstance(p, ferry.Producer)
                src = p.source(bufs["ids"])  # zero-copy view of the slot's pinned source
                src[: len(ids)] = ids
                p.set_count(bufs["ids"], len(ids))
                p.write(bufs["pos"], pos)
            pub.publish("tokens", stream)
            with pub.producer("sampling") as p:
                p.write(bufs["temp"], temp)
            pub.publish("sampling", stream)
            with pub.producer("blocks") as p:
                p.write(bufs["bt"], bt)
            pub.publish("blocks", stream)
        assert not slot.active
        stream.synchronize()
        check(dst, pub, bufs, data)
        for k, a in (("ids", ids), ("pos", pos), ("bt", bt)):
            high[k] = max(high[k], len(a))
            assert (dst[k][high[k]:] == SENTINEL).all(), f"{k}: tail beyond {high[k]} written"


def test_source_views_are_zero_copy(stream):
    pub, bufs, _ = make_publisher(stream)
    with pub.begin(0):
        with pub.producer("tokens") as p:
            a = p.source(bufs["ids"])
            b = p.source(bufs["ids"])
            assert a.ctypes.data == b.ctypes.data and a.shape == (64,) and a.dtype == np.int32
            a[0] = 42
            assert b[0] == 42
            rows = None
        with pub.producer("blocks") as p:
            rows = p.source(bufs["bt"])
            assert rows.shape == (16, 8)
    with pub.begin(1):
        with pub.producer("tokens") as p:
            assert p.source(bufs["ids"]).ctypes.data != a.ctypes.data  # each slot has its own sources


def test_graph_replay_with_stage_and_capture_upload(stream):
    pub, bufs, dst = make_publisher(stream)
    graphs = []
    for slot in range(2):
        stream.begin_capture()
        pub.capture_upload("tokens", slot, stream)
        graphs.append(stream.end_capture())
    for step in range(6):
        data = step_data(step)
        with pub.begin(step % 2):
            with pub.producer("tokens") as p:
                p.write(bufs["ids"], data[0])
                p.write(bufs["pos"], data[1])
            pub.stage("tokens")
            graphs[step % 2].launch(stream)
        stream.synchronize()
        np.testing.assert_array_equal(dst["ids"][: len(data[0])], data[0])
        np.testing.assert_array_equal(dst["pos"][: len(data[1])], data[1])


def test_bad_input_changes_nothing(stream, fake_cuda_array):
    pub = ferry.Publisher(backend="host")
    with pytest.raises(ferry.LogicError, match="dtype int32, got int64"):
        pub.declare("a", ["g"], np.int32, 8, dst=np.zeros(8, np.int64))
    with pytest.raises(ferry.LogicError, match="at least 32 bytes"):
        pub.declare("a", ["g"], np.int32, 8, dst=np.zeros(4, np.int32))
    with pytest.raises(ferry.LogicError, match="C-contiguous"):
        pub.declare("a", ["g"], np.int32, 8, dst=np.zeros(16, np.int32)[::2])
    with pytest.raises(ferry.LogicError, match="device tensor where the host backend"):
        pub.declare("a", ["g"], np.float32, 8, dst=fake_cuda_array(8))
    with pytest.raises(ferry.LogicError, match="unit"):
        pub.declare("a", ["g"], np.int32, 8, unit="pages")
    with pytest.raises(ferry.LogicError, match="row="):
        pub.declare("a", ["g"], np.int32, 8, unit="rows")
    with pytest.raises(ferry.LogicError, match="dtype"):
        pub.declare("a", ["g"], np.complex64, 8)
    with pytest.raises(TypeError):
        pub.declare("a", ["g"], "not-a-dtype", 8)
    dst = np.full(8, SENTINEL, np.int32)
    a = pub.declare("a", ["g"], np.int32, 8, dst=dst)
    with pytest.raises(ferry.LogicError, match="declared twice"):
        pub.declare("a", ["g"], np.int32, 8)
    with pytest.raises(TypeError, match="ferry.Stream"):
        pub.initialize(2, stream=7)
    with pytest.raises(ferry.LogicError, match="upload"):
        pub.initialize(2, stream=stream, upload="teleport")
    pub.initialize(2, stream=stream)
    with pytest.raises(ferry.LogicError, match="after initialize"):
        pub.declare("b", ["g"], np.int32, 8)
    with pytest.raises(ferry.LogicError):
        pub.producer("g")  # no active slot
    with pub.begin(0):
        with pub.producer("g") as p:
            with pytest.raises(ferry.LogicError):
                pub.producer("g")  # reentry
            with pytest.raises(ferry.LogicError, match="expected dtype int32, got float32"):
                p.write(a, np.zeros(3, np.float32))
            with pytest.raises(ferry.LogicError, match="C-contiguous"):
                p.write(a, np.zeros(6, np.int32)[::2])
            with pytest.raises(ferry.LogicError, match="at most 32 bytes"):
                p.write(a, np.zeros(9, np.int32))
            with pytest.raises(ferry.LogicError, match="host array"):
                p.write(a, fake_cuda_array(4))
            with pytest.raises(ferry.LogicError):
                p.set_count(a, 9)  # over capacity
            with pytest.raises(TypeError):
                p.write(a, "1234")
        with pytest.raises(ferry.LogicError, match="closed"):
            p.source(a)
        with pytest.raises(TypeError, match="ferry.Stream"):
            pub.publish("g", object())
        with pytest.raises(ferry.LogicError):
            pub.publish("nope", stream)
        stream.synchronize()
        assert (dst == SENTINEL).all()  # nothing was published by the failed calls
        with pub.producer("g") as p:
            p.write(a, np.array([1, 2, 3], np.int32))
        pub.publish("g", stream)
    stream.synchronize()
    assert dst.tolist() == [1, 2, 3] + [SENTINEL] * 5


@pytest.mark.parametrize("capacity", [2**62 + 16, 2**62])
def test_capacity_whose_bytes_overflow_is_a_typed_error_not_a_crash(capacity):
    # before: 2**62 + 16 int32 elements wrapped to 64 bytes and publish() died with SIGSEGV; 2**62 wrapped to 0
    pub = ferry.Publisher(backend="host")
    with pytest.raises(ferry.LogicError, match=r"h2d buffer 'ids': expected capacity x 4 bytes per unit of at most "
                                               r"2\^48 bytes, got capacity " + str(capacity)):
        pub.declare("ids", ["step"], "int32", capacity)


def test_source_views_become_read_only_when_the_scope_closes(stream):
    # before: a view kept past its scope stayed writable, and a write after publish() silently changed what
    # the upload read (200 of 200 host runs)
    pub, bufs, dst = make_publisher(stream)
    with pub.begin(0):
        with pub.producer("tokens") as p:
            ids = p.source(bufs["ids"])
            ids[:3] = [7, 8, 9]
            assert ids.flags.writeable
            p.set_count(bufs["ids"], 3)
            p.write(bufs["pos"], np.arange(3, dtype=np.int64))
        assert not ids.flags.writeable
        with pytest.raises(ValueError, match="assignment destination is read-only"):
            ids[0] = 1  # after the scope closed: refused before publish()
        pub.publish("tokens", stream)
        with pytest.raises(ValueError, match="assignment destination is read-only"):
            ids[1] = 1  # and after it
        with pub.producer("blocks") as p:
            rows = p.source(bufs["bt"])
            p.close()  # close() is the end of the scope too
            with pytest.raises(ValueError, match="assignment destination is read-only"):
                rows[0, 0] = 1
    stream.synchronize()
    assert dst["ids"][:3].tolist() == [7, 8, 9]
    assert ids.tolist()[:3] == [7, 8, 9]  # still readable


def test_device_array_is_read_only_on_the_host_backend(stream):
    pub, bufs, _ = make_publisher(stream)
    d = pub.device_array(bufs["temp"])
    assert not d.flags.writeable
    with pytest.raises(ValueError, match="assignment destination is read-only"):
        d[0] = 1.0
    with pytest.raises(ValueError):
        d.flags.writeable = True  # the view's buffer itself is read-only


def test_debug_sources_reports_a_write_after_publish(stream, monkeypatch):
    pub = ferry.Publisher(backend="host")
    a = pub.declare("a", ["g"], np.int32, 8)
    pub.initialize(2, stream=stream, debug_sources=True)
    assert pub.debug_sources
    with pub.begin(0):
        with pub.producer("g") as p:
            head = p.source(a)[:4]  # a view derived inside the scope keeps numpy's writeable flag
            p.write(a, np.array([1, 2, 3, 4], np.int32))
        pub.publish("g", stream)
        head[1] = 99  # the misuse the read-only views cannot catch
    with pytest.raises(ferry.LogicError, match=r"h2d group 'g': buffer 'a' source of slot 0 was written after "
                                               r"publish\(\) \(epoch \d+\): byte 4 of its 16 published bytes was "
                                               r"0x02, is 0x63 now \(found by begin\(\)"):
        pub.begin(1)
    with pub.begin(1):  # reported once; the publisher goes on
        pass
    monkeypatch.setenv("FERRY_H2D_DEBUG_SOURCES", "1")
    env = ferry.Publisher(backend="host")
    env.declare("a", ["g"], np.int32, 8)
    env.initialize(2, stream=stream)
    assert env.debug_sources
    monkeypatch.delenv("FERRY_H2D_DEBUG_SOURCES")
    off = ferry.Publisher(backend="host")
    off.declare("a", ["g"], np.int32, 8)
    off.initialize(2, stream=stream)
    assert not off.debug_sources


def test_a_buffer_of_another_publisher_is_refused_naming_both(stream):
    # Publisher.device_pointer / set_count and Producer.set_count took another publisher's Buffer by its index
    # (and set the count of this publisher's buffer of the same index; found by the fuzzer)
    a, b = ferry.Publisher(backend="host"), ferry.Publisher(backend="host")
    a_ids = a.declare("ids", "g", np.int32, 8)
    b_ids = b.declare("ids", "g", np.int32, 8)  # same name and index as a's
    b_pos = b.declare("pos", "g", np.int32, 8)  # an index a does not have
    a.initialize(slots=2, stream=stream)
    b.initialize(slots=2, stream=stream)
    with a.begin(0):
        p = a.producer("g")
        calls = [("Publisher.device_pointer", lambda x: a.device_pointer(x)),
                 ("Publisher.device_array", lambda x: a.device_array(x)),
                 ("Publisher.set_count", lambda x: a.set_count(x, 1)),
                 ("Producer.set_count", lambda x: p.set_count(x, 1)),
                 ("Producer.source", lambda x: p.source(x)),
                 ("Producer.write", lambda x: p.write(x, np.ones(1, np.int32)))]
        for who, call in calls:
            for buf in (b_ids, b_pos):
                with pytest.raises(ferry.LogicError, match=rf"{who}: expected a buffer declared by this publisher "
                                                           rf"\(Publisher #\d+\), got buffer '{buf.name}' of "
                                                           rf"Publisher #\d+") as info:
                    call(buf)
                # expected vs got: a's number and b's, as their reprs show them
                ids = re.findall(r"Publisher #(\d+)", str(info.value))
                assert [f"<ferry.Publisher #{i} host device 0>" for i in ids] == [repr(a), repr(b)]
        p.write(a_ids, np.arange(3, dtype=np.int32))  # a's own buffer: accepted
        p.close()
        a.publish("g", stream)
    stream.synchronize()
    np.testing.assert_array_equal(a.device_array(a_ids)[:3], np.arange(3))
    assert a.device_pointer(a_ids) != b.device_pointer(b_ids)


def test_graph_launch_after_its_publisher_died_is_refused(stream):
    # the H2D side of the graph ties: a captured upload's graph outliving its publisher is refused, not a read
    # of freed staging and a write into freed device memory
    import gc
    pub, bufs, dst = make_publisher(stream)
    stream.begin_capture()
    pub.capture_upload("tokens", 0, stream)
    graph = stream.end_capture()
    data = step_data(1)
    with pub.begin(0):
        with pub.producer("tokens") as p:
            p.write(bufs["ids"], data[0])
            p.write(bufs["pos"], data[1])
        pub.stage("tokens")
        graph.launch(stream)
    stream.synchronize()
    np.testing.assert_array_equal(dst["ids"][: len(data[0])], data[0])
    del pub, bufs, p  # the producer holds its publisher too
    gc.collect()
    with pytest.raises(ferry.LogicError, match=r"Graph.launch: .* got Publisher #\d+ \(host, device 0\) destroyed"):
        graph.launch(stream)
    stream.synchronize()
