# SPDX-License-Identifier: Apache-2.0
# The selective-capture benchmark's reports (issue 27): `run_files.py select` merges ferry_bench_select's JSON and
# bench/torch/qwen3_cb.py's into docs/perf/h200/select.json (each input replaces its own blocks; the replaced d2h
# blocks move to previous_run; its targets stay), `perf_page.py show select` renders the section of
# docs/perf/README.md, whose block must be what the committed select.json gives. Stdlib and the scripts only: no
# ferry, no GPU.
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN_FILES = ROOT / "bench/device/reports/run_files.py"
PAGE = ROOT / "bench/device/reports/perf_page.py"
COMMITTED = ROOT / "docs/perf/h200/select.json"

# ferry_bench_select's stdout of the committed run (4c29396), and the keys of qwen3_cb.py's JSON the merge reads
RAW = {
    "host_backend": False, "publish_every": 128,
    "d2h_t256_select16": {"select_gather_us": 3074.13, "select_us": 4012.42, "full_gather_us": 9313.55,
                          "none_us": 3016.81, "entries_checked": 327360, "entries_bad": 0},
    "d2h_t16_full": {"full_gather_us": 1737.02, "none_us": 1704.52, "entries_checked": 109120, "entries_bad": 0},
    "prefill_last_token_hidden_states": {"select_gather_us": 25238.69, "none_us": 25228.47, "entries_checked": 8960,
                                         "entries_bad": 0},
    "prefill_last_token_vllm_full": {"select_gather_us": 25282.12, "none_us": 25227.32, "entries_checked": 109120,
                                     "entries_bad": 0},
}
QWEN3 = {
    "device": "NVIDIA H200", "commit": "4c29396", "date": "2026-12-02T13:01:35Z",
    "command": "python3 bench/torch/qwen3_cb.py --out /root/out/qwen3_cb.json",
    "qwen3_cb": {
        "no_capture_ms": 951.0590515136719, "hidden_states_ms": 951.2569274902344, "vllm_full_ms": 954.2269897460938,
        "cpu_select_ms": 954.9448547363281, "torch_select_ms": 1339.4214477539062, "rows_checked": 491508,
        "rows_bad": 0, "misattributed": 0, "select_preset": "vllm-full",
        "per_preset": {
            "hidden_states": {"rows_ms": 951.2569274902344, "cpu_select_ms": 950.5457763671875,
                              "torch_select_ms": 983.3580932617188},
            "vllm_full": {"rows_ms": 954.2269897460938, "cpu_select_ms": 954.9448547363281,
                          "torch_select_ms": 1339.4214477539062}},
        "spreads": {}, "batch": 64, "tokens": 64, "rounds": 10},
    "check": {}, "config": {}, "failures": [],
}


def tables(cmd, *args, **env):
    """`select ...`: run_files.py's merge; `select-tables JSON`: perf_page.py's section of JSON."""
    clean = {k: v for k, v in os.environ.items()
             if k not in ("FERRY_DEVICE", "FERRY_COMMIT", "FERRY_DATE", "FERRY_COMMAND")}  # a device run exports some
    argv = [RUN_FILES, cmd, *args] if cmd == "select" else [PAGE, "show", "select", *args]
    return subprocess.run([sys.executable, *map(str, argv)], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**clean, **env})


def write(path, obj):
    path.write_text(json.dumps(obj))
    return path


def test_merging_the_committed_runs_inputs_gives_the_committed_select_json(tmp_path):
    out = tmp_path / "select.json"
    out.write_text(COMMITTED.read_text())
    r = tables("select", write(tmp_path / "select_raw.json", RAW), write(tmp_path / "qwen3_cb.json", QWEN3), out,
               FERRY_COMMIT="4c29396")
    assert r.returncode == 0, r.stderr
    assert out.read_text() == COMMITTED.read_text(), "the merge no longer gives select.json's schema and figures"


def test_merge_into_nothing_derives_the_blocks_and_overheads(tmp_path):
    raw = {"d2h_t256_select16": {"select_gather_us": 1020.0, "select_us": 1330.0, "full_gather_us": 3000.0,
                                 "none_us": 1000.0, "entries_checked": 10, "entries_bad": 0},
           "d2h_t16_full": {"full_gather_us": 505.0, "none_us": 500.0, "entries_checked": 5, "entries_bad": 1},
           "prefill_last_token_hidden_states": {"select_gather_us": 2002.0, "none_us": 2000.0, "entries_checked": 3,
                                                "entries_bad": 0},
           "prefill_last_token_vllm_full": {"select_gather_us": 2020.0, "none_us": 2002.0, "entries_checked": 4,
                                            "entries_bad": 0}}
    out = tmp_path / "select.json"
    r = tables("select", write(tmp_path / "raw.json", raw), write(tmp_path / "q.json", QWEN3), out,
               FERRY_DEVICE="NVIDIA H200", FERRY_COMMIT="c0ffee1", FERRY_DATE="2026-12-09T10:00Z",
               FERRY_COMMAND="ferry_bench_select")
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    assert list(d) == ["device", "commit", "date", "command", "d2h_t256_select16", "d2h_t16_full",
                       "prefill_last_token", "qwen3_cb"]
    assert (d["commit"], d["date"], d["command"]) == ("c0ffee1", "2026-12-09T10:00Z", "ferry_bench_select")
    t = d["d2h_t256_select16"]
    assert list(t) == ["no_capture_us", "ferry_us", "ferry_gather_us", "full_capture_us", "entries_checked",
                       "entries_bad", "overhead_pct"]
    assert t["overhead_pct"] == {"ferry": 33.0, "ferry_gather": 2.0, "full_capture": 200.0}
    assert d["d2h_t16_full"] == {"no_capture_us": 500.0, "ferry_gather_us": 505.0, "entries_checked": 5,
                                 "entries_bad": 1, "overhead_pct": {"ferry_gather": 1.0}}
    p = d["prefill_last_token"]
    assert (p["no_capture_us"], p["entries_checked"]) == (2001.0, 7)
    assert p["no_capture_us_per_preset"] == {"hidden_states": 2000.0, "vllm_full": 2002.0}
    assert p["overhead_pct"] == {"hidden_states": 0.1, "vllm_full": 0.9}, "each preset against its own no-capture"
    q = d["qwen3_cb"]
    assert "spreads" not in q and "batch" not in q and q["per_preset"] == QWEN3["qwen3_cb"]["per_preset"]
    assert q["source"] == {"file": "q.json", "commit": "4c29396", "date": QWEN3["date"], "command": QWEN3["command"]}
    assert "previous_run" not in d


def test_a_new_run_moves_the_replaced_blocks_to_previous_run_and_keeps_the_rest(tmp_path):
    out = tmp_path / "select.json"
    out.write_text(COMMITTED.read_text())
    before = json.loads(COMMITTED.read_text())
    raw = dict(RAW, d2h_t16_full=dict(RAW["d2h_t16_full"], full_gather_us=1730.0))
    r = tables("select", write(tmp_path / "raw.json", raw), "-", out, FERRY_COMMIT="beef002",
               FERRY_DATE="2026-12-09T10:00Z")
    assert r.returncode == 0 and "-: skipped" in r.stdout, r.stdout + r.stderr
    d = json.loads(out.read_text())
    assert (d["commit"], d["date"], d["command"]) == ("beef002", "2026-12-09T10:00Z", before["command"])
    prev = d["previous_run"]
    assert (prev["commit"], prev["date"]) == (before["commit"], before["date"])
    assert all(prev[k] == before[k] for k in ("d2h_t256_select16", "d2h_t16_full", "prefill_last_token"))
    assert d["d2h_t16_full"]["overhead_pct"]["ferry_gather"] == round((1730.0 / 1704.52 - 1) * 100, 2)
    assert all(d[k] == before[k] for k in ("method", "k1024", "qwen3_cb", "device"))
    # the same run merged again leaves previous_run alone
    assert tables("select", write(tmp_path / "raw.json", raw), out, FERRY_COMMIT="beef002").returncode == 0
    assert json.loads(out.read_text())["previous_run"] == prev


def test_merge_skips_absent_inputs_and_refuses_an_unknown_file(tmp_path):
    out = tmp_path / "select.json"
    r = tables("select", "-", tmp_path / "absent.json", write(tmp_path / "q.json", QWEN3), out)
    assert r.returncode == 0 and r.stdout.count("skipped") == 2, r.stdout
    d = json.loads(out.read_text())
    assert set(d) == {"device", "commit", "date", "command", "qwen3_cb"}, "a qwen3_cb file alone names its run"
    r = tables("select", write(tmp_path / "other.json", {"d2h": 1}), out)
    assert r.returncode != 0 and "neither" in r.stderr
    r = tables("select", COMMITTED, out)
    assert r.returncode != 0, "select.json itself is not ferry_bench_select's output"


def rows(text):
    return {line.split(" | ")[0][2:]: line for line in text.splitlines() if line.startswith("| ")}


def test_section_shows_the_figures_and_flips_met_when_a_target_is_missed(tmp_path):
    text = tables("select-tables", COMMITTED).stdout
    assert text.startswith("## Selective capture (issue 27), H200, commit 4c29396, 2026-12-02\n")
    assert "| scenario | target | K = 128 | K = 1024 (4dfbda3) | met |" in text
    prose = " ".join(text.split())
    assert "(0 bad of 554,560 entries)" in prose and "491,508 rows checked" in prose and "(+3.40% / +40.8%)" in prose
    assert "3.0 ms at 256 tokens, 1.7 ms at 16, 25.2 ms at 8192" in prose and "no capture 951.06 ms" in prose
    r = rows(text)
    assert r["16 tokens, every row captured (gather)"] == "| 16 tokens, every row captured (gather) | <= +2% | " \
                                                         "**+1.91%** | +1.83% | yes |"
    assert [line.endswith("| yes |") for line in r.values() if "<= +" in line] == [True] * 5
    d = json.loads(COMMITTED.read_text())
    d["d2h_t256_select16"]["overhead_pct"]["ferry_gather"] = 2.6
    d["prefill_last_token"]["overhead_pct"]["vllm_full"] = 1.01
    d["qwen3_cb"]["vllm_full_ms"] = d["qwen3_cb"]["no_capture_ms"] * 1.031
    r = rows(tables("select-tables", write(tmp_path / "s.json", d)).stdout)
    flipped = {k for k, line in r.items() if line.endswith("| **no** |")}
    assert len(flipped) == 3 and "same, vllm-full" in flipped
    assert "16 tokens, every row captured (gather)" not in flipped
    assert "**+2.60%**" in r[next(k for k in flipped if k.startswith("256 tokens"))]
    assert "**+0.02% / +3.10%**" in r[next(k for k in flipped if k.startswith("Qwen3"))]


def test_section_without_a_run_says_not_measured_yet(tmp_path):
    # the run file's targets alone: every targeted row says so, with its bound
    targets = write(tmp_path / "targets.json", {"targets": json.loads(COMMITTED.read_text())["targets"]})
    r = tables("select-tables", targets)
    assert r.returncode == 0, r.stderr
    targeted = [line for line in rows(r.stdout).values() if "<= +" in line]
    assert len(targeted) == 5 and all(line.endswith("| not measured yet |") for line in targeted)


def test_the_readme_block_is_what_the_committed_select_json_gives():
    r = tables("select-tables", "docs/perf/h200/select.json")
    assert r.returncode == 0, r.stderr
    assert f"<!-- perf:select -->\n{r.stdout}<!-- /perf -->" in (ROOT / "docs/perf/README.md").read_text(), \
        "docs/perf/README.md's selective-capture section is stale: run " \
        "python3 bench/device/reports/perf_page.py --write docs/perf/README.md"
