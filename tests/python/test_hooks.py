# SPDX-License-Identifier: Apache-2.0
# ferry.hooks on a tiny transformers Qwen3ForCausalLM on the CPU (host backend): preset hook counts and ids,
# every captured entry byte-exact against the hooked tensors, handle removal, and a smoke run of the Qwen3
# capture benchmark. Skipped where torch or transformers is missing.
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import ferry  # noqa: E402
import ferry.hooks as fh  # noqa: E402
from ranks_support import run_script  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LAYERS = 2


@pytest.fixture(scope="module")
def model():
    cfg = transformers.Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256,
                                   tie_word_embeddings=True)
    torch.manual_seed(0)
    m = transformers.Qwen3ForCausalLM(cfg).to(torch.bfloat16).eval()
    return m


def forward(model, seq=5):
    ids = torch.arange(seq).reshape(1, seq) * 7 % 256
    with torch.inference_mode():
        return model(input_ids=ids, use_cache=False).logits


def test_preset_counts_ids_and_names(model):
    hs = fh.preset(model, "hidden-states")
    vf = fh.preset(model, "vllm-full")
    assert len(hs) == LAYERS
    assert len(vf) == 12 * LAYERS + 5
    assert [p.id for p in hs] == list(range(LAYERS))
    assert [p.id for p in vf] == list(range(12 * LAYERS + 5))
    assert {p.id: p.name for p in vf} == fh.names("vllm-full", LAYERS)
    assert {p.id: p.name for p in hs} == fh.names("hidden-states", LAYERS)
    names = fh.names("vllm-full", 28)
    assert len(names) == 341 and len(fh.names("hidden-states", 28)) == 28
    assert names[0] == "token_ids" and names[1] == "embeddings" and names[2] == "layers.0.resid_pre"
    assert names[4] == "layers.0.q" and names[13] == "layers.0.mlp_out" and names[14] == "layers.1.resid_pre"
    assert names[338] == "final_residual" and names[339] == "final_norm" and names[340] == "logits"
    with pytest.raises(ferry.LogicError, match="preset"):
        fh.preset(model, "everything")
    with pytest.raises(ferry.LogicError, match="vllm-full"):
        fh.preset(model.model, "vllm-full")  # the base model has no lm_head
    assert len(fh.preset(model.model, "hidden-states")) == LAYERS


def test_select_by_pattern(model):
    pts = fh.select(model, [fh.Rule(r"model\.layers\.(\d+)\.mlp\.down_proj", "input", "layer{1}.act_mul"),
                            fh.Rule(r"lm_head", "output")], first_id=100)
    assert [(p.id, p.name) for p in pts] == [(100, "layer0.act_mul"), (101, "layer1.act_mul"),
                                             (102, "lm_head.output")]
    with pytest.raises(ferry.LogicError, match="'input' or 'output'"):
        fh.select(model, [fh.Rule("lm_head", "before")])
    with pytest.raises(ferry.LogicError, match="no_such"):
        fh.install(model, [fh.HookPoint(0, "x", "model.no_such", "input")], lambda h, t: None)
    with pytest.raises(ferry.LogicError, match="unique"):
        fh.install(model, [fh.HookPoint(0, "x", "lm_head", "input"), fh.HookPoint(0, "y", "lm_head", "output")],
                   lambda h, t: None)
    assert not model.lm_head._forward_hooks and not model.lm_head._forward_pre_hooks  # nothing registered


def _expected_shapes(preset, seq):
    if preset == "hidden-states":
        return {h: (1, seq, 64) for h in range(LAYERS)}
    per = [(1, seq, 64), (1, seq, 64), (1, seq, 4, 16), (1, seq, 2, 16), (1, seq, 32), (1, seq, 64),
           (1, seq, 64), (1, seq, 64), (1, seq, 64), (1, seq, 64), (1, seq, 128), (1, seq, 64)]
    out = {0: (1, seq), 1: (1, seq, 64)}
    for l in range(LAYERS):
        for k, s in enumerate(per):
            out[2 + 12 * l + k] = s
    out.update({12 * LAYERS + 2: (1, seq, 64), 12 * LAYERS + 3: (1, seq, 64), 12 * LAYERS + 4: (1, seq, 256)})
    return out


@pytest.mark.parametrize("preset", ["hidden-states", "vllm-full"])
def test_entries_bit_exact_and_removal(model, preset, make_channel, stream, drain):
    ch = make_channel(ring_bytes=1 << 20, publish_every=4)
    seen = []
    cap = fh.channel_capture(ch, stream)

    def both(h, t):
        seen.append((h, t.detach().clone()))  # the tensor as the hook saw it
        cap(h, t)

    points = fh.preset(model, preset)
    hooks = fh.install(model, points, both)
    assert hooks.installed and len(hooks) == len(points)
    assert hooks.names == fh.names(preset, LAYERS)
    seq = 5
    ch.begin_forward(stream)
    logits = forward(model, seq)
    ch.end_forward(stream)
    n = len(points)
    assert [h for h, _ in seen] == list(range(n))  # ids are the forward's execution order
    entries = drain(ch, n)
    shapes = _expected_shapes(preset, seq)
    for e, (h, t) in zip(entries, seen):
        assert e.hook == h  # entry (seq) order == hook id order in an eager forward
        assert tuple(t.shape) == shapes[h], hooks.names[h]
        want = t.contiguous().reshape(-1).view(torch.uint8).numpy()
        assert e.size == want.nbytes
        assert e.tobytes() == want.tobytes(), f"hook {h} ({hooks.names[h]}) differs"
        e.release()
    if preset == "vllm-full":
        assert torch.equal(seen[-1][1], logits)
        assert torch.equal(seen[0][1], torch.arange(seq).reshape(1, seq) * 7 % 256)

    hooks.remove()
    assert not hooks.installed
    hooks.remove()  # idempotent
    seen.clear()
    ch.begin_forward(stream)
    forward(model, seq)
    ch.end_forward(stream)
    stream.synchronize()
    assert seen == [] and ch.poll(16, timeout=0.2) == []
    for _, m in model.named_modules():
        assert not m._forward_hooks and not m._forward_pre_hooks
    assert ch.close()["clean"]


@pytest.mark.parametrize("preset", ["hidden-states", "vllm-full"])
@pytest.mark.parametrize("deferred", [True, False])
def test_rows_capture_holds_the_selected_token_rows_of_every_hook(model, preset, deferred, make_channel, stream,
                                                                 drain):
    """Continuous batching: a batch of 3 sequences x 4 tokens, the engine selects rows (tokens) 11, 2 and 7 at
    fixed "device" addresses; every hook's entry holds exactly those rows of the hooked tensor, attributed to the
    forward's requests (rows_of)."""
    ch = make_channel(ring_bytes=1 << 20, publish_every=8, tuning={"size_slots": 512})
    rows = np.array([11, 2, 7, 0], dtype=np.int32)
    count = np.array([3], dtype=np.int32)
    seen = []
    cap = fh.rows_capture(ch, stream, deferred=deferred, rows=rows, count=count, max_count=4)

    def both(h, t):
        seen.append((h, t.detach().clone()))
        cap(h, t)

    points = fh.preset(model, preset)
    with fh.install(model, points, both):
        ids = torch.arange(12).reshape(3, 4) * 5 % 256
        ch.begin_forward(stream, tag=42, requests=[311, 302, 307])
        with torch.inference_mode():
            model(input_ids=ids, use_cache=False)
        ch.end_forward(stream)
    entries = drain(ch, len(points))
    for e, (h, t) in zip(entries, seen):
        flat = t.contiguous().reshape(12, -1)
        assert (e.hook, e.ok, e.tag, e.rows) == (h, True, 42, 3)
        assert e.tobytes() == flat[[11, 2, 7]].view(torch.uint8).numpy().tobytes(), h
        assert e.rows_of(302).tobytes() == flat[[2]].view(torch.uint8).numpy().tobytes(), h
        e.release()
    assert ch.close()["clean"]


def test_context_manager_and_capture_fn(model, make_channel, stream, drain):
    ch = make_channel(ring_bytes=1 << 20)
    cap = fh.capture_fn(ch, stream, use_ops=False)
    with fh.install(model, fh.preset(model, "hidden-states"), cap) as hooks:
        ch.begin_forward(stream)
        forward(model)
        ch.end_forward(stream)
    assert not hooks.installed
    assert [e.hook for e in drain(ch, LAYERS)] == list(range(LAYERS))


@pytest.mark.parametrize("preset", ["hidden-states", "vllm-full"])
@pytest.mark.parametrize("use_ops", [False, "auto"])
def test_preset_deferred_entries_exact_and_not_written_in_place(model, preset, use_ops, make_channel, stream,
                                                                drain):
    # no_grad (not inference_mode): the tensors keep version counters, so an in-place write to a deferred
    # point before its flush would raise here: the presets' points are safe to defer.
    ch = make_channel(ring_bytes=1 << 20, publish_every=4)
    points = fh.preset(model, preset)
    assert all(p.deferred for p in points) and fh.deferred_ids(points) == set(range(len(points)))
    seen = []
    cap = fh.capture_fn(ch, stream, use_ops=use_ops, deferred=points)

    def both(h, t):
        seen.append((h, t.detach().clone()))
        cap(h, t)

    seq = 5
    ids = torch.arange(seq).reshape(1, seq) * 7 % 256
    with fh.install(model, points, both), torch.no_grad():
        ch.begin_forward(stream)
        model(input_ids=ids, use_cache=False)
        ch.end_forward(stream)
    entries = drain(ch, len(points))
    assert [e.hook for e in entries] == list(range(len(points)))
    for e, (h, t) in zip(entries, seen):
        assert e.tobytes() == t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes(), h
    assert ch.close()["clean"]


def test_benchmark_smoke(tmp_path):
    out = tmp_path / "torch_qwen3.json"
    env = dict(os.environ, FERRY_PYTHON_BACKEND="host")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(os.path.dirname(ferry.__file__)),
                                                    env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, str(ROOT / "bench/torch/qwen3_capture.py"), "--layers", "2", "--tokens", "4", "--device",
           "cpu", "--tiny", "--eager-reps", "1", "--h2d-iters", "4", "--h2d-reps", "1", "--capture", "core",
           "--drain-during", "off", "--out", str(out)]
    r = run_script(cmd, env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    d = json.loads(out.read_text())
    assert set(d) == {"device", "commit", "date", "command", "decode", "entries_checked", "entries_bad", "h2d_step",
                      "check", "config", "noise"}
    assert d["noise"] == {}  # graph modes only (no graphs on the host)
    assert d["config"]["pool"] == "shared" and d["config"]["publish_every"] == 4096 and d["config"]["capture"] == "core"
    assert d["config"]["drain_during"] == "off" and d["config"]["h2d_upload"] == "auto"
    assert d["config"]["bounce_capture_max"] == 16384
    assert set(d["decode"]) == {"b1_eager", "b1_graph", "b16_graph"}
    for mode in d["decode"].values():
        assert set(mode) == {"no_capture_ms", "hidden_states", "vllm_full"}
        for p in ("hidden_states", "vllm_full"):
            assert set(mode[p]) == {"ferry_ms", "gather_ms", "torch_copy_ms"}
    eager = d["decode"]["b1_eager"]
    assert eager["no_capture_ms"] > 0 and eager["vllm_full"]["ferry_ms"] > 0 and eager["vllm_full"]["gather_ms"] > 0
    # ferry and gather (deferred capture), each checked against the reference
    assert d["entries_checked"] == 2 * 4 * (2 + 12 * 2 + 5) and d["entries_bad"] == 0
    # the per-step replay reference and the determinism diagnostics (the host model is bit-reproducible)
    c = d["check"]
    assert {"method", "reference_vs_reference_bad", "step_token_mismatches"} <= set(c) and c["method"]
    assert c["reference_vs_reference_bad"] == 0 and c["step_token_mismatches"] == 0
    assert c["reference_vs_reference"]["b1_eager"]["entries"] == 4 * (12 * 2 + 5)  # vllm-full
    assert set(d["h2d_step"]) == {"eager", "graph"}
    assert set(d["h2d_step"]["eager"]) == {"torch_copies_us", "ferry_us"}
    assert d["h2d_step"]["eager"]["ferry_us"] > 0
    # the table and the plot of docs/perf
    reports = ROOT / "bench/device/reports"
    r = subprocess.run([sys.executable, str(reports / "perf_page.py"), "show", "torch", str(out)], capture_output=True,
                       text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    p = subprocess.run([sys.executable, str(reports / "perf_plots.py"), "", "", str(tmp_path), str(out)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "| B=1 eager |" in r.stdout and (tmp_path / "torch_qwen3.svg").read_text().startswith("<svg")


@pytest.mark.parametrize("preset", ["hidden-states", "vllm-full"])
def test_install_via_forward_captures_what_the_hooks_capture_and_restores_the_modules(model, preset):
    points = fh.preset(model, preset)
    got = {}
    for via in ("hooks", "forward"):
        seen = []
        with fh.install(model, points, lambda h, t: seen.append((h, t.detach().clone())), via=via):
            forward(model)
        got[via] = seen
    assert [h for h, _ in got["forward"]] == [h for h, _ in got["hooks"]] == list(range(len(points)))
    for (_, a), (_, b) in zip(got["forward"], got["hooks"]):
        assert torch.equal(a, b)
    assert not [n for n, m in model.named_modules() if "forward" in m.__dict__], "every wrapped forward restored"
    # two installs wrapping one module: removed in reverse order, else a LogicError (nothing restored wrongly)
    a = fh.install(model, points[:1], lambda h, t: None, via="forward")
    b = fh.install(model, points[:1], lambda h, t: None, via="forward")
    with pytest.raises(ferry.LogicError, match="reverse order"):
        a.remove()
    assert a.installed, "a refused removal leaves the install in place"
    b.remove()
    a.remove()
    assert not [n for n, m in model.named_modules() if "forward" in m.__dict__]
    with pytest.raises(ferry.LogicError, match="via"):
        fh.install(model, points, lambda h, t: None, via="patch")


@pytest.mark.parametrize("values", [[-3.0, -0.5, -1.25], [-2.0, 4.0, None], [0.0, 0.0, 0.0]])
def test_bar_plot_draws_negative_and_zero_overheads(tmp_path, values):
    """A capture measured faster than no capture (CPU noise) gives a negative overhead: the plot still draws, with
    every bar between its value and the zero line (CI once lost the torch plot to a log10 of a negative range)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("perf_plots", ROOT / "bench/device/reports/perf_plots.py")
    pp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pp)
    out = tmp_path / "bars.svg"
    pp.bars(str(out), "t", "s", [("g", values)], ["a", "b", "c"], "%")
    svg = out.read_text()
    assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
    heights = [float(h) for h in __import__("re").findall(r'<rect x="[^"]+" y="[^"]+" width="[^"]+" height="([^"]+)"', svg)]
    assert all(h >= 0 for h in heights)
    assert len(heights) == len([v for v in values if v is not None]) + 3  # one bar per value + 3 legend swatches
