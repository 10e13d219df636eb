#!/usr/bin/env bash
# ferry inside transformers' continuous batching on the lent GPU (issue 40): builds the Python package with the
# CUDA backend, runs the engine tests on the GPU (CUDA graphs, async mode) and bench/engine/cb_capture.py.
# Usage (repo root, device machine): bash bench/device/drivers/engine.sh [tests] [bench] [quick]
#   FERRY_ENGINE_PYTHONPATH: use that built package instead of building build-engine.
#   FERRY_ENGINE_ARGS: cb_capture.py's arguments, FERRY_ENGINE_TIMEOUT (default 540 s). On the H100 a round of the
#   issue's 512 requests is about 66 s per contestant, so one device call (600 s) holds one set, e.g.
#   "--requests 512 --rounds 2 --contestants none,eagle3,sae", then "none,all-layers" and "none,naive --rounds 1";
#   `cb_capture.py --merge a.json b.json c.json --json engine.json` joins them (each block with its own baseline).
# Writes under $OUT: build.log, pytest_engine.log, bench_engine.log, engine.json.
set -uo pipefail
steps=" ${*:-tests bench} "
has() { [[ $steps == *" $1 "* ]]; }
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export FERRY_COMMIT=${FERRY_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/device.txt"
if [[ -n ${FERRY_ENGINE_PYTHONPATH:-} ]]; then
  export PYTHONPATH=$FERRY_ENGINE_PYTHONPATH  # a package built already (h200.sh pybuild: build-h200/src/python)
else
  cmake -S . -B build-engine -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DFERRY_ENABLE_CUDA=ON \
    -DFERRY_BUILD_PYTHON=ON -DFERRY_PYTHON_CUDA=ON -DFERRY_BUILD_TORCH=OFF -DFERRY_BUILD_TESTS=OFF -DFERRY_BUILD_BENCH=OFF \
    "-DPython_EXECUTABLE=$(command -v python3)" > "$OUT/build.log" 2>&1 &&
    cmake --build build-engine -j"$(nproc)" --target ferry_python >> "$OUT/build.log" 2>&1 ||
    { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
  export PYTHONPATH=$PWD/build-engine/src/python
fi
rc=0
if has tests; then
  # the CUDA cases (graphs, async mode); the CPU ones run in CI (FERRY_ENGINE_PYTEST_K="" runs them all)
  PYTHONUNBUFFERED=1 timeout "${FERRY_ENGINE_TEST_TIMEOUT:-300}" python3 -m pytest -q tests/python/test_engine_transformers.py \
    ${FERRY_ENGINE_PYTEST_K-"-k cuda"} > "$OUT/pytest_engine.log" 2>&1 || rc=1
  tail -15 "$OUT/pytest_engine.log"
fi
if has bench; then
  args=${FERRY_ENGINE_ARGS:-}
  has quick && args=${FERRY_ENGINE_ARGS:---requests 32 --rounds 1 --new-tokens 32 --max-prompt 512}
  # shellcheck disable=SC2086
  PYTHONUNBUFFERED=1 timeout "${FERRY_ENGINE_TIMEOUT:-540}" python3 bench/engine/cb_capture.py $args \
    --json "$OUT/engine.json" > "$OUT/bench_engine.log" 2>&1 || rc=1
  grep -v "Logger\|^\s*$" "$OUT/bench_engine.log" | tail -30
fi
exit $rc
