#!/usr/bin/env bash
# CI stage: ferry's reliability harnesses under sanitizers (clang-14; no GPU).
#   * ThreadSanitizer tree (build-tsan):  CI-mode stress (>= 10^6 D2H entries, H2D random steps), and the
#     host-backend GoogleTest suites (D2H channel, H2D publisher, backend contract, the safetensors sink and its write
#     pipeline (sink_units); the deliberate-race mutant halves are skipped there: tests/support/sanitizer.hpp)
#   * AddressSanitizer + libFuzzer tree (build-asan): fault sweeps (ASan/LSan), the stress, both fuzzers (bounded -runs)
# Ends with one line "reliability: N passed, M failed". FERRY_STRESS_NIGHTLY=1 raises the stress to 10^8 entries.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
jobs=${FERRY_JOBS:-2}
fuzz_runs=${FERRY_FUZZ_RUNS:-20000}
passed=0; failed=0
step() {  # step <name> <command...>
  local name=$1; shift
  local t0=$SECONDS
  echo "== $name"
  if "$@"; then passed=$((passed + 1)); echo "-- $name: passed ($((SECONDS - t0)) s)"
  else failed=$((failed + 1)); echo "-- $name: FAILED ($((SECONDS - t0)) s)"; fi
}
configure() {  # configure <dir> <flags> [extra cmake args]
  local dir=$1 flags=$2; shift 2
  CC=clang-14 CXX=clang++-14 cmake -S "$root" -B "$dir" -G Ninja -DFERRY_ENABLE_CUDA=OFF -DFERRY_BUILD_BENCH=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS=$flags" "$@" > "$dir.configure.log" 2>&1 \
    || { cat "$dir.configure.log"; return 1; }
}
mkdir -p "$root/build"
tsan="$root/build/tsan"; asan="$root/build/asan"
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
export ASAN_OPTIONS="detect_leaks=1 ${ASAN_OPTIONS:-}"
# -O1 and line tables (-gline-tables-only: file:line in every report) over RelWithDebInfo's -O2 -g: a third less build.
# The GoogleTest suites' own sources at -O0 (FERRY_HOST_TEST_FLAGS, as tests/run.sh's tree; sink_units stays
# optimized): d2h_host_test.cpp under TSan compiles in 29 s instead of 98 s, and its suite runs in about 48 s instead
# of 20 s, inside lane a's time beside lane b.
san_build_type=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only -DNDEBUG"
                -DFERRY_HOST_TEST_FLAGS=-O0)
step "configure+build tsan" bash -c "$(declare -f configure); root=$root; configure $tsan '-fsanitize=thread' \
  $(printf '%q ' "${san_build_type[@]}") && ninja -C $tsan -j$jobs ferry_rel_stress d2h_host h2d_host \
  backend_contract_host sink_host sink_units sink_assembler_host"
step "configure+build asan+fuzz" bash -c "$(declare -f configure); root=$root; configure $asan \
  '-fsanitize=address,fuzzer-no-link -fno-omit-frame-pointer' $(printf '%q ' "${san_build_type[@]}") \
  -DFERRY_RELIABILITY_FUZZ=ON && ninja -C $asan -j$jobs ferry_rel_stress ferry_rel_sweep ferry_rel_fuzz_h2d \
  ferry_rel_fuzz_d2h sink_host sink_assembler_host"
rel=tests/reliability
lane_a() {  # the TSan runs, then the ASan fault sweeps
  step "stress (tsan)" "$tsan/$rel/ferry_rel_stress"
  step "d2h host suite (tsan)" "$tsan/tests/d2h/d2h_host" --gtest_brief=1
  step "sink host suite (tsan)" "$tsan/tests/sink/sink_host" --gtest_brief=1
  step "sample assembler (tsan)" "$tsan/tests/sink/sink_assembler_host" --gtest_brief=1
  step "fault sweep d2h (asan/lsan)" "$asan/$rel/ferry_rel_sweep" d2h
  step "fault sweep h2d sticky (asan/lsan)" "$asan/$rel/ferry_rel_sweep" h2d
}
lane_b() {  # the write pipeline and the other TSan suites, the other ASan runs and the fuzzers (up to 60 s each)
  # the write pipeline's threads: shared file_writers, lent writes, errors on the I/O threads
  step "sink units (tsan)" "$tsan/tests/sink/sink_units" --gtest_brief=1
  step "h2d host suite (tsan)" "$tsan/tests/h2d/h2d_host" --gtest_brief=1
  # The contract's out-of-memory test asks the allocator for more than it can give: TSan must return null.
  step "backend contract host (tsan)" env TSAN_OPTIONS="$TSAN_OPTIONS allocator_may_return_null=1" \
    "$tsan/tests/backend/backend_contract_host" --gtest_brief=1
  step "stress quick (asan)" "$asan/$rel/ferry_rel_stress" --quick
  step "sink host suite (asan/lsan)" "$asan/tests/sink/sink_host" --gtest_brief=1
  step "sample assembler (asan/lsan)" "$asan/tests/sink/sink_assembler_host" --gtest_brief=1
  for f in h2d d2h; do
    work=$(mktemp -d); cp "$root/$rel/fuzz/corpus_$f"/* "$work/"
    step "fuzz $f ($fuzz_runs runs)" "$asan/$rel/ferry_rel_fuzz_$f" -runs="$fuzz_runs" -max_total_time=60 \
      -artifact_prefix="$asan/fuzz-$f-" "$work"
    rm -rf "$work"
  done
}
# Two lanes side by side (one core each on 2 cores), about 120 s each: the TSan stress and the D2H and sink suites,
# then the ASan sweeps; and the write pipeline and the other TSan suites, the other ASan runs and the fuzzers. Each
# lane into its own log, printed in order; the counts come from the lanes' "-- <step>: passed|FAILED" lines.
if ((failed == 0)); then
  lanes="$root/build/sanitizer-lanes"; mkdir -p "$lanes"
  (lane_a) > "$lanes/a.log" 2>&1 &  # subshells: their counts are read from the logs below
  lane_a_pid=$!
  (lane_b) > "$lanes/b.log" 2>&1
  wait "$lane_a_pid"
  for lane in a b; do
    cat "$lanes/$lane.log"
    passed=$((passed + $(grep -cE '^-- .*: passed \(' "$lanes/$lane.log")))
    failed=$((failed + $(grep -cE '^-- .*: FAILED \(' "$lanes/$lane.log")))
  done
fi
echo "reliability: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
