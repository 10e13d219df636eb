#!/usr/bin/env bash
# Build, test and benchmark ferry on the lent H200 (device tool). Writes logs and JSON under $OUT.
# Usage (from the repo root on the device machine):
#   bash bench/device/drivers/h200.sh [steps...]   steps: tests memcheck synccheck initcheck bench stress python qwen3
#                                          qwen3cb stepprobe select sinks eager reduce arrow pybuild
#                                          (default: tests memcheck synccheck initcheck bench)
# pybuild: only build, the Python package included (engine.sh then reuses build-h200, see FERRY_ENGINE_PYTHONPATH);
# python: the Python package with the CUDA backend (+ the torch ops where torch imports), its pytest suite on
# the GPU (pytest_gpu.log; FERRY_PYTEST_TIMEOUT default 900 s: the suite takes more than one device call,
# so run it under detach.sh); qwen3: bench/torch/qwen3_capture.py, the Qwen3-0.6B-shaped decode benchmark
# (torch_qwen3.json, bench_qwen3.log); qwen3cb: bench/torch/qwen3_cb.py, selective capture under continuous
# batching at B=64 (qwen3_cb.json, bench_qwen3_cb.log; FERRY_QWEN3CB_ARGS, FERRY_QWEN3CB_TIMEOUT default 240 s);
# sinks: bench/sink's ferry_bench_sinks, the native sinks of issue 28 (sinks_raw.json, bench_sinks.log; FERRY_SINKS_ARGS,
# e.g. --volume-gib 16, FERRY_SINKS_TIMEOUT default 300 s; the build always includes ferry_bench_sinks); reduce:
# bench/torch/reduce_bench.py, reducers at t256 and the prefill mean (reduce.json, bench_reduce.log;
# FERRY_REDUCE_ARGS, FERRY_REDUCE_TIMEOUT default 300 s); arrow: bench/torch/arrow_bench.py, the Arrow sink's rate
# against the disk (build-h200/arrow-run; arrow.json, bench_arrow.log; FERRY_ARROW_ARGS, FERRY_ARROW_TIMEOUT 300 s).
# Output names are the ones docs/perf/h200 keeps (bench_d2h.log, d2h.json, ..., ctest_gpu.log,
# sanitizers.txt, gpu_stress.{json,log}); bench/device/drivers/publish.sh copies them there.
# FERRY_BENCH (d2h, h2d or both), FERRY_BENCH_ARGS (e.g. --benchmark_filter=...), FERRY_BENCH_TIMEOUT
# (default 330 s per binary), FERRY_SANITIZER_TIMEOUT (default 150 s per compute-sanitizer run),
# FERRY_ANCHORS (optional: shared/anchors-h200.md adds an "anchor" column to the headline; without it the headline shows this run beside the committed docs/perf/h200 results).
set -uo pipefail
steps=" ${*:-tests memcheck synccheck initcheck bench} "
has() { [[ $steps == *" $1 "* ]]; }
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export FERRY_REQUIRE_GPU=1
export FERRY_COMMIT=${FERRY_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export FERRY_DATE=${FERRY_DATE:-$(date -u +%Y-%m-%dT%H:%M:%SZ)}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
jobs=$(nproc)
py_flags=()
if has python || has qwen3 || has qwen3cb || has stepprobe || has eager || has reduce || has arrow || has pybuild; then
  py_flags=(-DFERRY_BUILD_PYTHON=ON -DFERRY_PYTHON_CUDA=ON "-DPython_EXECUTABLE=$(python3 -c 'import sys; print(sys.executable)')")
fi
cmake -S . -B build-h200 -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DFERRY_ENABLE_CUDA=ON "${py_flags[@]}" > "$OUT/configure.log" 2>&1 || { tail -40 "$OUT/configure.log"; exit 1; }
targets=${FERRY_BUILD_TARGETS:-}
if [[ -n $targets ]] && has sinks && [[ " $targets " != *" ferry_bench_sinks "* ]]; then targets+=" ferry_bench_sinks"; fi
cmake --build build-h200 -j"$jobs" ${targets:+--target $targets} > "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -40; exit 1; }
rc=0
if has select; then
  # selective capture (issue 27): bench/d2h/select.cpp; select_raw.json (medians) and bench_select.log (spreads)
  bin=build-h200/bench/d2h/ferry_bench_select
  FERRY_COMMAND="$bin" timeout "${FERRY_SELECT_TIMEOUT:-300}" "$bin" > "$OUT/select_raw.json" 2> "$OUT/bench_select.log" || rc=1
  tail -20 "$OUT/bench_select.log"
fi
if has sinks; then
  # native sinks (issue 28): bench/sink; the JSON on stdout (sinks_raw.json: run_files.py sinks merges it into
  # docs/perf/h200/sinks.json), the log on stderr (bench_sinks.log, after the disk and /dev/shm the run found).
  # The shards go to build-h200/bench/sink/sinks-run (the disk, not /dev/shm) and are removed after the check.
  bin=build-h200/bench/sink/ferry_bench_sinks
  df -h build-h200 /dev/shm > "$OUT/bench_sinks.log" 2>&1
  # shellcheck disable=SC2086
  FERRY_COMMAND="$bin ${FERRY_SINKS_ARGS:-}" timeout "${FERRY_SINKS_TIMEOUT:-300}" "$bin" ${FERRY_SINKS_ARGS:-} \
    > "$OUT/sinks_raw.json" 2>> "$OUT/bench_sinks.log" || rc=1
  tail -25 "$OUT/bench_sinks.log"
fi
if has bench; then
  # Names as docs/perf/h200 keeps them: d2h.json (summary), d2h_gbench.json (Google Benchmark's JSON),
  # bench_d2h.log; h2d.json, h2d_gbench.json, bench_h2d.log.
  for side in ${FERRY_BENCH:-d2h h2d}; do
    bin=build-h200/bench/$side/ferry_bench_$side
    [[ -x $bin ]] || continue
    args=(--benchmark_out="$OUT/${side}_gbench.json" --benchmark_out_format=json)
    [[ $side == h2d ]] && args+=(--ferry_json="$OUT/h2d.json")
    # shellcheck disable=SC2086
    FERRY_COMMAND="$bin ${args[*]} ${FERRY_BENCH_ARGS:-}" timeout "${FERRY_BENCH_TIMEOUT:-330}" "$bin" "${args[@]}" \
      ${FERRY_BENCH_ARGS:-} > "$OUT/bench_$side.log" 2>&1 || rc=1
    if [[ $side == d2h && -s $OUT/d2h_gbench.json ]]; then
      python3 bench/device/reports/run_files.py d2h-summary "$OUT/d2h_gbench.json" "$OUT/d2h.json" || rc=1
    fi
    tail -3 "$OUT/bench_$side.log"
  done
  anchors=${FERRY_ANCHORS:-shared/anchors-h200.md}
  python3 bench/device/reports/headline.py "$OUT/d2h.json" "$OUT/h2d.json" "$anchors"
fi
if has tests; then
  ctest --test-dir build-h200 -L gpu ${FERRY_CTEST_EXCLUDE:+-E $FERRY_CTEST_EXCLUDE} --output-on-failure -j4 --timeout "${FERRY_TEST_TIMEOUT:-60}" > "$OUT/ctest_gpu.log" 2>&1 || rc=1
  grep -E "tests passed|tests failed|Failed|Skipped" "$OUT/ctest_gpu.log" | tail -15
fi
if has stress; then
  # D2H stress on the GPU with an L2-hammering kernel beside it (tests/reliability/gpu_stress)
  bin=build-h200/tests/reliability/gpu_stress/ferry_gpu_stress
  timeout "${FERRY_STRESS_TIMEOUT:-200}" "$bin" --entries "${FERRY_GPU_STRESS_ENTRIES:-10000000}" --json "$OUT/gpu_stress.json" \
    > "$OUT/gpu_stress.log" 2>&1 || rc=1
  tail -12 "$OUT/gpu_stress.log"
fi
if has python; then
  PYTHONPATH=$PWD/build-h200/src/python FERRY_TEST_SINK_DIR=$PWD/build-h200/tests/python/native_sink FERRY_PYTHON_BACKEND=cuda timeout "${FERRY_PYTEST_TIMEOUT:-900}" \
    python3 -m pytest -q -rs tests/python > "$OUT/pytest_gpu.log" 2>&1 || rc=1
  tail -15 "$OUT/pytest_gpu.log"
fi
if has qwen3; then
  cmd="python3 bench/torch/qwen3_capture.py --out $OUT/torch_qwen3.json ${FERRY_QWEN3_ARGS:-}"
  # shellcheck disable=SC2086
  PYTHONPATH=$PWD/build-h200/src/python FERRY_COMMAND="$cmd" timeout "${FERRY_QWEN3_TIMEOUT:-420}" $cmd \
    > "$OUT/bench_qwen3.log" 2>&1 || rc=1
  tail -30 "$OUT/bench_qwen3.log"
fi
if has qwen3cb; then
  # selective capture under continuous batching (issue 27): ferry rows vs capture-all-then-select-on-the-CPU vs
  # torch index_select + pinned copies, B=64 graphed decode; every delivered row checked (about 1-2 minutes)
  cmd="python3 bench/torch/qwen3_cb.py --out $OUT/qwen3_cb.json ${FERRY_QWEN3CB_ARGS:-}"
  # shellcheck disable=SC2086
  PYTHONPATH=$PWD/build-h200/src/python FERRY_COMMAND="$cmd" timeout "${FERRY_QWEN3CB_TIMEOUT:-240}" $cmd \
    > "$OUT/bench_qwen3_cb.log" 2>&1 || rc=1
  tail -20 "$OUT/bench_qwen3_cb.log"
fi
if has eager; then
  # eager B=1 capture with a native sink running (issue 28): bench/torch/qwen3_eager.py (eager_b1.json,
  # bench_eager.log; FERRY_EAGER_ARGS, FERRY_EAGER_TIMEOUT default 420 s)
  cmd="python3 bench/torch/qwen3_eager.py --out $OUT/eager_b1.json ${FERRY_EAGER_ARGS:-}"
  # shellcheck disable=SC2086
  PYTHONPATH=$PWD/build-h200/src/python FERRY_COMMAND="$cmd" timeout "${FERRY_EAGER_TIMEOUT:-420}" $cmd \
    > "$OUT/bench_eager.log" 2>&1 || rc=1
  tail -20 "$OUT/bench_eager.log"
fi
if has reduce; then
  # reducers against whole capture (issue 41): t256 whole / topk64 / fp8_topk64, a per-request prefill mean; every
  # reduced entry checked against torch
  cmd="python3 bench/torch/reduce_bench.py --out $OUT/reduce.json ${FERRY_REDUCE_ARGS:-}"
  # shellcheck disable=SC2086
  PYTHONPATH=$PWD/build-h200/src/python:$PWD/bench/torch FERRY_COMMAND="$cmd" timeout "${FERRY_REDUCE_TIMEOUT:-300}" \
    $cmd > "$OUT/bench_reduce.log" 2>&1 || rc=1
  tail -20 "$OUT/bench_reduce.log"
fi
if has arrow; then
  # the Arrow sink (issue 41) against the disk it writes to, every row read back (arrow.json, bench_arrow.log)
  cmd="python3 bench/torch/arrow_bench.py --dir $PWD/build-h200/arrow-run --out $OUT/arrow.json ${FERRY_ARROW_ARGS:-}"
  # shellcheck disable=SC2086
  PYTHONPATH=$PWD/build-h200/src/python:$PWD/bench/torch FERRY_COMMAND="$cmd" timeout "${FERRY_ARROW_TIMEOUT:-300}" \
    $cmd > "$OUT/bench_arrow.log" 2>&1 || rc=1
  tail -5 "$OUT/bench_arrow.log"
fi
if has stepprobe; then
  # where the capture cost of the graphed decode step goes (bench/torch/step_probe.py; step_probe.json)
  cmd="python3 bench/torch/step_probe.py --out $OUT/step_probe.json ${FERRY_STEPPROBE_ARGS:---profile}"
  # shellcheck disable=SC2086
  PYTHONPATH=$PWD/build-h200/src/python timeout "${FERRY_STEPPROBE_TIMEOUT:-300}" $cmd > "$OUT/step_probe.log" 2>&1 || rc=1
  tail -60 "$OUT/step_probe.log"
fi
for tool in memcheck synccheck initcheck; do
  has $tool || continue
  # compute-sanitizer over the GPU test binaries
  for bin in build-h200/tests/*/*_cuda; do
    [[ -x $bin ]] || continue
    name=$(basename "$bin")
    {
      # Tests in which a kernel spins until the CPU stores a flag (stalled-stream tests) deadlock under a
      # sanitizer that serializes launches/queries; they are excluded from the sanitizer runs only.
      # ProgrammaticLaunchJoinsLikeStreamOrder's mutant half needs kernels to overlap under programmatic
      # launch; the sanitizers serialize launches, so the race it must catch cannot happen there. The same
      # holds for BranchPublishWaitsForTheFork's and BranchReleaseWaitsForTheGather's mutants (a release racing
      # the copies on another stream).
      filter="-*EventCompletesOnlyWhenReached*:*CrossStreamWaitOrdersTheWaiter*:*HostReleaseDeviceAcquire*:*Stall*:*Delayed*:*BeforeAcquire*:*BlocksThenTimesOut*:*ProgrammaticLaunchJoins*:*BranchPublishWaits*:*BranchReleaseWaits*"
      # Deliberately failing API calls (error-propagation tests) are not memory errors: --report-api-errors no.
      timeout "${FERRY_SANITIZER_TIMEOUT:-150}" compute-sanitizer --tool $tool --error-exitcode=1 --print-limit 20 --report-api-errors no "$bin" \
        --gtest_brief=1 --gtest_filter="$filter" > "$OUT/sanitizer_${name}_${tool}.log" 2>&1
      s=$?
      echo "compute-sanitizer $tool $name: exit $s ($(grep -E 'ERROR SUMMARY|tests ran|PASSED|FAILED' "$OUT/sanitizer_${name}_${tool}.log" | tr '\n' ' '))"
      { echo "== sanitizer_${name}_${tool}.log (exit $s)"; grep -E 'ERROR SUMMARY|PASSED|FAILED' "$OUT/sanitizer_${name}_${tool}.log"; } >> "$OUT/sanitizers.txt"
      [[ $s -eq 0 ]] || rc=1
    }
  done
done
exit $rc
