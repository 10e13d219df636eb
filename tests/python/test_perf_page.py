# SPDX-License-Identifier: Apache-2.0
# docs/perf/README.md is one command's output: `perf_page.py --write` renders every section from its run file in
# docs/perf/h200, each target read from that file's "targets" block and decided by the one decide(); the committed
# page must be what the committed run files give, and stay at most 140 lines. Stdlib and the scripts only: no ferry,
# no GPU.
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REPORTS = ROOT / "bench/device/reports"
README = ROOT / "docs/perf/README.md"
RUNS = ROOT / "docs/perf/h200"
sys.path.insert(0, str(REPORTS))
sys.dont_write_bytecode = True
import perf_page  # noqa: E402


def page(*args):
    return subprocess.run([sys.executable, str(REPORTS / "perf_page.py"), *map(str, args)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


def test_the_committed_page_is_what_the_run_files_give_and_at_most_140_lines():
    r = page("--check", README)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = README.read_text().count("\n")
    assert lines <= 140, f"docs/perf/README.md: expected at most 140 lines, got {lines}"


def test_check_names_a_stale_block_and_write_repairs_it(tmp_path):
    readme, runs = tmp_path / "README.md", tmp_path / "h200"
    shutil.copytree(RUNS, runs)
    readme.write_text(README.read_text().replace("| hooks28 | 1710.0 us |", "| hooks28 | 1700.0 us |"))
    r = page("--check", readme, "--dir", runs)
    assert r.returncode != 0 and "stale blocks d2h " in r.stderr, r.stderr
    assert page("--write", readme, "--dir", runs).returncode == 0
    assert readme.read_text() == README.read_text()
    assert (tmp_path / "torch_qwen3.svg").read_text().startswith("<svg"), "--write draws the plots beside the page"
    readme.write_text(README.read_text().replace("<!-- perf:h2d -->", "<!-- perf:h2x -->"))
    r = page("--check", readme, "--dir", runs)
    assert r.returncode != 0 and "expected one <!-- perf:NAME -->" in r.stderr and "h2x" in r.stderr


@pytest.mark.parametrize("median, ci95, target, verdict", [
    (0.9, [0.5, 0.99], {"max": 1}, "met"), (0.9, None, {"max": 1}, "met"), (1.0, [0.2, 1.0], {"max": 1}, "met"),
    (0.9, [0.5, 1.2], {"max": 1}, "undecided"), (1.1, [0.9, 1.3], {"max": 1}, "missed"), (1.1, None, {"max": 1}, "missed"),
    (52, [51, 53], {"min": 50}, "met"), (52, [49, 53], {"min": 50}, "undecided"), (49, None, {"min": 50}, "missed"),
    (None, None, {"max": 1}, None), (0.5, None, None, None)])
def test_decide_meets_a_target_only_where_the_interval_lies_within_its_bound(median, ci95, target, verdict):
    assert perf_page.decide(median, ci95, target) == verdict


def test_decide_refuses_a_target_without_a_bound():
    with pytest.raises(ValueError, match="expected a target"):
        perf_page.decide(1.0, None, {"at_most": 1})
    assert perf_page.combine("met", "undecided") == "undecided" and perf_page.combine("met", "missed") == "missed"
    assert perf_page.combine("met", None) is None and perf_page.combine("met", "met") == "met"


def test_every_run_file_the_page_reports_on_carries_its_targets():
    for name in ("d2h", "h2d", "torch_qwen3", "capture_cost", "select", "sinks"):
        t = json.loads((RUNS / f"{name}.json").read_text()).get("targets")
        assert t and all(("max" in b) != ("min" in b) for b in t.values()), name


def rows(text):
    return {line.split(" | ")[0][2:]: line for line in text.splitlines() if line.startswith("| ")}


def test_the_d2h_h2d_and_torch_targets_flip_with_their_figures():
    d2h = json.loads((RUNS / "d2h.json").read_text())
    r = rows(perf_page.d2h_section(d2h))
    assert r["publication above copies, 341 hooks"].endswith("| **no** |")
    assert r["whole overhead, 28 hooks"] == ("| whole overhead, 28 hooks | <= 2.5% | **+2.25%** (copy only +2.21%) "
                                             "| batched +3.31% | yes |")
    d2h["forward"]["hooks28"]["ferry_overhead_pct"] = 2.6
    d2h["targets"]["publication_pct_hooks341"]["max"] = 0.7
    r = rows(perf_page.d2h_section(d2h))
    assert r["whole overhead, 28 hooks"].endswith("| **no** |") and "<= 0.7%" in r["publication above copies, 341 hooks"]
    assert r["publication above copies, 341 hooks"].endswith("| yes |")
    h2d = json.loads((RUNS / "h2d.json").read_text())
    assert rows(perf_page.h2d_section(h2d))["CPU pack + enqueue (decode256)"].endswith("| yes |")
    h2d["cases"]["decode256"]["auto_cpu_us"] = 6.5
    assert rows(perf_page.h2d_section(h2d))["CPU pack + enqueue (decode256)"].endswith("| **no** |")
    torch = json.loads((RUNS / "torch_qwen3.json").read_text())
    r = rows(perf_page.torch_section(torch))
    assert r["b1_graph vllm-full"].endswith("| **no** |") and "0.25x the copies' overhead" in r["b1_graph vllm-full"]
    del torch["targets"]["h2d_step_ratio"]
    assert rows(perf_page.torch_section(torch))["H2D decode step B=64, ferry / per-tensor copies"].endswith("| - | - |")


def test_carry_keeps_the_targets_of_a_replaced_run_file_in_either_layout(tmp_path):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"commit": "a", "targets": {"x_us": {"max": 1}}, "anchors": {"cases": "y"}}))
    dumped, compact = tmp_path / "dumped.json", tmp_path / "compact.json"
    dumped.write_text(json.dumps({"device": "d", "commit": "b", "cases": {}}, indent=2) + "\n")
    compact.write_text('{\n  "commit": "b",\n  "cases": {"c": {"x_us": 2.000}}\n}\n')
    for new in (dumped, compact):
        r = subprocess.run([sys.executable, str(REPORTS / "run_files.py"), "carry", str(old), str(new)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        d = json.loads(new.read_text())
        assert d["targets"] == {"x_us": {"max": 1}} and d["anchors"] == {"cases": "y"} and d["commit"] == "b"
    assert list(json.loads(dumped.read_text())) == ["device", "commit", "targets", "anchors", "cases"]
    assert '"x_us": 2.000' in compact.read_text(), "a file not in json.dump's layout keeps its own"


def test_the_reduce_section_names_the_rounds_and_steps_its_command_ran():
    d = {"device": "GPU", "commit": "abc1234", "date": "2026-12-07T00:00:00Z",
         "command": "python3 bench/torch/reduce_bench.py --out r.json --reps 7 --steps 3"}
    assert "graph replay, 7 rounds of 3 back-to-back steps" in perf_page.reduce_section(d)
    d["command"] = "python3 bench/torch/reduce_bench.py --out r.json"  # the bench's defaults
    assert "graph replay, 20 rounds of 20 back-to-back steps" in perf_page.reduce_section(d)
