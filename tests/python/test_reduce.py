# SPDX-License-Identifier: Apache-2.0
# Reducers from Python (C++: tests/d2h/reduce_rows.hpp): Channel.capture_rows(..., reduce=...) on the host
# backend, each record checked against torch's own result on the same rows:
#   topk      values and indices equal torch.sort(descending=True, stable=True)'s first k (ties: lower index);
#   fp8_e4m3  scale = amax / 448 and codes equal torch's (x.float() / scale).to(torch.float8_e4m3fn), bit for bit;
#   mean      within 1e-6 relative + 1e-6 of torch's float64 mean (f32 sums of <= 64 rows of N(0, 1));
#   stats     mean and M2 (var x count) within the same bound, max |x| exact.
import numpy as np
import pytest

import ferry
from ferry import reduce as fr

torch = pytest.importorskip("torch")


def _capture(make_channel, drain, x, spec, **sel):
    ch = make_channel(ring_bytes=1 << 22, tuning={"size_slots": 16})
    s = ferry.Stream(backend="host")
    ch.begin_forward(s)
    ch.capture_rows(0, x, stream=s, reduce=spec, **sel)
    ch.end_forward(s)
    (e,) = drain(ch, 1)
    assert e.ok
    data = e.numpy().copy()
    row_bytes = e.row_bytes
    e.release()
    assert ch.close()["clean"]
    return fr.decode(data, spec, x.shape[1]), row_bytes


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("k", [1, 5, 64])
def test_topk_equals_torch_stable_descending_sort(make_channel, drain, dtype, k):
    g = torch.Generator().manual_seed(k)
    x = torch.randn(40, 1000, generator=g).to(dtype)
    x[3, :] = 0.5  # a row of ties: the k lowest indices
    rows = torch.tensor([3, 0, 39, 17, 3], dtype=torch.int32)
    got, row_bytes = _capture(make_channel, drain, x, fr.topk(k), rows=rows)
    assert row_bytes == 8 * k
    ref = torch.sort(x[rows.long()].float(), dim=1, descending=True, stable=True)
    np.testing.assert_array_equal(got["values"], ref.values[:, :k].numpy())
    np.testing.assert_array_equal(got["indices"], ref.indices[:, :k].numpy().astype(np.int32))
    tv = torch.topk(x[rows.long()].float(), k, dim=1)  # torch.topk's values are the same set
    np.testing.assert_array_equal(got["values"], tv.values.numpy())
    assert got["indices"][0].tolist() == list(range(k))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fp8_codes_equal_torch_cast_with_the_same_scale(make_channel, drain, dtype):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(16, 333, generator=g) * 7).to(dtype)
    x[5] = 0  # a row of zeros: scale 1
    x[6, 10] = 1e-4  # a subnormal after scaling
    rows = torch.arange(16, dtype=torch.int32)
    got, row_bytes = _capture(make_channel, drain, x, fr.FP8_E4M3, rows=rows)
    assert row_bytes == 4 + 336
    xf = x.float()
    amax = xf.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    np.testing.assert_array_equal(got["scale"], scale.numpy())
    ref = (xf / torch.from_numpy(got["scale"]).unsqueeze(1)).to(torch.float8_e4m3fn).view(torch.uint8)
    np.testing.assert_array_equal(got["codes"], ref.numpy())
    deq = fr.dequantize(got)
    assert np.all(np.abs(deq - xf.numpy()) <= np.abs(xf.numpy()) / 16 + scale.numpy()[:, None] / 512)


def test_mean_of_each_request_window_and_stats_of_the_rows(make_channel, drain):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(100, 300, generator=g).to(torch.bfloat16)  # 300 columns: three work units of a mean record
    qsl = torch.tensor([0, 40, 41, 100], dtype=torch.int32)
    req = torch.tensor([2, 0], dtype=torch.int32)
    got, row_bytes = _capture(make_channel, drain, x, fr.MEAN, query_start_loc=qsl, requests=req, window=(0, 32))
    assert row_bytes == 4 * 300 + 4
    xd = x.double()
    for i, r in enumerate((2, 0)):
        ref = xd[qsl[r]:qsl[r] + 32].mean(0).numpy()
        np.testing.assert_allclose(got["mean"][i], ref, rtol=1e-6, atol=1e-6)
    assert got["count"].tolist() == [32, 32]
    st, row_bytes = _capture(make_channel, drain, x, fr.STATS, query_start_loc=qsl, requests=req, window=(0, 32))
    assert row_bytes == 0  # one record: the entry whole
    sel = torch.cat([xd[41:73], xd[0:32]])
    np.testing.assert_allclose(st["mean"][0], sel.mean(0).numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(st["m2"][0], (sel.var(0, unbiased=False) * 64).numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(st["maxabs"][0], sel.abs().amax(0).float().numpy())
    assert st["count"].tolist() == [64]


@pytest.mark.parametrize("specs", [[fr.FP8_E4M3], [fr.topk(8)], [fr.FP8_E4M3, fr.topk(8)]])
def test_deferred_reduced_rows_equal_capture_rows_one_batch_per_reducer(make_channel, drain, specs):
    """capture_rows_deferred(reduce=) of reducers with a record per row: hooks of different widths and dtypes in
    one forward (a batch per input dtype and reducer: reduce_rows_publish; hook h takes specs[h % len(specs)], so
    the last case changes reducer at every hook), each entry's records byte-equal to capture_rows' (reduce_rows)
    on the same rows, in entry order, with the record's row_bytes."""
    g = torch.Generator().manual_seed(7)
    xs = [torch.randn(12, w, generator=g).to(dt) for w, dt in
          ((64, torch.bfloat16), (300, torch.bfloat16), (48, torch.bfloat16), (33, torch.float32),
           (1000, torch.float16))]
    rows = torch.tensor([11, 0, 4, 4], dtype=torch.int32)
    ch = make_channel(ring_bytes=1 << 22, tuning={"size_slots": 64})
    s = ferry.Stream(backend="host")
    for deferred in (True, False):
        ch.begin_forward(s)
        for h, x in enumerate(xs):
            spec = specs[h % len(specs)]
            (ch.capture_rows_deferred if deferred else ch.capture_rows)(h, x, rows=rows, stream=s, reduce=spec)
        ch.end_forward(s)
    got = drain(ch, 2 * len(xs))
    recs = [(e.hook, e.ok, e.row_bytes, e.numpy().tobytes()) for e in got]
    for e in got:
        e.release()
    assert ch.close()["clean"]
    n = len(xs)
    assert [r[0] for r in recs] == list(range(n)) * 2
    assert all(r[1] for r in recs)
    for h in range(n):
        assert recs[h][2:] == recs[n + h][2:], f"hook {h}: the deferred records differ from capture_rows'"
        assert len(recs[h][3]) == rows.numel() * recs[h][2]


def test_bad_reducers_are_typed_errors_at_the_call(make_channel):
    ch = make_channel(tuning={"size_slots": 16})
    s = ferry.Stream(backend="host")
    x = torch.randn(8, 16)
    rows = torch.tensor([1], dtype=torch.int32)
    ch.begin_forward(s)
    with pytest.raises(ferry.LogicError, match=r"expected topk's k in \[1, min\(row width 16, 1024\)\], got 17"):
        ch.capture_rows(0, x, rows=rows, stream=s, reduce=fr.topk(17))
    with pytest.raises(ferry.LogicError,
                       match="expected reduce= 'topk\\(K\\)', 'fp8_e4m3', 'mean' or 'stats', got 'max'"):
        ch.capture_rows(0, x, rows=rows, stream=s, reduce="max")
    with pytest.raises(TypeError, match="of float32, float16 or bfloat16 rows, got torch.int64"):
        ch.capture_rows(0, torch.ones(8, 4, dtype=torch.int64), rows=rows, stream=s, reduce=fr.MEAN)
    with pytest.raises(TypeError, match="expected reduce= a str"):
        ch.capture_rows(0, x, rows=rows, stream=s, reduce=3)
    with pytest.raises(ferry.LogicError, match="expected a reducer with one record per row .*, got mean"):
        ch.capture_rows_deferred(0, x, rows=rows, stream=s, reduce=fr.MEAN)
    ch.end_forward(s)
    assert ch.stats()["entries_reserved"] == 0
    assert ch.close()["clean"]
    with pytest.raises(ValueError, match="expected a multiple of 20 bytes"):
        fr.decode(b"\0" * 21, fr.MEAN, 4)


def test_a_reduced_hook_in_the_schema_is_written_and_decoded_by_the_safetensors_sink(tmp_path):
    """The schema names a reduced hook by its reducer and the rows it reduces: the sink writes its records (U8) and
    the reducer into index.json; ferry.shards.Run.records decodes them; Channel.schema gives the hook back as given."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(10, 50, generator=g)
    rows = torch.tensor([9, 2, 2], dtype=torch.int32)
    schema = {0: ("logits.top", fr.topk(4), (50,)), 1: ("resid.mean", fr.MEAN, (50,)), 2: ("resid", x)}
    sink = ferry.sinks.safetensors(tmp_path / "run", schema)
    s = ferry.Stream(backend="host")
    with ferry.Channel(backend="host", ring_bytes=1 << 20, sink=sink, tuning={"size_slots": 16}) as ch:
        for tag in range(2):
            ch.begin_forward(s, tag=tag)
            ch.capture_rows(0, x * (tag + 1), rows=rows, stream=s, reduce=fr.topk(4))
            ch.capture_rows(1, x, rows=rows, stream=s, reduce=fr.MEAN)
            ch.capture(2, x, s)
            ch.end_forward(s)
    assert sink.close()["first_error"] is None
    run = ferry.shards.open(tmp_path / "run")
    assert run.reduced == {"logits.top": ("topk(4)", 50), "resid.mean": ("mean", 50)}
    for tag in range(2):
        top = run.records(tag, "logits.top")
        ref = torch.topk(x[rows.long()] * (tag + 1), 4, dim=1)
        np.testing.assert_array_equal(top["values"], ref.values.numpy())
        np.testing.assert_array_equal(top["indices"], ref.indices.numpy())
        m = run.records(tag, "resid.mean")
        np.testing.assert_array_equal(m["mean"], x[rows.long()].numpy())  # one row per item: the row itself
        assert m["count"].tolist() == [1, 1, 1]
    assert run.tensor(0, "logits.top").shape == (3, 32)  # the raw records: U8 [n, record_bytes]
    with pytest.raises(KeyError, match="not a reduced hook"):
        run.records(0, "resid")
    with ferry.Channel(backend="host", ring_bytes=1 << 16, schema=schema) as ch:  # the schema as it was given
        assert ch.schema[0] == ("logits.top", "topk(4)", (50,)) and ch.schema[1] == ("resid.mean", "mean", (50,))


@pytest.mark.parametrize("bad, match", [(("a", "topk(0)", (8,)), "expected topk\\(0\\) of rows"),
                                         (("a", "topk(9)", (8,)), "expected topk\\(9\\) of rows"),
                                         (("a", "max", (8,)), "expected a dtype")])
def test_bad_reduced_hooks_are_schema_errors(bad, match):
    with pytest.raises(ferry.LogicError, match=match):
        ferry.Channel(backend="host", ring_bytes=1 << 16, schema={0: bad})


def test_reduce_benchmark_smoke(tmp_path):
    """bench/torch/reduce_bench.py on the host backend (tiny shapes): every contestant timed and every reduced entry
    checked against torch, none bad (the GPU run writes docs/perf/h200/reduce.json)."""
    import json
    import os
    import pathlib
    import subprocess
    import sys
    root = pathlib.Path(__file__).resolve().parents[2]
    out = tmp_path / "reduce.json"
    env = dict(os.environ, FERRY_PYTHON_BACKEND="host")
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(ferry.__file__)),
                                         str(root / "bench" / "torch")] + [env.get("PYTHONPATH", "")])
    from ranks_support import run_script
    r = run_script([sys.executable, str(root / "bench/torch/reduce_bench.py"), "--device", "cpu", "--tiny",
                    "--reps", "1", "--out", str(out)], env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    d = json.loads(out.read_text())
    assert {"device", "commit", "date", "command", "t256_whole", "t256_topk64", "t256_fp8_topk64",
            "prefill_mean"} <= set(d)
    for k in ("t256_whole", "t256_topk64", "t256_fp8_topk64", "prefill_mean"):
        assert d[k]["entries_checked"] > 0 and d[k]["entries_bad"] == 0, (k, d[k])
        assert d[k]["no_capture_us"] > 0 and d[k]["ferry_us"] > 0


def test_decode_entry_reads_a_reduced_entry_by_its_schema(make_channel, drain):
    x = torch.randn(6, 20)
    schema = {4: ("top", fr.topk(3), (20,)), 5: ("plain", "F32", (20,))}
    ch = make_channel(ring_bytes=1 << 20, tuning={"size_slots": 16}, schema=schema)
    s = ferry.Stream(backend="host")
    ch.begin_forward(s)
    ch.capture_rows(4, x, rows=torch.tensor([5, 0], dtype=torch.int32), stream=s, reduce=fr.topk(3))
    ch.capture(5, x, s)
    ch.end_forward(s)
    top, plain = drain(ch, 2)
    assert top.numpy().shape == (2, 24)  # typed by the schema: U8 records
    f = fr.decode_entry(top, ch.schema)
    np.testing.assert_array_equal(f["values"], torch.topk(x[[5, 0]], 3).values.numpy())
    with pytest.raises(ferry.LogicError, match="hook 5: expected a reduced hook of the schema"):
        fr.decode_entry(plain, ch.schema)
    top.release()
    plain.release()
