#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ctest style.shipped_code: the limits of the code ferry ships, checked on every run (CI included).
#   * no line over 120 columns (.clang-format's ColumnLimit) in include/, kernels/ and src/ (C++, CUDA, Python);
#   * no file over 300 lines in include/, kernels/ and src/python.
# Prints every offending line or file (path:line: length) and exits 1 when there is one.
# Usage: bash cmake/check-style.sh [repo root]
set -uo pipefail
root=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
cd "$root" || exit 2
code=(-name '*.hpp' -o -name '*.h' -o -name '*.inl' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' -o -name '*.py')
bad=0
long=$(find include kernels src -type f \( "${code[@]}" \) -print0 | xargs -0 awk 'length($0) > 120 {
  printf "%s:%d: %d columns (expected at most 120)\n", FILENAME, FNR, length($0) }')
if [[ -n $long ]]; then echo "$long"; bad=1; fi
big=$(find include kernels src/python -type f \( "${code[@]}" \) -print0 | xargs -0 wc -l | awk '$2 != "total" && $1 > 300 {
  printf "%s: %d lines (expected at most 300)\n", $2, $1 }')
if [[ -n $big ]]; then echo "$big"; bad=1; fi
if ((bad)); then exit 1; fi
echo "style: every shipped line within 120 columns, every file in include/, kernels/, src/python within 300 lines"
