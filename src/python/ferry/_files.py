# SPDX-License-Identifier: Apache-2.0
"""Files written whole: a manifest (index.json, state.json, dataset_info.json, tp.json) goes to a temporary name in
its directory, is synced when asked, then renamed over the old one, so a reader (or a crash) sees the old file or
the new one, never part of one."""

from __future__ import annotations

import json
import os
from typing import Any


def replace_json(path: str, obj: Any, *, fsync: bool = False, indent: int | None = None) -> None:
    """``obj`` as JSON at ``path``, written whole (module docstring); ``fsync``: synced before the rename."""
    head, name = os.path.split(path)
    tmp = os.path.join(head, f".{name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=indent)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
