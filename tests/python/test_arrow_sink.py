# SPDX-License-Identifier: Apache-2.0
# ferry.arrow (SAELens's cache layout as a Hugging Face dataset) on the host backend: a channel's whole-context
# forwards read back through datasets.load_from_disk equal to what was captured (BF16 widened exactly); a forward the
# layout refuses is counted and the next ones are written, while an error of a shard's write (of any type) ends the
# run; a forward widened while the one before it is written (a slowed writer) reads back whole; a full shard is
# finished by the finisher thread while the writer fills the next;
# the shards of a run share one _ferry.FileWriter (tuned: the same rows), and files of one writer hold their own
# bytes; a tuning key FileWriter does not take, or a value out of range, is a LogicError;
# every BF16 and F16 value widens exactly; a writer SIGKILLed mid-run leaves a loadable dataset of
# complete shards; a full disk (EFBIG through RLIMIT_FSIZE) ends the run with the earlier shards loadable.
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import ferry

pa = pytest.importorskip("pyarrow")
datasets = pytest.importorskip("datasets")
torch = pytest.importorskip("torch")

CTX, W = 8, 6


def _forward(f, b=2):
    g = torch.Generator().manual_seed(f)
    return {0: torch.randn(b * CTX, W, generator=g).to(torch.bfloat16), 1: torch.randn(b * CTX, 3, generator=g),
            2: torch.arange(b * CTX, dtype=torch.int64) + 1000 * f}


SCHEMA = {0: ("blocks.3.hook_resid_post", torch.bfloat16, (W,)), 1: ("blocks.3.attn.hook_z", "F32", (3,)),
          2: ("token_ids", "I64", ())}


def _run(directory, forwards, shard_bytes=1 << 30, bad_at=None, tuning=None):
    s = ferry.Stream(backend="host")
    ch = ferry.Channel(backend="host", ring_bytes=1 << 20, schema=SCHEMA)
    sink = ferry.arrow.ArrowSink(ch, str(directory), CTX, shard_bytes=shard_bytes, fsync=tuning is not None,
                                 tuning=tuning)
    for f in range(forwards):
        ch.begin_forward(s, tag=f)
        for h, t in _forward(f).items():
            ch.capture(h, t[:-1] if f == bad_at and h == 0 else t, s)  # a forward of 15 tokens: refused
        ch.end_forward(s)
    return sink.close()


# tuned: the shards written durably through a writer of one I/O thread and four 4 KiB buffers (every shard many
# writes, cut at page boundaries), read back the same
@pytest.mark.parametrize("tuning", [None, {"io_threads": 1, "write_buffers": 4, "write_bytes": 4096}])
def test_forwards_read_back_as_saelens_rows_through_load_from_disk(tmp_path, tuning):
    st = _run(tmp_path / "ds", 5, shard_bytes=2000, bad_at=3, tuning=tuning)
    assert st["forwards_written"] == 4 and st["forwards_refused"] == 1 and st["rows_written"] == 8, st
    assert "expected 16 tokens (token_ids') of 6 values, got 90 values" in st["first_error"], st
    assert st["shards"] > 1
    d = datasets.load_from_disk(str(tmp_path / "ds"))
    assert d.features["blocks.3.hook_resid_post"] == datasets.Array2D(shape=(CTX, W), dtype="float32")
    assert d.num_rows == 8
    rows = d.with_format("numpy")
    k = 0
    for f in (0, 1, 2, 4):
        want = _forward(f)
        for b in range(2):
            r = rows[k]
            np.testing.assert_array_equal(r["blocks.3.hook_resid_post"], want[0][b * CTX:(b + 1) * CTX].float().numpy())
            np.testing.assert_array_equal(r["blocks.3.attn.hook_z"], want[1][b * CTX:(b + 1) * CTX].numpy())
            np.testing.assert_array_equal(r["token_ids"], want[2][b * CTX:(b + 1) * CTX].numpy())
            k += 1
    first = sorted(p.name for p in (tmp_path / "ds").glob("data-*.arrow"))[0]
    assert datasets.Dataset.from_file(str(tmp_path / "ds" / first)).num_rows >= 2


def test_a_forward_is_widened_while_the_one_before_is_written_and_each_reads_back_whole(tmp_path, monkeypatch):
    # The writer thread is slowed (each write sleeps) so that the poll thread widens the next forwards meanwhile: a
    # slot reused before its forward was written would show as another forward's values in the dataset.
    from ferry import arrow
    append = arrow.ContextWriter.append

    def slow(self, *args, **kw):
        time.sleep(0.01)
        return append(self, *args, **kw)

    monkeypatch.setattr(arrow.ContextWriter, "append", slow)
    st = _run(tmp_path / "ds", 24, shard_bytes=4000)
    assert st["forwards_written"] == 24 and st["forwards_refused"] == 0 and st["first_error"] is None, st
    sec = st["seconds"]  # where the threads' time went: the writer's includes the 24 sleeps
    assert set(sec) == {"poll", "widen", "slot_wait", "write", "copy", "io_wait", "seal_wait", "writer_wait"}, sec
    assert sec["write"] >= 0.24 and sec["widen"] > 0 and sec["poll"] > 0 and sec["copy"] > 0, sec
    rows = datasets.load_from_disk(str(tmp_path / "ds")).with_format("numpy")
    for f in range(24):
        want = _forward(f)
        for b in range(2):
            r = rows[2 * f + b]
            np.testing.assert_array_equal(r["blocks.3.hook_resid_post"], want[0][b * CTX:(b + 1) * CTX].float().numpy())
            np.testing.assert_array_equal(r["token_ids"], want[2][b * CTX:(b + 1) * CTX].numpy())


def test_an_error_of_the_shards_write_ends_the_run_whatever_its_type(tmp_path, monkeypatch):
    # Only the layout's refusals (ContextWriter.batch: nothing written) count as refused forwards and let the next
    # ones go on. An error of the shard's write, even a LogicError, ends the run with the earlier shards loadable
    # once close() returns (the finisher slowed: close() waits for the shards sealed before the failure).
    from ferry import _arrow_shards, arrow
    append, calls, finish = arrow.ContextWriter.append, [], _arrow_shards.Shards._finish

    def slow_finish(self, *args):
        time.sleep(0.2)
        return finish(self, *args)

    monkeypatch.setattr(_arrow_shards.Shards, "_finish", slow_finish)

    def failing(self, *args):
        calls.append(1)
        if len(calls) == 3:
            raise ferry.LogicError("injected: the shard's file refused the write")
        return append(self, *args)

    monkeypatch.setattr(arrow.ContextWriter, "append", failing)
    st = _run(tmp_path / "ds", 5, shard_bytes=1)  # every forward a shard of its own
    assert st["forwards_written"] == 2 and st["forwards_refused"] == 0, st
    assert "injected" in st["first_error"], st
    assert datasets.load_from_disk(str(tmp_path / "ds")).num_rows == 4


def test_widen_to_f32_is_exact_for_every_16_bit_value():
    bits = np.arange(1 << 16, dtype=np.uint16)
    out = np.empty(bits.size, np.float32)
    ferry._ferry.widen_to_f32(bits, "BF16", out)
    np.testing.assert_array_equal(out.view(np.uint32), bits.astype(np.uint32) << 16)
    ferry._ferry.widen_to_f32(bits, "F16", out)  # numpy's float16 -> float32 keeps NaN payloads, as ferry does
    np.testing.assert_array_equal(out.view(np.uint32), bits.view(np.float16).astype(np.float32).view(np.uint32))
    with pytest.raises(ferry.LogicError, match="expected an output of 65536 floats .* got 65535"):
        ferry._ferry.widen_to_f32(bits, "BF16", out[:-1])
    with pytest.raises(ferry.LogicError, match="expected dtype 'BF16' or 'F16', got 'F32'"):
        ferry._ferry.widen_to_f32(bits, "F32", out)
    with pytest.raises(TypeError, match="out: expected a C-contiguous writable buffer, got bytes"):
        ferry._ferry.widen_to_f32(bits, "BF16", bytes(4 << 16))


def test_bad_layouts_are_logic_errors(tmp_path):
    with pytest.raises(ferry.LogicError, match="expected context >= 1"):
        ferry.arrow.ContextWriter(str(tmp_path), {"a": ("F32", (4,))}, 0)
    with pytest.raises(ferry.LogicError, match="expected hooks of F32, F16 or BF16 rows"):
        ferry.arrow.ContextWriter(str(tmp_path), {"a": ("I32", (4,))}, 4)
    with pytest.raises(ferry.LogicError, match=r"expected tuning keys of _ferry.FileWriter, got \['threads'\]"):
        ferry.arrow.ContextWriter(str(tmp_path), {"a": ("F32", (4,))}, 4, tuning={"threads": 4})
    with pytest.raises(ferry.LogicError, match=r"file_writer: expected tuning io_threads in \[1, 64\].*got 4, 4 and"):
        ferry.arrow.ContextWriter(str(tmp_path), {"a": ("F32", (4,))}, 4, tuning={"io_threads": 4, "write_buffers": 4})
    with pytest.raises(ferry.LogicError, match=r"expected a writer that holds 3 open files .*, got tuning .* with 2"):
        ferry.arrow.ContextWriter(str(tmp_path), {"a": ("F32", (4,))}, 4, tuning={"write_buffers": 3})
    ch = ferry.Channel(backend="host", ring_bytes=1 << 16)
    with pytest.raises(ferry.LogicError, match="expected a channel made with a schema"):
        ferry.arrow.ArrowSink(ch, str(tmp_path), 4)
    ch.close()


_WRITER = textwrap.dedent("""
    import sys, time, numpy as np, ferry
    d, mode = sys.argv[1], sys.argv[2]
    if mode == "fsize":
        import resource
        resource.setrlimit(resource.RLIMIT_FSIZE, (150000, 150000))
        import signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    schema = {0: ("h", "F32", (64,)), 1: ("token_ids", "I64", ())}
    s = ferry.Stream(backend="host")
    ch = ferry.Channel(backend="host", ring_bytes=1 << 22, schema=schema)
    sink = ferry.arrow.ArrowSink(ch, d, 16, shard_bytes=40000)
    for f in range(10 ** 6 if mode == "kill" else 40):
        n = 64 if f < 30 else 640  # fsize: from forward 30 a batch is larger than the file size limit
        ch.begin_forward(s, tag=f)
        ch.capture(0, np.full((n, 64), f, np.float32), s)
        ch.capture(1, np.arange(n, dtype=np.int64), s)
        ch.end_forward(s)
        if f == 20:
            print("written", flush=True)
    st = sink.close()
    print("error" if st["first_error"] else "clean", st["shards"], flush=True)
""")


def _loadable(d):
    ds = datasets.load_from_disk(str(d))
    a = ds.with_format("numpy")
    for i in range(ds.num_rows):  # every row is whole: one forward's value in all its tokens
        h = a[i]["h"]
        assert h.shape == (16, 64) and (h == h[0, 0]).all()
    return ds.num_rows


def test_a_writer_killed_mid_run_leaves_a_loadable_dataset_of_complete_shards(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path / "ds"), "kill"], stdout=subprocess.PIPE,
                         text=True, env=dict(os.environ))
    assert p.stdout.readline().strip() == "written"
    deadline = time.monotonic() + 60
    while not (tmp_path / "ds" / "state.json").exists() and time.monotonic() < deadline:  # a shard closed
        time.sleep(0.05)
    time.sleep(0.2)  # mid-run: more forwards and shards being written
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    n = _loadable(tmp_path / "ds")
    assert n > 0 and n % 4 == 0  # whole forwards of 4 contexts, in complete shards only


def test_a_full_disk_ends_the_run_with_the_earlier_shards_loadable(tmp_path):
    r = subprocess.run([sys.executable, "-c", _WRITER, str(tmp_path / "ds"), "fsize"], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ))
    assert r.returncode == 0, r.stderr[-2000:]
    kind, shards = r.stdout.split()[-2:]
    assert kind == "error" and int(shards) >= 1, r.stdout
    assert _loadable(tmp_path / "ds") >= 2
    assert not list((tmp_path / "ds").glob(".data-*"))  # the failed shard's temporary is gone


def test_the_writer_fills_the_next_shard_while_the_last_is_finished(tmp_path, monkeypatch):
    """A sealed shard is finished (fsync, rename, state.json) by the finisher thread while the writer fills the next:
    with the finisher held, the writer seals two shards and none is in the dataset; released, flush() puts them in,
    in order, each whole."""
    import threading

    from ferry import _arrow_shards
    gate, finish = threading.Event(), _arrow_shards.Shards._finish

    def held(self, *args):
        gate.wait(30)
        return finish(self, *args)

    monkeypatch.setattr(_arrow_shards.Shards, "_finish", held)
    made, seq = [], ferry._ferry.SequentialFile  # every shard through the run's one FileWriter

    def recorded(*args, **kw):
        made.append(kw.get("writer"))
        return seq(*args, **kw)

    monkeypatch.setattr(ferry._ferry, "SequentialFile", recorded)
    schema = pa.schema([("x", pa.int64())])
    sh = _arrow_shards.Shards(str(tmp_path), schema, {}, 800, False, _arrow_shards.file_writer(None))
    batches = [pa.record_batch([pa.array(np.arange(100) + 100 * i)], schema=schema) for i in range(3)]
    sealed = threading.Event()
    t = threading.Thread(target=lambda: [sh.write(b, 800) for b in batches[:2]] and sealed.set())
    t.start()
    assert sealed.wait(30), "the writer waited for the finisher"
    assert sh.names == [] and not (tmp_path / "state.json").exists() and len(list(tmp_path.glob(".data-*"))) == 2
    gate.set()
    t.join()
    sh.write(batches[2], 800)
    sh.flush()
    assert sh.names == [f"data-{i:05d}.arrow" for i in range(3)] and not list(tmp_path.glob(".data-*"))
    for i, name in enumerate(sh.names):
        got = pa.ipc.open_stream(pa.OSFile(str(tmp_path / name))).read_all()
        assert got.column("x").to_pylist() == list(range(100 * i, 100 * i + 100))
    assert len(made) == 3 and made[0] is not None and all(w is made[0] for w in made), made


@pytest.mark.parametrize("durable", [True, False])
def test_files_of_one_file_writer_each_hold_their_own_bytes(tmp_path, durable):
    """_ferry.FileWriter: three SequentialFiles written in turns through one writer's buffers, each closed on a
    thread of its own while the others are written, hold their own bytes in order; times are the writer's."""
    import threading

    w = ferry._ferry.FileWriter(write_buffers=6, write_bytes=16 << 20)
    assert w.max_open == 5 and ferry._ferry.FileWriter().max_open == 3
    files = [ferry._ferry.SequentialFile(str(tmp_path / f"f{k}"), durable=durable, writer=w) for k in range(3)]
    rng = np.random.default_rng(7)
    want = [bytearray() for _ in files]
    for n in (17 << 20, 5, 70000):
        for k, f in enumerate(files):
            b = rng.integers(1, 256, n + k, dtype=np.uint8)
            assert f.write(b) == n + k
            want[k] += b.tobytes()
    closers = [threading.Thread(target=f.close) for f in files]
    for t in closers:
        t.start()
    for t in closers:
        t.join()
    assert w.times[0] > 0 and all(f.times == w.times for f in files), (w.times, [f.times for f in files])
    for k in range(3):
        assert (tmp_path / f"f{k}").read_bytes() == bytes(want[k]), f"file {k}"
    with pytest.raises(TypeError):
        ferry._ferry.SequentialFile(str(tmp_path / "x"), writer=object())
    five = [ferry._ferry.SequentialFile(str(tmp_path / f"o{k}"), writer=w) for k in range(5)]
    with pytest.raises(ferry.LogicError, match="at most 5 open files of one file_writer"):
        ferry._ferry.SequentialFile(str(tmp_path / "sixth"), writer=w)
    assert not (tmp_path / "sixth").exists()
    for f in five:
        f.close()
