#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs the Python tests on the host backend.
#   tests/python/run.sh                 # against the installed package (pip install ./src/python)
#   tests/python/run.sh <build-dir>     # against a CMake build with FERRY_BUILD_PYTHON=ON (<build>/src/python/ferry)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if [[ $# -ge 1 ]]; then
  export PYTHONPATH="$(cd "$1" && pwd)/src/python${PYTHONPATH:+:$PYTHONPATH}"
  shift
fi
export FERRY_PYTHON_BACKEND="${FERRY_PYTHON_BACKEND:-host}"
exec "${PYTHON:-python3}" -m pytest -q "$here" "$@"
