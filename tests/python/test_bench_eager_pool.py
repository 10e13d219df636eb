# SPDX-License-Identifier: Apache-2.0
# bench/torch/eager_pool.py: the eager B=1 runs kept side by side (per-round overheads) and pooled; a comparison each
# run leaves undecided is decided by their rounds together, a run added twice counts once, and the committed
# docs/perf/h200/eager_rounds.json reads back; a figure pools the runs that timed its contestants, no others.
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
POOL = ROOT / "bench/torch/eager_pool.py"


def run_json(path, commit, date, seed, n, shift):
    # per-round overheads: deferred - ferry spread evenly over shift +- 8 pp (its median -shift), in a shuffled order
    rng = random.Random(seed)
    ferry = [2.0 + rng.uniform(-3, 3) for _ in range(n)]
    diffs = [-shift + 16 * (j / (n - 1) - 0.5) for j in range(n)]
    rng.shuffle(diffs)
    deferred = [f + x for f, x in zip(ferry, diffs)]
    d = {"device": "NVIDIA H200", "commit": commit, "date": date, "command": "python3 bench/torch/qwen3_eager.py",
         "eager_b1": {"rounds": n, "no_capture_ms": 30.0},
         "contestants": {"none": {"cpu_ms": 30.0},
                         "ferry:hidden-states": {"round_overhead_pct": ferry},
                         "deferred:hidden-states": {"round_overhead_pct": deferred}}}
    path.write_text(json.dumps(d))
    return path


def pool(*args):
    r = subprocess.run([sys.executable, str(POOL), *map(str, args)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_runs_pool_into_one_decision_and_a_run_counts_once(tmp_path):
    to, out = tmp_path / "rounds.json", tmp_path / "report.json"
    runs = [run_json(tmp_path / f"r{i}.json", "c0ffee1", f"2026-12-0{i + 1}T00:00:00Z", i, 40, 1.5) for i in range(4)]
    pool("add", runs[0], "--to", to)
    pool("report", to, "--json", out)
    one = json.loads(out.read_text())["hidden-states"]
    assert one["pooled"]["rounds"] == 40 and not one["pooled"]["figures"]["deferred_minus_ferry_pp"]["decided"]
    pool("add", *runs, "--to", to)  # runs[0] again: replaced, not added twice
    pool("report", to, "--json", out)
    r = json.loads(out.read_text())["hidden-states"]
    assert len(r["runs"]) == 4 and r["pooled"]["rounds"] == 160
    d = r["pooled"]["figures"]["deferred_minus_ferry_pp"]
    assert d["decided"] and d["ci95"][1] < 0 and -2.5 < d["median"] < -0.5, d
    assert {"ferry", "deferred"} <= set(r["pooled"]["figures"])


def test_a_json_without_rounds_is_refused(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"eager_b1": {"rounds": 3}, "contestants": {"none": {"cpu_ms": 1.0}}}))
    r = subprocess.run([sys.executable, str(POOL), "add", str(bad), "--to", str(tmp_path / "r.json")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "expected a qwen3_eager.py JSON with per-round overheads" in r.stderr
    assert not (tmp_path / "r.json").exists()


def test_the_committed_rounds_read_back(tmp_path):
    out = tmp_path / "report.json"
    pool("report", ROOT / "docs/perf/h200/eager_rounds.json", "--json", out)
    r = json.loads(out.read_text())["hidden-states"]
    assert r["runs"] and all(x["figures"] for x in r["runs"])
    assert r["pooled"]["rounds"] == sum(x["rounds"] for x in r["runs"])
    for kind in ("ferry", "deferred", "collect", "torch", "hooks"):  # each over the runs that timed it
        timed = [x for x in r["runs"] if kind in x["figures"]]
        f = r["pooled"]["figures"][kind]
        assert (f["rounds"], f["runs"]) == (sum(x["rounds"] for x in timed), len(timed)), kind
    # a contestant only some runs timed (session 21's incall-collect, run C's diagnostic) pools their rounds alone
    timed = [x for x in r["runs"] if "incall-collect" in x["figures"]]
    assert timed and 0 < len(timed) < len(r["runs"])
    ic = r["pooled"]["figures"]["incall-collect"]
    assert (ic["rounds"], ic["runs"]) == (sum(x["rounds"] for x in timed), len(timed))


def test_a_run_of_some_contestants_pools_into_theirs_alone(tmp_path):
    to, out = tmp_path / "rounds.json", tmp_path / "report.json"
    full = json.loads(run_json(tmp_path / "full.json", "c0ffee1", "2026-12-01T00:00:00Z", 1, 30, 1.0).read_text())
    full["contestants"]["torch:hidden-states"] = {"round_overhead_pct": [3.0 + 0.01 * j for j in range(30)]}
    (tmp_path / "full.json").write_text(json.dumps(full))
    some = run_json(tmp_path / "some.json", "c0ffee2", "2026-12-02T00:00:00Z", 2, 50, 1.0)  # ferry, deferred only
    pool("add", tmp_path / "full.json", some, "--to", to)
    pool("report", to, "--json", out)
    f = json.loads(out.read_text())["hidden-states"]["pooled"]["figures"]
    assert (f["torch"]["rounds"], f["torch"]["runs"]) == (30, 1)
    assert (f["ferry_minus_torch_pp"]["rounds"], f["ferry_minus_torch_pp"]["runs"]) == (30, 1)
    assert (f["deferred_minus_ferry_pp"]["rounds"], f["deferred_minus_ferry_pp"]["runs"]) == (80, 2)
    assert f["torch"]["median"] == pytest.approx(3.145)
