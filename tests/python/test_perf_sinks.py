# SPDX-License-Identifier: Apache-2.0
# The native-sink benchmark's reports (issue 28): `run_files.py sinks` merges ferry_bench_sinks' JSON and the eager
# B=1 block into docs/perf/h200/sinks.json (each input replaces its own blocks only; its targets stay),
# `perf_page.py show sinks` renders the table of docs/perf/README.md, whose block must be what the committed
# sinks.json (or a file of its targets alone) gives. Where the build tree beside the ferry package has ferry_bench_sinks, its --quick output (host
# backend) goes through the same merge: the binary's keys are the ones the report reads.
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN_FILES = ROOT / "bench/device/reports/run_files.py"
PAGE = ROOT / "bench/device/reports/perf_page.py"
COMMITTED = ROOT / "docs/perf/h200/sinks.json"
TARGETS = {"targets": json.loads(COMMITTED.read_text())["targets"]}  # what a merge into the committed file keeps

RAW = {
    "backend": "cuda", "device": "NVIDIA H200", "commit": "c0ffee1", "date": "2026-12-03T10:00:00Z",
    "command": "build-h200/bench/sink/ferry_bench_sinks",
    "forward": {"hooks": 341, "tokens": 16, "step_bytes": 27115648, "layers": 28},
    "safetensors": {"disk_write_gbps": 1.40, "sink_write_gbps": 1.33, "forward_overhead_pct": 0.9,
                    "null_consumer_overhead_pct": 0.7, "entries_checked": 150000, "entries_bad": 0,
                    "block": {"forwards_missing": 0, "forwards_torn": 0, "stalls": 12},
                    "drop": {"forwards_captured": 320, "dropped_forwards": 250, "forwards_torn": 0}},
    "shm": {"reader_gbps": 52.5, "forward_overhead_pct": 1.1, "in_process_overhead_pct": 0.8,
            "entries_checked": 110000, "entries_bad": 0, "check": "a sample of every entry",
            "throughput": {"entry_bytes": 64 << 20, "memcpy_d2h_gbps": 55.1}},
}
EAGER = {
    "device": "NVIDIA H200", "commit": "beef002", "date": "2026-12-04T10:00:00Z", "command": "python3 eager.py",
    "eager_b1": {"rounds": 12, "no_capture_ms": 4.0,
                 "hidden_states": {"ferry_ms": 4.03, "deferred_ms": 4.02, "torch_copy_ms": 4.1},
                 "vllm_full": {"ferry_ms": 5.3, "deferred_ms": 5.2, "torch_copy_ms": 5.2}},
}


def tables(cmd, *args):
    """`sinks ...`: run_files.py's merge; `sinks-tables JSON`: perf_page.py's section of JSON."""
    argv = [RUN_FILES, cmd, *args] if cmd == "sinks" else [PAGE, "show", "sinks", *args]
    return subprocess.run([sys.executable, *map(str, argv)], capture_output=True, text=True, timeout=120, cwd=ROOT)


def targeted(tmp_path):
    """A sinks.json holding the committed targets alone, as a new run's merge finds it."""
    return write(tmp_path / "sinks.json", TARGETS)


def write(path, obj):
    path.write_text(json.dumps(obj))
    return path


def test_merge_takes_each_block_from_its_input_and_keeps_the_issue_schema(tmp_path):
    out = tmp_path / "sinks.json"
    r = tables("sinks", write(tmp_path / "raw.json", RAW), write(tmp_path / "eager.json", EAGER), out)
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    assert list(d)[:7] == ["device", "commit", "date", "command", "safetensors", "shm", "eager_b1"]
    assert (d["device"], d["commit"], d["command"]) == ("NVIDIA H200", "c0ffee1", RAW["command"])
    assert d["safetensors"] == RAW["safetensors"] and d["shm"] == RAW["shm"]
    assert d["eager_b1"]["vllm_full"] == EAGER["eager_b1"]["vllm_full"]
    assert d["eager_b1"]["source"]["commit"] == "beef002", "a block of another run says where it comes from"
    assert "missing" not in r.stdout


def test_merge_replaces_only_the_blocks_it_is_given(tmp_path):
    out = tmp_path / "sinks.json"
    assert tables("sinks", write(tmp_path / "raw.json", RAW), "-", out).returncode == 0
    assert "eager_b1" not in json.loads(out.read_text())
    eager2 = dict(EAGER, eager_b1=dict(EAGER["eager_b1"], rounds=20))
    r = tables("sinks", tmp_path / "absent.json", write(tmp_path / "eager.json", eager2), out)
    assert r.returncode == 0 and "skipped" in r.stdout
    d = json.loads(out.read_text())
    assert d["safetensors"] == RAW["safetensors"] and d["commit"] == "c0ffee1"
    assert d["eager_b1"]["rounds"] == 20
    raw2 = dict(RAW, commit="c0ffee2", shm=dict(RAW["shm"], reader_gbps=53.0))
    assert tables("sinks", write(tmp_path / "raw2.json", raw2), out).returncode == 0
    d = json.loads(out.read_text())
    assert d["shm"]["reader_gbps"] == 53.0 and d["eager_b1"]["rounds"] == 20 and d["commit"] == "c0ffee2"


def test_merge_names_missing_keys_and_refuses_an_unknown_file(tmp_path):
    out = tmp_path / "sinks.json"
    partial = dict(RAW, shm={"reader_gbps": 50.0})
    r = tables("sinks", write(tmp_path / "raw.json", partial), out)
    assert r.returncode == 0 and "forward_overhead_pct" in r.stdout and "missing" in r.stdout
    r = tables("sinks", write(tmp_path / "other.json", {"d2h": 1}), out)
    assert r.returncode != 0 and "neither" in r.stderr


def test_table_without_a_run_says_not_measured_yet(tmp_path):
    r = tables("sinks-tables", targeted(tmp_path))
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if line.startswith("| ") and "benchmark" not in line]
    assert len(rows) == 8
    assert all(row.endswith("| not measured yet |") for row in rows)


def test_table_shows_the_figures_and_whether_each_target_is_met(tmp_path):
    out = targeted(tmp_path)
    assert tables("sinks", write(tmp_path / "raw.json", RAW), write(tmp_path / "eager.json", EAGER), out).returncode == 0
    text = tables("sinks-tables", out).stdout
    assert "commit c0ffee1" in text
    row = lambda key: next(line for line in text.splitlines() if key in line)
    assert "**1.330 GB/s**" in row("sustained write") and row("sustained write").endswith("| yes |")  # 95% of 1.40
    assert "**52.50 GB/s**" in row("receives 64 MiB") and row("receives 64 MiB").endswith("| yes |")
    assert "gap 0.30 pp" in row("reader process attached") and row("reader process attached").endswith("| yes |")
    assert row("hidden-states").endswith("| yes |")
    assert row("vllm-full (341").endswith("| **no** |"), "ferry 5.3 ms above the torch copies' 5.2 ms"
    assert "(best mode: deferred)" in row("hidden-states")
    # hidden-states: the best of ferry's eager modes decides (+1.25% immediate and deferred, +0.5% the Collector)
    slow = dict(EAGER, eager_b1=dict(EAGER["eager_b1"], hidden_states={"ferry_ms": 4.05, "deferred_ms": 4.05,
                                                                       "torch_copy_ms": 4.1}))
    assert tables("sinks", tmp_path / "absent.json", write(tmp_path / "slow.json", slow), out).returncode == 0
    assert row2(tables("sinks-tables", out).stdout, "hidden-states").endswith("| **no** |")
    slow["eager_b1"]["hidden_states"]["collect_ms"] = 4.02
    assert tables("sinks", tmp_path / "absent.json", write(tmp_path / "slow.json", slow), out).returncode == 0
    r = row2(tables("sinks-tables", out).stdout, "hidden-states")
    assert "(best mode: collect)" in r and "Collector 4.020 ms (+0.50%" in r and r.endswith("| yes |")


def test_an_eager_target_is_met_only_where_its_ci95_decides_it(tmp_path):
    # the bench's 95% intervals: a median inside the target with an interval across its bound is undecided, not met
    out = targeted(tmp_path)
    hs = {"ferry_ms": 4.1, "deferred_ms": 4.05, "torch_copy_ms": 4.1, "collect_ms": 4.02,
          "overhead_pct": {"ferry": 2.5, "deferred": 1.0, "collect": 0.06, "torch": 2.9},
          "ci95_pct": {"ferry": [1.0, 3.3], "deferred": [0.1, 2.2], "collect": [-1.7, 0.85], "torch": [2.0, 3.7]},
          "comparisons_pp": {"deferred_minus_ferry_pp": {"median": -1.3, "ci95": [-2.9, -0.2]}}}
    vf = {"ferry_ms": 5.6, "deferred_ms": 5.5, "torch_copy_ms": 5.8,
          "overhead_pct": {"ferry": 11.5, "deferred": 8.6, "torch": 15.8},
          "comparisons_pp": {"ferry_minus_torch_pp": {"median": -5.1, "ci95": [-7.1, -2.9]},
                             "deferred_minus_ferry_pp": {"median": -2.5, "ci95": [-4.2, -0.8]}}}

    def verdicts(hs, vf):
        run = dict(EAGER, eager_b1=dict(EAGER["eager_b1"], hidden_states=hs, vllm_full=vf))
        assert tables("sinks", tmp_path / "absent.json", write(tmp_path / "e.json", run), out).returncode == 0
        text = tables("sinks-tables", out).stdout
        return row2(text, "hidden-states").rsplit("|", 2)[1].strip(), row2(text, "vllm-full (341").rsplit("|", 2)[1].strip()

    assert verdicts(hs, vf) == ("yes", "yes")
    crossing = dict(hs, comparisons_pp={"deferred_minus_ferry_pp": {"median": -1.3, "ci95": [-2.9, 0.5]}})
    assert verdicts(crossing, vf)[0].startswith("**undecided**"), "deferred - immediate's interval crosses 0"
    wide = dict(hs, ci95_pct=dict(hs["ci95_pct"], collect=[-1.7, 1.2]))
    assert verdicts(wide, vf)[0].startswith("**undecided**"), "the Collector's interval crosses +1%"
    above = dict(vf, comparisons_pp=dict(vf["comparisons_pp"], ferry_minus_torch_pp={"median": 0.4, "ci95": [-1, 2]}))
    assert verdicts(hs, above)[1] == "**no**", "the median above the torch copies fails, whatever the interval"


def test_the_pooled_eager_rows_come_from_eager_pools_report_and_are_decided_by_their_ci95(tmp_path):
    # eager_pool.py report --json: every kept run's rounds pooled; the rows decide as the published run's do
    out = targeted(tmp_path)

    def fig(median, lo, hi, rounds=600, runs=3):
        return {"median": median, "ci95": [lo, hi], "rounds": rounds, "runs": runs}

    hs = {"ferry": fig(1.9, 1.5, 2.5), "deferred": fig(1.1, 0.8, 1.5), "collect": fig(0.47, 0.11, 0.92),
          "torch": fig(3.0, 2.6, 3.4, 400, 2), "deferred_minus_ferry_pp": fig(-0.9, -1.6, 0.05),
          "ferry_minus_torch_pp": fig(-0.9, -1.6, -0.5, 400, 2)}
    vf = {"ferry": fig(11.5, 10.8, 13.0, 164, 1), "deferred_minus_ferry_pp": fig(-2.5, -4.2, -0.8, 164, 1),
          "ferry_minus_torch_pp": fig(-5.1, -7.1, -2.9, 164, 1)}

    def report(hs, vf):
        runs = [{"commit": "c0ffee1", "date": "2026-12-03T06:00:00Z"}]
        return write(tmp_path / "pool.json", {"hidden-states": {"runs": runs, "pooled": {"rounds": 600, "figures": hs}},
                                              "vllm-full": {"runs": runs, "pooled": {"rounds": 164, "figures": vf}}})

    def verdicts(hs, vf):
        r = tables("sinks", report(hs, vf), out)
        assert r.returncode == 0 and "eager_pooled" in r.stdout, r.stdout + r.stderr
        text = tables("sinks-tables", out).stdout
        rows = [line for line in text.splitlines() if "every kept run pooled" in line]
        assert len(rows) == 2 and "(3 runs, 600 rounds" in rows[0] and "torch copies +3.00% [ci95 +2.60..+3.40] " \
            "(400 rounds of 2 runs)" in rows[0], rows
        return tuple(x.rsplit("|", 2)[1].strip() for x in rows)

    assert verdicts(hs, vf)[0].startswith("**undecided**"), "deferred - immediate's pooled interval crosses 0"
    decided = dict(hs, deferred_minus_ferry_pp=fig(-0.9, -1.5, -0.2))
    assert verdicts(decided, vf) == ("yes", "yes")
    above = dict(decided, collect=fig(1.2, 0.5, 1.9), deferred=fig(1.1, 0.8, 1.5), ferry=fig(1.9, 1.5, 2.5))
    assert verdicts(above, vf)[0] == "**no**", "every mode's pooled median above +1%"
    assert json.loads(out.read_text())["eager_pooled"]["hidden_states"]["collect"]["median"] == 1.2


def row2(text, key):
    return next(line for line in text.splitlines() if key in line)


def test_the_readme_block_is_what_the_committed_sinks_json_gives():
    r = tables("sinks-tables", "docs/perf/h200/sinks.json")
    assert r.returncode == 0, r.stderr
    assert f"<!-- perf:sinks -->\n{r.stdout}<!-- /perf -->" in (ROOT / "docs/perf/README.md").read_text(), \
        "docs/perf/README.md's sinks block is stale: run perf_page.py --write docs/perf/README.md"


def test_the_benchmark_binarys_json_has_the_keys_the_report_reads(tmp_path):
    ferry = pytest.importorskip("ferry")  # the build tree is the one beside the ferry package
    build = Path(ferry.__file__).resolve().parents[3]  # <build>/src/python/ferry/__init__.py
    binary = build / "bench/sink/ferry_bench_sinks_host"
    if not binary.exists():
        binary = build / "bench/sink/ferry_bench_sinks"
    if not binary.exists():
        pytest.skip(f"no ferry_bench_sinks in {build}")
    r = subprocess.run([str(binary), "--quick", "--dir", str(tmp_path / "run")], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    raw = write(tmp_path / "raw.json", json.loads(r.stdout))
    out = targeted(tmp_path)
    m = tables("sinks", raw, out)
    assert m.returncode == 0 and "missing" not in m.stdout, m.stdout
    d = json.loads(out.read_text())
    assert d["safetensors"]["entries_checked"] > 0 and d["safetensors"]["entries_bad"] == 0
    assert d["shm"]["entries_checked"] > 0 and d["shm"]["entries_bad"] == 0
    assert "not measured yet" not in tables("sinks-tables", out).stdout.split("eager B=1")[0]
