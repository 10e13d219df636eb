#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ctest python.pip_install: the README's first command, `bash src/python/capture.sh`, from this checkout: a fresh
# venv, `pip install ./src/python[engine]` WITH build isolation (pip fetches scikit-build-core, nanobind and numpy
# from PyPI: the build generates the stubs by importing the module, which imports numpy), then `ferry capture` from
# the venv on the embedded default (CPU, host backend); then `python -m ferry capture --help` (the same command),
# and the installed package runs one D2H forward and one H2D publish on the host backend, outside the build tree.
# The module is built at -O0 here, its own sources too (FERRY_PIP_ARGS: without FERRY_PYTHON_MINSIZE=OFF nanobind
# adds -Os after the build type's flags; less compile time in CI, where ctest's other tests share the cores; the
# install path is the same).
# Usage: tests/python/pip_install.sh <python> <scratch-dir>
set -euo pipefail
py=${1:?python}
work=${2:?scratch dir}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
rm -rf "$work"
mkdir -p "$work"
export FERRY_PIP_ARGS="--config-settings=cmake.define.CMAKE_CXX_FLAGS_RELEASE=-O0 \
--config-settings=cmake.define.FERRY_PYTHON_MINSIZE=OFF"
PYTHON="$py" FERRY_VENV="$work/venv" bash "$root/src/python/capture.sh" --out "$work/samples" --requests 4 \
  --max-new-tokens 3 --quiet | tee "$work/capture.log"
grep -q "4 samples (4 complete, 0 incomplete, 0 dropped, 0 lost)" "$work/capture.log"
ls "$work/samples"/req_0.safetensors > /dev/null
cd "$work"
"$work/venv/bin/python" -m ferry capture --help > "$work/help.txt"  # python -m ferry: the same command
grep -q -- "--preset" "$work/help.txt"
"$work/venv/bin/python" - <<'PY'
import os
import numpy as np
import ferry
assert ferry.__file__.startswith(os.path.join(os.getcwd(), "venv")), ferry.__file__
s = ferry.Stream(backend="host")
ch = ferry.Channel(backend="host", ring_bytes=1 << 16, publish_every=2)
x = np.random.default_rng(1).integers(1, 255, 4096, dtype=np.uint8)
ch.begin_forward(s)
for h in range(3):
    ch.capture(h, x, s)
ch.end_forward(s)
got = []
while len(got) < 3:
    got += ch.poll(3 - len(got), timeout=5.0)
assert all(np.array_equal(e.numpy(), x) for e in got), "entries differ"
for e in got:
    e.release()
report = ch.close()
assert report["clean"], report
print("pip install ./src/python (fresh venv, build isolation): ok,", ferry.__file__)
PY
