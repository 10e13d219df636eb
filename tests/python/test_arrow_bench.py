# SPDX-License-Identifier: Apache-2.0
# bench/torch/arrow_bench.py (the Arrow sink's write rate against its medium, issue 41) on the host backend, tiny
# shapes: every written row read back with pyarrow and equal to what was captured, the JSON's fields present.
import json
import os
import sys
from pathlib import Path

import pytest
from ranks_support import run_script

pytest.importorskip("pyarrow")
pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


def test_arrow_benchmark_smoke(tmp_path):
    out = tmp_path / "arrow.json"
    import ferry
    env = dict(os.environ, FERRY_PYTHON_BACKEND="host")
    pkg = os.path.dirname(os.path.dirname(ferry.__file__))
    env["PYTHONPATH"] = os.pathsep.join([pkg, str(ROOT / "bench" / "torch"), env.get("PYTHONPATH", "")])
    r = run_script([sys.executable, str(ROOT / "bench/torch/arrow_bench.py"), "--device", "cpu", "--tiny",
                    "--dir", str(tmp_path / "medium"), "--out", str(out)], timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    a = json.loads(out.read_text())["arrow"]
    assert a["rows_bad"] == 0 and a["rows_checked"] > 0, a
    assert a["sink_write_gbps"] > 0 and a["disk_write_gbps"] > 0 and a["bytes_written"] > 0, a
    assert not (tmp_path / "medium" / "ds").exists(), "the bench removes what it wrote"


def test_arrow_writer_ab_smoke(tmp_path, monkeypatch, capsys):
    """bench/torch/arrow_writer_ab.py in this process, tiny: the medium and every tuning run each round, the tunings
    in rotating order, each run's writer made with its own tuning, and every run's directory is removed."""
    monkeypatch.setenv("FERRY_PYTHON_BACKEND", "host")
    monkeypatch.syspath_prepend(str(ROOT / "bench" / "torch"))
    import arrow_writer_ab as ab
    import ferry

    made = []
    fw = ferry._ferry.FileWriter

    def recorded(**kw):
        made.append(kw)
        return fw(**kw)

    monkeypatch.setattr(ferry._ferry, "FileWriter", recorded)
    out = tmp_path / "ab.json"
    assert ab.main(["--device", "cpu", "--dir", str(tmp_path / "m"), "--gib", "0.004", "--shard-mib", "1",
                    "--rounds", "2", "--hooks", "2", "--width", "64", "--context", "16", "--contexts", "4",
                    "--variants", "2x16x6", "1x1x4", "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert len(d["rates_gbps"]["2x16x6"]) == 2 and len(d["rates_gbps"]["1x1x4"]) == 2, d
    assert all(v > 0 for v in d["median_gbps"].values()) and len(d["medium_gbps"]) == 2, d
    order = [ln.split()[2].rstrip(":") for ln in capsys.readouterr().out.splitlines() if ln.startswith("round")]
    assert order == ["medium", "2x16x6", "1x1x4", "medium", "1x1x4", "2x16x6"], order
    one = {"io_threads": 1, "write_bytes": 1 << 20, "write_buffers": 4}
    assert made[1:] == [d["tunings"][v] for v in ("2x16x6", "1x1x4", "1x1x4", "2x16x6")] and made[2] == one, made
    assert not list((tmp_path / "m").glob("ab-*"))
