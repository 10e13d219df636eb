# SPDX-License-Identifier: Apache-2.0
# A smoke run of bench/torch/tp_bench.py (issue 42: tensor-parallel capture against the in-forward all-gather) on
# the CPU: 2 gloo ranks as processes (the rendezvous store held here, as torchrun's agent holds it), ferry's host
# backend, the tiny model, eager steps. Every tensor ferry.tp.open assembles from the ranks' runs must match the
# TP=1 model's, and the JSON must have the keys docs/perf/h200/tp.json takes.
import json
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import ferry  # noqa: E402
from ranks_support import run_ranks  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
KEYS = {"device", "commit", "date", "command", "tp", "no_capture_us", "ferry_us", "allgather_us", "tensors_checked",
        "tensors_bad", "overhead_pct", "spread_us"}


def test_tp_bench_smoke_two_gloo_ranks_check_every_assembled_tensor(tmp_path):
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo")
    world, out = 2, tmp_path / "tp.json"
    path = os.pathsep.join(p for p in (os.path.dirname(os.path.dirname(ferry.__file__)), str(ROOT / "bench/torch"),
                                       os.environ.get("PYTHONPATH")) if p)
    cmd = [sys.executable, str(ROOT / "bench/torch/tp_bench.py"), "--device", "cpu", "--tiny", "--reps", "2",
           "--out", str(out), "--dir", str(tmp_path / "runs"), "--timeout", "60"]
    # the ranks are clients of the test's store, as under torchrun (TORCHELASTIC_USE_AGENT_STORE)
    run_ranks(torch, world, lambda r: cmd, cwd=ROOT, ok=out.exists,
              env=lambda r: dict(LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(world), TORCHELASTIC_USE_AGENT_STORE="True",
                                 TORCHELASTIC_RESTART_COUNT="0", PYTHONPATH=path, PYTHONUNBUFFERED="1"))
    d = json.loads(out.read_text())
    assert KEYS <= set(d), sorted(KEYS - set(d))
    assert d["tp"] == world
    assert d["tensors_checked"] == 3 * 2 and d["tensors_bad"] == 0, d  # hidden, z and act of each of 2 layers
    assert d["max_rel_err"] <= d["tolerance"] == 1e-4 and d["max_rel_err_end_to_end"] <= 1e-4
    assert all(d[k] > 0 for k in ("no_capture_us", "ferry_us", "allgather_us"))
    assert set(d["overhead_pct"]) == {"ferry", "allgather"}
    for k in ("none", "ferry", "allgather"):
        lo, hi = d["spread_us"][k]
        assert 0 < lo <= hi
        assert len(d["per_rank_us"][k]) == world and all(v > 0 for v in d["per_rank_us"][k])
    assert d["forwards_written"] == 2 + 1 + 1  # 2 timed rounds, the warm-up round, the checked step
    # each rank's run records its slices; assembled, the forwards read back whole
    runs = [str(tmp_path / "runs" / f"rank{r}") for r in range(world)]
    assert ferry.shards.open(runs[1]).layout["layers.0.attn.z"] == ferry.tp.shard(world, 1, 0, 32)
    run = ferry.tp.open(runs)
    assert run.ranks == [0, 1] and run.complete and run.tags == [0, 1, 2, 3]
    f = run.forward(3)
    assert f["layers.1.attn.z"].shape == (64, 64) and f["layers.1.mlp.act"].shape == (64, 128)
    assert f["layers.1.hidden"].shape == (64, 64)
