#!/usr/bin/env bash
# ferry's test command (README): installs what it needs, builds, runs every test that this machine can run.
#   * host-labelled tests always (backend contract on the host-emulated device, D2H/H2D protocols,
#     consumer projects against the install and build trees, the PTX memory-ordering check);
#   * gpu-labelled tests too when an NVIDIA GPU is present (FERRY_REQUIRE_GPU=1: a skip is a failure);
#   * the Python package's tests (pytest, tests/python, label host;python) when its build dependencies
#     (nanobind, scikit-build-core, numpy, pytest: from PyPI) can be imported or pip-installed; with torch
#     and transformers (PyPI, skipped with FERRY_SKIP_TORCH=1) also the torch ops, hooks and presets tests;
#   * the HIP compile check (gfx90a) when hipcc is installed (CI installs it), and a .hip consumer of the
#     installed ferry::hip.
# Usage: bash tests/run.sh        (from anywhere; builds under <repo>/build/test-*)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/cmake/setup-deps.sh"
ferry_install_deps test
py_flags=(-DFERRY_BUILD_PYTHON=OFF)
if ferry_install_python_deps; then
  py_flags=(-DFERRY_BUILD_PYTHON=ON "-DPython_EXECUTABLE=$("${PYTHON:-python3}" -c 'import sys; print(sys.executable)')")
  ferry_install_torch_deps || echo "ferry: torch is missing: the torch layer's tests do not run here" >&2
else
  echo "ferry: the Python package's dependencies are missing: its tests do not run here" >&2
fi

export PATH="/usr/local/cuda/bin:$PATH"
cuda_flags=(-DFERRY_ENABLE_CUDA=OFF)
if command -v nvcc > /dev/null; then
  archs=90
  [[ -n "${CI:-}" ]] && archs="80;90"
  cuda_flags=(-DFERRY_ENABLE_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$archs")
fi
jobs=$(nproc)
build="$root/build/test"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${cuda_flags[@]}" "${py_flags[@]}"
cmake --build "$build" -j"$jobs"

labels="host"
if command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; then
  export FERRY_REQUIRE_GPU=1
  labels="host|gpu"
fi
ctest --test-dir "$build" -L "$labels" --output-on-failure -j"$jobs" --timeout 900

# Reliability under sanitizers (clang-14): TSan/ASan stress, fault sweeps with LSan, bounded libFuzzer runs.
if command -v clang++-14 > /dev/null && [[ "${FERRY_SKIP_SANITIZERS:-0}" != 1 ]]; then
  bash "$root/tests/reliability/run_sanitizers.sh"
fi

if command -v hipcc > /dev/null && [[ "${FERRY_SKIP_HIP:-0}" != 1 ]]; then
  echo "== HIP compile check (gfx90a) =="
  cmake -S "$root" -B "$root/build/test-hip" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_ENABLE_CUDA=OFF \
        -DFERRY_ENABLE_HIP=ON -DCMAKE_HIP_ARCHITECTURES=gfx90a -DFERRY_BUILD_TESTS=OFF -DFERRY_BUILD_BENCH=OFF
  cmake --build "$root/build/test-hip" -j"$jobs"
  echo "HIP compile check: ferry::hip and the testing kernels built for gfx90a"
  # A .hip consumer (hipcc, gfx90a) against the installed ferry::hip: both sides run on the host backend.
  cmake -DFERRY_BINARY_DIR="$root/build/test-hip" -DCONSUMER_SOURCE_DIR="$root/tests/consumer" \
        -DWORK_DIR="$root/build/test-hip-consumer" -DMODE=install -DEXPECT_HIP=ON -DHIP_ARCHITECTURES=gfx90a \
        -DFERRY_CMAKE_DIR="$root/cmake" -P "$root/tests/consumer/run_consumer.cmake"
fi
