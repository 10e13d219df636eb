# SPDX-License-Identifier: Apache-2.0
"""Tensor-parallel tests' processes (test_tp.py, test_tp_bench.py): `world` ranks started as processes that meet
on a rendezvous store held by the test (a port the OS picks: no race for a "free" port), each rank's output kept,
and every rank's output shown when one fails (a failing rank makes the others wait)."""
import datetime
import os
import subprocess
import time

import pytest


def run_ranks(torch, world, argv_of, env=None, cwd=None, timeout=150.0, ok=None):
    """Runs ``argv_of(rank)`` for ranks 0..world-1 with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT (the store's)
    and `env` on top of os.environ (NCCL_NVLS_ENABLE=0, one OpenMP thread, gloo on lo); pytest.fail with every
    rank's output when one exits non-zero, none exits within `timeout` seconds, or ``ok()`` is false after."""
    store = torch.distributed.TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=60),
                                       wait_for_workers=False)
    procs = []
    for r in range(world):
        e = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port),
                 GLOO_SOCKET_IFNAME="lo", NCCL_NVLS_ENABLE="0", OMP_NUM_THREADS="1", **(env(r) if env else {}))
        procs.append(subprocess.Popen(argv_of(r), env=e, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    deadline, outs = time.monotonic() + timeout, []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
        except subprocess.TimeoutExpired:
            p.kill()
            outs.append(p.communicate()[0] + f"\n(killed: no exit in {timeout:g} s)".encode())
    if any(p.returncode != 0 for p in procs) or (ok is not None and not ok()):
        pytest.fail("\n".join(f"rank {r} of {world} exited {p.returncode}:\n{o.decode(errors='replace')}"
                              for r, (p, o) in enumerate(zip(procs, outs))))
    del store
