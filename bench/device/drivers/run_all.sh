#!/usr/bin/env bash
# One device-tool call: bench/device/drivers/h200.sh with the given steps (+ "probe": every exploratory probe in
# bench/device/probes/, or "probe=<name>": one; + "demo": the README's `bash bench/run.sh`, its results under
# bench-results/), every output packed into $OUT/results.tgz (the device tool returns at most 8 files).
# Example: FERRY_COMMIT=$(git rev-parse --short HEAD) bash bench/device/drivers/run_all.sh tests bench stress memcheck
# Then, on the development machine: bash bench/device/drivers/publish.sh <results.tgz> (copies the files docs/perf keeps).
set -uo pipefail
final=${OUT:?}
export OUT=$final/r
mkdir -p "$OUT"
rc=0
steps=()
probes=()
demo=0
for s in "$@"; do
  case $s in
    probe) probes+=(bench/device/probes/*.cu) ;;
    probe=*) probes+=("bench/device/probes/${s#probe=}.cu") ;;
    demo) demo=1 ;;
    *) steps+=("$s") ;;
  esac
done
if ((${#steps[@]})); then bash bench/device/drivers/h200.sh "${steps[@]}" || rc=1; fi
if ((demo)); then FERRY_BENCH_RESULTS=$OUT/bench-results bash bench/run.sh || rc=1; fi
for p in "${probes[@]}"; do
  n=$(basename "$p" .cu)
  { /usr/local/cuda/bin/nvcc -O3 -std=c++20 -arch=sm_90 -I include -I kernels "$p" -o "$OUT/../$n.bin" &&
    "$OUT/../$n.bin" | tee "$OUT/$n.txt"; } || rc=1
  rm -f "$OUT/../$n.bin"
done
tar czf "$final/results.tgz" -C "$final" r && rm -rf "$final/r"
exit $rc
