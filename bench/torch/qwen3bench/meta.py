# SPDX-License-Identifier: Apache-2.0
"""Run metadata (device, commit, date, command), the JSON writing, the progress log and the --capture choice of
the bench/torch programs."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import time

import torch

T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


def use_ops(capture: str):
    """The benchmarks' --capture choice (auto, ops, core) as ferry.hooks.capture_fn's ``use_ops``."""
    return {"auto": "auto", "ops": True, "core": False}[capture]


def git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except Exception:
        return "unknown"


def device_name(cuda):
    """The JSON "device": the GPU's name, or the host backend's."""
    return torch.cuda.get_device_name(0) if cuda else "cpu (ferry host backend)"


def header(device, command, commit=None):
    """The JSON's first keys: device, commit (``commit``, else $FERRY_COMMIT, else git's HEAD), date (UTC),
    command."""
    return {"device": device, "commit": commit or os.environ.get("FERRY_COMMIT") or git_commit(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": command}


def write_json(path, obj, indent=2, newline=True):
    with open(path, "w") as f:
        json.dump(obj, f, indent=indent)
        if newline:
            f.write("\n")
