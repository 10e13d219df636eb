#!/usr/bin/env bash
# Copies the files docs/perf keeps from one device run (run_all.sh's results.tgz, or its unpacked r/
# folder) into docs/perf/h200 under the same names, redraws the plots and rewrites every generated block of
# docs/perf/README.md (targets, selective capture, native sinks, D2H, H2D, torch) from docs/perf/h200's JSON.
# Only the files the run produced are replaced. step_probe.json and capture_cost.json, also in docs/perf/h200,
# are not among the names copied here. sinks.json is merged, not copied: the run's sinks_raw.json (h200.sh sinks)
# and eager_b1.json (the eager B=1 Python benchmark), whichever the run has, replace their blocks of it.
# Usage (repo root): bash bench/device/drivers/publish.sh <results.tgz | results dir>
set -euo pipefail
src=${1:?usage: bash bench/device/drivers/publish.sh <results.tgz | results dir>}
if [[ -f $src ]]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  tar xzf "$src" -C "$tmp"
  src=$tmp/r
fi
dst=docs/perf/h200
kept=(d2h.json d2h_gbench.json h2d.json bench_d2h.log bench_h2d.log ctest_gpu.log sanitizers.txt gpu_stress.json
      gpu_stress.log h2d_upload_probe.txt h2d_scatter_probe.txt h2d_params_probe.txt torch_qwen3.json
      bench_qwen3.log pytest_gpu.log bench_sinks.log)
for f in "${kept[@]}"; do
  if [[ -f $src/$f ]]; then
    cp "$src/$f" "$dst/$f"
    if [[ $f == *.json ]]; then  # a stale file in the tarball shows here (the device may keep old outputs)
      echo "updated $dst/$f ($(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d.get("commit", "-"), d.get("date") or d.get("context", {}).get("date"))' "$src/$f" 2>/dev/null || echo "no commit/date"))"
    else
      echo "updated $dst/$f"
    fi
  fi
done
if [[ -f $src/sinks_raw.json || -f $src/eager_b1.json ]]; then
  python3 bench/device/reports/perf_tables.py sinks "$src/sinks_raw.json" "$src/eager_b1.json" "$dst/sinks.json"
fi
python3 bench/device/reports/perf_tables.py sinks-tables "$dst/sinks.json" --write docs/perf/README.md
python3 bench/device/reports/perf_tables.py select-tables "$dst/select.json" --write docs/perf/README.md
python3 bench/device/reports/perf_plots.py "$dst/d2h.json" "$dst/h2d.json" docs/perf
python3 bench/device/reports/perf_tables.py tables "$dst/d2h.json" "$dst/h2d.json" --write docs/perf/README.md
if [[ -f $dst/torch_qwen3.json ]]; then
  python3 bench/device/reports/torch_tables.py "$dst/torch_qwen3.json" --plot docs/perf/torch_qwen3.svg --write docs/perf/README.md
fi
python3 bench/device/reports/targets.py "$dst" --write docs/perf/README.md
