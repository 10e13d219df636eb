#!/usr/bin/env bash
# ferry's main demo/benchmark command (README): installs what it needs, builds, runs the D2H and H2D
# benchmarks, and ends with one screen (headline.py): ferry beside the designs it replaces, all
# measured in this run (D2H, in the simulated forward: copy only, per-entry st.release.sys, an event per
# hook polled by the CPU; H2D: one cudaMemcpyAsync per member, cudaMemcpyBatchAsync), and beside them the
# committed H200 run (docs/perf/h200/*.json, labelled with its commit and date) as the reference column.
# On a machine with an NVIDIA GPU it runs the CUDA benchmarks at full size; otherwise the same benchmarks on
# the host-emulated device at small sizes (same protocols and checks; the timings are of the emulation).
# Usage: bash bench/run.sh
# Writes to <repo>/build/bench-results/ (or $FERRY_BENCH_RESULTS): build.log, d2h.log and h2d.log (the raw benchmark output),
# d2h_gbench.json and h2d_gbench.json (Google Benchmark's JSON), d2h.json and h2d.json (the summaries,
# docs/perf/h200's format), and the plots (*.svg). Optional: $FERRY_ANCHORS, else shared/anchors-h200.md in
# or beside the repository, adds that file's figures as an extra "anchor" column (nothing needs it).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/cmake/setup-deps.sh"
ferry_install_deps bench

export PATH="/usr/local/cuda/bin:$PATH"
gpu=0
if command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1 && command -v nvcc > /dev/null; then gpu=1; fi
cuda_flags=(-DFERRY_ENABLE_CUDA=OFF)
((gpu)) && cuda_flags=(-DFERRY_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
# not build/bench: a top-level build/ tree has its own bench/ subdirectory. FERRY_BENCH_BUILD: an already
# configured tree to build the two binaries in instead (.ci/run passes tests/run.sh's, which has built them).
build=${FERRY_BENCH_BUILD:-$root/build/bench-run}
out=${FERRY_BENCH_RESULTS:-$root/build/bench-results}
mkdir -p "$out"
rm -f "$out"/*.json "$out"/*.log "$out"/*.svg
suffix=_host
((gpu)) && suffix=
where=$( ((gpu)) && echo GPU || echo "host-emulated device")

echo "ferry: building the benchmarks ($where; log: $out/build.log)"
if ! { { [[ -n ${FERRY_BENCH_BUILD:-} ]] ||
    cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_BUILD_TESTS=OFF "${cuda_flags[@]}"; } &&
  cmake --build "$build" -j"$(nproc)" --target ferry_bench_d2h$suffix ferry_bench_h2d$suffix; } > "$out/build.log" 2>&1; then
  tail -30 "$out/build.log"
  echo "ferry: build failed (log: $out/build.log)" >&2
  exit 1
fi

export FERRY_COMMIT=${FERRY_COMMIT:-$(git -C "$root" rev-parse --short HEAD 2> /dev/null || echo unknown)}
export FERRY_DATE=${FERRY_DATE:-$(date -u +%Y-%m-%dT%H:%M:%SZ)}
status=0
for side in d2h h2d; do
  bin="$build/bench/$side/ferry_bench_$side$suffix"
  args=(--benchmark_out="$out/${side}_gbench.json" --benchmark_out_format=json)
  [[ $side == h2d ]] && args+=(--ferry_json="$out/h2d.json")  # the H2D binary writes its own summary
  echo "ferry: running the $side benchmarks (log: $out/$side.log)"
  start=$SECONDS
  FERRY_COMMAND="$bin ${args[*]}" "$bin" "${args[@]}" > "$out/$side.log" 2>&1 || {
    status=1
    tail -5 "$out/$side.log"
    echo "ferry: $side benchmark failed or found a bad entry (log: $out/$side.log)" >&2
  }
  echo "ferry: $side done in $((SECONDS - start)) s"
done

py="$root/bench/device/reports"
if [[ -s $out/d2h_gbench.json ]]; then
  python3 "$py/run_files.py" d2h-summary "$out/d2h_gbench.json" "$out/d2h.json" ||
    status=1
fi
python3 "$py/perf_plots.py" "$out/d2h.json" "$out/h2d.json" "$out" || status=1

anchors=${FERRY_ANCHORS:-}
if [[ -z $anchors ]]; then
  for a in "$root/shared/anchors-h200.md" "$root/../shared/anchors-h200.md"; do
    [[ -f $a ]] && anchors=$(cd "$(dirname "$a")" && pwd)/$(basename "$a") && break
  done
fi
echo
echo "raw output: $out/{d2h,h2d}.log; JSON: $out/{d2h,h2d}.json (Google Benchmark's: *_gbench.json); plots: $out/*.svg"
python3 "$py/headline.py" "$out/d2h.json" "$out/h2d.json" ${anchors:+"$anchors"} || status=1
exit $status
