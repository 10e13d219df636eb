# SPDX-License-Identifier: Apache-2.0
# ferry.tp: tensor-parallel capture, one run per rank, assembled at read time. A tiny MLP sharded by hand over 2
# and 4 gloo ranks (separate processes running tp_worker.py) reads back through ferry.tp.open equal to the
# unsharded model bit for bit; the layout checks (a missing rank, overlapping slices, a gap, a world size that
# changed, a rank that skipped or repeated a forward, ...) each raise a LayoutError naming the run at fault, on runs
# written in-process by several host channels standing in for the ranks.
import json
import os
import pathlib
import sys

import numpy as np
import pytest

import ferry
from ferry.tp import LayoutError
from ranks_support import run_ranks

HERE = os.path.dirname(os.path.abspath(__file__))


def write(directory, stream, schema, forwards):
    """One rank's run: `forwards` [(tag, [(hook, array)])] through a host channel into a safetensors sink."""
    sink = ferry.sinks.safetensors(directory, schema)
    with ferry.Channel(backend="host", ring_bytes=1 << 16, sink=sink) as ch:
        for tag, captures in forwards:
            ch.begin_forward(stream, tag=tag)
            for hook, a in captures:
                ch.capture(hook, np.ascontiguousarray(a), stream)
            ch.end_forward(stream)
    sink.close()
    return str(directory)


def whole(tag, rows=3, width=6):
    """The unsharded tensor of forward `tag`: [rows, 2, width] float32, distinct values."""
    return (np.arange(rows * 2 * width, dtype=np.float32) + 1000 * tag).reshape(rows, 2, width)


def rank_run(tmp_path, stream, rank, world, tags=(0, 1, 2), *, extent=None, offset=None, full=None, name="r",
             replicated=None):
    """Rank `rank`'s run of hook "h" (row shape [2, extent], sharded along dim 1) over forwards `tags`; with
    `replicated` also hook "y" (whole) = replicated(tag)."""
    extent = 6 // world if extent is None else extent
    sh = ferry.tp.shard(world, rank, 1, extent, full=full, offset=offset)
    schema = {0: ("h", np.float32, (2, extent), sh)}
    if replicated is not None:
        schema[1] = ("y", np.float32, (4,))
    fwd = []
    for t in tags:
        caps = [(0, whole(t, width=sh["full"])[:, :, sh["offset"]:sh["offset"] + extent])]
        fwd.append((t, caps + ([(1, replicated(t))] if replicated is not None else [])))
    return write(tmp_path / f"{name}{rank}", stream, schema, fwd)


def test_shard_and_spec_build_the_slice():
    assert ferry.tp.shard(4, 3, 0, 8) == {"world": 4, "rank": 3, "dim": 0, "offset": 24, "full": 32}
    assert ferry.tp.shard(2, 1, 1, 2, full=6, offset=4) == {"world": 2, "rank": 1, "dim": 1, "offset": 4, "full": 6}
    assert ferry.tp.spec("a", np.float32, (2, 5), dim=1, rank=1, world=3) == (
        "a", np.float32, (2, 5), {"world": 3, "rank": 1, "dim": 1, "offset": 5, "full": 15})
    assert ferry.tp.spec("a", "F16", 5, dim=0, rank=0, world=2)[2] == (5,)
    assert issubclass(LayoutError, ferry.Error)


@pytest.mark.parametrize("bad", [dict(rank=2, world=2), dict(rank=0, world=2, dim=1), dict(rank=1, world=2, full=5)])
def test_an_invalid_slice_is_refused_by_the_core_when_the_schema_is_declared(tmp_path, bad):
    schema = {0: ferry.tp.spec("mlp.act", np.float32, (3,), **{"dim": 0, **bad})}
    with pytest.raises(ferry.LogicError, match="mlp.act"):
        ferry.sinks.safetensors(tmp_path / "run", schema)
    with pytest.raises(ferry.LogicError, match="mlp.act"):
        ferry.Channel(backend="host", ring_bytes=1 << 16, schema=schema)


@pytest.mark.parametrize("world", [2, 4])
def test_a_tensor_parallel_mlp_over_gloo_ranks_assembles_to_the_unsharded_model_bit_for_bit(tmp_path, world):
    torch = pytest.importorskip("torch")
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo")
    # Small integers in float32: every product and partial sum is an integer far below 2^24 (|act| <= 8 * 3 * 2,
    # |y| <= 16 * 48 * 2), exact in float32, so the order of the sums (the matmuls' blocking, gloo's all-reduce
    # across ranks) cannot change a bit: the TP output equals the TP=1 output exactly.
    rng = np.random.default_rng(world)
    hidden, ffn, tags = 8, 16, [7, 8, 11, 12]
    m = {"w1": rng.integers(-2, 3, (ffn, hidden)).astype(np.float32),
         "w2": rng.integers(-2, 3, (hidden, ffn)).astype(np.float32), "tags": np.array(tags)}
    for k, tag in enumerate(tags):
        m[f"x{tag}"] = rng.integers(-3, 4, (k + 2, hidden)).astype(np.float32)  # 2, 3, 4, 5 tokens
    np.savez(tmp_path / "model.npz", **m)
    dirs = [str(tmp_path / f"rank{r}") for r in range(world)]
    run_ranks(torch, world, lambda r: [sys.executable, os.path.join(HERE, "tp_worker.py"), str(tmp_path / "model.npz"),
                                       dirs[r]])
    for r in range(world):  # each rank's run records its slice
        part = ffn // world
        assert ferry.shards.open(dirs[r]).layout == {"mlp.act": ferry.tp.shard(world, r, 0, part)}
    run = ferry.tp.open(dirs[::-1])  # any order: the ranks come from the layouts
    assert run.ranks == list(range(world)) and run.tags == tags and run.complete
    assert run.layout["mlp.act"]["full"] == ffn
    for tag in tags:
        x = m[f"x{tag}"]
        act = np.maximum(x @ m["w1"].T, 0)  # the unsharded model (TP=1)
        y = act @ m["w2"].T
        got = run.forward(tag)
        assert set(got) == {"mlp.act", "mlp.out"}
        assert got["mlp.act"].dtype == np.float32 and got["mlp.act"].shape == (x.shape[0], ffn)
        assert got["mlp.act"].tobytes() == act.tobytes()  # the sharded intermediate, bit for bit
        assert got["mlp.out"].tobytes() == y.tobytes()    # the all-reduced output, bit for bit (exact math)
        assert (act != 0).any() and (y != 0).any()
    np.testing.assert_array_equal(run.tensor(tags[-1], "mlp.act"), np.maximum(m[f"x{tags[-1]}"] @ m["w1"].T, 0))


def test_uneven_slices_along_an_inner_dim_assemble_in_offset_order(tmp_path, stream):
    # rank 0 holds [2, 6) and rank 1 [0, 2) of row dim 1 (extents 4 and 2 of full 6); y on both: rank 0's is read
    d0 = rank_run(tmp_path, stream, 0, 2, extent=4, offset=2, full=6, replicated=lambda t: np.full((3, 4), t, "f4"))
    d1 = rank_run(tmp_path, stream, 1, 2, extent=2, offset=0, full=6, replicated=lambda t: np.full((3, 4), -1, "f4"))
    run = ferry.tp.open([d1, d0])
    assert run.directories == [d0, d1] and run.tags == [0, 1, 2]
    assert [s[:2] for s in run.layout["h"]["slices"]] == [(0, 2), (2, 4)]
    for tag in run.tags:
        f = run.forward(tag)
        np.testing.assert_array_equal(f["h"], whole(tag))
        np.testing.assert_array_equal(f["y"], np.full((3, 4), tag, "f4"))  # the lowest rank's replicated hook
    assert [(t, n) for t, n, _ in run] == [(t, n) for t in (0, 1, 2) for n in ("h", "y")]
    np.testing.assert_array_equal(run.tensor(1, "y"), np.full((3, 4), 1, "f4"))
    np.testing.assert_array_equal(run.tensor(2, "h"), whole(2))
    with pytest.raises(KeyError):
        run.tensor(5, "h")


def test_a_hook_captured_twice_in_a_forward_assembles_each_capture(tmp_path, stream):
    dirs = []
    for r in range(2):
        sh = ferry.tp.shard(2, r, 1, 3)
        parts = [whole(t, rows=t + 1)[:, :, 3 * r:3 * r + 3] for t in (0, 1)]
        dirs.append(write(tmp_path / f"r{r}", stream, {0: ("h", np.float32, (2, 3), sh)},
                          [(5, [(0, parts[0]), (0, parts[1])])]))
    f = ferry.tp.open(dirs).forward(5)
    np.testing.assert_array_equal(f["h"], whole(0, rows=1))
    np.testing.assert_array_equal(f["h#1"], whole(1, rows=2))


def _raises(dirs, path, *words):
    with pytest.raises(LayoutError) as err:
        ferry.tp.open(dirs)
    assert err.value.path == str(path)
    for w in (str(path),) + words:
        assert w in str(err.value), (w, str(err.value))
    return err.value


def test_a_missing_rank_is_named_with_its_hook(tmp_path, stream):
    dirs = [rank_run(tmp_path, stream, r, 3) for r in (0, 2)]
    _raises(dirs, tmp_path, "hook 'h'", "rank 1 of world 3 is missing", dirs[0], dirs[1])


def test_a_rank_given_twice_is_named_with_both_runs(tmp_path, stream):
    dirs = [rank_run(tmp_path, stream, 0, 2, name=n) for n in ("a", "b")] + [rank_run(tmp_path, stream, 1, 2)]
    _raises(dirs, dirs[1], "rank 0 appears twice", dirs[0])


def test_overlapping_slices_name_both_runs_and_the_offsets(tmp_path, stream):
    d0 = rank_run(tmp_path, stream, 0, 2, extent=4, offset=0, full=6)  # [0, 4)
    d1 = rank_run(tmp_path, stream, 1, 2, extent=4, offset=2, full=6)  # [2, 6): overlaps [2, 4)
    _raises([d0, d1], d1, "overlap", d0, "ends at 4", "expected offset 4", "[2, 6)")


def test_a_gap_between_slices_names_both_runs_and_the_offsets(tmp_path, stream):
    d0 = rank_run(tmp_path, stream, 0, 2, extent=2, offset=0, full=6)  # [0, 2)
    d1 = rank_run(tmp_path, stream, 1, 2, extent=3, offset=3, full=6)  # [3, 6): [2, 3) is nobody's
    _raises([d1, d0], d1, "gap", d0, "ends at 2", "expected offset 2", "[3, 6)")


def test_a_gap_at_the_end_names_the_last_slice(tmp_path, stream):
    d0 = rank_run(tmp_path, stream, 0, 2, extent=2, offset=0, full=6)  # [0, 2)
    d1 = rank_run(tmp_path, stream, 1, 2, extent=2, offset=2, full=6)  # [2, 4): [4, 6) is nobody's
    _raises([d0, d1], d1, "gap", "end at full 6", "ending at 4")


def test_a_world_size_that_changed_between_runs_names_the_run(tmp_path, stream):
    d0 = rank_run(tmp_path, stream, 0, 2)
    d1 = rank_run(tmp_path, stream, 1, 3)
    _raises([d0, d1], d1, "world size changed", "expected world 2", d0, "got 3")


def test_a_dim_or_full_that_differs_names_the_run(tmp_path, stream):
    d0 = rank_run(tmp_path, stream, 0, 2, extent=3, full=6)
    d1 = rank_run(tmp_path, stream, 1, 2, extent=3, offset=3, full=9)
    _raises([d0, d1], d1, "expected full 6", "got 9")


def test_a_hook_sharded_in_one_run_and_whole_in_another_names_the_whole_one(tmp_path, stream):
    d0 = rank_run(tmp_path, stream, 0, 2)
    d1 = write(tmp_path / "whole", stream, {0: ("h", np.float32, (2, 3)), 1: ("g", np.float32, (1, 2),
                                            ferry.tp.shard(2, 1, 1, 2))}, [(t, [(0, whole(t)[:, :, :3])])
                                                                            for t in (0, 1, 2)])
    _raises([d0, d1], d1, "expected a sharded hook", d0)


def test_a_run_whose_hooks_name_two_ranks_is_refused(tmp_path, stream):
    schema = {0: ("a", np.float32, (2,), ferry.tp.shard(2, 0, 0, 2)), 1: ("b", np.float32, (2,),
                                                                         ferry.tp.shard(2, 1, 0, 2))}
    d = write(tmp_path / "mixed", stream, schema, [(0, [(0, np.ones((1, 2), "f4")), (1, np.ones((1, 2), "f4"))])])
    _raises([d], d, "one rank for every sharded hook", "rank 0", "rank 1")


def test_a_rank_that_skipped_a_forward_names_the_run_and_the_tag(tmp_path, stream):
    d0 = rank_run(tmp_path, stream, 0, 2, tags=(0, 1, 2, 3))
    d1 = rank_run(tmp_path, stream, 1, 2, tags=(0, 1, 3))
    _raises([d1, d0], d1, "rank 1 skipped forward tag 2", d0)


def test_a_rank_with_a_forward_the_others_lack_names_the_run_and_the_tag(tmp_path, stream):
    d0 = rank_run(tmp_path, stream, 0, 2, tags=(0, 1))
    d1 = rank_run(tmp_path, stream, 1, 2, tags=(0, 1, 2))
    _raises([d0, d1], d1, "has forward tag 2", d0)


def test_a_rank_that_repeated_a_forward_names_the_run_and_the_tag(tmp_path, stream):
    d0 = rank_run(tmp_path, stream, 0, 2, tags=(0, 1, 2))
    with pytest.raises(ferry.LogicError, match="got tag 1 again"):  # its sink refuses the repeat, and records it
        rank_run(tmp_path, stream, 1, 2, tags=(0, 1, 1, 2))
    d1 = str(tmp_path / "r1")
    assert ferry.shards.open(d1).tags == [0, 1, 2]  # the same tags as rank 0: the index's refused_tags tell
    assert ferry.shards.open(d1).refused_tags == [1]
    _raises([d0, d1], d1, "repeated forward tag 1")


def test_a_run_listing_a_forward_tag_twice_names_the_run_and_the_tag(tmp_path, stream):
    # The sink refuses a repeated tag; a run written otherwise may list one twice: rank 1's run here is merged by
    # hand from two runs that both have a forward tagged 1 (hook h in one, hook y in the other)
    d0 = rank_run(tmp_path, stream, 0, 2, tags=(0, 1))
    schema = {0: ("h", np.float32, (2, 3), ferry.tp.shard(2, 1, 1, 3)), 1: ("y", np.float32, (4,))}
    d1 = write(tmp_path / "r1", stream, schema, [(t, [(0, whole(t)[:, :, 3:])]) for t in (0, 1)])
    extra = write(tmp_path / "extra", stream, schema, [(1, [(1, np.zeros((1, 4), "f4"))])])
    os.rename(os.path.join(extra, "shard-00000.safetensors"), os.path.join(d1, "shard-00001.safetensors"))
    index, moved = (json.loads(pathlib.Path(d, "index.json").read_text()) for d in (d1, extra))
    index["metadata"]["shards"].append(dict(moved["metadata"]["shards"][0], file="shard-00001.safetensors"))
    index["weight_map"]["1/y"] = "shard-00001.safetensors"
    pathlib.Path(d1, "index.json").write_text(json.dumps(index))
    assert ferry.shards.open(d1).tags == [0, 1, 1]
    _raises([d0, d1], d1, "repeated forward tag 1", "got it twice")


def test_a_dtype_or_row_shape_that_differs_names_the_run(tmp_path, stream):
    d0 = rank_run(tmp_path, stream, 0, 2)
    d1 = write(tmp_path / "r1", stream, {0: ("h", np.float16, (2, 3), ferry.tp.shard(2, 1, 1, 3))},
               [(t, [(0, whole(t)[:, :, 3:].astype(np.float16))]) for t in (0, 1, 2)])
    _raises([d0, d1], d1, "expected dtype F32 and row shape (2, 3) except at dim 1", "got F16 (2, 3)")
    d2 = write(tmp_path / "r2", stream, {0: ("h", np.float32, (1, 3), ferry.tp.shard(2, 1, 1, 3))},
               [(t, [(0, whole(t)[:, :1, 3:])]) for t in (0, 1, 2)])
    _raises([d0, d2], d2, "got F32 (1, 3)")


def test_ranks_with_different_rows_in_a_forward_name_the_shard_file(tmp_path, stream):
    d0 = rank_run(tmp_path, stream, 0, 2)
    sh = ferry.tp.shard(2, 1, 1, 3)
    d1 = write(tmp_path / "r1", stream, {0: ("h", np.float32, (2, 3), sh)},
               [(t, [(0, whole(t, rows=3 + (t == 1))[:, :, 3:])]) for t in (0, 1, 2)])
    run = ferry.tp.open([d0, d1])
    np.testing.assert_array_equal(run.forward(0)["h"], whole(0))
    with pytest.raises(LayoutError) as err:
        run.forward(1)
    assert err.value.path == os.path.join(d1, "shard-00000.safetensors")
    assert "tensor '1/h'" in str(err.value) and "expected 3 rows" in str(err.value) and "got 4" in str(err.value)


def test_a_rank_that_did_not_capture_a_sharded_hook_in_a_forward_is_named(tmp_path, stream):
    d0 = rank_run(tmp_path, stream, 0, 2, replicated=lambda t: np.zeros((1, 4), "f4"))
    schema = {0: ("h", np.float32, (2, 3), ferry.tp.shard(2, 1, 1, 3)), 1: ("y", np.float32, (4,))}
    d1 = write(tmp_path / "r1", stream, schema,
               [(t, [(0, whole(t)[:, :, 3:])] if t != 1 else [(1, np.zeros((1, 4), "f4"))]) for t in (0, 1, 2)])
    run = ferry.tp.open([d0, d1])
    with pytest.raises(LayoutError) as err:
        run.forward(1)
    assert err.value.path == d1 and "expected tensor 1/h in every rank's run" in str(err.value)
