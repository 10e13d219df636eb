#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Python fuzz stage (docs/testing.md, "Python fuzzing (atheris)"): tests/python/fuzz/fuzz_ferry.py on the
# host backend, against a CMake build with FERRY_BUILD_PYTHON=ON (default build/test, as tests/run.sh builds it):
#   1. regression: every seed of tests/python/fuzz/corpus/ once;
#   2. a bounded random run from that corpus: FERRY_PY_FUZZ_RUNS inputs (1500), at most FERRY_PY_FUZZ_SECONDS (90),
#      libFuzzer seed FERRY_PY_FUZZ_SEED (1; 0 = a new one each run).
# Every input is bounded by -timeout=10 s and the run by -rss_limit_mb=3072. Findings (crash-*, timeout-*, oom-*)
# and the inputs the random run adds go to build/test-logs/python-fuzz/ (FERRY_PY_FUZZ_OUT), never into the source
# tree. Ends with one line "python fuzz: N inputs (...), M findings"; exits non-zero on a finding.
# Usage: tests/python/fuzz/run.sh [--build <build-dir>] [extra libFuzzer flags for the random run]
# Replay one finding: PYTHONPATH=<build>/src/python FERRY_FUZZ_TRACE=1 python tests/python/fuzz/fuzz_ferry.py <crash-file>
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
build="$root/build/test"
if [[ ${1:-} == --build ]]; then
  build=${2:-}
  shift 2
fi
if [[ ! -d $build/src/python/ferry ]]; then
  echo "tests/python/fuzz/run.sh: expected --build <a CMake build dir with src/python/ferry>, got '$build'" >&2
  exit 2
fi
build="$(cd "$build" && pwd)"
py=${PYTHON:-python3}
export PYTHONPATH="$build/src/python${PYTHONPATH:+:$PYTHONPATH}"
export FERRY_TEST_SINK_DIR="${FERRY_TEST_SINK_DIR:-$build/tests/python/native_sink}"
export FERRY_PYTHON_BACKEND=host
if ! "$py" -c "import atheris" > /dev/null 2>&1; then
  echo "tests/python/fuzz/run.sh: expected atheris importable by $py (pip install atheris), got none" >&2
  exit 2
fi

out="${FERRY_PY_FUZZ_OUT:-$root/build/test-logs/python-fuzz}"
rm -rf "$out/corpus" "$out/findings" "$out/corpus.log" "$out/random.log"
mkdir -p "$out/corpus" "$out/findings"
runs=${FERRY_PY_FUZZ_RUNS:-1500}
secs=${FERRY_PY_FUZZ_SECONDS:-90}
seed=${FERRY_PY_FUZZ_SEED:-1}
flags=(-timeout=10 -rss_limit_mb=3072 -max_len=1024 -len_control=0 -print_final_stats=1 "-artifact_prefix=$out/findings/")
t0=$SECONDS

# 1. the corpus, each seed once (libFuzzer runs the files given as arguments and stops at the first finding)
seeds=("$here"/corpus/*)
echo "== python fuzz: ${#seeds[@]} corpus seeds (tests/python/fuzz/corpus)"
"$py" "$here/fuzz_ferry.py" "${flags[@]}" -runs=1 "${seeds[@]}" 2>&1 | tee "$out/corpus.log"
rc1=${PIPESTATUS[0]}
n1=$(grep -c "^Executed " "$out/corpus.log")
((rc1 == 0)) || echo "python fuzz: the corpus run failed (exit $rc1) after $n1 of ${#seeds[@]} seeds"

# 2. the bounded random run (new inputs go to $out/corpus, the first corpus directory)
echo "== python fuzz: random run (-runs=$runs -max_total_time=$secs -seed=$seed)"
"$py" "$here/fuzz_ferry.py" "${flags[@]}" -runs="$runs" -max_total_time="$secs" -seed="$seed" "$@" \
  "$out/corpus" "$here/corpus" 2>&1 | tee "$out/random.log"
rc2=${PIPESTATUS[0]}
n2=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+).*/\1/p' "$out/random.log" | tail -1)
n2=${n2:-0}

findings=$(find "$out/findings" -type f \( -name 'crash-*' -o -name 'timeout-*' -o -name 'oom-*' -o -name 'leak-*' \) | wc -l)
# a failed run that wrote no artifact (a seed that fails as a file argument; a death outside libFuzzer's handlers)
((rc1 != 0)) && ! grep -q "Test unit written to" "$out/corpus.log" && findings=$((findings + 1))
((rc2 != 0)) && ! grep -q "Test unit written to" "$out/random.log" && findings=$((findings + 1))
echo "python fuzz: $((n1 + n2)) inputs ($n1 corpus, $n2 random), $findings findings, $((SECONDS - t0)) s" \
  "(findings and new inputs: ${out#"$root"/})"
((findings == 0 && rc1 == 0 && rc2 == 0))
