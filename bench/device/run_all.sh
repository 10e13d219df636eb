#!/usr/bin/env bash
# One device-tool call: bench/device/h200.sh with the given steps (+ "probe": the exploratory H2D upload
# probe), every output packed into $OUT/results.tgz (the device tool returns at most 8 files).
set -uo pipefail
final=${OUT:?}
export OUT=$final/r
mkdir -p "$OUT"
rc=0
steps=()
probe=0
for s in "$@"; do
  if [[ $s == probe ]]; then probe=1; else steps+=("$s"); fi
done
if ((${#steps[@]})); then bash bench/device/h200.sh "${steps[@]}" || rc=1; fi
if ((probe)); then
  /usr/local/cuda/bin/nvcc -O3 -std=c++17 -arch=sm_90 bench/device/probes/h2d_upload_probe.cu -o "$OUT/../probe.bin" &&
    "$OUT/../probe.bin" | tee "$OUT/h2d_upload_probe.txt"
  rm -f "$OUT/../probe.bin"
fi
tar czf "$final/results.tgz" -C "$final" r && rm -rf "$final/r"
exit $rc
