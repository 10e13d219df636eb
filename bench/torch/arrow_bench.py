#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The Arrow sink's write rate against its medium (issue 41: >= 90% of the disk's sequential rate, same run).

A channel with SAELens's schema (--hooks residual hooks of [--width] bf16 and token_ids) captures forwards of
--contexts contexts of --context tokens as fast as ferry.arrow.ArrowSink (policy block, shards of --shard-mib,
fsync per shard) takes them, until --gib of Arrow data is written under --dir. After one untimed warm-up run (two
shards: the channel's pinned ring, the writer's buffers and the first files' extents), --rounds rounds alternate
the medium and the sink, as METHOD.md asks: each round measures the medium (the same bytes written by one thread in
64 MiB writes then fsync, in the same directory, buffered and with O_DIRECT as dd oflag=direct; the sink writes with
O_DIRECT), then one sink run, whose rate is the bytes it wrote over the time from the first capture until close()
returned (every shard on the medium). The bound is the higher of the medium's two medians; the sink's rate is its
median, with the spread. Every row of every run's shards is read back with pyarrow and checked against the captured
tensors (BF16 widened to float32, exactly). The captures come from --device (cuda: the GPU channel; cpu: the host
backend, for the smoke test).

  python bench/torch/arrow_bench.py --dir /path/on/the/disk --out arrow.json          # GPU
  python bench/torch/arrow_bench.py --device cpu --tiny --dir /tmp/a --out /tmp/a.json  # smoke (host)

Output: {"device","commit","date","command","arrow":{"disk_write_gbps","sink_write_gbps","share","rows_checked",
"rows_bad","bytes_written","seconds","rounds","sink_gbps_rounds","disk_buffered_gbps_rounds","disk_direct_gbps_rounds",
"capture_loop_seconds","sink_seconds"}} (seconds, capture_loop_seconds and sink_seconds: the median round's)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time

import numpy as np
import torch

import ferry
import ferry.arrow  # noqa: F401  (ferry.arrow.ArrowSink)
from qwen3bench.meta import device_name, header, log, write_json
from qwen3bench.timing import write_rate


def forward_tensors(a, dev, k):
    """Forward variant k's tensors {hook: tensor}: residuals [contexts x context, width] bf16, then token_ids."""
    g = torch.Generator(device="cpu").manual_seed(100 + k)
    n = a.contexts * a.context
    t = {h: torch.randn(n, a.width, generator=g).to(torch.bfloat16).to(dev) for h in range(a.hooks)}
    t[a.hooks] = (torch.arange(n, dtype=torch.int64) + 7919 * k).to(dev)
    return t


def add_shape_args(ap) -> None:
    """The forwards' shape and the shards' size (forward_tensors, forwards_for, sink_run read them): this bench's
    and arrow_writer_ab.py's."""
    ap.add_argument("--hooks", type=int, default=4)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--contexts", type=int, default=16, help="contexts per forward")
    ap.add_argument("--shard-mib", type=int, default=512)
    ap.add_argument("--tuning", type=tuning_arg, default=None,
                    help="the shards' writer, IOxMIBxBUFS: io_threads x write MiB x write_buffers (default: "
                         "ferry's, sink::write_tuning)")


def tuning_arg(text: str) -> dict:
    """'IOxMIBxBUFS' as ArrowSink's tuning dict."""
    io, mib, bufs = (int(x) for x in text.lower().split("x"))
    return {"io_threads": io, "write_bytes": mib << 20, "write_buffers": bufs}


def forwards_for(a, total_bytes: int) -> int:
    """How many forwards make `total_bytes` of Arrow data (float32 values and int64 token ids on disk), at least one."""
    per_fwd = a.hooks * a.contexts * a.context * a.width * 4 + a.contexts * a.context * 8
    return max(1, total_bytes // per_fwd)


def sink_run(a, fwds, n_fwd: int, directory: str, tuning: dict | None = None) -> tuple[dict, float, float]:
    """ArrowSink (fsync, shards of --shard-mib, `tuning` or --tuning) over `n_fwd` forwards, taking turns among
    `fwds`, into `directory`: (its close()'s stats, seconds from the first capture until close() returned, seconds
    of the capture loop)."""
    cuda = a.device == "cuda"
    schema = {h: (f"blocks.{h}.hook_resid_post", torch.bfloat16, (a.width,)) for h in range(a.hooks)}
    schema[a.hooks] = ("token_ids", "I64", ())
    ch = ferry.Channel(backend="cuda" if cuda else "host", ring_bytes=1 << 30 if cuda else 64 << 20, schema=schema,
                       on_full="block", timeout=60.0)
    s = torch.cuda.Stream() if cuda else ferry.Stream(backend="host")
    sink = ferry.arrow.ArrowSink(ch, directory, a.context, shard_bytes=a.shard_mib << 20, fsync=True,
                                 tuning=tuning if tuning is not None else a.tuning)
    t0 = time.perf_counter()
    for f in range(n_fwd):
        ch.begin_forward(s, tag=f)
        for h, t in fwds[f % len(fwds)].items():
            ch.capture(h, t, s)
        ch.end_forward(s)
    t_loop = time.perf_counter() - t0
    st = sink.close()
    return st, time.perf_counter() - t0, t_loop


def check(directory: str, a, variants) -> tuple[int, int]:
    """(rows checked, rows bad): every row of every shard against forward variant (row // contexts) % variants."""
    import pyarrow as pa
    names = sorted(p for p in os.listdir(directory) if p.startswith("data-") and p.endswith(".arrow"))
    want = [{h: v.cpu() for h, v in forward_tensors(a, "cpu", k).items()} for k in range(variants)]
    row = bad = 0
    for name in names:
        with pa.OSFile(os.path.join(directory, name), "rb") as f:
            for batch in pa.ipc.open_stream(f):
                cols = {c: batch.column(c) for c in batch.schema.names}
                for i in range(batch.num_rows):
                    w = want[(row // a.contexts) % variants]
                    c = row % a.contexts
                    lo, hi = c * a.context, (c + 1) * a.context
                    ok = np.array_equal(np.asarray(cols["token_ids"][i].values), w[a.hooks][lo:hi].numpy())
                    for h in range(a.hooks):
                        got = np.asarray(cols[f"blocks.{h}.hook_resid_post"][i].values.flatten())
                        ok = ok and np.array_equal(got, w[h][lo:hi].float().numpy().reshape(-1))
                    bad += not ok
                    row += 1
    return row, bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dir", required=True, help="a directory on the medium under test (emptied)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="small shapes (tests)")
    ap.add_argument("--gib", type=float, default=8.0, help="Arrow bytes to write")
    add_shape_args(ap)
    ap.add_argument("--rounds", type=int, default=3, help="medium-then-sink rounds (medians)")
    a = ap.parse_args(argv)
    if a.tiny:
        a.gib, a.hooks, a.width, a.context, a.contexts, a.shard_mib, a.rounds = 0.004, 2, 64, 16, 4, 1, 2
    cuda = a.device == "cuda"
    dev = torch.device(a.device)
    out = header(device_name(cuda), " ".join([sys.executable] + sys.argv))
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    total = int(a.gib * (1 << 30))
    probe = os.path.join(a.dir, "probe")
    variants = 4
    fwds = [forward_tensors(a, dev, k) for k in range(variants)]
    n_fwd = forwards_for(a, total)
    ds = os.path.join(a.dir, "ds")
    warm = max(1, forwards_for(a, min(total, 2 * (a.shard_mib << 20))))
    sink_run(a, fwds, warm, ds)  # untimed
    shutil.rmtree(ds, ignore_errors=True)
    runs, buffered, direct, rows, bad = [], [], [], 0, 0
    for r in range(a.rounds):
        buffered.append(write_rate(probe, total))
        direct.append(write_rate(probe, total, direct=True))
        shutil.rmtree(probe, ignore_errors=True)
        st, dt, t_loop = sink_run(a, fwds, n_fwd, ds)
        rate = st["bytes_written"] / dt / 1e9
        runs.append((rate, dt, t_loop, st))
        log(f"round {r}: medium {buffered[-1]:.3f} GB/s buffered, {direct[-1]:.3f} O_DIRECT; sink "
            f"{st['bytes_written'] / 1e9:.2f} GB in {dt:.2f} s = {rate:.3f} GB/s ({st['forwards_written']} forwards, "
            f"{st['shards']} shards, refused {st['forwards_refused']}); sink threads (s): "
            + ", ".join(f"{k} {v:.2f}" for k, v in st["seconds"].items()) + f"; captures enqueued in {t_loop:.2f}")
        n, b = check(ds, a, variants)
        rows += n
        bad += b + (st["rows_written"] != n_fwd * a.contexts) + st["forwards_refused"]
        shutil.rmtree(ds, ignore_errors=True)
    rate = statistics.median(x[0] for x in runs)
    mid = min(runs, key=lambda x: abs(x[0] - rate))  # the median round (the lower middle of an even count)
    disk = max(statistics.median(buffered), statistics.median(direct))
    out["arrow"] = {"disk_write_gbps": disk, "sink_write_gbps": rate, "share": rate / disk, "rows_checked": rows,
                    "rows_bad": bad, "bytes_written": mid[3]["bytes_written"], "seconds": mid[1],
                    "rounds": a.rounds, "sink_gbps_rounds": [x[0] for x in runs],
                    "disk_buffered_gbps_rounds": buffered, "disk_direct_gbps_rounds": direct, "dir": a.dir,
                    "capture_loop_seconds": mid[2], "sink_seconds": mid[3]["seconds"], "tuning": a.tuning}
    log(f"arrow: median {rate:.3f} GB/s (rounds {min(x[0] for x in runs):.3f}-{max(x[0] for x in runs):.3f}) of the "
        f"medium's {disk:.3f} ({rate / disk:.1%}); rows checked {rows}, bad {bad}")
    write_json(a.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
