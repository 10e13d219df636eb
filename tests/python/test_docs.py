# SPDX-License-Identifier: Apache-2.0
# Runs every ```python block of docs/api/python.md (and of README.md), in order and in one namespace per
# document, on the host backend.
import gc
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "api" / "python.md"
README = ROOT / "README.md"


def blocks(doc=DOC):
    return re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S)


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


def test_readme_python_snippets_run(monkeypatch):
    monkeypatch.setenv("FERRY_PYTHON_BACKEND", "host")
    found = blocks(README)
    assert found, "README.md has a python block"
    for i, code in enumerate(found):
        ns = {"__name__": "readme"}
        try:
            exec(compile(code, f"README.md[python block {i}]", "exec"), ns)
        except Exception as err:
            pytest.fail(f"README.md python block {i} failed: {err!r}\n{code}")
        ns.clear()
    gc.collect()
