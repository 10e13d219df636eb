#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ctest python.pip_install: the README's `pip install ./src/python` from this checkout, into a scratch target
# (no isolation, no downloads: nanobind and scikit-build-core must be importable), then the installed
# package runs one D2H forward and one H2D publish on the host backend, outside the build tree.
# Usage: tests/python/pip_install.sh <python> <scratch-dir>
set -euo pipefail
py=${1:?python}
work=${2:?scratch dir}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
rm -rf "$work"
mkdir -p "$work"
"$py" -m pip install -q --no-build-isolation --no-deps --target "$work/site" \
  --config-settings=build-dir="$work/build" "$root/src/python"
cd "$work"
PYTHONPATH="$work/site" "$py" - <<'PY'
import numpy as np
import ferry
assert ferry.__file__.startswith(__import__("os").getcwd()), ferry.__file__
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
print("pip install ./src/python: ok,", ferry.__file__)
PY
