# SPDX-License-Identifier: Apache-2.0
# A smoke run of bench/torch/qwen3_eager.py (eager B=1 capture with a native sink running, issue 28) on the CPU
# with the host backend and a tiny model: every contestant timed in step-level interleaved rounds, the sinks'
# shards read back bit-exact against the witness (before the rounds), the JSON's eager_b1 block in the schema
# docs/perf/h200/sinks.json takes, with each overhead's confidence interval and the targets' paired comparisons.
# Skipped where torch or transformers is missing.
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


def eager(tmp_path, *args):
    """qwen3_eager.py on the CPU (host backend, tiny 2-layer model, shards under tmp_path) with `args`."""
    env = dict(os.environ, FERRY_PYTHON_BACKEND="host")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(os.path.dirname(ferry.__file__)),
                                                    env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, str(ROOT / "bench/torch/qwen3_eager.py"), "--device", "cpu", "--tiny", "--layers", "2",
           "--sink-dir", str(tmp_path), *map(str, args)]
    return run_script(cmd, env=env, timeout=300)


def test_qwen3_eager_smoke_checks_every_entry_and_writes_the_schema(tmp_path):
    out = tmp_path / "eager.json"
    r = eager(tmp_path, "--steps", "2", "--rounds", "3", "--min-rounds", "3", "--check-steps", "2", "--diagnostics", "on",
              "--out", out)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    d = json.loads(out.read_text())
    e = d["eager_b1"]
    assert e["rounds"] == 3 and e["tokens_per_round"] == 2 and e["no_capture_ms"] > 0
    for p, hooks in (("hidden_states", 2), ("vllm_full", 29)):
        assert {"ferry_ms", "deferred_ms", "torch_copy_ms"} <= set(e[p]) and e[p]["hooks"] == hooks
        assert all(e[p][k] > 0 for k in ("ferry_ms", "deferred_ms", "torch_copy_ms"))
        assert set(e[p]["ci95_pct"]) == set(e[p]["overhead_pct"]) == set(e[p]["spread_pct"])
        assert {"ferry_minus_torch_pp", "deferred_minus_ferry_pp"} <= set(e[p]["comparisons_pp"])
    # every round ran every contestant once, in an order of its own, each between two no-capture turns (key 0)
    orders, keys = d["round_orders"]["orders"], d["round_orders"]["keys"]
    assert keys[0] == "none" and len(orders) == 3
    assert all(sorted(o[1::2]) == list(range(1, len(keys))) and set(o[0::2]) == {0} for o in orders)
    assert all(len(c["round_overhead_pct"]) == 3 for k, c in d["contestants"].items() if k != "none")
    # 2 check steps x 4 ferry kinds (immediate, deferred, collect, bounce) x (2 + 29) hooks, each read back from
    # the shards
    assert d["entries_checked"] == 2 * 4 * 31 and d["entries_bad"] == 0
    assert all(e[p]["collect_ms"] > 0 for p in ("hidden_states", "vllm_full"))
    assert e["vllm_full"]["bounce_ms"] > 0
    assert all(s["failed_entries"] == 0 and s["dropped_entries"] == 0 and s["channel_clean"] for s in d["sinks"].values())
    assert {"pyconsumer:vllm-full", "hooks:vllm-full", "torch:hidden-states"} <= set(d["contestants"])
    # the in-call diagnostic: time inside ferry's calls per step, for its contestants only
    c = d["contestants"]
    assert all(c[f"incall-{k}:{p}"]["in_call_us"] > 0 for k in ("ferry", "deferred", "collect") for p in ("hidden-states", "vllm-full"))
    assert "in_call_us" not in c["ferry:vllm-full"] and "in_call_us" not in c["hooks:vllm-full"]
    assert not list(tmp_path.glob("ferry-eager-*"))  # the shard runs are removed


def test_qwen3_eager_kinds_time_only_the_named_contestants(tmp_path):
    # --kinds: a run that spends every turn on one comparison (none, ferry, none, deferred, none per round); a kind
    # that names no contestant is refused before anything is timed
    out = tmp_path / "eager.json"
    base = ("--presets", "hidden-states", "--bounce", "0", "--rounds", "2", "--min-rounds", "2", "--out", out)
    r = eager(tmp_path, *base, "--kinds", "ferry,deferred")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    d = json.loads(out.read_text())
    assert set(d["contestants"]) == {"none", "ferry:hidden-states", "deferred:hidden-states"}
    assert all(len(o) == 5 for o in d["round_orders"]["orders"]) and len(d["round_orders"]["orders"]) == 2
    e = d["eager_b1"]["hidden_states"]
    assert e["ferry_ms"] > 0 and e["deferred_ms"] > 0 and e["torch_copy_ms"] is None
    assert set(e["comparisons_pp"]) == {"deferred_minus_ferry_pp"}
    assert set(d["verdict"]["hidden_states"]) >= {"deferred_le_ferry", "deferred_le_ferry_decided"}
    assert "ferry_le_torch" not in d["verdict"]["hidden_states"]
    # the refusal: the script's own pick() (the run above went through it), in this process
    sys.path.insert(0, str(ROOT / "bench" / "torch"))
    try:
        import qwen3_eager
    finally:
        sys.path.pop(0)
    runs = {"none": 0, "ferry:hidden-states": 1, "deferred:hidden-states": 2}
    with pytest.raises(SystemExit, match="--kinds: expected kinds among deferred, ferry, got defered"):
        qwen3_eager.pick(runs, "ferry,defered")
    assert list(qwen3_eager.pick(runs, "ferry")) == ["none", "ferry:hidden-states"]
