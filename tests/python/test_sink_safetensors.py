# SPDX-License-Identifier: Apache-2.0
# ferry.sinks.safetensors (the C++ shard sink behind ferry.Channel(sink=...)) and ferry.shards (the pure-Python
# reader), on the host backend: captures read back byte exact through ferry.shards and through the safetensors
# package (skipped where it is not installed), the schema from Python, typed errors, a corrupted or truncated
# shard, and a writer SIGKILLed mid-shard leaving a directory that reads as a valid run of complete shards.
import errno
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np
import pytest

import ferry
from ferry import _ferry

SCHEMA = {0: ("embed", np.float32, (4,)), 1: ("token_ids", np.int64, ()), 2: ("layers.0.q", "F16", (2, 3))}


def arrays(f):
    """Forward f's captures: hook -> array ((f % 3) + 1 rows each)."""
    n = f % 3 + 1
    return {0: (np.arange(n * 4, dtype=np.float32) + 100 * f).reshape(n, 4),
            1: np.arange(n, dtype=np.int64) * (f + 1) - 7,
            2: (np.arange(n * 6, dtype=np.float16) / 8 + f).reshape(n, 2, 3)}


def capture(directory, stream, forwards=6, schema=SCHEMA, **kw):
    """`forwards` forwards through a host channel into a safetensors sink; returns [(tag, name, array)]."""
    sink = ferry.sinks.safetensors(directory, schema, **kw)
    want = []
    with ferry.Channel(backend="host", ring_bytes=1 << 16, sink=sink) as ch:
        assert ch.has_sink
        for f in range(forwards):
            ch.begin_forward(stream)
            for hook, a in arrays(f).items():
                ch.capture(hook, a, stream)
                want.append((f, schema[hook][0], a))
            ch.end_forward(stream)
    stats = sink.close()
    assert stats["forwards_written"] == forwards and stats["first_error"] is None
    return want


def test_captures_read_back_exact_through_ferry_shards(tmp_path, stream):
    want = capture(tmp_path / "run", stream, shard_bytes=300)
    run = ferry.shards.open(tmp_path / "run")
    assert run.complete and run.error is None
    assert len(run.shards) > 1 and run.tags == list(range(6))
    got = list(run)
    assert [(t, n) for t, n, _ in got] == [(t, n) for t, n, _ in want]
    for (_, _, a), (_, _, b) in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(run.tensor(4, "layers.0.q"), arrays(4)[2])
    assert set(run.forward(2)) == {"embed", "token_ids", "layers.0.q"}
    assert run.schema == {0: ("embed", "F32", (4,)), 1: ("token_ids", "I64", ()), 2: ("layers.0.q", "F16", (2, 3))}
    with pytest.raises(KeyError):
        run.tensor(99, "embed")
    index = json.loads((tmp_path / "run" / "index.json").read_text())
    assert index["metadata"]["ferry_version"] == ferry.__version__
    (listed,) = [s for s in index["metadata"]["shards"] if s["file"] == index["weight_map"]["5/embed"]]
    assert 5 in listed["tags"]


@pytest.mark.parametrize("where", ["disk", "tmpfs"])
def test_shards_written_at_once_read_back_in_forward_order(tmp_path, stream, where):
    """open_shards deals the forwards to that many shards written at once (tmpfs's default: two); each shard holds
    whole forwards, and ferry.shards merges them back by index.json's "order"."""
    if where == "tmpfs":
        if not os.path.isdir("/dev/shm"):
            pytest.skip("no /dev/shm")
        d, kw, lanes = tempfile.mkdtemp(prefix="ferry-lanes-", dir="/dev/shm"), {}, 2
    else:
        d, kw, lanes = str(tmp_path / "run"), {"open_shards": 3}, 3
    try:
        want = capture(d, stream, forwards=12, shard_bytes=300, **kw)
        run = ferry.shards.open(d)
        listed = json.loads(pathlib.Path(d, "index.json").read_text())["metadata"]["shards"]
        if where == "tmpfs" and all(s["order"] == list(range(s["order"][0], s["order"][0] + len(s["order"])))
                                    for s in listed):
            pytest.skip("/dev/shm is not tmpfs here: one shard at a time")
        assert run.tags == list(range(12)) and len(run.shards) > lanes
        assert {s["order"][0] % lanes for s in listed[:lanes]} == set(range(lanes))  # forward f in shard lane f % n
        for s in listed:
            assert s["tags"] == s["order"] and all(b - a == lanes for a, b in zip(s["order"], s["order"][1:]))
        got = list(run)
        assert [(t, n) for t, n, _ in got] == [(t, n) for t, n, _ in want]
        for (_, _, a), (_, _, b) in zip(got, want):
            np.testing.assert_array_equal(a, b)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_open_shards_out_of_range_is_refused(tmp_path):
    with pytest.raises(ferry.LogicError, match=r"expected tuning open_shards in \[0, 64\] .*got 65"):
        ferry.sinks.safetensors(tmp_path / "r", SCHEMA, open_shards=65)


@pytest.mark.parametrize("direct_io", [True, False])
def test_durable_runs_read_back_exact_with_and_without_direct_io(tmp_path, stream, direct_io):
    # fsync on: the data through the sink's I/O threads, O_DIRECT where the filesystem takes it (direct_io)
    want = capture(tmp_path / "run", stream, shard_bytes=300, fsync=True, direct_io=direct_io)
    got = list(ferry.shards.open(tmp_path / "run"))
    assert [(t, n) for t, n, _ in got] == [(t, n) for t, n, _ in want]
    for (_, _, a), (_, _, b) in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_shards_read_with_the_safetensors_package(tmp_path, stream):
    st = pytest.importorskip("safetensors", reason="pip install safetensors")
    want = capture(tmp_path / "run", stream, shard_bytes=300)
    run = ferry.shards.open(tmp_path / "run")
    got = {}
    for file in run.shards:
        with st.safe_open(str(tmp_path / "run" / file), framework="numpy") as f:
            assert f.metadata()["format"] == "pt"
            for k in f.keys():
                got[k] = f.get_tensor(k)
    assert sorted(got) == sorted(f"{t}/{n}" for t, n, _ in want)  # safe_open lists keys by name
    for t, n, a in want:
        np.testing.assert_array_equal(got[f"{t}/{n}"], a)


def test_torch_bf16_and_a_schema_from_an_example_tensor(tmp_path, stream):
    torch = pytest.importorskip("torch")
    x = torch.randn(5, 8).to(torch.bfloat16)
    assert ferry.sinks.row_spec("h", x) == ("h", "BF16", (8,))
    sink = ferry.sinks.safetensors(tmp_path / "run", {3: ferry.sinks.row_spec("h", x)})
    with ferry.Channel(backend="host", ring_bytes=1 << 16, sink=sink) as ch:
        ch.begin_forward(stream)
        ch.capture(3, x, stream)
        ch.capture(3, x[:2].contiguous(), stream)
        ch.end_forward(stream)
    sink.close()
    a = ferry.shards.open(tmp_path / "run").tensor(0, "h")
    assert a.shape == (5, 8)
    assert torch.equal(torch.from_numpy(a.view(np.uint16).copy()).view(torch.bfloat16), x)
    st = pytest.importorskip("safetensors.torch")
    t = st.load_file(str(tmp_path / "run" / "shard-00000.safetensors"))
    assert torch.equal(t["0/h"], x) and torch.equal(t["0/h#1"], x[:2])


def test_dtype_names():
    torch = pytest.importorskip("torch")
    assert ferry.sinks.dtype_name(torch.bfloat16) == "BF16"
    assert ferry.sinks.dtype_name(torch.bool) == "BOOL"
    assert ferry.sinks.dtype_name(np.uint8) == "U8"
    assert ferry.sinks.dtype_name(np.dtype("float64")) == "F64"
    assert ferry.sinks.dtype_name("float16") == "F16"
    assert ferry.sinks.dtype_name("torch.int32") == "I32"
    assert ferry.sinks.dtype_name("F8_E4M3") == "F8_E4M3"
    with pytest.raises(ferry.LogicError, match="expected a dtype safetensors stores"):
        ferry.sinks.dtype_name(np.complex64)


@pytest.mark.parametrize("schema,msg", [
    ({}, "expected schema a non-empty dict"),
    ({0: ("a", "F32"), 1: ("a", "F32")}, 'expected unique hook names, got "a" for hook 0 and hook 1'),
    ({0: ("a", "F99")}, "expected a dtype safetensors stores"),
    ({0: ("a", "F32", (4, 0))}, "expected row dimensions >= 1, got 0 at dimension 1"),
    ({0: ("", "F32")}, "expected a non-empty name"),
    ({"0": ("a", "F32")}, "expected int hook ids"),
    ({0: ("a", "F32", (2.5,))}, "expected row_shape a tuple of ints"),
])
def test_bad_schemas_are_logic_errors(tmp_path, schema, msg):
    with pytest.raises(ferry.LogicError, match=msg):
        ferry.sinks.safetensors(tmp_path / "run", schema)


def test_bad_knobs(tmp_path):
    with pytest.raises(ferry.LogicError, match="expected policy 'block' or 'drop', got 'wait'"):
        ferry.sinks.safetensors(tmp_path / "a", SCHEMA, policy="wait")
    with pytest.raises(ferry.LogicError, match="expected shard_bytes an int in"):
        ferry.sinks.safetensors(tmp_path / "b", SCHEMA, shard_bytes=-1)
    with ferry.sinks.safetensors(tmp_path / "c", SCHEMA, policy="drop", max_queue_bytes=1 << 20) as sink:
        assert set(sink.stats()) == set(_ferry.sink_stats)
        assert sink.directory == str(tmp_path / "c")
    assert sink.closed


def test_another_run_is_an_io_error_unless_overwrite(tmp_path, stream):
    capture(tmp_path / "run", stream, forwards=1)
    with pytest.raises(ferry.IOError, match="expected no other run's files") as e:
        ferry.sinks.safetensors(tmp_path / "run", SCHEMA)
    assert isinstance(e.value, OSError) and isinstance(e.value, ferry.Error) and e.value.errno == errno.EEXIST
    capture(tmp_path / "run", stream, forwards=2, overwrite=True)
    assert ferry.shards.open(tmp_path / "run").tags == [0, 1]
    (tmp_path / "file").write_text("x")
    with pytest.raises(ferry.IOError, match="creating the run directory"):
        ferry.sinks.safetensors(tmp_path / "file" / "run", SCHEMA)


def test_an_entry_outside_the_schema_is_refused_and_raised_by_close(tmp_path, stream):
    sink = ferry.sinks.safetensors(tmp_path / "run", SCHEMA)
    with ferry.Channel(backend="host", ring_bytes=1 << 16, sink=sink) as ch:
        with pytest.raises(ferry.LogicError, match="native sink"):
            ch.poll(1)
        ch.begin_forward(stream)
        ch.capture(0, np.zeros(8, np.float32), stream)
        ch.capture(0, np.zeros(3, np.float32), stream)  # 12 bytes: not a whole 16-byte row
        ch.capture(9, np.zeros(3, np.float32), stream)  # not in the schema
        ch.end_forward(stream)
    with pytest.raises(ferry.LogicError, match=r"expected a multiple of its row bytes 16 \(\[4\] x F32\), got 12 bytes"):
        sink.close()
    st = sink.stats()
    assert st["refused_entries"] == 2 and st["tensors_written"] == 1 and "hook 0" in st["first_error"]
    sink.close()  # idempotent: the error was raised once


def test_flush_publishes_what_was_delivered(tmp_path, stream):
    sink = ferry.sinks.safetensors(tmp_path / "run", SCHEMA)
    ch = ferry.Channel(backend="host", ring_bytes=1 << 16, sink=sink)
    for f in range(2):
        ch.begin_forward(stream)
        for hook, a in arrays(f).items():
            ch.capture(hook, a, stream)
        ch.end_forward(stream)
    ch.close()
    sink.flush()
    run = ferry.shards.open(tmp_path / "run")
    assert run.tags == [0, 1] and not run.complete
    sink.close()
    assert ferry.shards.open(tmp_path / "run").complete


# ---- a run that does not read back: a typed ferry.Error naming the file and what is wrong ----

@pytest.fixture
def written(tmp_path, stream):
    capture(tmp_path / "run", stream, shard_bytes=300)
    return tmp_path / "run"


def _rewrite(path, fn):
    b = bytearray(path.read_bytes())
    path.write_bytes(bytes(fn(b)))


def test_a_corrupted_data_byte_is_found_by_its_crc(written):
    shard = written / "shard-00001.safetensors"
    _rewrite(shard, lambda b: b[:-3] + bytes([b[-3] ^ 0xFF]) + b[-2:])
    run = ferry.shards.open(written)  # headers are fine
    with pytest.raises(ferry.shards.ShardError, match="corrupted data: bytes .* have CRC-32") as e:
        list(run)
    assert isinstance(e.value, ferry.Error) and e.value.path == str(shard)
    assert len(list(ferry.shards.open(written, verify=False))) == 18  # verify=False reads the bytes as they are


@pytest.mark.parametrize("damage,msg", [
    (lambda b: b[:-10], "truncated: its tensors need"),
    (lambda b: b[:4], "truncated: 4 bytes, expected at least the 8-byte header size"),
    (lambda b: b[:8] + b"x" + b[9:], "corrupted header: not JSON"),
    (lambda b: (10 ** 9).to_bytes(8, "little") + b[8:], "corrupted: a header of 1000000000 bytes"),
    (lambda b: len(b).to_bytes(8, "little") + b[8:], "truncated: a header of"),
    (lambda b: b + b"extra", "corrupted: 5 bytes past its last tensor"),
])
def test_a_damaged_shard_is_a_shard_error(written, damage, msg):
    shard = written / "shard-00000.safetensors"
    _rewrite(shard, damage)
    with pytest.raises(ferry.shards.ShardError, match=msg) as e:
        ferry.shards.open(written)
    assert e.value.path == str(shard)


def test_a_damaged_index_is_a_shard_error(written):
    index = written / "index.json"
    good = index.read_text()
    index.write_text(good.replace('"shard-00001.safetensors"', '".shard-00001.safetensors.tmp"', 1))
    with pytest.raises(ferry.shards.ShardError, match="a temporary file is never read"):
        ferry.shards.open(written)
    index.write_text(good[:-20])
    with pytest.raises(ferry.shards.ShardError, match="corrupted: not JSON") as e:
        ferry.shards.open(written)
    assert e.value.path == str(index)
    index.write_text(good)
    (written / "shard-00001.safetensors").unlink()
    with pytest.raises(ferry.shards.ShardError, match="missing or unreadable"):
        ferry.shards.open(written)
    with pytest.raises(ferry.shards.ShardError, match="missing: not a run directory"):
        ferry.shards.open(written / "nothing")


# ---- a writer killed mid-shard ----

WRITER = textwrap.dedent("""
    import sys, numpy as np, ferry
    sink = ferry.sinks.safetensors(sys.argv[1], {0: ("x", np.float32, (1024,)), 1: ("y", np.int64, ())},
                                   shard_bytes=64 << 10, open_shards=int(sys.argv[2]))
    ch = ferry.Channel(backend="host", ring_bytes=1 << 20, sink=sink)
    s = ferry.Stream(backend="host")
    f = 0
    while True:  # until killed: 4 KiB + a few rows a forward, a shard every ~15 forwards
        ch.begin_forward(s)
        ch.capture(0, np.full((1, 1024), f, np.float32), s)
        ch.capture(1, np.arange(f % 5 + 1, dtype=np.int64) + f, s)
        ch.end_forward(s)
        f += 1
""")


@pytest.mark.parametrize("open_shards", [1, 2])
def test_a_writer_killed_mid_shard_leaves_a_valid_run_of_complete_shards(tmp_path, open_shards):
    """One shard at a time leaves a prefix of the forwards; two open shards leave whole forwards in forward order,
    where the shard killed in one lane may leave a gap before the other lane's published ones."""
    d = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-c", WRITER, str(d), str(open_shards)],
                         env=dict(os.environ, FERRY_PYTHON_BACKEND="host"))
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            if p.poll() is not None:
                pytest.fail(f"the writer exited with {p.returncode}")
            try:
                if len(json.loads((d / "index.json").read_text())["metadata"]["shards"]) >= 4:
                    break
            except (OSError, ValueError):  # not there yet (the index is replaced whole: never half written)
                pass
            time.sleep(0.01)
        else:
            pytest.fail("the writer published fewer than 4 shards in 60 s")
        p.send_signal(signal.SIGKILL)
    finally:
        p.kill()
        p.wait()
    run = ferry.shards.open(d)
    assert not run.complete and len(run.shards) >= 4
    got = list(run)  # every forward's bytes against its CRC-32
    if open_shards == 1:
        assert run.tags == list(range(len(run.tags)))
    else:
        assert run.tags == sorted(set(run.tags)) and len(run.tags) >= 3 * 4
    for i in range(0, len(got), 2):
        f = run.tags[i // 2]
        (t0, n0, x), (t1, n1, y) = got[i], got[i + 1]
        assert (t0, n0, t1, n1) == (f, "x", f, "y")
        assert (x == f).all() and x.shape == (1, 1024)
        np.testing.assert_array_equal(y, np.arange(f % 5 + 1) + f)
    listed = set(run.shards)
    leftovers = [p.name for p in d.iterdir() if p.name not in listed and p.name != "index.json"]
    assert all(n.endswith(".tmp") or n.startswith("shard-") for n in leftovers), leftovers
    st = pytest.importorskip("safetensors")
    for file in run.shards:
        with st.safe_open(str(d / file), framework="numpy") as f:
            assert len(f.keys()) > 0


FAILING_WRITER = textwrap.dedent("""
    import json, resource, signal, sys, numpy as np, ferry
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past RLIMIT_FSIZE fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (32 << 10, 32 << 10))
    sink = ferry.sinks.safetensors(sys.argv[1], {0: ("x", np.float32, (1024,))}, shard_bytes=8 << 10,
                                   open_shards=1)
    ch = ferry.Channel(backend="host", ring_bytes=1 << 20, sink=sink)
    s = ferry.Stream(backend="host")
    for f in range(16):  # forwards of one 4 KiB row, but forward 4 has 16 rows: a shard of its own, past the limit
        ch.begin_forward(s)
        ch.capture(0, np.full((16 if f == 4 else 1, 1024), f, np.float32), s)
        ch.end_forward(s)
    ch.close()
    try:
        sink.close()
        out = {"errno": None}
    except ferry.IOError as e:
        out = {"errno": e.errno, "message": str(e)}
    out["stats"] = sink.stats()
    print(json.dumps(out))
""")


def test_a_write_failing_mid_shard_ends_the_run_and_leaves_complete_shards(tmp_path):
    # EFBIG from RLIMIT_FSIZE: a write failing mid-shard without root (tests/sink does ENOSPC on a tmpfs as root)
    d = tmp_path / "run"
    r = subprocess.run([sys.executable, "-c", FAILING_WRITER, str(d)], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, FERRY_PYTHON_BACKEND="host"))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["errno"] == errno.EFBIG and ".shard-00002.safetensors.tmp" in out["message"], out
    st = out["stats"]
    # forwards 4..15 (one entry each) are lost or refused: forward 4's write fails on the sink's I/O thread. The
    # writer sees it at a later entry: at the latest when it hands over the third shard after forward 4's (at most
    # two sealed shards wait for the finisher), so forwards 5..10 may be lost with their shards, 11..15 are refused
    assert st["failed"] and st["forwards_written"] == 4 and st["refused_entries"] + st["lost_forwards"] == 12, st
    assert st["refused_entries"] >= 5, st
    run = ferry.shards.open(d)
    assert run.tags == [0, 1, 2, 3] and run.complete and "errno 27" in run.error
    for tag, _, a in run:
        assert (a == tag).all()
    assert not [p for p in d.iterdir() if p.name.endswith(".tmp")]


def test_the_version_is_the_packages():
    pyproject = pathlib.Path(__file__).resolve().parents[2] / "src" / "python" / "pyproject.toml"
    assert f'version = "{ferry.__version__}"' in pyproject.read_text()
