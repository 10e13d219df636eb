# SPDX-License-Identifier: Apache-2.0
# Runs every ```python block of docs/api/python.md, in order and in one namespace, on the host backend.
import gc
import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "api" / "python.md"


def blocks():
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_doc_has_snippets():
    assert len(blocks()) >= 4


def test_doc_snippets_run(monkeypatch):
    monkeypatch.setenv("FERRY_PYTHON_BACKEND", "host")
    ns = {"__name__": "python_md"}
    for i, code in enumerate(blocks()):
        try:
            exec(compile(code, f"{DOC.name}[python block {i}]", "exec"), ns)
        except Exception as err:  # name the block that failed
            pytest.fail(f"docs/api/python.md python block {i} failed: {err!r}\n{code}")
    ns.clear()
    gc.collect()
