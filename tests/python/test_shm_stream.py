# SPDX-License-Identifier: Apache-2.0
# ferry.sinks.shm_stream and ferry.ShmReader (docs/api/sinks.md, docs/design/shm_stream.md): a host-backend channel
# whose staging is a shared-memory segment, read zero-copy by a reader in a second process (a subprocess spawned
# here, with no GPU). The reader reports every entry's hook, seq, tag, forward, status and a SHA-256 of its bytes,
# checked against what this process captured; both policies, a SIGKILLed reader and its successor, two readers,
# another layout version, misuse; typed entries (the hook schema in the segment: numpy / torch views of the
# declared dtype and shape in the reader process), a corrupted schema region.
import hashlib
import importlib.util
import json
import mmap
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import ferry

READER = textwrap.dedent("""
    import hashlib, sys, time
    import ferry
    name, count, hold_after, delay = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    r = ferry.ShmReader(name, timeout=20)
    print("attached", r.stats()["start_index"], flush=True)
    kept, n = [], 0
    while n < count:
        if delay:
            time.sleep(delay)
        got = r.poll(1 if delay else min(64, count - n), timeout=0.1)
        if not got and r.ended:
            break
        for e in got:
            a = e.numpy()
            assert not a.flags.writeable
            print("entry", e.index, e.hook, e.seq, e.forward, e.tag, e.status, hashlib.sha256(a).hexdigest(), flush=True)
            del a
            n += 1
            if 0 <= hold_after < n:
                kept.append(e)
            else:
                e.release()
    if hold_after >= 0:
        print("holding", flush=True)
        time.sleep(600)
    print("ended" if r.ended else "done", flush=True)
    r.close()
""")


class Reader:
    """A reader process: `count` entries (or to the end of the stream); holds every entry after the first
    `hold_after` (>= 0) and then waits to be killed; sleeps `delay` seconds before each entry (a slow reader)."""

    def __init__(self, name, count=10**9, hold_after=-1, delay=0.0):
        env = dict(os.environ, FERRY_PYTHON_BACKEND="host", CUDA_VISIBLE_DEVICES="")
        self.p = subprocess.Popen([sys.executable, "-c", READER, name, str(count), str(hold_after), str(delay)],
                                  stdout=subprocess.PIPE, text=True, env=env)

    def line(self):
        line = self.p.stdout.readline()
        assert line, f"the reader ended early (exit {self.p.poll()})"
        return line.split()

    def until(self, stop):
        """The entry records up to the line `stop`: (index, hook, seq, forward, tag, status, sha256)."""
        out = []
        while True:
            w = self.line()
            if w[0] == stop:
                return out, w
            assert w[0] == "entry", w
            out.append((int(w[1]), int(w[2]), int(w[3]), int(w[4]), int(w[5]), w[6], w[7]))

    def kill(self):
        self.p.send_signal(signal.SIGKILL)
        self.p.wait()

    def close(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()
        self.p.stdout.close()


def data(f, h):
    """Hook h's tensor of forward f: a size per hook, every byte from (f, h, position)."""
    n = (4000, 1000, 48)[h]
    return ((np.arange(n, dtype=np.uint64) * 7 + f * 37 + h * 101 + 3) % 251).astype(np.uint8)


def sha(f, h):
    return hashlib.sha256(data(f, h)).hexdigest()


def run_forwards(ch, stream, forwards, sleep=0.0):
    for f in forwards:
        ch.begin_forward(stream, tag=1000 + f)
        for h in range(3):
            ch.capture(h, data(f, h), stream)
        ch.end_forward(stream)
        if sleep:
            time.sleep(sleep)


def expect_whole_forwards(recs, first_index):
    """Consecutive stream indices from first_index, whole forwards in hook order, every byte as captured."""
    assert len(recs) % 3 == 0, recs
    for i, (index, hook, seq, forward, tag, status, digest) in enumerate(recs):
        assert index == first_index + i
        assert hook == i % 3 and seq == forward * 3 + hook and tag == 1000 + forward and status == "ok"
        assert digest == sha(forward, hook), f"entry {index}: bytes differ from the captured ones"
        if i % 3:
            assert forward == recs[i - 1][3]


def wait_for(pred, what, timeout=10.0):
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.005)


@pytest.fixture
def name(request):
    n = f"pytest-{os.getpid()}-{request.node.name}"[:120].replace("[", "-").replace("]", "")
    yield n
    try:
        os.unlink(f"/dev/shm/ferry-{n}")
    except OSError:
        pass


def test_a_reader_process_gets_every_entry_byte_exact_with_hook_seq_and_tag(name, stream):
    # 64 KiB of staging holds ~13 forwards: it is reused ~15 times, a region only after the reader released it
    with ferry.sinks.shm_stream(name, staging_bytes=64 << 10, descriptors=32) as sink:
        reader = Reader(name, count=600)
        try:
            assert reader.line() == ["attached", "0"]
            ch = ferry.Channel(backend="host", ring_bytes=1 << 16, publish_every=4, sink=sink)
            run_forwards(ch, stream, range(200))
            recs, _ = reader.until("done")
            assert ch.close()["clean"]
        finally:
            reader.close()
        st = sink.close()
    assert len(recs) == 600
    expect_whole_forwards(recs, 0)
    assert st["entries_published"] == st["entries_released"] == 600
    assert st["bytes_published"] == 200 * 5048 and st["readers_attached"] == 1 and st["first_error"] is None


def test_block_keeps_everything_for_a_late_reader_and_close_reports_the_stall(name, stream):
    sink = ferry.sinks.shm_stream(name, staging_bytes=64 << 10, descriptors=8, timeout=0.2)
    ch = ferry.Channel(backend="host", ring_bytes=1 << 16, sink=sink)
    run_forwards(ch, stream, range(6))
    wait_for(lambda: ch.stats()["entries_drained"] == 18, "the drain")
    st = sink.stats()
    assert (st["entries_published"], st["pending_entries"], st["stall_timeouts"]) == (8, 10, 1)
    assert "expected a free descriptor within timeout 200 ms" in st["first_error"]
    reader = Reader(name, count=18)
    try:
        assert reader.line() == ["attached", "0"]
        recs, _ = reader.until("done")
    finally:
        reader.close()
    expect_whole_forwards(recs, 0)
    ch.close()
    with pytest.raises(ferry.TimeoutError, match="expected a free descriptor"):
        sink.close()


def test_drop_admits_or_drops_whole_forwards_and_a_slow_reader_never_slows_the_producer(name, stream):
    sink = ferry.sinks.shm_stream(name, policy="drop", max_lag_entries=6)
    reader = Reader(name, delay=0.002)
    try:
        reader.line()
        wait_for(lambda: sink.stats()["readers_attached"] == 1, "the reader")
        ch = ferry.Channel(backend="host", ring_bytes=1 << 20, sink=sink)
        t0 = time.monotonic()
        run_forwards(ch, stream, range(150), sleep=0.0002)
        assert time.monotonic() - t0 < 5.0
        ch.close()
        sink.close()
        recs, _ = reader.until("ended")
    finally:
        reader.close()
    st = sink.stats()
    expect_whole_forwards(recs, 0)
    assert st["dropped_forwards"] > 0 and st["entries_published"] == len(recs)
    assert st["entries_published"] // 3 + st["dropped_forwards"] == 150
    assert st["dropped_entries"] == 3 * st["dropped_forwards"]


def test_a_sigkilled_reader_is_replaced_and_its_successor_resumes_at_its_last_release(name, stream):
    sink = ferry.sinks.shm_stream(name, staging_bytes=1 << 20)
    first = Reader(name, count=30, hold_after=10)
    try:
        first.line()
        ch = ferry.Channel(backend="host", ring_bytes=1 << 20, sink=sink)
        run_forwards(ch, stream, range(20))
        held, _ = first.until("holding")
        assert len(held) == 30
        first.kill()
        wait_for(lambda: sink.stats()["readers_died"] == 1, "the reader's death")
        assert sink.stats()["entries_released"] == 10
        nxt = Reader(name, count=80)
        try:
            assert nxt.line() == ["attached", "10"]
            run_forwards(ch, stream, range(20, 30))
            recs, _ = nxt.until("done")
        finally:
            nxt.close()
        assert ch.close()["clean"]
    finally:
        first.close()
    assert [r[0] for r in recs] == list(range(10, 90))
    expect_whole_forwards(recs[2:], 12)  # 10, 11: the rest of forward 3, whose first entry the killed reader released
    st = sink.close()
    assert st["entries_released"] == 90 and st["readers_attached"] == 2


def test_a_second_reader_is_refused_naming_the_first(name):
    with ferry.sinks.shm_stream(name) as sink:
        first = Reader(name, count=1, hold_after=0)
        try:
            first.line()
            with pytest.raises(ferry.StreamBusyError, match=f"got reader pid {first.p.pid}") as e:
                ferry.ShmReader(name, timeout=1)
            assert e.value.owner_pid == first.p.pid
            first.kill()
            with ferry.ShmReader(name, timeout=2) as mine:  # the dead reader's slot is freed
                assert mine.poll(timeout=0) == []
            assert sink.stats()["readers_died"] == 1
        finally:
            first.close()


# 1: the layout before the schema region; 2: before the record region (a reader of 2 refuses this stream's 3 alike)
@pytest.mark.parametrize("version", [1, 2, 99])
def test_a_reader_of_another_layout_version_is_refused_naming_both(name, version):
    with ferry.sinks.shm_stream(name):
        with open(f"/dev/shm/ferry-{name}", "r+b") as f, mmap.mmap(f.fileno(), 4096) as m:
            assert int.from_bytes(m[8:16], "little") == 3  # this producer's layout version
            m[8:16] = version.to_bytes(8, "little")  # the layout version word
        with pytest.raises(ferry.LayoutVersionError, match=rf"expected layout version 3 .*got version {version}\b") as e:
            ferry.ShmReader(name, timeout=1)
        assert (e.value.expected, e.value.got) == (3, version)


def test_entries_release_by_views_and_misuse_is_refused(name, stream):
    with pytest.raises(ferry.LogicError, match="policy"):
        ferry.sinks.shm_stream(name, policy="sometimes")
    with pytest.raises(ferry.LogicError, match="name"):
        ferry.sinks.shm_stream("a/b")
    with pytest.raises(ferry.TimeoutError, match="no such stream"):
        ferry.ShmReader(name + "-none", timeout=0.05)
    sink = ferry.sinks.shm_stream(name, staging_bytes=1 << 16)
    with pytest.raises(ferry.LogicError, match="staging_bytes expected 0 or the given staging's 65536 bytes"):
        ferry.Channel(backend="host", ring_bytes=1 << 16, staging_bytes=4096, sink=sink)
    ch = ferry.Channel(backend="host", ring_bytes=1 << 16, sink=sink)
    with pytest.raises(ferry.LogicError, match="one channel at a time"):
        ferry.Channel(backend="host", ring_bytes=1 << 16, sink=sink)
    with pytest.raises(ferry.LogicError, match="sink"):
        ch.poll()
    with ferry.ShmReader(name) as r:  # a reader in this process too (tests; the use is another process)
        run_forwards(ch, stream, [0])
        got = []
        while len(got) < 3:
            got += r.poll(3, timeout=5)
        view = got[0].numpy()
        got[0].release()  # the view keeps the entry until it dies
        assert got[0].released and sink.stats()["entries_released"] == 0
        assert bytes(view) == data(0, 0).tobytes()
        del view
        with got[1], got[2]:
            assert got[1].tobytes() == data(0, 1).tobytes() and got[2].tag == 1000
        wait_for(lambda: sink.stats()["entries_released"] == 3, "the releases")
        with pytest.raises(ferry.LogicError, match="released"):
            got[1].numpy()
    ch.close()
    sink.close()
    assert repr(sink).endswith("closed>")


def test_the_stream_errors_are_ferry_errors():
    for cls in (ferry.StreamBusyError, ferry.LayoutVersionError, ferry.ReaderDetachedError, ferry.ProducerGoneError,
                ferry.AttributionOverflowError):
        assert issubclass(cls, ferry.Error) and cls.__module__ == "ferry"


def test_block_close_waits_for_a_reader_that_attaches_late(name, stream):
    # the producer is done before the trainer started: close() (policy block) waits up to its timeout for a reader
    # to attach and release what was published, so nothing is lost
    sink = ferry.sinks.shm_stream(name, timeout=20)
    ch = ferry.Channel(backend="host", ring_bytes=1 << 16, sink=sink)
    run_forwards(ch, stream, range(3))
    assert ch.close()["clean"]
    reader = Reader(name)
    try:
        st = sink.close()  # the reader attaches meanwhile, reads to the end of the stream, releases
        assert reader.line() == ["attached", "0"]
        recs, _ = reader.until("ended")
    finally:
        reader.close()
    expect_whole_forwards(recs, 0)
    assert st["entries_released"] == 9 and st["unreleased_at_close"] == 0


def test_a_cuda_channel_streams_to_a_reader_process_without_a_gpu(name):
    # the CUDA backend (the H200 run): the D2H lands in the cudaHostRegister'ed segment, read byte-exact by a
    # process that sees no GPU (CUDA_VISIBLE_DEVICES="")
    torch = pytest.importorskip("torch")
    if "cuda" not in ferry.available_backends() or not torch.cuda.is_available():
        pytest.skip("needs ferry built with FERRY_PYTHON_CUDA=ON, a GPU and torch")
    xs = {(f, h): torch.from_numpy(data(f, h)).cuda() for f in range(100) for h in range(3)}
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    with ferry.sinks.shm_stream(name, staging_bytes=64 << 10, descriptors=32) as sink:
        reader = Reader(name, count=300)
        try:
            assert reader.line() == ["attached", "0"]
            ch = ferry.Channel(0, backend="cuda", ring_bytes=1 << 20, publish_every=4, sink=sink)
            with torch.cuda.stream(s):
                for f in range(100):
                    ch.begin_forward(s, tag=1000 + f)
                    for h in range(3):
                        ch.capture(h, xs[f, h], s)
                    ch.end_forward(s)
            recs, _ = reader.until("done")
            assert ch.close()["clean"]
        finally:
            reader.close()
        st = sink.close()
    expect_whole_forwards(recs, 0)
    assert len(recs) == 300 and st["entries_released"] == 300


TYPED_READER = textwrap.dedent("""
    import hashlib, json, sys
    import ferry
    try:
        import torch
    except ImportError:
        torch = None

    def sha(b):
        return hashlib.sha256(b).hexdigest()

    name, count = sys.argv[1], int(sys.argv[2])
    with ferry.ShmReader(name, timeout=20) as r:
        print("attached", len(r.schema), flush=True)
        n = 0
        while n < count:
            for e in r.poll(64, timeout=0.1):
                with e:
                    a, raw = e.numpy(), e.numpy(raw=True)
                    assert not a.flags.writeable and not raw.flags.writeable
                    at = raw.__array_interface__["data"][0]
                    rec = {"index": e.index, "hook": e.hook, "name": e.name, "hook_name": e.hook_name, "dtype": e.dtype,
                           "shape": e.shape, "numpy": [a.dtype.str, list(a.shape), sha(a.tobytes())],
                           "raw": [raw.dtype.str, list(raw.shape), sha(raw)],
                           "zero_copy": a.__array_interface__["data"][0] == at and at != 0, "aligned": a.flags.aligned}
                    if torch is not None:
                        t = e.tensor()
                        rec["torch"] = [str(t.dtype), list(t.shape), sha(t.view(torch.uint8).reshape(-1).numpy().tobytes()),
                                        t.data_ptr() == at]
                        del t
                    del a, raw
                print("entry", json.dumps(rec), flush=True)
                n += 1
        print("schema", json.dumps({str(k): [v[0], v[1], list(v[2])] for k, v in r.schema.items()}), flush=True)
""")

SCHEMA = {0: ("resid", np.float32, (8,)), 1: ("ids", np.int64), 2: ("half", np.float16, (2, 3)),
          3: ("bf", "BF16", (4,)), 4: ("flags", np.bool_, (3,))}
# per hook: numpy's dtype of the typed view (BF16: its bits), torch's dtype, the row shape
TYPED = {0: ("<f4", "torch.float32", [8]), 1: ("<i8", "torch.int64", []), 2: ("<f2", "torch.float16", [2, 3]),
         3: ("<u2", "torch.bfloat16", [4]), 4: ("|b1", "torch.bool", [3]), 9: ("|u1", "torch.uint8", None)}


def typed_data(f, h):
    """Hook h's array of forward f: 1 + (f + h) % 3 rows of the schema's row; hook 9 (undeclared): bytes."""
    rows = 1 + (f + h) % 3
    g = np.random.default_rng(f * 16 + h)
    return {0: lambda: g.standard_normal((rows, 8), dtype=np.float32),
            1: lambda: g.integers(-2**40, 2**40, rows, dtype=np.int64),
            2: lambda: g.standard_normal((rows, 2, 3)).astype(np.float16),
            3: lambda: g.integers(0, 2**16, (rows, 4), dtype=np.uint16),  # bfloat16's bits
            4: lambda: g.integers(0, 2, (rows, 3)).astype(np.bool_),
            9: lambda: g.integers(0, 256, 10 + f, dtype=np.uint8)}[h]()


def test_a_reader_process_gets_typed_arrays_of_the_channels_schema(name, stream):
    # the reader attaches before the channel exists (no schema yet); the stream takes the channel's schema before
    # its first entry, and every entry of a declared hook reaches the reader as [rows, *row_shape] of its dtype
    hooks = (0, 1, 2, 3, 4, 9)
    with ferry.sinks.shm_stream(name, staging_bytes=1 << 20) as sink:
        env = dict(os.environ, FERRY_PYTHON_BACKEND="host", CUDA_VISIBLE_DEVICES="")
        p = subprocess.Popen([sys.executable, "-c", TYPED_READER, name, str(8 * len(hooks))], stdout=subprocess.PIPE,
                             text=True, env=env)
        try:
            assert p.stdout.readline().split() == ["attached", "0"]
            ch = ferry.Channel(backend="host", ring_bytes=1 << 20, schema=SCHEMA, sink=sink)
            assert sink.schema == ch.schema
            sent = {}
            for f in range(8):
                ch.begin_forward(stream, tag=f)
                for h in hooks:
                    sent[f, h] = typed_data(f, h)
                    ch.capture(h, sent[f, h], stream)
                ch.end_forward(stream)
            recs = [json.loads(p.stdout.readline().split(" ", 1)[1]) for _ in range(8 * len(hooks))]
            schema_line = p.stdout.readline().split(" ", 1)
            assert ch.close()["clean"]
        finally:
            if p.poll() is None:
                p.kill()
            p.wait()
            p.stdout.close()
    assert schema_line[0] == "schema"
    assert json.loads(schema_line[1]) == {str(k): [v[0], v[1], list(v[2])] for k, v in ch.schema.items()}
    have_torch = importlib.util.find_spec("torch") is not None
    assert ("torch" in recs[0]) == have_torch, "the reader process checks tensor() where torch imports"
    for i, rec in enumerate(recs):
        f, h = divmod(i, len(hooks))
        h = hooks[h]
        x = sent[f, h]
        np_dtype, torch_dtype, row = TYPED[h]
        assert (rec["index"], rec["hook"]) == (i, h)
        digest = hashlib.sha256(x.tobytes()).hexdigest()
        assert rec["raw"] == ["|u1", [x.nbytes], digest] and rec["zero_copy"] and rec["aligned"], rec
        if row is None:
            assert rec["name"] is rec["hook_name"] is rec["dtype"] is rec["shape"] is None
            assert rec["numpy"] == ["|u1", [x.nbytes], digest]
        else:
            shape = [x.shape[0]] + row
            assert rec["name"] == rec["hook_name"] == SCHEMA[h][0]
            assert rec["dtype"] == ferry.sinks.dtype_name(SCHEMA[h][1]) and rec["shape"] == shape
            assert rec["numpy"] == [np_dtype, shape, digest], f"entry {i} (hook {h}): {rec['numpy']}"
        if have_torch:
            assert rec["torch"] == [torch_dtype, shape if row is not None else [x.nbytes], digest, True], rec


def test_a_stream_schema_of_its_own_types_entries_and_a_channels_is_taken_before_the_first_entry_only(name, stream):
    own = {0: ("resid", np.float32, (4,))}
    with ferry.sinks.shm_stream(name, own, staging_bytes=1 << 16) as sink, ferry.ShmReader(name) as r:
        assert sink.schema == r.schema == {0: ("resid", "F32", (4,))}  # in the segment before the reader attached
        ch = ferry.Channel(backend="host", ring_bytes=1 << 16, schema={0: ("other", np.int32, (4,))}, sink=sink)
        assert sink.schema == r.schema == {0: ("resid", "F32", (4,))}, "a stream with a schema keeps it"
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        ch.begin_forward(stream)
        ch.capture(0, x, stream)
        ch.end_forward(stream)
        (e,) = r.poll(timeout=5.0)
        a = e.numpy()
        np.testing.assert_array_equal(a, x)
        assert (e.name, e.dtype, e.shape) == ("resid", "F32", (3, 4)) and not a.flags.writeable
        e.release()
        del a
        ch.close()
    with ferry.sinks.shm_stream(name + "-late", staging_bytes=1 << 16) as sink, ferry.ShmReader(name + "-late") as r:
        ch = ferry.Channel(backend="host", ring_bytes=1 << 16, sink=sink)  # no schema: nothing to take
        assert sink.schema == r.schema == {}
        ch.begin_forward(stream)
        ch.capture(0, np.arange(4, dtype=np.float32), stream)
        ch.end_forward(stream)
        (e,) = r.poll(timeout=5.0)
        assert e.name is None and e.shape is None and e.numpy().dtype == np.uint8
        e.release()
        ch.close()
        with pytest.raises(ferry.LogicError, match="expected to take its channel's schema before its first entry"):
            ferry.Channel(backend="host", ring_bytes=1 << 16, schema=own, sink=sink)
    with pytest.raises(ferry.LogicError, match="expected a schema of at most 4096 bytes"):
        with ferry.sinks.shm_stream(name + "-small", schema_bytes=4096) as sink:
            ferry.Channel(backend="host", ring_bytes=1 << 16, sink=sink,
                          schema={k: (f"model.layers.{k}.mlp.down_proj.output", "BF16", (4096,)) for k in range(100)})


def test_tensor_is_a_zero_copy_torch_view_of_the_declared_dtype(name, stream):
    torch = pytest.importorskip("torch")
    schema = {0: ("bf", torch.bfloat16, (2, 4)), 1: ("h", torch.float16, (3,))}
    with ferry.sinks.shm_stream(name, schema, staging_bytes=1 << 16) as sink, ferry.ShmReader(name) as r:
        ch = ferry.Channel(backend="host", ring_bytes=1 << 16, sink=sink)
        xs = [torch.randn(3, 2, 4).to(torch.bfloat16), torch.randn(5, 3).to(torch.float16)]
        ch.begin_forward(stream)
        for h, x in enumerate(xs):
            ch.capture(h, x, stream)
        ch.end_forward(stream)
        got = []
        while len(got) < 2:
            got += r.poll(2, timeout=5.0)
        for e, x in zip(got, xs):
            with e:
                t = e.tensor()
                assert t.dtype == x.dtype and t.shape == x.shape and torch.equal(t, x)
                assert t.data_ptr() == e.numpy(raw=True).__array_interface__["data"][0], "zero-copy"
                assert e.tensor(raw=True).dtype == torch.uint8
                del t
        ch.close()


def test_a_corrupted_schema_region_is_a_logic_error_naming_the_stream(name, stream):
    with ferry.sinks.shm_stream(name, {0: ("resid", np.float32, (4,))}, timeout=0.2) as sink:
        with open(f"/dev/shm/ferry-{name}", "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
            offset = int.from_bytes(m[96:104], "little")  # the schema region (shm_layout.hpp: w_schema_offset)
            assert m[offset:offset + 8] == b"FERRYHKS"
            m[offset + 32 + 19] ^= 0x20  # a byte of the hook's name: the CRC-32 differs
        ch = ferry.Channel(backend="host", ring_bytes=1 << 16, sink=sink)
        ch.begin_forward(stream)
        ch.capture(0, np.zeros(4, np.float32), stream)
        ch.end_forward(stream)
        with ferry.ShmReader(name, timeout=1) as r:
            with pytest.raises(ferry.LogicError, match=rf"stream '{name}': schema region of .*expected the body's CRC-32"):
                r.schema
            wait_for(lambda: sink.stats()["entries_published"] == 1, "the entry")
            with pytest.raises(ferry.LogicError, match="schema region"):
                r.poll(timeout=1.0)
        ch.close()


ATTR_READER = textwrap.dedent("""
    import hashlib, json, sys
    import ferry
    name, count = sys.argv[1], int(sys.argv[2])
    with ferry.ShmReader(name, timeout=20) as r:
        print("attached", flush=True)
        n = 0
        while n < count and not r.ended:
            for e in r.poll(64, timeout=0.1):
                n += 1
                rec = {k: getattr(e, k) for k in ("index", "forward", "tag", "status", "size", "reserved", "row_bytes",
                                                  "rows", "attribution")}
                try:
                    rec["requests"], rec["meta"] = e.requests, e.meta and e.meta.hex()
                except ferry.AttributionOverflowError as err:
                    rec["overflow"] = [err.record_bytes, err.capacity, str(err)]
                    rec["sha"] = hashlib.sha256(e.numpy(raw=True)).hexdigest()
                    try:
                        e.rows_of(0) if e.row_bytes else None
                    except ferry.AttributionOverflowError:
                        rec["rows_of_overflow"] = True
                if e.ok and rec.get("requests"):
                    try:
                        views = {q[0]: e.rows_of(q[0]) for q in rec["requests"]}
                        rec["rows_of"] = {str(k): [list(v.shape), v.flags.writeable, hashlib.sha256(v).hexdigest()]
                                          for k, v in views.items()}
                        del views
                    except ferry.LogicError as err:
                        rec["rows_of_error"] = str(err)
                if e.ok and "requests" in rec:
                    try:
                        e.rows_of(2**62)
                    except ferry.LogicError as err:
                        rec["unknown"] = str(err)
                if not e.ok:
                    try:
                        e.numpy()
                    except ferry.SizeOverflowError as err:
                        rec["error"] = str(err)
                e.release()
                print("entry", json.dumps(rec), flush=True)
    print("done", flush=True)
""")


def attr_records(name, count, produce, **sink_kw):
    """Runs produce(channel) into a stream read by an ATTR_READER process; its records and the stream's stats."""
    with ferry.sinks.shm_stream(name, staging_bytes=1 << 20, **sink_kw) as sink:
        env = dict(os.environ, FERRY_PYTHON_BACKEND="host", CUDA_VISIBLE_DEVICES="")
        p = subprocess.Popen([sys.executable, "-c", ATTR_READER, name, str(count)], stdout=subprocess.PIPE, text=True,
                             env=env)
        try:
            assert p.stdout.readline().split() == ["attached"]
            ch = ferry.Channel(backend="host", ring_bytes=1 << 16, tuning={"size_slots": 16}, sink=sink)
            produce(ch)
            recs = []
            for _ in range(count):
                line = p.stdout.readline()
                assert line.startswith("entry "), line
                recs.append(json.loads(line.split(" ", 1)[1]))
            assert p.stdout.readline() == "done\n"
            ch.close()
        finally:
            if p.poll() is None:
                p.kill()
            p.wait()
            p.stdout.close()
    return recs, sink.stats()


def _rows_sha(x, rows):
    return hashlib.sha256(np.ascontiguousarray(x[rows]).view(np.uint8)).hexdigest()


def test_a_reader_process_gets_each_entrys_attribution_and_rows_of_splits_its_rows(name, stream):
    # what begin_forward(tag=, requests=, meta=) gave each forward arrives per entry unchanged: a tagged forward with
    # requests as spans and meta bytes, an unattributed one, requests as ints without meta; rows_of(request) is a
    # read-only [rows, row_bytes] view of exactly that request's rows, refused for a whole entry and an unknown id
    x = (np.arange(32 * 12, dtype=np.float32).reshape(32, 12) * 3 + 1).copy()
    sel = [np.array([31, 4, 5, 11], np.int32), np.array([0, 1], np.int32), np.array([2, 9], np.int32)]

    def produce(ch):
        ch.begin_forward(stream, tag=1000, requests=[(103, 0, 1), (100, 1, 2), (102, 3, 1)], meta=b"step 1000")
        ch.capture_rows(1, x, rows=sel[0], stream=stream)
        ch.capture(2, x[:2], stream)
        ch.end_forward(stream)
        ch.begin_forward(stream)
        ch.capture_rows(1, x, rows=sel[1], stream=stream)
        ch.end_forward(stream)
        ch.begin_forward(stream, tag=7, requests=[40, 41])
        ch.capture_rows(3, x, rows=sel[2], stream=stream)
        ch.end_forward(stream)

    recs, st = attr_records(name, 4, produce)
    a, whole, untagged, ints = recs
    assert (a["tag"], a["forward"], a["attribution"], a["meta"]) == (1000, 0, "present", b"step 1000".hex())
    assert (a["rows"], a["row_bytes"], a["reserved"] >= 4 * 48) == (4, 48, True)
    assert a["requests"] == [[103, 0, 1], [100, 1, 2], [102, 3, 1]]
    assert a["rows_of"] == {"103": [[1, 48], False, _rows_sha(x, [31])], "100": [[2, 48], False, _rows_sha(x, [4, 5])],
                            "102": [[1, 48], False, _rows_sha(x, [11])]}
    assert "got request 4611686018427387904" in a["unknown"]
    assert (whole["tag"], whole["requests"], whole["meta"], whole["rows"], whole["row_bytes"]) == \
        (1000, a["requests"], a["meta"], 0, 0)
    assert whole["reserved"] >= 96 and "captured whole" in whole["rows_of_error"]
    assert (untagged["tag"], untagged["forward"], untagged["attribution"]) == (1, 1, "none")
    assert (untagged["requests"], untagged["meta"], untagged["rows"]) == ([], None, 2)
    assert (ints["tag"], ints["attribution"], ints["meta"], ints["requests"]) == (7, "present", None, [[40, 0, 1], [41, 1, 1]])
    assert ints["rows_of"] == {"40": [[1, 48], False, _rows_sha(x, [2])], "41": [[1, 48], False, _rows_sha(x, [9])]}
    assert (st["attribution_records"], st["attribution_overflows"]) == (2, 0)


def test_a_size_overflow_entry_names_its_reservation_in_the_reader_process(name, stream):
    # plan(selected=2) reserves 2 rows (96 bytes) per row entry; a replay selecting 3 rows is size_overflow: the reader
    # sees .reserved == 96 and a SizeOverflowError naming 96 reserved bytes (not 0)
    x = (np.arange(32 * 12, dtype=np.float32).reshape(32, 12)).copy()
    idx = np.array([1, 6, 11, 0], np.int32)
    n = np.array([3], np.int32)

    def produce(ch):
        stream.begin_capture()
        ch.begin_forward(stream)
        ch.capture_rows(0, x, rows=idx, count=n, max_count=4, stream=stream)
        plan = ch.end_forward(stream)
        g = stream.end_capture()
        ch.plan(plan, stream, selected=2, tag=9, requests=[(5, 0, 3)])
        g.launch(stream)
        stream.synchronize()

    (e,), _ = attr_records(name, 1, produce)
    assert (e["status"], e["size"], e["reserved"], e["tag"], e["requests"]) == ("size_overflow", 144, 96, 9, [[5, 0, 3]])
    assert "GPU-resolved size 144 bytes exceeds the reserved 96 bytes" in e["error"], e["error"]


def test_a_record_larger_than_the_region_is_attribution_overflow_counted_never_a_wrong_attribution(name, stream):
    # record_bytes=4096: a forward of 200 requests and 3 meta bytes needs 64 + 200 x 24 + 8 = 4872 bytes, so its
    # entries arrive without it (attribution 'overflow': requests / meta / rows_of raise AttributionOverflowError
    # naming both sizes; the bytes intact), counted once; the next forward's record is there again
    x = (np.arange(32 * 12, dtype=np.float32).reshape(32, 12)).copy()
    rows = np.array([3, 4, 5], np.int32)

    def produce(ch):
        ch.begin_forward(stream, tag=1, requests=[(k, k % 3, 1) for k in range(200)], meta=b"big")
        ch.capture_rows(0, x, rows=rows, stream=stream)
        ch.capture(1, x[:1], stream)
        ch.end_forward(stream)
        ch.begin_forward(stream, tag=2, requests=[(9, 0, 3)], meta=b"small")
        ch.capture_rows(0, x, rows=rows, stream=stream)
        ch.end_forward(stream)

    recs, st = attr_records(name, 3, produce, record_bytes=4096)
    for e, data in zip(recs[:2], (x[rows], x[:1])):
        assert (e["attribution"], e["tag"], e["status"]) == ("overflow", 1, "ok")
        assert e["overflow"][:2] == [4872, 4096] and "requests" not in e
        assert e.get("rows_of_overflow", False) == (e["row_bytes"] != 0)
        assert "got a record of 4872 bytes, larger than the region's 4096 bytes" in e["overflow"][2]
        assert e["sha"] == hashlib.sha256(np.ascontiguousarray(data).view(np.uint8)).hexdigest()
    last = recs[2]
    assert (last["attribution"], last["requests"], last["meta"]) == ("present", [[9, 0, 3]], b"small".hex())
    assert last["rows_of"] == {"9": [[3, 48], False, _rows_sha(x, rows)]}
    assert (st["attribution_overflows"], st["attribution_records"]) == (1, 1)
