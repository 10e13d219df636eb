# SPDX-License-Identifier: Apache-2.0
# ferry.engine under tensor parallelism: transformers' continuous batching with its TP plan (gloo, CPU), 2 and 4
# ranks as processes (engine_tp_worker.py), one Capture per rank. The samples that open_samples assembles equal
# each rank's own tensors (a witness: plain torch hooks) bit for bit, and the unsharded model's within tolerance:
# the row-parallel all-reduce sums its partial products in another order than one matmul does. The layout checks
# (a missing rank, a changed world size, overlapping slices, a request twice, token ids that differ, a rank
# without a sample) run on a real run's directories, altered.
import json
import os
import shutil
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers' TP plan needs it (from_pretrained(tp_plan=...))

import ferry.engine as fe  # noqa: E402
from engine_support import cb_config, gen_config, prompts  # noqa: E402
from ferry import LogicError  # noqa: E402
from ferry.engine.tp import TP, layouts, slice_of  # noqa: E402
from ferry.tp import LayoutError  # noqa: E402
from ranks_support import run_ranks  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import engine_tp_worker as worker  # noqa: E402

# The ranks run the model on the CPU (gloo), as in CI, on a GPU machine too: transformers' TP plan takes a visible
# GPU as the rank's device (LOCAL_RANK), and one GPU cannot hold two ranks.
CPU_RANKS = {"CUDA_VISIBLE_DEVICES": ""}
TOL = dict(rtol=1e-5, atol=1e-5)  # fp32: the all-reduce's order of summation against one matmul's


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny Qwen3 whose heads, KV heads and MLP split over 4 ranks; saved once, loaded by every rank."""
    cfg = transformers.Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                                   num_key_value_heads=4, head_dim=16, vocab_size=256, tie_word_embeddings=True,
                                   max_position_embeddings=1024)
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("tiny")
    transformers.Qwen3ForCausalLM(cfg).eval().save_pretrained(d)
    return str(d)


def run_tp(model_dir, out, world, fmt, taps, manager=False):
    argv = [sys.executable, os.path.join(HERE, "engine_tp_worker.py"), model_dir, str(out), fmt, taps,
            str(out) + ".witness"] + (["manager"] if manager else [])
    run_ranks(torch, world, lambda r: argv, cwd=HERE, timeout=240.0, env=lambda r: CPU_RANKS)
    return str(out)


def reference(model_dir, out, fmt, taps):
    """The same requests through the unsharded model in this process: {request_id: (meta, arrays)}, arrays per tap
    (per_tap). Taps of different widths (the mixed run) go through one Capture each: on one GPU a sample holds one
    row shape."""
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    groups = [[t] for t in worker.TAPS[taps]()] if taps == "mixed" else [worker.TAPS[taps]()]
    got = {}
    for g, group in enumerate(groups):
        cap = fe.Capture(model, taps=group, out=str(out) + f".{g}", format=fmt, backend="host")
        cap.generate_batch(prompts(worker.LENGTHS, seed=3), generation_config=gen_config(worker.MAX_NEW),
                           capture=[fe.Spec("all"), fe.Spec((2, 12)), fe.Spec("prompt"), None],
                           continuous_batching_config=cb_config())
        rep = cap.close()
        assert rep["complete"] == 3, rep
        for m, a in fe.open_samples(str(out) + f".{g}"):
            m0, a0 = got.setdefault(m["request_id"], (dict(m, taps="[]"), dict(a, taps={})))
            a0["taps"].update(per_tap(m, a))
            m0["taps"] = json.dumps(json.loads(m0["taps"]) + json.loads(m["taps"]))
    return got


def per_tap(meta, arrays):
    taps = json.loads(meta["taps"])
    if "hidden_states" in arrays:
        return {t: arrays["hidden_states"][:, i] for i, t in enumerate(taps)}
    return {t: arrays[f"hidden_states.{t}"] for t in taps}


def witness(out, world):
    """Each rank's own tensors: {(request, tap, position): [row]} concatenated over the ranks holding the tap."""
    got = {}
    for r in range(world):
        path = f"{out}.witness.rank{r}.npz"
        if not os.path.exists(path):
            continue
        for k, v in np.load(path).items():
            rid, tap, p = k.split("|")
            got.setdefault((rid, tap, int(p)), []).append(v)
    return {k: np.concatenate(v) for k, v in got.items()}


def check_run(out, world, ref, wit=True):
    got = {m["request_id"]: (m, a) for m, a in fe.open_samples(out)}
    assert sorted(got) == sorted(ref) == ["req_0", "req_1", "req_2"]
    w = witness(out, world) if wit else None
    for rid, (m, a) in got.items():
        rm, ra = ref[rid]
        assert m["complete"] == "true", m
        assert json.loads(m["taps"]) == json.loads(rm["taps"])
        np.testing.assert_array_equal(a["positions"], ra["positions"])
        np.testing.assert_array_equal(a["token_ids"], ra["token_ids"])
        mine, theirs = per_tap(m, a), ra["taps"]
        for tap, x in mine.items():
            assert x.shape == theirs[tap].shape, (rid, tap)
            np.testing.assert_allclose(x, theirs[tap], **TOL)
            if w is not None:  # the assembly itself is exact: each rank's slice where its offset says
                for row, p in zip(x, a["positions"]):
                    np.testing.assert_array_equal(row, w[(rid, tap, int(p))])
    return got


@pytest.fixture(scope="module")
def mixed(model_dir, tmp_path_factory):
    """One TP=2 run (per-request files): layer 1 (replicated, rank 0) and up_proj's output (sharded)."""
    out = tmp_path_factory.mktemp("mixed") / "out"
    return run_tp(model_dir, out, 2, "per-request", "mixed")


def test_mixed_taps_over_two_ranks_equal_the_unsharded_model(mixed, model_dir, tmp_path):
    assert sorted(os.listdir(mixed)) == ["rank-00000", "rank-00001"]
    t1 = json.load(open(os.path.join(mixed, "rank-00001", "tp.json")))
    assert t1["local"] == ["up.1"] and t1["kinds"] == {"layer.1": "replicated", "up.1": "sharded"}
    got = check_run(mixed, 2, reference(model_dir, tmp_path / "ref", "per-request", "mixed"))
    m, a = got["req_0"]
    assert a["hidden_states.layer.1"].shape[1:] == (64,) and a["hidden_states.up.1"].shape[1:] == (128,)


def test_sharded_taps_over_four_ranks_in_shards(model_dir, tmp_path):
    out = run_tp(model_dir, tmp_path / "out", 4, "shards", "sharded")
    got = check_run(out, 4, reference(model_dir, tmp_path / "ref", "shards", "sharded"))
    assert got["req_0"][1]["hidden_states"].shape[1:] == (2, 128)  # one whole row shape: one tensor, as on 1 GPU


def test_attention_z_through_the_manager_in_arrow(model_dir, tmp_path):
    """o_proj's input (row-parallel: each rank's heads), requests added on the driver only, the Arrow format."""
    pytest.importorskip("pyarrow")
    out = run_tp(model_dir, tmp_path / "out", 2, "arrow", "z", manager=True)
    ref = reference(model_dir, tmp_path / "ref", "arrow", "z")
    ref = {k.replace("req_", "r"): v for k, v in ref.items()}
    got = {m["request_id"]: (m, a) for m, a in fe.open_samples(out)}
    assert sorted(got) == sorted(ref)
    for rid, (m, a) in got.items():
        assert m["complete"] == "true"
        np.testing.assert_allclose(a["hidden_states"][:, 0], ref[rid][1]["taps"]["z.1"], **TOL)


def test_replicated_taps_are_rank_zeros_and_the_others_install_nothing(model_dir, tmp_path):
    out = run_tp(model_dir, tmp_path / "out", 2, "per-request", "eagle3")
    assert json.load(open(os.path.join(out, "rank-00001", "tp.json")))["local"] == []
    assert not [n for n in os.listdir(os.path.join(out, "rank-00001")) if n.endswith(".safetensors")]
    check_run(out, 2, reference(model_dir, tmp_path / "ref", "per-request", "eagle3"))


# ---- the layout checks, each on a copy of the mixed run, altered ----
def altered(mixed, tmp_path):
    d = tmp_path / "run"
    shutil.copytree(mixed, d)
    return str(d)


def rewrite(path, meta_fn=None, tensor_fn=None):
    """Rewrites one per-request sample file with its metadata / tensors changed."""
    from ferry.shards import read_header
    base, meta, tensors = read_header(path)
    raw = open(path, "rb").read()
    out = {}
    for b, e, name, dt, shape in tensors:
        a = np.frombuffer(raw[base + b:base + e], dtype="<f4" if dt == "F32" else "<i8").reshape(shape).copy()
        out[name] = (dt, tuple(shape), tensor_fn(name, a) if tensor_fn else a)
    fe.write_safetensors(path, out, meta_fn(dict(meta)) if meta_fn else meta)


def test_a_missing_rank_names_its_directory(mixed, tmp_path):
    d = altered(mixed, tmp_path)
    shutil.rmtree(os.path.join(d, "rank-00001"))
    with pytest.raises(LayoutError, match="rank 1 of world 2 is missing") as e:
        list(fe.open_samples(d))
    assert e.value.path.endswith("rank-00001")


def test_a_changed_world_size_is_refused(mixed, tmp_path):
    d = altered(mixed, tmp_path)
    p = os.path.join(d, "rank-00001", "tp.json")
    meta = json.load(open(p))
    meta["world"] = 3
    json.dump(meta, open(p, "w"))
    with pytest.raises(LayoutError, match="the world size changed: expected world 2") as e:
        list(fe.open_samples(d))
    assert e.value.path.endswith("rank-00001")


def test_overlapping_slices_are_refused(mixed, tmp_path):
    d = altered(mixed, tmp_path)

    def overlap(meta):
        tp = json.loads(meta["tp"])
        tp["slices"]["up.1"]["offset"] = 32  # rank 1 claims [32, 96): over rank 0's [0, 64)
        meta["tp"] = json.dumps(tp)
        return meta

    rewrite(os.path.join(d, "rank-00001", "req_0.safetensors"), overlap)
    with pytest.raises(LayoutError, match=r"slices of dim 0 \(overlap\): expected offset 64"):
        list(fe.open_samples(d))


def test_a_request_twice_in_one_rank_is_refused(mixed, tmp_path):
    d = altered(mixed, tmp_path)
    man = os.path.join(d, "rank-00001", "samples.jsonl")
    lines = open(man).read().splitlines()
    open(man, "a").write(lines[1] + "\n")
    with pytest.raises(LayoutError, match="twice: expected each request once per rank") as e:
        list(fe.open_samples(d))
    assert e.value.path.endswith("rank-00001")


def test_token_ids_that_differ_between_ranks_are_refused(mixed, tmp_path):
    d = altered(mixed, tmp_path)
    rewrite(os.path.join(d, "rank-00001", "req_0.safetensors"),
            tensor_fn=lambda name, a: a + (name == "token_ids"))
    with pytest.raises(LayoutError, match="expected the token ids of .* at every position"):
        list(fe.open_samples(d))


def test_a_rank_without_a_sample_gives_an_incomplete_sample_without_its_tap(mixed, tmp_path):
    d = altered(mixed, tmp_path)
    rank1 = os.path.join(d, "rank-00001")
    os.unlink(os.path.join(rank1, "req_1.safetensors"))
    man = os.path.join(rank1, "samples.jsonl")
    lines = open(man).read().splitlines()
    open(man, "w").write("".join(ln + "\n" for ln in lines if '"req_1"' not in ln))
    got = {m["request_id"]: (m, a) for m, a in fe.open_samples(d)}
    m, a = got["req_1"]
    assert m["complete"] == "false" and json.loads(m["taps"]) == ["layer.1"]
    assert "rank 1 has no sample of this request" in m["reason"] and "tap 'up.1' left out" in m["reason"]
    assert got["req_0"][0]["complete"] == "true"


def test_positions_one_rank_lacks_are_left_out_and_listed(mixed, tmp_path):
    d = altered(mixed, tmp_path)
    path = os.path.join(d, "rank-00001", "req_0.safetensors")
    from ferry.shards import read_header
    _, meta, tensors = read_header(path)
    raw = open(path, "rb").read()
    base = read_header(path)[0]
    arr = {n: np.frombuffer(raw[base + b:base + e], dtype="<f4" if dt == "F32" else "<i8").reshape(s)
           for b, e, n, dt, s in tensors}
    keep = arr["positions"] != 3
    fe.write_safetensors(path, {n: (dt, (int(keep.sum()), *s[1:]), arr[n][keep]) for _, _, n, dt, s in tensors}, meta)
    m, a = next((m, a) for m, a in fe.open_samples(d) if m["request_id"] == "req_0")
    assert m["complete"] == "false" and [3, 4] in json.loads(m["missing"])
    assert 3 not in a["positions"].tolist() and len(a["positions"]) == int(keep.sum())


# ---- the layout of a tap, and the refusals at construction ----
def test_the_layout_comes_from_the_tap_or_the_tp_plan_never_a_guess(model_dir):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tp = TP(2, 1)
    taps = [fe.Tap("up", "model.layers.1.mlp.up_proj"), fe.Tap("z", "model.layers.1.self_attn.o_proj", "input"),
            fe.Tap("o", "model.layers.1.self_attn.o_proj"), fe.Tap("x", "model.layers.1.mlp.up_proj", "input"),
            fe.Tap("act", "model.layers.1.mlp.act_fn", tp=0), fe.Tap("n", "model.layers.1.mlp.act_fn",
                                                                     tp="replicated")]
    assert layouts(model, taps, tp) == [(-1, 128), (-1, 64), None, None, (0, None), None]
    with pytest.raises(LogicError, match="expected tap 'act' replicated or sharded: give Tap"):
        layouts(model, [fe.Tap("act", "model.layers.1.mlp.act_fn")], tp)
    with pytest.raises(LogicError, match="expected tp None, 'replicated' or a row dimension"):
        fe.Tap("bad", "model.norm", tp="sharded")
    # torch's chunking: 10 over 4 ranks is 3, 3, 3, 1; a slice of another extent is refused
    assert [slice_of("t", (-1, 10), TP(4, r), (e,))["offset"] for r, e in enumerate((3, 3, 3, 1))] == [0, 3, 6, 9]
    with pytest.raises(LogicError, match="expected a slice of 1 of dim 0's 10"):
        slice_of("t", (-1, 10), TP(4, 3), (3,))


class _Mesh:
    mesh_dim_names = None

    def size(self):
        return 2

    def get_local_rank(self):
        return 0


def test_capture_under_tp_refuses_a_stream_and_a_reducer_of_slices(model_dir, tmp_path):
    import ferry
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model._device_mesh = _Mesh()
    with pytest.raises(LogicError, match="expected out a directory"):
        fe.Capture(model, taps="sae", out=ferry.sinks.safetensors(str(tmp_path / "s")), backend="host")
    with pytest.raises(LogicError, match="expected reduce None with sharded taps"):
        fe.Capture(model, taps=[fe.Tap("up", "model.layers.1.mlp.up_proj")], out=str(tmp_path / "o"),
                   backend="host", reduce="fp8_e4m3")


def test_the_api_docs_tp_block_runs_on_two_ranks(model_dir, tmp_path):
    """docs/api/engine.md's ```python tp block, as written, in 2 processes (torchrun's environment: the test's
    store stands in for torchrun's agent store); its samples read back whole."""
    import pathlib
    import re
    doc = pathlib.Path(HERE).parents[1] / "docs" / "api" / "engine.md"
    (code,) = re.findall(r"```python tp\n(.*?)```", doc.read_text(), flags=re.S)
    script = tmp_path / "capture_tp.py"
    script.write_text(code)
    out = tmp_path / "out"
    run_ranks(torch, 2, lambda r: [sys.executable, str(script)], cwd=HERE, timeout=240.0,
              env=lambda r: {"MODEL": model_dir, "OUT": str(out), "TORCHELASTIC_USE_AGENT_STORE": "True",
                             "LOCAL_RANK": str(r), "PYTHONPATH": os.pathsep.join(sys.path), **CPU_RANKS})
    got = list(fe.open_samples(str(out)))
    assert [m["complete"] for m, _ in got] == ["true", "true"]
    assert got[0][1]["hidden_states"].shape[1:] == (1, 64)  # z of 4 heads x 16, whole again


def test_taps_of_two_row_shapes_in_one_sample_are_refused(model_dir, tmp_path):
    """Without TP too: a sample holds one dtype and row shape, so the residual (64) beside up_proj's output (128)
    stops capture at the first step that holds both with a LogicError naming them (on_error="disable": the report
    says why; up_proj runs inside layer 1, so it is seen first)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    cap = fe.Capture(model, taps=worker.TAPS["mixed"](), out=str(tmp_path / "o"), backend="host", on_error="disable")
    cap.generate_batch(prompts((6, 4), seed=1), generation_config=gen_config(3), capture=fe.Spec("all"),
                       continuous_batching_config=cb_config())
    rep = cap.close()
    assert "a sample holds one dtype and row shape for all its taps: expected tap 'layer.1' like tap 'up.1'" \
        in rep["disabled"], rep["disabled"]
