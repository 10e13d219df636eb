# SPDX-License-Identifier: Apache-2.0
# The hook schema on a channel (ferry.Channel(schema=...), d2h/typed_view.hpp), host backend: entries of declared
# hooks are typed zero-copy views (Entry.numpy(), Entry.tensor(), several dtypes incl. bf16 and float8, several
# row shapes), undeclared hooks keep the byte view, sizes that do not fit are LogicErrors naming the hook,
# expected vs got; a safetensors sink without a schema takes its channel's; Channel.stats()["sink"] holds the
# attached native sink's counters (safetensors and shm_stream).
import gc
import pathlib

import numpy as np
import pytest

import ferry
from ferry import _ferry

torch = pytest.importorskip("torch")


def _addr(a):
    return a.__array_interface__["data"][0]


NUMPY_CASES = [  # (dtype, row_shape)
    (np.float32, (4,)), (np.float64, ()), (np.float16, (2, 3)), (np.int64, ()), (np.int32, (3,)),
    (np.int16, (2, 2)), (np.int8, (5,)), (np.uint8, (7,)), (np.uint16, (2,)), (np.uint32, ()), (np.uint64, (1,)),
    (np.bool_, (3,)),
]


@pytest.mark.parametrize("dtype,row", NUMPY_CASES, ids=[f"{np.dtype(d).name}{list(r)}" for d, r in NUMPY_CASES])
def test_numpy_dtypes_are_typed_views_of_the_staging(make_channel, drain, stream, dtype, row):
    rng = np.random.default_rng(7)
    n = 3
    x = (rng.integers(0, 2, size=(n, *row)) if dtype is np.bool_ else rng.integers(-50, 50, size=(n, *row)) % 120)
    x = np.ascontiguousarray(x.astype(dtype))
    ch = make_channel(schema={4: ("layers.0.x", dtype, row)})
    assert ch.schema == {4: ("layers.0.x", ferry.dtype_name(dtype), row)}
    ch.begin_forward(stream)
    ch.capture(4, x, stream)
    ch.end_forward(stream)
    (e,) = drain(ch, 1)
    assert (e.name, e.dtype, e.shape) == ("layers.0.x", ferry.dtype_name(dtype), (n, *row))
    a = e.numpy()
    assert a.dtype == np.dtype(dtype) and a.shape == (n, *row) and not a.flags.writeable
    np.testing.assert_array_equal(a, x)
    t = e.tensor()
    assert tuple(t.shape) == (n, *row) and t.dtype == getattr(torch, np.dtype(dtype).name if dtype is not np.bool_ else "bool")
    assert t.data_ptr() == _addr(a), "numpy() and tensor() are views of the same staging, no copy"
    np.testing.assert_array_equal(t.numpy(), x)
    assert e.views == 2
    del a, t
    e.release()


@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float16"])
def test_torch_dtypes_incl_bf16_are_typed_tensors_and_numpy_has_their_bits(make_channel, drain, stream, name):
    dt = getattr(torch, name)
    x = (torch.arange(24, dtype=torch.float32).reshape(4, 2, 3) / 4 - 2).to(dt)
    ch = make_channel(schema={1: ("layers.0.q", x)})  # (name, example): the row shape and dtype of x
    assert ch.schema[1] == ("layers.0.q", ferry.dtype_name(dt), (2, 3))
    ch.begin_forward(stream)
    ch.capture(1, x, stream)
    ch.end_forward(stream)
    (e,) = drain(ch, 1)
    t = e.tensor()
    assert t.dtype == dt and tuple(t.shape) == (4, 2, 3)
    assert torch.equal(t.view(torch.uint8), x.view(torch.uint8)), "bit-exact"
    a = e.numpy()
    bits = {1: np.uint8, 2: np.uint16}[x.element_size()]
    if name == "float16":
        assert a.dtype == np.float16  # numpy has it
    else:
        assert a.dtype == bits, "numpy has no bf16 / float8: the elements' bits"
    assert a.shape == (4, 2, 3)
    np.testing.assert_array_equal(a.view(bits), x.view(torch.uint8).numpy().view(bits).reshape(4, 2, 3))
    assert t.data_ptr() == _addr(a)
    e.release()
    del t, a


def test_undeclared_hooks_keep_the_byte_view(make_channel, drain, stream):
    ch = make_channel(schema={0: ("a", np.float32, (2,))})
    x = np.arange(6, dtype=np.int16)
    ch.begin_forward(stream)
    ch.capture(9, x, stream)
    ch.end_forward(stream)
    (e,) = drain(ch, 1)
    assert (e.name, e.dtype, e.shape) == (None, None, None)
    a = e.numpy()
    assert a.dtype == np.uint8 and a.shape == (12,)
    assert a.tobytes() == x.tobytes()
    t = e.tensor()
    assert t.dtype == torch.uint8 and bytes(t.numpy()) == x.tobytes()
    e.release()
    plain = make_channel()  # no schema at all: bytes, as before
    assert plain.schema == {}
    plain.begin_forward(stream)
    plain.capture(0, x, stream)
    plain.end_forward(stream)
    (p,) = drain(plain, 1)
    assert p.numpy().dtype == np.uint8 and p.name is None
    p.release()


def test_a_size_that_is_not_whole_rows_is_a_logic_error_naming_the_hook(make_channel, drain, stream):
    ch = make_channel(schema={3: ("layers.3.mlp", np.float32, (4,))})
    ch.begin_forward(stream)
    ch.capture(3, np.zeros(3, np.float32), stream)  # 12 bytes, rows of 16
    ch.end_forward(stream)
    (e,) = drain(ch, 1)
    msg = r'entry of hook 3 "layers.3.mlp": expected a multiple of its row bytes 16 \(\[4\] x F32\), got 12 bytes'
    for f in (e.numpy, e.tensor, lambda: e.shape):
        with pytest.raises(ferry.LogicError, match=msg):
            f()
    assert e.tobytes() == bytes(12), "the bytes are still there"
    e.release()


def test_a_row_entry_of_another_row_size_is_a_logic_error(make_channel, drain, stream):
    ch = make_channel(schema={2: ("h", np.float32, (4,))}, tuning={"size_slots": 4})
    tokens = np.arange(5 * 8, dtype=np.float32).reshape(5, 8)  # rows of 32 bytes, the schema's are 16
    ch.begin_forward(stream)
    ch.capture_rows(2, tokens, rows=np.array([1, 3], np.int32), stream=stream)
    ch.capture_rows(2, tokens[:, :4].copy(), rows=np.array([4, 0], np.int32), stream=stream)
    ch.end_forward(stream)
    bad, good = drain(ch, 2)
    with pytest.raises(ferry.LogicError, match=r'expected rows of 16 bytes \(\[4\] x F32\), got capture_rows rows of 32'):
        bad.numpy()
    np.testing.assert_array_equal(good.numpy(), tokens[[4, 0], :4])
    assert good.shape == (2, 4)
    bad.release()
    good.release()


@pytest.mark.parametrize("schema,err,msg", [
    ({}, ferry.LogicError, "ferry.Channel: expected schema a non-empty dict"),
    ([(0, "a", "F32")], ferry.LogicError, "expected schema a non-empty dict"),
    ({0: ("a", "F99")}, ferry.LogicError, "expected a dtype safetensors stores"),
    ({0: ("a", "F32"), 1: ("a", "F32")}, ferry.LogicError, 'expected unique hook names, got "a" for hook 0 and hook 1'),
    ({0: ("a", np.float32, (4, 0))}, ferry.LogicError, "expected row dimensions >= 1, got 0 at dimension 1"),
    ({-1: ("a", np.float32)}, ferry.LogicError, r"expected a hook id an int in \[0, 4294967295\], got -1"),
])
def test_bad_schemas_are_refused_before_the_channel_exists(schema, err, msg):
    with pytest.raises(err, match=msg):
        ferry.Channel(backend="host", ring_bytes=1 << 16, schema=schema)


def test_the_raw_class_takes_hook_tuples_only():
    with pytest.raises(TypeError, match="expected schema a sequence of"):
        _ferry.host.Channel(ring_bytes=1 << 16, schema={0: ("a", "F32", [])})
    with pytest.raises(TypeError, match="row_shape, shard or None"):
        _ferry.host.Channel(ring_bytes=1 << 16, schema=[(0, "a", "F32", [2])])
    ch = _ferry.host.Channel(ring_bytes=1 << 16, schema=[(0, "a", "F32", [2], None)])
    assert ch.schema == {0: ("a", "F32", (2,))}
    ch.close()


def test_a_safetensors_sink_without_a_schema_takes_its_channels(tmp_path, stream):
    x = (torch.arange(12, dtype=torch.float32).reshape(3, 4) / 3).to(torch.bfloat16)
    ids = np.arange(3, dtype=np.int64)
    schema = {0: ("layers.0.resid_pre", x), 1: ("token_ids", np.int64)}
    with ferry.sinks.safetensors(tmp_path / "run") as sink, \
            ferry.Channel(backend="host", ring_bytes=1 << 16, schema=schema, sink=sink) as ch:
        for step in range(3):
            ch.begin_forward(stream, tag=100 + step)
            ch.capture(0, x * (step + 1), stream)
            ch.capture(1, ids + step, stream)
            ch.end_forward(stream)
    run = ferry.shards.open(tmp_path / "run")
    assert run.schema == {0: ("layers.0.resid_pre", "BF16", (4,)), 1: ("token_ids", "I64", ())}
    assert run.tags == [100, 101, 102]
    got = {(tag, name): a for tag, name, a in run}
    for step in range(3):
        want = (x * (step + 1)).view(torch.int16).numpy().view(np.uint16)
        assert np.asarray(got[(100 + step, "layers.0.resid_pre")]).view(np.uint16).tolist() == want.tolist()
        np.testing.assert_array_equal(got[(100 + step, "token_ids")], ids + step)


def test_a_sinks_own_schema_wins_and_neither_having_one_is_refused(tmp_path, stream):
    own = {0: ("own", np.float32, (2,))}
    with ferry.sinks.safetensors(tmp_path / "a", own) as sink, \
            ferry.Channel(backend="host", ring_bytes=1 << 16, schema={0: ("chan", np.float32)}, sink=sink) as ch:
        ch.begin_forward(stream)
        ch.capture(0, np.ones(4, np.float32), stream)
        ch.end_forward(stream)
    assert [name for _, name, _ in ferry.shards.open(tmp_path / "a")] == ["own"]
    sink = ferry.sinks.safetensors(tmp_path / "b")
    with pytest.raises(ferry.LogicError, match=r"safetensors sink .*/b: expected a schema \(safetensors_config::schema, "
                                               r"or its channel's\), got none from either"):
        ferry.Channel(backend="host", ring_bytes=1 << 16, sink=sink)
    sink.close()
    gc.collect()


def test_channel_stats_hold_the_safetensors_sinks_counters(tmp_path, stream):
    sink = ferry.sinks.safetensors(tmp_path / "run", {0: ("a", np.float32, (4,))})
    ch = ferry.Channel(backend="host", ring_bytes=1 << 16, sink=sink)
    assert set(ch.stats()["sink"]) == set(_ferry.sink_stats)
    for step in range(4):
        ch.begin_forward(stream)
        ch.capture(0, np.full((2, 4), step, np.float32), stream)
        ch.end_forward(stream)
    ch.close()
    st = ch.stats()["sink"]  # as the channel closed: every entry given to the sink
    assert st["failed"] is False and st["first_error"] is None
    assert st["refused_entries"] == st["dropped_entries"] == st["stalls"] == 0
    sink.flush()
    sink.close()
    final = sink.stats()
    assert (final["forwards_written"], final["tensors_written"], final["bytes_written"]) == (4, 4, 4 * 32)
    assert ch.stats()["sink"]["dropped_forwards"] == 0 and ch.stats()["entries_drained"] == 4


def test_channel_stats_follow_the_sink_while_it_runs(tmp_path, stream):
    with ferry.sinks.safetensors(tmp_path / "run", {0: ("a", np.float32, (4,))}) as sink, \
            ferry.Channel(backend="host", ring_bytes=1 << 16, sink=sink) as ch:
        ch.begin_forward(stream)
        ch.capture(0, np.ones((2, 4), np.float32), stream)
        ch.end_forward(stream)
        ch.begin_forward(stream)  # the next forward completes the first
        ch.capture(0, np.ones((2, 4), np.float32), stream)
        ch.end_forward(stream)
        while ch.stats()["entries_drained"] < 2:
            pass
        sink.flush()
        st = ch.stats()["sink"]
        assert st["forwards_written"] == 2 and st["shards_written"] == 1 and st["bytes_written"] == 64
        assert st == {**sink.stats(), "writer_lag_seconds": st["writer_lag_seconds"]}


def test_channel_stats_hold_the_shm_streams_counters(stream):
    with ferry.sinks.shm_stream("test-typed-stats", staging_bytes=1 << 20) as acts, \
            ferry.ShmReader("test-typed-stats") as reader:
        ch = ferry.Channel(backend="host", ring_bytes=1 << 16, sink=acts)
        assert set(ch.stats()["sink"]) == set(_ferry.shm_stream_stats)
        ch.begin_forward(stream)
        for h in range(3):
            ch.capture(h, np.arange(16, dtype=np.float32), stream)
        ch.end_forward(stream)
        got = []
        while len(got) < 3:
            got += reader.poll(timeout=5.0)
        st = ch.stats()["sink"]
        assert st["entries_published"] == 3 and st["bytes_published"] == 3 * 64 and st["readers_attached"] == 1
        for e in got:
            e.release()
        ch.close()
        assert ch.stats()["sink"]["entries_published"] == 3
    plain = ferry.Channel(backend="host", ring_bytes=1 << 16)
    assert "sink" not in plain.stats()
    plain.close()


def test_the_sink_stats_keys_are_documented():
    doc = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "api" / "python.md").read_text()
    for name in list(_ferry.sink_stats) + list(_ferry.shm_stream_stats):
        assert f"`{name}`" in doc, f"stats()['sink'] key {name} is not in docs/api/python.md"
