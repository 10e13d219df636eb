# SPDX-License-Identifier: Apache-2.0
# bench/torch/arrow_bench.py (the Arrow sink's write rate against its medium, issue 41) on the host backend, tiny
# shapes: every written row read back with pyarrow and equal to what was captured, the JSON's fields present.
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


def test_arrow_benchmark_smoke(tmp_path):
    out = tmp_path / "arrow.json"
    import ferry
    env = dict(os.environ, FERRY_PYTHON_BACKEND="host")
    pkg = os.path.dirname(os.path.dirname(ferry.__file__))
    env["PYTHONPATH"] = os.pathsep.join([pkg, str(ROOT / "bench" / "torch"), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, str(ROOT / "bench/torch/arrow_bench.py"), "--device", "cpu", "--tiny",
                        "--dir", str(tmp_path / "medium"), "--out", str(out)], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    a = json.loads(out.read_text())["arrow"]
    assert a["rows_bad"] == 0 and a["rows_checked"] > 0, a
    assert a["sink_write_gbps"] > 0 and a["disk_write_gbps"] > 0 and a["bytes_written"] > 0, a
    assert not (tmp_path / "medium" / "ds").exists(), "the bench removes what it wrote"
