#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""ferry.arrow's writer tunings against each other and against the medium, in alternating rounds on the same forwards.

Each round measures the medium (arrow_bench's: --gib in 64 MiB O_DIRECT writes then fsync, as dd oflag=direct; buffered
where O_DIRECT is refused), then runs ferry.arrow.ArrowSink (fsync, shards of --shard-mib) over --gib of Arrow data
under --dir once per tuning of --variants (IOxMIBxBUFS: io_threads x write MiB x write_buffers; the order rotates
each round), each rate taken as arrow_bench.py does: bytes written over the time from the first capture until close()
returned. Prints every round, then each tuning's median, spread and share of the medium's median; --out writes them
as JSON. The first tuning runs once untimed first (the channel's ring, the first files' extents).

  python bench/torch/arrow_writer_ab.py --dir /path/on/the/disk --gib 4 --rounds 3 --out ab.json   # GPU
  python bench/torch/arrow_writer_ab.py --device cpu --dir /tmp/ab --gib 0.05 --shard-mib 8 --rounds 1  # host
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys

import torch

from arrow_bench import add_shape_args, forward_tensors, forwards_for, sink_run, tuning_arg
from qwen3bench.timing import write_rate


def run(a, fwds, n_fwd: int, directory: str, tuning: dict) -> tuple[float, dict]:
    """One sink run (arrow_bench.sink_run) with `tuning`: (GB/s, stats()["seconds"])."""
    try:
        st, dt, _ = sink_run(a, fwds, n_fwd, directory, tuning)
        assert st["forwards_written"] == n_fwd and st["first_error"] is None, st
        return st["bytes_written"] / dt / 1e9, st["seconds"]
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, help="a directory on the medium under test (its runs are removed)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", nargs="+", default=["2x64x4", "2x16x6", "4x16x8", "4x64x6"],
                    help="tunings IOxMIBxBUFS (the first: ferry's default)")
    add_shape_args(ap)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    fwds = [forward_tensors(a, dev, k) for k in range(2)]
    n_fwd = forwards_for(a, int(a.gib * (1 << 30)))
    tunings = {v: tuning_arg(v) for v in a.variants}
    os.makedirs(a.dir, exist_ok=True)
    run(a, fwds, max(1, n_fwd // 4), os.path.join(a.dir, "ab-warm"), tunings[a.variants[0]])  # untimed
    rates: dict[str, list[float]] = {v: [] for v in a.variants}
    medium: list[float] = []
    probe = os.path.join(a.dir, "ab-probe")
    for r in range(a.rounds):
        direct = write_rate(probe, int(a.gib * (1 << 30)), direct=True)
        medium.append(direct or write_rate(probe, int(a.gib * (1 << 30))))
        shutil.rmtree(probe, ignore_errors=True)
        print(f"round {r} medium: {medium[-1]:.3f} GB/s ({'O_DIRECT' if direct else 'buffered'})", flush=True)
        k = r % len(a.variants)
        for v in a.variants[k:] + a.variants[:k]:
            g, sec = run(a, fwds, n_fwd, os.path.join(a.dir, f"ab-{v}"), tunings[v])
            rates[v].append(g)
            print(f"round {r} {v}: {g:.3f} GB/s; " + ", ".join(f"{x} {y:.2f}" for x, y in sec.items()), flush=True)
    med = {v: statistics.median(x) for v, x in rates.items()}
    disk = statistics.median(medium)
    print(f"medium: median {disk:.3f} GB/s, min {min(medium):.3f}, max {max(medium):.3f}")
    for v, x in rates.items():
        print(f"{v}: median {med[v]:.3f} GB/s, min {min(x):.3f}, max {max(x):.3f} over {len(x)} rounds "
              f"({med[v] / disk:.1%} of the medium)")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"command": " ".join([sys.executable] + sys.argv), "rates_gbps": rates, "median_gbps": med,
                       "medium_gbps": medium, "medium_median_gbps": disk, "tunings": tunings, "gib": a.gib,
                       "shard_mib": a.shard_mib, "device": a.device}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
