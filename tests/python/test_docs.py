# SPDX-License-Identifier: Apache-2.0
# Runs every ```python block of docs/api/python.md and docs/api/sinks.md (and of README.md), in order and in one
# namespace per document, on the host backend. Tagged blocks need more: ```python torch runs where torch and transformers
# import (CI installs them), ```python arrow where pyarrow and datasets do (CI installs them), ```python gpu where
# the CUDA backend has a GPU (the H200 run); otherwise they are
# skipped and the test says so. ```c blocks are compiled (syntax only) against src/python/ferry_capi.h.
import gc
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import types

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "api" / "python.md"
SINKS = ROOT / "docs" / "api" / "sinks.md"
README = ROOT / "README.md"


def tagged_blocks(doc=DOC, lang="python"):
    """(tag, code) of every ```<lang>[ tag] block."""
    return re.findall(r"```" + lang + r"(?: (\w+))?\n(.*?)```", doc.read_text(), flags=re.S)


def blocks(doc=DOC):
    return [code for tag, code in tagged_blocks(doc) if not tag]


def _importable(*mods):
    try:
        for m in mods:
            __import__(m)
        return True
    except Exception:
        return False


def _have_gpu():
    if not _importable("torch"):
        return False
    import torch

    import ferry
    return torch.cuda.is_available() and "cuda" in ferry.available_backends()


def test_doc_has_snippets():
    assert len(blocks()) >= 4


def test_doc_snippets_run(monkeypatch):
    monkeypatch.setenv("FERRY_PYTHON_BACKEND", "host")
    # The blocks run in a real (registered) module: torch.compile's dynamo imports the module of the code
    # it traces by its __name__.
    mod = types.ModuleType("python_md")
    sys.modules["python_md"] = mod
    ns = mod.__dict__
    have = {"": True, "torch": _importable("torch", "transformers", "ferry.torch_ops"), "gpu": _have_gpu(),
            "arrow": _importable("pyarrow", "datasets")}
    skipped = []
    for i, (tag, code) in enumerate(tagged_blocks()):
        if tag not in have:
            pytest.fail(f"docs/api/python.md python block {i}: unknown tag {tag!r} (none, torch, gpu or arrow)")
        if not have[tag]:
            skipped.append(f"{i} ({tag})")
            continue
        try:
            exec(compile(code, f"{DOC.name}[python block {i}]", "exec"), ns)
        except Exception as err:  # name the block that failed
            pytest.fail(f"docs/api/python.md python block {i} failed: {err!r}\n{code}")
    ns.clear()
    del sys.modules["python_md"]
    gc.collect()
    if skipped:
        pytest.skip(f"ran the other blocks; skipped blocks {', '.join(skipped)}: torch/transformers, pyarrow/datasets "
                    f"or a GPU missing")


def test_sinks_doc_snippets_run(monkeypatch):
    monkeypatch.setenv("FERRY_PYTHON_BACKEND", "host")
    found = tagged_blocks(SINKS)
    assert len(found) >= 2, "docs/api/sinks.md has python blocks (the sink, the reader)"
    ns = {"__name__": "sinks_md"}
    for i, (tag, code) in enumerate(found):
        assert not tag, f"docs/api/sinks.md python block {i}: expected an untagged block (host backend), got {tag!r}"
        try:
            exec(compile(code, f"{SINKS.name}[python block {i}]", "exec"), ns)
        except Exception as err:  # name the block that failed
            pytest.fail(f"docs/api/sinks.md python block {i} failed: {err!r}\n{code}")
    ns.clear()
    gc.collect()


def test_doc_c_snippets_compile(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    found = [code for _, code in tagged_blocks(DOC, "c")]
    assert found, "docs/api/python.md has a c block (the native sink)"
    for i, code in enumerate(found):
        src = tmp_path / f"block{i}.c"
        src.write_text(code)
        r = subprocess.run([cc, "-fsyntax-only", "-Wall", "-Werror", "-Wno-unused-parameter", "-Wno-unused-function",
                            f"-I{ROOT / 'src' / 'python'}", f"-I{sysconfig.get_paths()['include']}", str(src)],
                           capture_output=True, text=True)
        assert r.returncode == 0, f"docs/api/python.md c block {i} does not compile:\n{r.stderr}\n{code}"


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
