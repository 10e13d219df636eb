# SPDX-License-Identifier: Apache-2.0
"""CPU cost of one eager capture call from Python, per call path, and of the pieces it is made of.

Every path is timed as the median over ``--runs`` runs of ``--calls`` calls inside one open forward (after a
warm-up run), with a consumer thread draining the channel (qwen3_capture.py's: bench/torch/qwen3bench/drain.py).
Runs on cuda:0 with the cuda backend when a GPU is present, else on the cpu with the host backend (the host
backend snapshots the tensor of a torch op capture and copies on its stream thread: its absolute numbers are
not the GPU's, but the Python / binding part of every path is the same code).

    python bench/torch/capture_cost.py [--calls 2000] [--runs 7] [--numel 1024] [--out capture_cost.json]

Paths (us per call): ``op_packet`` torch.ops.ferry.capture(token, t, handle, hook); ``op_default`` the same
through the OpOverload ``torch.ops.ferry.capture.default``; ``hooks_auto`` / ``hooks_ops`` / ``hooks_core``
ferry.hooks.capture_fn(use_ops="auto" (the default, as qwen3_capture.py) / True / False); ``channel_stream`` Channel.capture(hook, t, stream) with an
explicit stream (an int handle on cuda, the ferry.Stream on the host backend); ``channel_default``
Channel.capture(hook, t) on torch's current stream (cuda only); ``channel_deferred`` Channel.capture_deferred
(one gather per 16 calls), ``channel_deferred_inference`` the same with an inference tensor.
References (``ref_*``): t.detach(), t.is_contiguous(), torch.cuda.current_stream(),
torch._C._cuda_getCurrentRawStream(i), t.__dlpack__(), torch.ops.aten.alias.default(t), an empty nanobind
method (Plan.__len__) and an empty Python call. ``above_cpp_us`` of a path = its cost minus ``--cpp-us`` (the
C++ immediate capture's CPU cost, bench/d2h capture_cpu; 4.79 us on the H200), the target being <= 3 us.
``thread_cpu_us``: the same medians as the calling thread's CPU time (time.thread_time), which leaves out the
time the thread is preempted (by the drain thread, the host backend's stream thread, other processes).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time

import torch

import ferry
import ferry.hooks as fh
from qwen3bench.drain import Drain  # the same consumer thread (this script's directory is on sys.path)
from qwen3bench.meta import device_name, write_json


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000, help="calls per run (>= 2000 for the record)")
    ap.add_argument("--runs", type=int, default=7, help="timed runs per path (median; >= 5)")
    ap.add_argument("--numel", type=int, default=1024, help="elements of the captured bf16 tensor")
    ap.add_argument("--cpp-us", type=float, default=4.79, help="the C++ immediate capture's CPU us per call")
    ap.add_argument("--out", default="", help="write the results as JSON to this file")
    args = ap.parse_args()

    cuda = torch.cuda.is_available() and "cuda" in ferry.available_backends()
    backend = "cuda" if cuda else "host"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    n = args.calls
    ring = max(64 << 20, 4 * n * (args.numel * 2 + 256))
    ch = ferry.Channel(0, ring_bytes=ring, publish_every=16, backend=backend, fifo_capacity=16384)
    if cuda:
        # a created stream, made torch's current one (ferry refuses the legacy default stream, handle 0)
        fstream = torch.cuda.Stream(0)
        torch.cuda.set_stream(fstream)
        stream_arg = fstream.cuda_stream  # an int handle: the cheapest explicit stream
        sync = fstream.synchronize
    else:
        fstream = ferry.Stream(0, backend="host")
        stream_arg = fstream
        sync = fstream.synchronize
    drain = Drain(ch)
    drain.start()
    expected = 0
    t = torch.randn(args.numel, device=device).to(torch.bfloat16)
    with torch.inference_mode():
        t_inf = t.clone()  # an inference tensor (no version counter), as engines' forwards make them

    thread_us: dict[str, float] = {}

    def timed(fn, captures, name):
        """Median us per call of fn() over the runs, each inside one open forward (wall time; the calling
        thread's CPU time goes to thread_us[name])."""
        nonlocal expected
        per, cpu = [], []
        for r in range(args.runs + 1):  # run 0: warm-up
            gc.collect()
            ch.begin_forward(stream_arg)
            c0 = time.thread_time()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            dt = (time.perf_counter() - t0) / n * 1e6
            dc = (time.thread_time() - c0) / n * 1e6
            plan = ch.end_forward(stream_arg)
            del plan
            sync()
            if captures:
                expected += n
                drain.wait(expected)
            if r > 0:
                per.append(dt)
                cpu.append(dc)
        thread_us[name] = statistics.median(cpu)
        return statistics.median(per)

    res: dict[str, float] = {}
    paths: dict[str, float] = {}
    try:
        import ferry.torch_ops as fto  # noqa: F401
        have_ops = True
    except ImportError as err:
        print(f"# torch ops not built ({err}): op paths skipped", file=sys.stderr)
        have_ops = False

    h = ch.handle
    if have_ops:
        token = fto.token(device)
        packet = torch.ops.ferry.capture
        overload = torch.ops.ferry.capture.default
        paths["op_packet"] = timed(lambda: packet(token, t, h, 7), True, "op_packet")
        paths["op_default"] = timed(lambda: overload(token, t, h, 7), True, "op_default")
        cap_ops = fh.capture_fn(ch, stream_arg, use_ops=True, device=device)
        paths["hooks_ops"] = timed(lambda: cap_ops(7, t), True, "hooks_ops")
    # what bench/torch/qwen3_capture.py's hooks call: capture_fn defaults (stream None on cuda)
    cap_auto = fh.capture_fn(ch, None if cuda else fstream, device=device)
    paths["hooks_auto"] = timed(lambda: cap_auto(7, t), True, "hooks_auto")
    cap_core = fh.capture_fn(ch, stream_arg, use_ops=False)
    paths["hooks_core"] = timed(lambda: cap_core(7, t), True, "hooks_core")
    capture = ch.capture
    paths["channel_stream"] = timed(lambda: capture(7, t, stream_arg), True, "channel_stream")
    if cuda:
        paths["channel_default"] = timed(lambda: capture(7, t), True, "channel_default")
    deferred = ch.capture_deferred
    paths["channel_deferred"] = timed(lambda: deferred(7, t, stream_arg), True, "channel_deferred")
    paths["channel_deferred_inference"] = timed(lambda: deferred(7, t_inf, stream_arg), True,
                                                "channel_deferred_inference")

    # references: the pieces a capture call may be made of (no capture)
    res["ref_detach"] = timed(lambda: t.detach(), False, "ref_detach")
    res["ref_is_contiguous"] = timed(lambda: t.is_contiguous(), False, "ref_is_contiguous")
    if cuda:
        res["ref_current_stream"] = timed(lambda: torch.cuda.current_stream(0), False, "ref_current_stream")
        raw = torch._C._cuda_getCurrentRawStream
        res["ref_current_raw_stream"] = timed(lambda: raw(0), False, "ref_current_raw_stream")
    res["ref_dlpack"] = timed(lambda: t.__dlpack__(), False, "ref_dlpack")
    alias = torch.ops.aten.alias.default
    res["ref_aten_alias_default"] = timed(lambda: alias(t), False, "ref_aten_alias_default")
    ch.begin_forward(stream_arg)
    a_plan = ch.end_forward(stream_arg)
    sync()
    res["ref_nanobind_empty_method"] = timed(lambda: a_plan.__len__(), False, "ref_nanobind_empty_method")

    def nothing():
        return None

    res["ref_python_call"] = timed(nothing, False, "ref_python_call")

    drain.wait(expected)
    drain.stop()
    report = ch.close(timeout=30.0)
    out = {
        "device": device_name(cuda),
        "backend": backend,
        "torch": torch.__version__,
        "calls": n, "runs": args.runs, "tensor_bytes": t.nbytes,
        "cpp_capture_us": args.cpp_us,
        "paths_us": paths,
        "above_cpp_us": {k: v - args.cpp_us for k, v in paths.items()} if cuda else None,
        "refs_us": res,
        "thread_cpu_us": thread_us,
        "entries": expected,
        "clean": bool(report.get("clean")),
    }
    print(f"{'path':28s} {'wall':>7s}    {'thread cpu':>10s}")
    for k, v in paths.items():
        extra = f"  ({v - args.cpp_us:+.2f} over C++)" if cuda else ""
        print(f"{k:28s} {v:7.2f} us {thread_us[k]:7.2f} us{extra}")
    for k, v in res.items():
        print(f"{k:28s} {v:7.2f} us {thread_us[k]:7.2f} us")
    print(f"# {out['device']}, torch {torch.__version__}, {n} calls x {args.runs} runs, clean={out['clean']}")
    if args.out:
        write_json(args.out, out)
    return 0 if out["clean"] else 1


if __name__ == "__main__":
    sys.exit(main())
