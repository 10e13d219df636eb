#!/usr/bin/env bash
# ferry's test command (README): installs what it needs, builds, runs every test that this machine can run.
#   * host-labelled tests always (backend contract on the host-emulated device, D2H/H2D protocols,
#     consumer projects against the install and build trees, the PTX memory-ordering check);
#   * gpu-labelled tests too when an NVIDIA GPU is present (FERRY_REQUIRE_GPU=1: a skip is a failure); without
#     one their binaries and the CUDA benchmarks are not built (FERRY_BUILD_GPU_BINARIES=OFF), the device code
#     still is (ferry::cuda for sm_90, and sm_80 in CI);
#   * the Python package's tests (pytest, tests/python, label host;python) when its build dependencies
#     (nanobind, scikit-build-core, numpy, pytest: from PyPI) can be imported or pip-installed; with torch
#     and transformers (PyPI, skipped with FERRY_SKIP_TORCH=1) also the torch ops, hooks and presets tests;
#   * the Python surface under atheris (tests/python/fuzz: its corpus, then a bounded random run) when the
#     Python package was built and atheris (PyPI, CPython <= 3.11) can be imported or pip-installed;
#   * the HIP compile check (gfx90a) when hipcc is installed (CI installs it), and a .hip consumer of the
#     installed ferry::hip.
# Every stage's output goes to build/test-logs/<stage>.log (a failing stage prints its tail); the run ends with
# one summary screen (every stage: passed / failed / skipped, its count, where its log is) and the line
# "N passed, M failed".
# Usage: bash tests/run.sh        (from anywhere; builds under <repo>/build/test-*)
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/cmake/setup-deps.sh"
logs="$root/build/test-logs"
mkdir -p "$logs"
names=() results=() counts=() times=() logfiles=()
passed=0 failed=0

# record NAME RESULT COUNT SECONDS LOG: one row of the summary screen.
record() {
  names+=("$1") results+=("$2") counts+=("$3") times+=("$4") logfiles+=("$5")
}
# stage NAME LOGNAME COMMAND...: runs COMMAND with its output in build/test-logs/LOGNAME.log; a failure prints
# the log's tail. Counts one test per stage unless the stage's runner reported counts (ctest, reliability).
stage() {
  local name=$1 log="$logs/$2.log" t0=$SECONDS rc=0 count="" p=1 f=0 line
  shift 2
  echo "ferry: $name ... (log: ${log#"$root"/})"
  "$@" > "$log" 2>&1 || rc=$?
  if line=$(grep -E "^[0-9]+% tests passed, [0-9]+ tests failed out of [0-9]+" "$log" | tail -1) && [[ -n $line ]]; then
    f=$(sed -E 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\1/' <<< "$line")
    p=$(($(sed -E 's/.*out of ([0-9]+).*/\1/' <<< "$line") - f))
    count="$p/$((p + f)) tests"
  elif line=$(grep -E "^reliability: [0-9]+ passed, [0-9]+ failed" "$log" | tail -1) && [[ -n $line ]]; then
    p=$(sed -E 's/reliability: ([0-9]+) passed.*/\1/' <<< "$line")
    f=$(sed -E 's/.* ([0-9]+) failed.*/\1/' <<< "$line")
    count="$p/$((p + f)) runs"
  elif ((rc != 0)); then
    p=0 f=1
  fi
  ((rc != 0 && f == 0)) && f=1
  passed=$((passed + p)) failed=$((failed + f))
  if ((rc == 0)); then
    record "$name" passed "$count" $((SECONDS - t0)) "${log#"$root"/}"
  else
    echo "ferry: $name FAILED (exit $rc); the end of ${log#"$root"/}:" >&2
    tail -40 "$log" >&2
    grep -A30 "The following tests FAILED" "$log" >&2 || true
    record "$name" FAILED "$count" $((SECONDS - t0)) "${log#"$root"/}"
  fi
  return $rc
}
skip() { record "$1" skipped "" 0 "$2"; }

ferry_install_deps test
py_flags=(-DFERRY_BUILD_PYTHON=OFF)
python_note="not built: its dependencies (nanobind, scikit-build-core, numpy, pytest) are missing"
if ferry_install_python_deps; then
  py_flags=(-DFERRY_BUILD_PYTHON=ON "-DPython_EXECUTABLE=$("${PYTHON:-python3}" -c 'import sys; print(sys.executable)')")
  python_note="built, tested by ctest's python.pytest.{core,engine,tp,bench} and python.pip_install"
  if ! ferry_install_torch_deps; then
    python_note="$python_note; torch missing or FERRY_SKIP_TORCH=1: the torch layer's tests skip"
  fi
fi
echo "ferry: Python package: $python_note"

export PATH="/usr/local/cuda/bin:$PATH"
gpu=0
if command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; then gpu=1; fi
cuda_flags=(-DFERRY_ENABLE_CUDA=OFF)
gpu_note="no CUDA compiler: host only"
if command -v nvcc > /dev/null; then
  archs=90
  [[ -n "${CI:-}" ]] && archs="80;90"
  # Without a GPU the gpu-only test and benchmark binaries are not built (nothing here could run them); ferry::cuda,
  # the docs' nvcc check, the PTX check and the CUDA consumer still compile the device code for $archs.
  cuda_flags=(-DFERRY_ENABLE_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$archs" "-DFERRY_BUILD_GPU_BINARIES=$((gpu))"
              "-DCMAKE_CUDA_FLAGS_RELWITHDEBINFO=-O2 -DNDEBUG -Xcompiler=-g1")
  gpu_note="CUDA for sm_${archs//;/, sm_}; gpu-only binaries $( ((gpu)) && echo "built and run" || echo "not built (no GPU)")"
fi
jobs=$(nproc)
build="$root/build/test"
ok=1
# -g1 (line tables: file:line in backtraces and sanitizer reports, no variable info) builds in two thirds of -g's time.
# The host GoogleTest suites' own sources at -O0 (FERRY_HOST_TEST_FLAGS): a third of -O2's compile time; the library
# they test (ferry_core), the benchmarks and the reliability harnesses stay at -O2.
stage "configure" configure cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" -DFERRY_HOST_TEST_FLAGS=-O0 "${cuda_flags[@]}" \
  "${py_flags[@]}" || ok=0
((ok)) && { stage "build" build cmake --build "$build" -j"$jobs" || ok=0; }

labels="host"
if ((gpu)); then
  export FERRY_REQUIRE_GPU=1
  labels="host|gpu"
fi
if ((ok)); then
  stage "ctest ($labels)" ctest ctest --test-dir "$build" -L "$labels" --output-on-failure -j"$jobs" --timeout 900
else
  skip "ctest ($labels)" "(the build failed)"
fi

# The HIP compile check and its consumer (hipcc, gfx90a) run in the background beside the atheris stage (one
# process: the other core), in a subshell whose summary rows are added after it ($logs/hip.rows).
hip_pid=""
if command -v hipcc > /dev/null && [[ "${FERRY_SKIP_HIP:-0}" != 1 ]]; then
  hip_check() {
    cmake -S "$root" -B "$root/build/test-hip" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_ENABLE_CUDA=OFF \
          -DFERRY_ENABLE_HIP=ON -DCMAKE_HIP_ARCHITECTURES=gfx90a -DFERRY_BUILD_TESTS=OFF -DFERRY_BUILD_BENCH=OFF &&
      cmake --build "$root/build/test-hip" -j"$jobs" &&
      echo "HIP compile check: ferry::hip and the testing kernels built for gfx90a"
  }
  # A .hip consumer (hipcc, gfx90a) against the installed ferry::hip: both sides run on the host backend.
  hip_consumer() {
    cmake -DFERRY_BINARY_DIR="$root/build/test-hip" -DCONSUMER_SOURCE_DIR="$root/tests/consumer" \
          -DWORK_DIR="$root/build/test-hip-consumer" -DMODE=install -DEXPECT_HIP=ON -DHIP_ARCHITECTURES=gfx90a \
          -DFERRY_CMAKE_DIR="$root/cmake" -P "$root/tests/consumer/run_consumer.cmake"
  }
  rm -f "$logs/hip.rows"
  (
    names=() results=() counts=() times=() logfiles=() passed=0 failed=0
    if stage "HIP compile check (gfx90a)" hip hip_check; then
      stage "HIP consumer (.hip, installed ferry::hip)" hip-consumer hip_consumer
    else
      skip "HIP consumer (.hip, installed ferry::hip)" "(the HIP build failed)"
    fi
    hip_names=("${names[@]}") hip_results=("${results[@]}") hip_counts=("${counts[@]}") hip_times=("${times[@]}")
    hip_logfiles=("${logfiles[@]}") hip_passed=$passed hip_failed=$failed
    declare -p hip_names hip_results hip_counts hip_times hip_logfiles hip_passed hip_failed > "$logs/hip.rows"
  ) &
  hip_pid=$!
fi
# hip_rows: waits for the HIP stages and adds their rows and counts (a subshell that left none: one failure).
hip_rows() {
  if [[ -z $hip_pid ]]; then
    skip "HIP compile check (gfx90a)" "(hipcc missing or FERRY_SKIP_HIP=1)"
    return
  fi
  wait "$hip_pid"
  if [[ ! -s $logs/hip.rows ]]; then
    record "HIP compile check (gfx90a)" FAILED "" 0 "build/test-logs/hip.log"
    failed=$((failed + 1))
    return
  fi
  source "$logs/hip.rows"
  for i in "${!hip_names[@]}"; do
    record "${hip_names[$i]}" "${hip_results[$i]}" "${hip_counts[$i]}" "${hip_times[$i]}" "${hip_logfiles[$i]}"
  done
  passed=$((passed + hip_passed)) failed=$((failed + hip_failed))
}

# The Python surface under atheris (tests/python/fuzz/run.sh: the corpus, then a bounded random run).
if ((!ok)); then
  skip "python fuzz (atheris)" "(the build failed)"
elif [[ ${py_flags[0]} != -DFERRY_BUILD_PYTHON=ON ]]; then
  skip "python fuzz (atheris)" "(the Python package was not built)"
elif ferry_install_fuzz_deps; then
  stage "python fuzz (atheris)" python-fuzz bash "$root/tests/python/fuzz/run.sh" --build "$build"
else
  skip "python fuzz (atheris)" "(atheris not importable: pip install atheris, CPython <= 3.11)"
fi

hip_rows

# Reliability under sanitizers (clang-14): TSan/ASan stress, fault sweeps with LSan, bounded libFuzzer runs.
if command -v clang++-14 > /dev/null && [[ "${FERRY_SKIP_SANITIZERS:-0}" != 1 ]]; then
  stage "sanitizers (tsan, asan, fuzz)" sanitizers bash "$root/tests/reliability/run_sanitizers.sh"
else
  skip "sanitizers (tsan, asan, fuzz)" "(clang-14 missing or FERRY_SKIP_SANITIZERS=1)"
fi

echo
echo "=================================================== ferry tests: summary ==================================================="
printf '%-44s %-8s %-14s %7s  %s\n' stage result count time log
for i in "${!names[@]}"; do
  printf '%-44s %-8s %-14s %6ss  %s\n' "${names[$i]}" "${results[$i]}" "${counts[$i]}" "${times[$i]}" "${logfiles[$i]}"
done
echo "Python package: $python_note"
echo "CUDA: $gpu_note"
echo "============================================================================================================================"
echo "$passed passed, $failed failed"
((failed == 0))
