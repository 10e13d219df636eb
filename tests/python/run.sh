#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs the Python tests on the host backend.
#   tests/python/run.sh [pytest args]                     # against the installed package (pip install ./src/python)
#   tests/python/run.sh --build <build-dir> [pytest args] # against a CMake build with FERRY_BUILD_PYTHON=ON
# Any other argument goes to pytest (e.g. -k deferred, -x).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if [[ ${1:-} == --build ]]; then
  [[ $# -ge 2 && -d $2/src/python/ferry ]] || {
    echo "tests/python/run.sh: expected --build <a CMake build dir with src/python/ferry>, got '${2:-}'" >&2
    exit 2
  }
  export PYTHONPATH="$(cd "$2" && pwd)/src/python${PYTHONPATH:+:$PYTHONPATH}"
  export FERRY_TEST_SINK_DIR="${FERRY_TEST_SINK_DIR:-$(cd "$2" && pwd)/tests/python/native_sink}"
  shift 2
fi
export FERRY_PYTHON_BACKEND="${FERRY_PYTHON_BACKEND:-host}"
exec "${PYTHON:-python3}" -m pytest -q "$here" "$@"
