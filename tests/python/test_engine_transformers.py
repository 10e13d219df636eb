# SPDX-License-Identifier: Apache-2.0
"""ferry.engine.Capture in transformers' continuous batching (host backend on CPU; CUDA with graphs on a GPU): every
sample's rows bit for bit against a witness tap in the same forwards, and within tolerance against the plain forward
of its sequence (a row given to the wrong request fails both); per-request metadata; chunked prefill, mixed lengths,
every token form; the fault cases."""

from __future__ import annotations

import numpy as np
import pytest

import ferry
from engine_support import (Witness, as_tensor, cb_config, gen_config, plain_reference, prompts, reference_model,
                            tiny_model, torch)
from ferry.engine import Capture, Spec, open_samples, resolve_taps

CUDA = torch.cuda.is_available() and "cuda" in ferry.available_backends()
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])


def _run(tmp_path, model, taps, specs, lengths, max_new=5, fmt="per-request", graphs=False, **cbkw):
    cap = Capture(model, taps=taps, out=str(tmp_path / "out"), format=fmt)
    wit = Witness(model, cap.taps)  # after the Capture: its compute_batch wrapper is outside ferry's dispatch
    try:
        outs = cap.generate_batch(prompts(lengths), generation_config=gen_config(max_new), capture=specs,
                                  continuous_batching_config=cb_config(use_cuda_graph=graphs, **cbkw))
    finally:
        wit.remove()
        rep = cap.close()
    return cap, wit, outs, rep


def _check(cap, wit, outs, rep, model, tmp_path, expect):
    """Every sample: the positions its spec names, its token ids, its rows equal to the witness's bit for bit and to
    the plain forward's within tolerance."""
    dtype = next(model.parameters()).dtype
    ref = reference_model(model)
    got = {m["request_id"]: (m, t) for m, t in open_samples(str(tmp_path / "out"))}
    assert sorted(got) == sorted(expect), (sorted(got), rep)
    for rid, (lo, hi) in expect.items():
        meta, t = got[rid]
        o = outs[rid]
        seq = list(o.prompt_ids) + list(o.generated_tokens)
        end = min(hi, len(seq) - 1)
        assert meta["complete"] == "true", (rid, meta)
        assert t["positions"].tolist() == list(range(lo, end)), rid
        assert t["token_ids"].tolist() == seq[lo:end], rid
        hid = as_tensor(t["hidden_states"], dtype)
        assert tuple(hid.shape) == (end - lo, len(cap.taps), 64)
        plain = plain_reference(ref, seq[:end], cap.taps)
        for k, tap in enumerate(cap.taps):
            w = wit.rows(rid, k)
            want = torch.stack([w[p] for p in range(lo, end)]).to(hid.dtype)
            assert torch.equal(hid[:, k].cpu(), want.cpu().view(hid.dtype)), (rid, tap.name)
            if plain[tap.name] is not None:
                # bf16: the engine's paged attention and the plain forward's sdpa round in different orders, and
                # after a few layers a value of magnitude 2-4 may differ by one or two bf16 steps (1/64 .. 1/32
                # there); a row of another position or request differs by O(1)
                tol = 6e-2 if dtype == torch.bfloat16 else 2e-4
                torch.testing.assert_close(hid[:, k].float().cpu(), plain[tap.name][lo:end].float().cpu(),
                                           atol=tol, rtol=tol)
    assert rep["lost"] == [] and rep["dropped"] == [] and not rep.get("error"), rep


MODES = [("cpu", False)] + ([("cuda", False), ("cuda", True)] if CUDA else [])


@pytest.mark.parametrize("device,async_mode", MODES, ids=[f"{d}{'-async' if a else ''}" for d, a in MODES])
def test_every_token_form_with_chunked_prefill(tmp_path, device, async_mode):
    """CPU: eager steps on the host backend; CUDA: the engine's CUDA graphs (and its async mode: two IO pairs)."""
    model = tiny_model(device=device, dtype=torch.float32 if device == "cpu" else torch.bfloat16, layers=8)
    lengths = [5, 40, 17, 3, 26, 9]
    specs = [Spec("all"), Spec("prompt"), Spec("generated"), Spec("last_prompt"), Spec((20, 28)), None]
    extra = {"use_async_batching": True} if async_mode else {}
    cap, wit, outs, rep = _run(tmp_path, model, "eagle3", specs, lengths, max_new=6, graphs=device == "cuda",
                               **extra)
    assert [t.name for t in cap.taps] == ["layer.2", "layer.4", "layer.5", "final"]
    p = lengths
    expect = {"req_0": (0, p[0] + 5), "req_1": (0, p[1]), "req_2": (p[2], p[2] + 5), "req_3": (p[3] - 1, p[3]),
              "req_4": (20, 28)}
    _check(cap, wit, outs, rep, model, tmp_path, expect)
    assert rep["samples"] == 5 and rep["complete"] == 5
    assert rep["channel"]["clean"], rep["channel"]


def test_arrow_dataset_of_per_request_rows(tmp_path):
    """format="arrow": a Hugging Face dataset, one row per request (request_id, positions, token_ids, a column per
    tap); every sample read back through open_samples bit for bit against the witness, and the directory loads with
    datasets.load_from_disk as it is (a request whose spec keeps one tap has nulls in the others)."""
    pa = pytest.importorskip("pyarrow")
    model = tiny_model()
    specs = [Spec("all"), Spec("prompt"), Spec((2, 9)), None]
    lengths = [12, 33, 7, 5]
    cap, wit, outs, rep = _run(tmp_path, model, "eagle3", specs, lengths, max_new=4, fmt="arrow")
    _check(cap, wit, outs, rep, model, tmp_path, {"req_0": (0, 12 + 3), "req_1": (0, 33), "req_2": (2, 9)})
    out = tmp_path / "out"
    shards = sorted(p.name for p in out.glob("data-*.arrow"))
    assert shards == ["data-00000.arrow"] and not list(out.glob(".*tmp*"))
    with pa.OSFile(str(out / shards[0]), "rb") as f:
        t = pa.ipc.open_stream(f).read_all()
    assert t.column("request_id").to_pylist() == ["req_0", "req_1", "req_2"]
    assert t.column("positions").to_pylist()[2] == list(range(2, 9))
    assert [f.name for f in t.schema][3:3 + len(cap.taps)] == cap.names
    datasets = pytest.importorskip("datasets")
    d = datasets.load_from_disk(str(out))
    assert d.num_rows == 3 and d["request_id"] == ["req_0", "req_1", "req_2"]
    row = d.with_format("numpy")[1]
    assert np.asarray(row[cap.names[0]]).shape == (33, 64) and list(row["positions"]) == list(range(33))
    assert datasets.Dataset.from_file(str(out / shards[0])).num_rows == 3


def test_arrow_rows_of_a_request_that_keeps_fewer_taps_are_null(tmp_path):
    """A Spec(taps=[...]) keeps some taps: its row holds them and nulls for the others, and open_samples names the
    kept ones."""
    pytest.importorskip("pyarrow")
    model = tiny_model()
    cap = Capture(model, taps="eagle3", out=str(tmp_path / "out"), format="arrow")
    try:
        cap.generate_batch(prompts([6, 9]), generation_config=gen_config(2),
                           capture=[Spec("all"), Spec("all", taps=["final"])], continuous_batching_config=cb_config())
    finally:
        rep = cap.close()
    assert rep["complete"] == 2, rep
    got = {m["request_id"]: (m, t) for m, t in open_samples(str(tmp_path / "out"))}
    import json
    assert json.loads(got["req_0"][0]["taps"]) == cap.names and json.loads(got["req_1"][0]["taps"]) == ["final"]
    assert got["req_1"][1]["hidden_states"].shape == (9 + 1, 1, 64)


def test_arrow_samples_take_the_writer_tuning_and_refuse_a_bad_one_before_touching_a_file(tmp_path, monkeypatch):
    """Capture(writer_tuning=...) reaches format "arrow"'s FileWriter; a key it does not take, or tuning for a
    safetensors format, is a LogicError at the call, and an overwrite=True directory keeps its files."""
    pytest.importorskip("pyarrow")
    from ferry.engine import SampleWriter
    made, fw = [], ferry._ferry.FileWriter

    def recorded(**kw):
        made.append(kw)
        return fw(**kw)

    monkeypatch.setattr(ferry._ferry, "FileWriter", recorded)
    tuning = {"io_threads": 1, "write_buffers": 4, "write_bytes": 1 << 20}
    cap = Capture(tiny_model(), taps="eagle3", out=str(tmp_path / "out"), format="arrow", writer_tuning=tuning)
    try:
        cap.generate_batch(prompts([6, 9]), generation_config=gen_config(2), capture=[Spec("all"), Spec("prompt")],
                           continuous_batching_config=cb_config())
    finally:
        rep = cap.close()
    assert rep["complete"] == 2 and made == [tuning], (rep, made)
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "index.json").write_text("{}")
    with pytest.raises(ferry.LogicError, match=r"expected tuning keys of _ferry.FileWriter, got \['threads'\]"):
        SampleWriter(str(tmp_path / "old"), "arrow", overwrite=True, tuning={"threads": 2})
    with pytest.raises(ferry.LogicError, match=r"writer tuning .* is for format 'arrow' .*, got format 'shards'"):
        SampleWriter(str(tmp_path / "old"), "shards", overwrite=True, tuning={"io_threads": 2})
    assert (tmp_path / "old" / "index.json").read_text() == "{}"


def test_all_layers_into_shards(tmp_path):
    model = tiny_model()
    specs = [Spec("all")] * 3
    cap, wit, outs, rep = _run(tmp_path, model, "all-layers", specs, [12, 33, 7], max_new=4, fmt="shards")
    assert len(cap.taps) == 5  # embeddings, layers 0..2, final
    _check(cap, wit, outs, rep, model, tmp_path, {f"req_{i}": (0, n + 3) for i, n in enumerate([12, 33, 7])})
    import json
    idx = json.loads((tmp_path / "out" / "index.json").read_text())
    assert sorted(idx["samples"]) == ["req_0", "req_1", "req_2"]
    safetensors = pytest.importorskip("safetensors")
    shard = tmp_path / "out" / idx["samples"]["req_1"]["shard"]
    with safetensors.safe_open(str(shard), "pt") as f:
        assert f.get_tensor("req_1/hidden_states").shape == (36, 5, 64)  # 33 + 4 - 1 positions


def test_per_request_files_open_with_safetensors(tmp_path):
    safetensors = pytest.importorskip("safetensors")
    model = tiny_model()
    _run(tmp_path, model, "sae:1", Spec("prompt"), [10, 20], max_new=3)
    with safetensors.safe_open(str(tmp_path / "out" / "req_1.safetensors"), "pt") as f:
        meta = f.metadata()
        assert meta["request_id"] == "req_1" and meta["taps"] == '["layer.1"]' and meta["complete"] == "true"
        assert f.get_tensor("hidden_states").shape == (20, 1, 64)
        assert f.get_tensor("token_ids").tolist() == prompts([10, 20])[1]


def test_requests_without_a_spec_capture_nothing(tmp_path):
    model = tiny_model()
    cap, _, outs, rep = _run(tmp_path, model, "sae", None, [8, 9], max_new=3)
    assert len(outs) == 2 and rep["samples"] == 0 and rep["entries"] == 0
    assert list(open_samples(str(tmp_path / "out"))) == []


def test_spec_errors_are_typed():
    model = tiny_model()
    with pytest.raises(ferry.LogicError, match="layer index in \\[0, 4\\)"):
        resolve_taps(model, [7])
    with pytest.raises(ferry.LogicError, match="empty or inverted"):
        Spec((5, 5))
    with pytest.raises(ferry.LogicError, match="empty or inverted"):
        Spec((6, 2))
    with pytest.raises(ferry.LogicError, match="expected tokens one of"):
        Spec("everything")
    with pytest.raises(ferry.LogicError, match="within the positions the request can run"):
        Spec((0, 50)).positions(10, 5, "r")
    with pytest.raises(ferry.LogicError, match="expected a decoder model"):
        resolve_taps(torch.nn.Linear(4, 4), "eagle3")


def test_duplicate_request_ids_and_unknown_taps_refused(tmp_path):
    model = tiny_model()
    cap = Capture(model, taps="sae", out=str(tmp_path / "o"))
    try:
        cap.register("a", [1, 2, 3], 4, Spec("all"))
        with pytest.raises(ferry.LogicError, match="unique request ids, got 'a' twice"):
            cap.register("a", [1, 2], 4, Spec("all"))
        with pytest.raises(ferry.LogicError, match="expected taps among"):
            cap.register("b", [1, 2], 4, Spec("all", taps=["final"]))
        with pytest.raises(ferry.LogicError, match="already has a Capture"):
            Capture(model, taps="sae", out=str(tmp_path / "p"))
    finally:
        rep = cap.close()
    # registered, never run: written incomplete, everything missing, and why
    assert rep["incomplete"] == [{"request_id": "a", "missing": [(0, 6)],
                                  "reason": "not finished when the capture closed"}], rep
    assert "_ferry_capture" not in model.__dict__


def test_window_past_an_early_stop_is_reported_missing(tmp_path):
    """A window the request never reaches (it stops at max_new_tokens) is refused at the call; one it reaches only
    partly because it ended early is written incomplete with the missing positions."""
    model = tiny_model()
    cap = Capture(model, taps="sae", out=str(tmp_path / "out"))
    try:
        with pytest.raises(ferry.LogicError, match="within the positions"):
            cap.generate_batch(prompts([6]), generation_config=gen_config(3), capture=Spec((0, 9)),
                               continuous_batching_config=cb_config())
    finally:
        cap.close()


def test_prefix_sharing_is_refused(tmp_path):
    model = tiny_model()
    cap = Capture(model, taps="sae", out=str(tmp_path / "out"))
    try:
        with pytest.raises(ferry.LogicError, match="allow_block_sharing=False"):
            cap.generate_batch(prompts([6]), generation_config=gen_config(3), capture=Spec("all"),
                               continuous_batching_config=cb_config(allow_block_sharing=True))
    finally:
        cap.close()


def test_cancelled_request_is_written_incomplete(tmp_path):
    """A request cancelled mid-prefill (a 100-token prompt in chunks of 16): its sample says cancelled and what is
    missing; the other request is complete."""
    model = tiny_model()
    cap = Capture(model, taps="sae", out=str(tmp_path / "out"))
    manager = model.init_continuous_batching(generation_config=gen_config(4),
                                             continuous_batching_config=cb_config(max_batch_tokens=16))
    cap.attach(manager)
    manager.start()
    try:
        long, short = prompts([100, 6])
        cap.add_request(long, request_id="long", capture=Spec("prompt"))
        manager.cancel_request("long")
        cap.add_request(short, request_id="short", capture=Spec("all"))
        assert manager.get_result(request_id="short", timeout=120).is_finished()
    finally:
        manager.stop(block=True)
        rep = cap.close()
    got = {m["request_id"]: (m, t) for m, t in open_samples(str(tmp_path / "out"))}
    assert got["short"][0]["complete"] == "true"
    meta, t = got["long"]
    assert meta["complete"] == "false" and "cancelled" in meta["reason"]
    have = set(t["positions"].tolist())
    missing = [p for a, b in __import__("json").loads(meta["missing"]) for p in range(a, b)]
    assert sorted(have | set(missing)) == list(range(100)) and not have & set(missing)
    assert [x["request_id"] for x in rep["incomplete"]] == ["long"]


def test_full_disk_keeps_complete_samples_readable(tmp_path, monkeypatch):
    """The writer's second file fails with ENOSPC: that sample is reported lost and not listed; the samples written
    before and after it read back; generation finishes."""
    import errno

    from ferry.engine import samples

    real, calls = samples.write_safetensors, []

    def failing(path, *a, **k):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", path)
        return real(path, *a, **k)

    monkeypatch.setattr(samples, "write_safetensors", failing)
    model = tiny_model()
    cap, _, outs, rep = _run(tmp_path, model, "sae", Spec("all"), [5, 9, 7], max_new=3)
    assert len(outs) == 3 and all(o.is_finished() for o in outs.values())
    lost = [x["request_id"] for x in rep["lost"]]
    assert len(lost) == 1 and "No space left" in rep["io_errors"][0]
    listed = [m["request_id"] for m, _ in open_samples(str(tmp_path / "out"))]
    assert sorted(listed + lost) == ["req_0", "req_1", "req_2"] and len(listed) == 2
    assert not list((tmp_path / "out").glob("*.tmp-*"))


def test_drop_policy_reports_every_dropped_request(tmp_path, monkeypatch):
    """A writer slower than the engine with max_queue_bytes=1 and policy='drop': each dropped sample is reported
    with its request and tokens, and written ones plus dropped ones are every request."""
    import time

    from ferry.engine import samples

    real = samples.SampleWriter.write
    monkeypatch.setattr(samples.SampleWriter, "write", lambda self, s: (time.sleep(0.3), real(self, s))[1])
    model = tiny_model()
    cap = Capture(model, taps="sae", out=str(tmp_path / "out"), policy="drop", max_queue_bytes=1)
    try:
        outs = cap.generate_batch(prompts([4, 5, 6, 7, 8, 9]), generation_config=gen_config(2), capture=Spec("all"),
                                  continuous_batching_config=cb_config(max_batch_tokens=64))
    finally:
        rep = cap.close()
    assert len(outs) == 6
    dropped = {x["request_id"]: x["tokens"] for x in rep["dropped"]}
    written = [m["request_id"] for m, _ in open_samples(str(tmp_path / "out"))]
    assert dropped and sorted(list(dropped) + written) == sorted(outs)
    assert all(dropped[r] == len(outs[r].prompt_ids) + 1 for r in dropped)


def test_on_error_disable_keeps_the_engine_serving(tmp_path):
    """A ring too small for one step's rows: with on_error='disable' capture stops, generation finishes, and the
    report says why and what is missing; with on_error='raise' the capture error reaches the step."""
    model = tiny_model()
    cap = Capture(model, taps="sae", out=str(tmp_path / "out"), ring_bytes=1024, on_error="disable")
    try:
        outs = cap.generate_batch(prompts([20, 30]), generation_config=gen_config(3), capture=Spec("all"),
                                  continuous_batching_config=cb_config())
    finally:
        rep = cap.close()
    assert len(outs) == 2 and all(not o.error for o in outs.values())
    assert rep["disabled"] and rep["capture_errors"] >= 1, rep
    assert rep["complete"] < 2 and {x["request_id"] for x in rep["incomplete"]} <= set(outs)


@pytest.mark.parametrize("layout", ["shards", "arrow"])
def test_writer_killed_leaves_only_complete_shards(tmp_path, layout):
    """SIGKILL while a process writes shards: index.json (arrow: state.json) lists only shards that exist and read
    back whole."""
    if layout == "arrow":
        pytest.importorskip("pyarrow")
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    code = ("import numpy as np, ferry.engine as fe\n"
            f"w = fe.SampleWriter({str(out)!r}, {layout!r}, shard_bytes=200_000)\n"
            "for i in range(100000):\n"
            "    h = np.full((50, 2, 128), i % 251, np.uint8)\n"
            "    p = np.arange(50, dtype=np.int64)\n"
            "    w.write(fe.Sample(f'r{i}', h, p, p, ['a', 'b'], 'BF16', (64,)))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    try:
        end = time.time() + 60
        marker = out / ("index.json" if layout == "shards" else "state.json")
        while not marker.exists() and time.time() < end:
            time.sleep(0.05)
        time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    n = 0
    for meta, t in open_samples(str(out)):
        i = int(meta["request_id"][1:])
        assert t["hidden_states"].shape == (50, 2, 64) and (t["hidden_states"].view(np.uint8) == i % 251).all()
        n += 1
    assert n >= 1


def test_api_doc_snippets_run(tmp_path):
    """Every ```python torch block of docs/api/engine.md (in one namespace) and of README.md."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[2]
    for doc, least in ((root / "docs" / "api" / "engine.md", 2), (root / "README.md", 1)):
        found = re.findall(r"```python torch\n(.*?)```", doc.read_text(), flags=re.S)
        assert len(found) >= least, doc
        ns = {"tmp": tmp_path / doc.stem}
        for i, code in enumerate(found):
            exec(compile(code, f"{doc.name}[torch block {i}]", "exec"), ns)


def test_api_doc_commands_run(tmp_path, monkeypatch):
    """The `ferry capture` lines of docs/api/engine.md's second sh block, as written (split as the shell splits
    them: quotes, $CKPT, comments), each run by `ferry.cli.main` in this process (the `ferry` entry point as a
    command: python.pip_install), a saved tiny checkpoint as $CKPT and a prompts.jsonl
    of token ids."""
    import json
    import os
    import pathlib
    import re
    import shlex

    from ferry import cli

    doc = pathlib.Path(__file__).resolve().parents[2] / "docs" / "api" / "engine.md"
    lines = [ln for ln in re.findall(r"```sh\n(.*?)```", doc.read_text(), flags=re.S)[1].splitlines()
             if ln.startswith("ferry capture")]
    assert len(lines) == 4
    tiny_model().save_pretrained(tmp_path / "ckpt")
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"input_ids": p}) + "\n" for p in prompts([9, 21])))
    monkeypatch.setenv("CKPT", str(tmp_path / "ckpt"))
    monkeypatch.chdir(tmp_path)
    for ln in lines:
        words = [os.path.expandvars(w) for w in shlex.split(ln, comments=True)]
        assert words[:2] == ["ferry", "capture"], words
        assert cli.main(["capture", "--quiet", "--requests", "3", "--max-new-tokens", "3", *words[2:]]) == 0, ln
    assert (tmp_path / "run" / "index.json").exists()
    got = {m["request_id"]: t for m, t in open_samples(str(tmp_path / "sae"))}
    assert sorted(got) == ["req_0", "req_1"] and got["req_1"]["hidden_states"].shape == (21, 1, 64)
    assert (tmp_path / "ds" / "state.json").exists() and len(list(open_samples(str(tmp_path / "ds")))) == 3
    assert all(m["reduce"] == "fp8_e4m3" for m, _ in open_samples(str(tmp_path / "fp8")))


def test_ferry_capture_smoke(tmp_path, capsys):
    """The main command on CPU (`ferry.cli.main`, in this process: python.pip_install runs the `ferry` command from a
    fresh venv): the embedded default, its summary and the samples it names."""
    from ferry import cli

    out = tmp_path / "ds"
    assert cli.main(["capture", "--out", str(out), "--requests", "4", "--max-new-tokens", "3", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "4 samples (4 complete, 0 incomplete, 0 dropped, 0 lost)" in printed, printed
    assert len(list(open_samples(str(out)))) == 4


def test_ferry_capture_reduce_writes_fp8_records(tmp_path):
    """ferry capture --reduce fp8_e4m3: the samples hold fp8 records that ferry.engine.decode splits."""
    from ferry import cli
    from ferry.engine import decode

    out = tmp_path / "ds"
    assert cli.main(["capture", "--out", str(out), "--requests", "2", "--max-new-tokens", "2", "--reduce", "fp8_e4m3",
                     "--quiet"]) == 0
    got = list(open_samples(str(out)))
    assert len(got) == 2
    for meta, arrays in got:
        f = decode(meta, arrays)
        assert meta["reduce"] == "fp8_e4m3" and f["codes"].dtype == np.uint8
        assert f["scale"].shape == f["codes"].shape[:2] and (f["scale"] > 0).all()


READER = """
import json, sys, ferry.engine as fe
name, out = sys.argv[1], sys.argv[2]
r = fe.open_reader(name)
got = {}
with r:
    for step, tap, h, p0, rows in fe.stream_rows(r):
        for j in range(rows.shape[0]):
            got.setdefault(str(h), {})[str(p0 + j)] = rows[j].tobytes().hex()
json.dump(got, open(out, "w"))
"""


def test_stream_to_a_reader_process_keeps_requests_and_positions(tmp_path):
    """Capture(out=ferry.sinks.shm_stream(...)): a reader in another process gets every captured row with its
    request and position (ferry.engine.stream_rows), bit for bit the witness's rows."""
    import json
    import os
    import subprocess
    import sys

    model = tiny_model()
    name = f"engine-test-{os.getpid()}"
    sink = ferry.sinks.shm_stream(name)
    out = tmp_path / "reader.json"
    reader = subprocess.Popen([sys.executable, "-c", READER, name, str(out)],
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    cap = Capture(model, taps="sae", out=sink)
    wit = Witness(model, cap.taps)
    try:
        outs = cap.generate_batch(prompts([7, 30, 12]), generation_config=gen_config(4),
                                  capture=[Spec("all"), Spec((3, 20)), None], continuous_batching_config=cb_config())
    finally:
        wit.remove()
        rep = cap.close()
    assert reader.wait(timeout=120) == 0
    got = json.loads(out.read_text())
    assert sorted(got) == sorted(rep["request_ids"].values()) == ["req_0", "req_1"]  # the engine's ids
    expect = {"req_0": range(0, 7 + 3), "req_1": range(3, 20)}
    for rid, rows in got.items():
        assert sorted(int(p) for p in rows) == list(expect[rid]), rid
        w = wit.rows(rid, 0)
        for p, hexrow in rows.items():
            assert bytes.fromhex(hexrow) == w[int(p)].numpy().tobytes(), (rid, p)
    assert len(outs) == 3 and rep["samples"] == 0


def test_stream_drop_policy_reports_each_dropped_request_and_its_tokens(tmp_path):
    """A stream with policy "drop" and no reader drops every step whole; the report lists each request that lost
    rows with all of its tokens (the sink's per-request ledger, mapped to the engine's ids), not a random subset."""
    import os

    model = tiny_model()
    sink = ferry.sinks.shm_stream(f"engine-drop-{os.getpid()}", policy="drop")
    cap = Capture(model, taps="sae", out=sink)
    try:
        cap.generate_batch(prompts([7, 30, 12]), generation_config=gen_config(4),
                           capture=[Spec("all"), Spec((3, 20)), None], continuous_batching_config=cb_config())
    finally:
        rep = cap.close()
    got = {d["request_id"]: d["tokens"] for d in rep["dropped"]}
    assert got == {"req_0": 7 + 3, "req_1": 20 - 3}, rep["dropped"]
    assert rep["sink"]["dropped_forwards"] >= 1 and rep["sink"]["entries_published"] == 0


def test_two_generate_batch_calls_on_one_capture(tmp_path):
    """Request ids go on across calls (a Capture refuses an id twice): req_0, req_1, then req_2, req_3."""
    model = tiny_model()
    cap = Capture(model, taps="sae", out=str(tmp_path / "out"))
    try:
        a = cap.generate_batch(prompts([5, 6]), generation_config=gen_config(2), capture=Spec("all"),
                               continuous_batching_config=cb_config())
        b = cap.generate_batch(prompts([7, 8], seed=1), generation_config=gen_config(2), capture=Spec("all"),
                               continuous_batching_config=cb_config())
    finally:
        rep = cap.close()
    assert list(a) == ["req_0", "req_1"] and list(b) == ["req_2", "req_3"]
    assert rep["complete"] == 4 and sorted(m["request_id"] for m, _ in open_samples(str(tmp_path / "out"))) == \
        ["req_0", "req_1", "req_2", "req_3"]


def test_a_damaged_sample_file_is_a_shard_error_naming_it(tmp_path):
    """open_samples checks each file's header as ferry.shards does: a truncated file is a ShardError naming it."""
    from ferry.engine import Sample, SampleWriter
    from ferry.shards import ShardError

    w = SampleWriter(str(tmp_path), "per-request")
    p = np.arange(4, dtype=np.int64)
    w.write(Sample("r0", np.ones((4, 1, 8), np.uint8), p, p, ["a"], "BF16", (4,)))
    w.close()
    f = tmp_path / "r0.safetensors"
    f.write_bytes(f.read_bytes()[:-3])
    with pytest.raises(ShardError, match="r0.safetensors: truncated"):
        list(open_samples(str(tmp_path)))


@pytest.mark.parametrize("fmt", ["per-request", "arrow"])
@pytest.mark.parametrize("spec", ["fp8_e4m3", "topk(4)"])
def test_reduced_taps_hold_the_reducer_of_the_witness_rows(tmp_path, fmt, spec):
    """Capture(reduce=...): every tap's rows reduced on the device (one record per token); ferry.engine.decode splits
    a sample into the reducer's fields, equal to torch's reduction of the witness rows (fp8: torch's float8_e4m3fn
    cast with the recorded scale, bit for bit; topk: a stable descending sort)."""
    if fmt == "arrow":
        pytest.importorskip("pyarrow")
    from ferry.engine import decode
    model = tiny_model()
    cap = Capture(model, taps="eagle3", out=str(tmp_path / "out"), format=fmt, reduce=spec)
    wit = Witness(model, cap.taps)
    try:
        cap.generate_batch(prompts([7, 12]), generation_config=gen_config(3), capture=[Spec("all"), Spec("prompt")],
                           continuous_batching_config=cb_config())
    finally:
        wit.remove()
        rep = cap.close()
    assert rep["complete"] == 2 and rep["lost"] == [] and rep["dropped"] == [], rep
    got = {m["request_id"]: (m, t) for m, t in open_samples(str(tmp_path / "out"))}
    assert sorted(got) == ["req_0", "req_1"]
    for rid, (meta, arrays) in got.items():
        assert meta["reduce"] == spec and meta["reduce_width"] == "64"
        f = decode(meta, arrays)
        pos = arrays["positions"].tolist()
        for k in range(len(cap.taps)):
            w = wit.rows(rid, k)
            x = torch.stack([w[p] for p in pos]).float().cpu()
            if spec == "fp8_e4m3":
                amax = x.abs().amax(dim=1)
                scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
                np.testing.assert_array_equal(f["scale"][:, k], scale.numpy())
                ref = (x / scale.unsqueeze(1)).to(torch.float8_e4m3fn).view(torch.uint8)
                np.testing.assert_array_equal(f["codes"][:, k], ref.numpy())
            else:
                ref = torch.sort(x, dim=1, descending=True, stable=True)
                np.testing.assert_array_equal(f["values"][:, k], ref.values[:, :4].numpy())
                np.testing.assert_array_equal(f["indices"][:, k], ref.indices[:, :4].numpy())


def test_reduce_with_one_record_per_item_or_entry_is_refused():
    model = tiny_model()
    for bad in ("mean", "stats", "topk", 3):
        with pytest.raises(ferry.LogicError, match="expected reduce None or a reducer with one record per row"):
            Capture(model, taps="eagle3", out="unused", reduce=bad)
