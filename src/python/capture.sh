#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The main job (README's first command): installs ferry into a fresh virtual environment and captures a dataset.
#   1. Debian packages the build needs (cmake, ninja, g++; cmake/setup-deps.sh), when missing;
#   2. a fresh venv ($FERRY_VENV, default <repo>/build/venv; it sees the system's site-packages, so a torch
#      installed there is not downloaded twice) and `pip install ./src/python[engine]` into it WITH build
#      isolation (pip fetches scikit-build-core, nanobind and numpy for the build; torch and transformers for
#      the engine), with the CUDA backend where nvcc and an NVIDIA GPU are present;
#   3. `ferry capture` from the venv: transformers' continuous batching on the embedded default (a small
#      Qwen3-shaped model with seeded random weights, built-in prompts), per-request samples in
#      <repo>/build/ferry-samples (or --out), GPU if present, else CPU and ferry's host backend.
# Usage: bash src/python/capture.sh [ferry capture arguments, e.g. --preset all-layers --format shards]
#   (--format arrow: a Hugging Face dataset; the install adds the [arrow] extra, pyarrow)
#   FERRY_PIP_ARGS: more arguments for that pip install (word-split; tests/python/pip_install.sh builds at -O0)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$root/cmake/setup-deps.sh"
ferry_install_deps bench
py=${PYTHON:-python3}
venv=${FERRY_VENV:-$root/build/venv}
export PATH="/usr/local/cuda/bin:$PATH"
if command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1 && command -v nvcc > /dev/null; then
  export FERRY_PYTHON_CUDA=ON FERRY_CUDA_ARCHITECTURES=${FERRY_CUDA_ARCHITECTURES:-90}
fi
extras=engine
[[ " $* " == *" arrow "* || " $* " == *"--format=arrow"* ]] && extras=engine,arrow
echo "ferry: a fresh venv in $venv; pip install ./src/python[$extras] with build isolation" \
  "(CUDA backend: ${FERRY_PYTHON_CUDA:-OFF}; log: $venv.log)"
rm -rf "$venv"
"$py" -m venv --system-site-packages "$venv"
# shellcheck disable=SC2086
if ! "$venv/bin/python" -m pip install -q --config-settings=build-dir="$root/build/venv-build" ${FERRY_PIP_ARGS:-} \
  "$root/src/python[$extras]" > "$venv.log" 2>&1; then
  tail -30 "$venv.log"
  echo "ferry: pip install ./src/python failed (log: $venv.log)" >&2
  exit 1
fi
args=("$@")
if [[ " ${args[*]} " != *" --out "* ]]; then
  args+=(--out "$root/build/ferry-samples" --overwrite)
fi
cd "$root/build"
exec "$venv/bin/ferry" capture "${args[@]}"
