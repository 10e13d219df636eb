#!/usr/bin/env bash
# Copies the files docs/perf keeps from one device run (run_all.sh's results.tgz, or its unpacked r/
# folder) into docs/perf/h200 under the same names (a replaced JSON keeps the committed file's "targets" and
# "anchors" blocks: run_files.py carry), then rewrites docs/perf/README.md and its plots from docs/perf/h200's
# JSON (perf_page.py --write, the page's one command). Only the files the run produced are replaced. step_probe.json and capture_cost.json, also in docs/perf/h200,
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
tmp_old=$(mktemp)
kept=(d2h.json d2h_gbench.json h2d.json bench_d2h.log bench_h2d.log ctest_gpu.log sanitizers.txt gpu_stress.json
      gpu_stress.log h2d_upload_probe.txt h2d_scatter_probe.txt h2d_params_probe.txt torch_qwen3.json
      bench_qwen3.log pytest_gpu.log bench_sinks.log)
for f in "${kept[@]}"; do
  if [[ -f $src/$f ]]; then
    if [[ $f == *.json && -f $dst/$f ]]; then
      cp "$dst/$f" "$tmp_old"
      cp "$src/$f" "$dst/$f"
      python3 bench/device/reports/run_files.py carry "$tmp_old" "$dst/$f"
    else
      cp "$src/$f" "$dst/$f"
    fi
    if [[ $f == *.json ]]; then  # a stale file in the tarball shows here (the device may keep old outputs)
      echo "updated $dst/$f ($(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d.get("commit", "-"), d.get("date") or d.get("context", {}).get("date"))' "$src/$f" 2>/dev/null || echo "no commit/date"))"
    else
      echo "updated $dst/$f"
    fi
  fi
done
if [[ -f $src/sinks_raw.json || -f $src/eager_b1.json ]]; then
  python3 bench/device/reports/run_files.py sinks "$src/sinks_raw.json" "$src/eager_b1.json" "$dst/sinks.json"
fi
rm -f "$tmp_old"
python3 bench/device/reports/perf_page.py --write docs/perf/README.md --dir "$dst"
