#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""ferry.arrow's shards through one _ferry.FileWriter a run (shared, ferry.arrow's way) against one
writer a shard (per-shard: SequentialFile without a writer, as before), in alternating rounds on the same forwards.

Each round runs ferry.arrow.ArrowSink (fsync, shards of --shard-mib) over --gib of Arrow data under --dir, once per
contestant (the order alternates), and takes its rate as arrow_bench.py does: bytes written over the time from the
first capture until close() returned. Prints every round and the medians; --out writes them as JSON.

  python bench/torch/arrow_writer_ab.py --dir /path/on/the/disk --gib 4 --rounds 3 --out ab.json   # GPU
  python bench/torch/arrow_writer_ab.py --device cpu --dir /tmp/ab --gib 1 --shard-mib 128          # host backend
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys

import torch

import ferry
from arrow_bench import add_shape_args, forward_tensors, forwards_for, sink_run


def run(a, fwds, n_fwd: int, directory: str, per_shard: bool) -> tuple[float, dict]:
    """One sink run (arrow_bench.sink_run): (GB/s, stats()["seconds"]); per_shard: every shard's SequentialFile
    without the run's writer."""
    seq = ferry._ferry.SequentialFile
    if per_shard:
        ferry._ferry.SequentialFile = lambda p, durable=False, writer=None: seq(p, durable=durable)
    try:
        st, dt, _ = sink_run(a, fwds, n_fwd, directory)
        assert st["forwards_written"] == n_fwd and st["first_error"] is None, st
        return st["bytes_written"] / dt / 1e9, st["seconds"]
    finally:
        ferry._ferry.SequentialFile = seq
        shutil.rmtree(directory, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, help="a directory on the medium under test (its runs are removed)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=3)
    add_shape_args(ap)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    fwds = [forward_tensors(a, dev, k) for k in range(2)]
    n_fwd = forwards_for(a, int(a.gib * (1 << 30)))
    rates: dict[str, list[float]] = {"shared": [], "per_shard": []}
    for r in range(a.rounds):
        for name in (("shared", "per_shard") if r % 2 == 0 else ("per_shard", "shared")):
            g, sec = run(a, fwds, n_fwd, os.path.join(a.dir, f"ab-{name}"), name == "per_shard")
            rates[name].append(g)
            print(f"round {r} {name}: {g:.3f} GB/s; " + ", ".join(f"{k} {v:.2f}" for k, v in sec.items()), flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    for k, v in rates.items():
        print(f"{k}: median {med[k]:.3f} GB/s, min {min(v):.3f}, max {max(v):.3f} over {len(v)} rounds")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"command": " ".join([sys.executable] + sys.argv), "rates_gbps": rates, "median_gbps": med,
                       "gib": a.gib, "shard_mib": a.shard_mib, "device": a.device}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
