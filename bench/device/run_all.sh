#!/usr/bin/env bash
# One device-tool call: bench/device/h200.sh with the given steps (+ "probe": every exploratory probe in
# bench/device/probes/, or "probe=<name>": one), every output packed into $OUT/results.tgz (the device tool
# returns at most 8 files).
set -uo pipefail
final=${OUT:?}
export OUT=$final/r
mkdir -p "$OUT"
rc=0
steps=()
probes=()
for s in "$@"; do
  case $s in
    probe) probes+=(bench/device/probes/*.cu) ;;
    probe=*) probes+=("bench/device/probes/${s#probe=}.cu") ;;
    *) steps+=("$s") ;;
  esac
done
if ((${#steps[@]})); then bash bench/device/h200.sh "${steps[@]}" || rc=1; fi
for p in "${probes[@]}"; do
  n=$(basename "$p" .cu)
  { /usr/local/cuda/bin/nvcc -O3 -std=c++20 -arch=sm_90 -I include -I kernels "$p" -o "$OUT/../$n.bin" &&
    "$OUT/../$n.bin" | tee "$OUT/$n.txt"; } || rc=1
  rm -f "$OUT/../$n.bin"
done
tar czf "$final/results.tgz" -C "$final" r && rm -rf "$final/r"
exit $rc
