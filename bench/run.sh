#!/usr/bin/env bash
# ferry's main demo/benchmark command (README): installs what it needs, builds, runs the D2H and H2D
# benchmarks side by side. On a machine with an NVIDIA GPU it runs the CUDA benchmarks at full size and
# writes docs-style JSON summaries; otherwise it runs the same benchmarks on the host-emulated device at
# small sizes (the protocols and the checking are the same; the timings are of the emulation).
# Usage: bash bench/run.sh   (results in <repo>/build/bench-results/)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/cmake/setup-deps.sh"
ferry_install_deps bench

export PATH="/usr/local/cuda/bin:$PATH"
gpu=0
if command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1 && command -v nvcc > /dev/null; then gpu=1; fi
cuda_flags=(-DFERRY_ENABLE_CUDA=OFF)
((gpu)) && cuda_flags=(-DFERRY_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
build="$root/build/bench-run"  # not build/bench: a top-level build/ tree has its own bench/ subdirectory
out="$root/build/bench-results"
mkdir -p "$out"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_BUILD_TESTS=OFF "${cuda_flags[@]}"
suffix=_host
((gpu)) && suffix=
cmake --build "$build" -j"$(nproc)" --target ferry_bench_d2h$suffix ferry_bench_h2d$suffix

export FERRY_COMMIT=${FERRY_COMMIT:-$(git -C "$root" rev-parse --short HEAD 2> /dev/null || echo unknown)}
export FERRY_DATE=${FERRY_DATE:-$(date -u +%Y-%m-%dT%H:%M:%SZ)}
status=0
for side in d2h h2d; do
  bin="$build/bench/$side/ferry_bench_$side$suffix"
  echo "== $side ($([[ $gpu == 1 ]] && echo GPU || echo host-emulated device)) =="
  FERRY_COMMAND="$bin --ferry_json=$out/$side.json" "$bin" --ferry_json="$out/$side.json" || status=1
done
echo "JSON summaries: $out/d2h.json $out/h2d.json"
exit $status
