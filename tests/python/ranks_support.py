# SPDX-License-Identifier: Apache-2.0
"""Test processes. run_ranks: the tensor-parallel tests' `world` ranks (test_tp.py, test_tp_bench.py,
test_engine_tp.py) that meet on a rendezvous store held by the test (a port the OS picks: no race for a "free"
port), each rank's output kept, and every rank's output shown when one fails (a failing rank makes the others
wait). run_script: subprocess.run for the benchmark scripts' smoke tests.

A process of ``[sys.executable, script, args...]`` is forked from a zygote (zygote.py) that imported torch,
transformers and ferry.engine once for the pytest process, instead of a fresh interpreter that imports them again
(about 10 CPU-seconds each on the 2-core CI machine). FERRY_TEST_RANKS_SPAWN=1, or a GPU, starts fresh
interpreters."""
import atexit
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

ZYGOTE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zygote.py")
_zygote = None


def _the_zygote():
    global _zygote
    if _zygote is None or _zygote.poll() is not None:
        _zygote = subprocess.Popen([sys.executable, ZYGOTE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                   env=dict(os.environ, OMP_NUM_THREADS="1"))  # libgomp reads it once, at load
        atexit.register(_zygote.kill)
        ready = _zygote.stdout.readline().strip()
        if ready != "ready":
            pytest.fail(f"the ranks' zygote ({ZYGOTE}) did not start: printed {ready!r}, exit {_zygote.poll()}")
    return _zygote


def forkable(argv):
    """Whether ``argv`` is ``[sys.executable, script, args...]``, forking is not turned off, and the machine has no GPU
    (a process forked after its parent initialized CUDA cannot use CUDA, and the zygote's imports may initialize it:
    test_engine_tp.py's forked ranks failed on the H100 machine, so GPU machines spawn fresh interpreters)."""
    gpu = any(os.path.exists(d) for d in ("/dev/nvidiactl", "/dev/kfd"))
    return (os.environ.get("FERRY_TEST_RANKS_SPAWN") != "1" and not gpu and len(argv) > 1
            and os.fspath(argv[0]) == sys.executable and not os.fspath(argv[1]).startswith("-"))


def _forked(argv, env, cwd, log, err=None):
    z = _the_zygote()
    job = {"argv": [os.fspath(a) for a in argv], "env": env, "cwd": os.fspath(cwd) if cwd else None, "log": log,
           "err": err}
    z.stdin.write(json.dumps(job) + "\n")
    z.stdin.flush()
    return int(z.stdout.readline())


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def _wait(pids, rcs, deadline):
    """Each process's exit status from its ``rcs`` file (a string where it is gone without one: a signal ended it),
    or None for those still running at `deadline`, which are killed."""
    codes = [None] * len(pids)
    while True:
        for i, (pid, rc) in enumerate(zip(pids, rcs)):
            if codes[i] is None and (os.path.exists(rc) or not _alive(pid)):  # its status, unless it died without one
                codes[i] = int(open(rc).read()) if os.path.exists(rc) else "died without an exit status"
        if None not in codes or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for pid, code in zip(pids, codes):
        if code is None:
            os.kill(pid, signal.SIGKILL)
    return codes


def _read(path):
    """The bytes of a log, empty where it was never created."""
    if not os.path.exists(path):
        return b""
    with open(path, "rb") as f:
        return f.read()


def run_script(argv, env=None, cwd=None, timeout=300.0):
    """``subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)``, forked from the
    zygote where ``argv`` runs a Python script (forkable): returncode (a string where a signal ended it), stdout and
    stderr. Past `timeout` the process is killed and subprocess.TimeoutExpired raised, as subprocess.run does."""
    if not forkable(argv):
        return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    logs = tempfile.mkdtemp(prefix="ferry-script-")
    out, err = os.path.join(logs, "out"), os.path.join(logs, "err")
    try:
        pid = _forked(argv, dict(env if env is not None else os.environ), cwd, out, err)
        (code,) = _wait([pid], [out + ".rc"], time.monotonic() + timeout)
        if code is None:
            raise subprocess.TimeoutExpired(argv, timeout)
        return subprocess.CompletedProcess(argv, code, _read(out).decode(errors="replace"),
                                           _read(err).decode(errors="replace"))
    finally:
        shutil.rmtree(logs, ignore_errors=True)


def run_ranks(torch, world, argv_of, env=None, cwd=None, timeout=150.0, ok=None):
    """Runs ``argv_of(rank)`` for ranks 0..world-1 with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT (the store's)
    and `env` on top of os.environ (NCCL_NVLS_ENABLE=0, one OpenMP thread, gloo on lo); pytest.fail with every
    rank's output when one exits non-zero, none exits within `timeout` seconds, or ``ok()`` is false after."""
    store = torch.distributed.TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=60),
                                       wait_for_workers=False)
    envs = [dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port),
                 GLOO_SOCKET_IFNAME="lo", NCCL_NVLS_ENABLE="0", OMP_NUM_THREADS="1", **(env(r) if env else {}))
            for r in range(world)]
    argvs = [argv_of(r) for r in range(world)]
    fork = all(forkable(a) for a in argvs)
    deadline, codes, outs = time.monotonic() + timeout, [], []
    if fork:
        logs = tempfile.mkdtemp(prefix="ferry-ranks-")
        paths = [os.path.join(logs, f"rank{r}") for r in range(world)]
        pids = [_forked(argvs[r], envs[r], cwd, paths[r]) for r in range(world)]
        codes = _wait(pids, [p + ".rc" for p in paths], deadline)
        outs = [_read(p) + (f"\n(killed: no exit in {timeout:g} s)".encode() if c is None else b"")
                for p, c in zip(paths, codes)]
        shutil.rmtree(logs, ignore_errors=True)
    else:
        procs = [subprocess.Popen(argvs[r], env=envs[r], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                 for r in range(world)]
        for p in procs:
            try:
                outs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
            except subprocess.TimeoutExpired:
                p.kill()
                outs.append(p.communicate()[0] + f"\n(killed: no exit in {timeout:g} s)".encode())
            codes.append(p.returncode)
    if any(c != 0 for c in codes) or (ok is not None and not ok()):
        pytest.fail("\n".join(f"rank {r} of {world} exited {c}:\n{o.decode(errors='replace')}"
                              for r, (c, o) in enumerate(zip(codes, outs))))
    del store
