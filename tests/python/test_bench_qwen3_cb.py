# SPDX-License-Identifier: Apache-2.0
# Smoke runs of bench/torch/qwen3_cb.py (selective capture under continuous batching) on the CPU with the host
# backend and a tiny model: every delivered row checked bit-exact and attributed to its step and request, and a
# fault the check must catch (the requests rotated by one). Skipped where torch or transformers is missing.
import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import ferry  # noqa: E402
from ranks_support import run_script  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench/torch/qwen3_cb.py"
LAYERS = 2


def _run(out, *extra):
    env = dict(os.environ, FERRY_PYTHON_BACKEND="host")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(os.path.dirname(ferry.__file__)),
                                                    env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--layers", str(LAYERS), "--out", str(out),
           *extra]
    return run_script(cmd, env=env, timeout=300)


def test_qwen3_cb_smoke_rows_exact_and_attributed(tmp_path):
    out = tmp_path / "qwen3_cb.json"
    r = _run(out, "--tokens", "4", "--rounds", "1")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    d = json.loads(out.read_text())
    assert {"device", "commit", "date", "command", "qwen3_cb"} <= set(d)
    q = d["qwen3_cb"]
    for key in ("no_capture_ms", "hidden_states_ms", "vllm_full_ms", "cpu_select_ms", "torch_select_ms"):
        assert q[key] is not None and q[key] > 0, key
    assert q["rows_bad"] == 0 and q["misattributed"] == 0
    # rows and cpu_select, both presets: every hook of every step, each selected row
    hooks = LAYERS + (12 * LAYERS + 5)
    assert q["rows_checked"] == 2 * hooks * q["selected"]["rows_per_generation"] > 0
    assert 4 <= q["selected"]["min"] <= q["selected"]["max"] <= 16
    assert set(q["per_preset"]) == {"hidden_states", "vllm_full"}
    for p in q["per_preset"].values():
        assert set(p) == {"rows_ms", "cpu_select_ms", "torch_select_ms"} and all(v > 0 for v in p.values())
    assert q["per_preset"]["vllm_full"]["rows_ms"] == q["vllm_full_ms"]
    assert len(q["spreads"]) == 7 and all(len(s["samples_ms"]) == 1 for s in q["spreads"].values())
    assert set(d["check"]["runs"]) == {"rows:hidden-states", "rows:vllm-full", "cpu_select:hidden-states",
                                       "cpu_select:vllm-full"}
    assert d["check"]["first_bad"] is None and d["failures"] == []
    assert d["config"]["channel_close_clean"] is True


def test_qwen3_cb_check_catches_misattributed_rows(tmp_path):
    out = tmp_path / "qwen3_cb_fault.json"
    r = _run(out, "--tokens", "2", "--rounds", "0", "--presets", "hidden-states", "--contestants", "rows",
             "--fault", "requests")
    assert r.returncode == 1, r.stdout[-4000:] + r.stderr[-4000:]
    q = json.loads(out.read_text())["qwen3_cb"]
    assert q["rows_checked"] > 0 and q["misattributed"] == q["rows_checked"]
