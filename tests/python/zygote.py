# SPDX-License-Identifier: Apache-2.0
"""The test processes' zygote (ranks_support.run_ranks, run_script): imports torch, transformers' Qwen3 and
ferry.engine once, runs no torch op (so no OpenMP thread pool exists to be lost across fork), then forks one child
per job read from stdin and prints its pid. A child runs its script as ``python script args...`` would:
``sys.argv``, the job's environment (its PYTHONPATH entries put before sys.path), cwd, stdout and stderr to the
job's log file, ``__main__``; its exit status goes to ``<log>.rc`` after its atexit functions ran, as it exits.
Children are not reaped here (SIGCHLD ignored): they never linger.

    stdin:  one JSON object a line, {"argv": [python, script, args...], "env": {...}, "cwd": dir, "log": path}
            (and "err": path, for stderr apart from stdout)
    stdout: the child's pid, one a line; "ready" first, once the imports are done
"""
import json
import os
import signal
import sys

try:  # what a job lacks it imports itself (and fails on) as a fresh interpreter would
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401
    import transformers  # noqa: F401
    from transformers.models.qwen3 import modeling_qwen3  # noqa: F401

    import ferry.engine  # noqa: F401
except ImportError:
    pass


def child(job: dict) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # its own subprocesses are waited for
    code = 1
    try:
        os.environ.clear()
        os.environ.update(job["env"])
        for p in reversed([p for p in job["env"].get("PYTHONPATH", "").split(os.pathsep) if p]):
            if p not in sys.path:
                sys.path.insert(0, p)
        os.chdir(job["cwd"] or os.getcwd())
        log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(os.open(job["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) if job.get("err") else log, 2)
        script, *args = job["argv"][1:]
        sys.argv = [script, *args]
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        import runpy
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if isinstance(e.code, str):
                print(e.code, file=sys.stderr)
    except BaseException:  # noqa: B902 - the job's failure is its exit status; the traceback goes to its log
        import traceback
        traceback.print_exc()
        code = 1
    finally:
        try:
            import atexit
            atexit._run_exitfuncs()  # what the interpreter's exit would run (ferry closes what is still open)
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            with open(job["log"] + ".rc.tmp", "w") as f:
                f.write(str(code))
            os.rename(job["log"] + ".rc.tmp", job["log"] + ".rc")  # whole when the test sees it
            os._exit(code)


def main() -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # exited children are reaped by the kernel
    print("ready", flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            child(job)
        print(pid, flush=True)


if __name__ == "__main__":
    main()
