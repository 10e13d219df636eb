# SPDX-License-Identifier: Apache-2.0
# Sourced by tests/run.sh and bench/run.sh: installs ferry's build dependencies from Debian's packages
# when they are missing (as root, with apt-get; nothing is downloaded at configure time).
# A dependency counts as present when its tool is on PATH or its header/library is found (so a machine
# that ships cmake, ninja, ... outside dpkg, like a GPU image, installs nothing), else when dpkg lists its
# package; only what is still missing is passed to apt-get.

# "package probe...": probes are cmd:NAME (on PATH) or file:GLOB (exists); any one satisfies.
_ferry_deps_bench=(
  "cmake cmd:cmake"
  "ninja-build cmd:ninja"
  "g++ cmd:g++"
  "git cmd:git"
  "libfmt-dev file:/usr/include/fmt/core.h file:/usr/local/include/fmt/core.h"
  "libgtest-dev file:/usr/include/gtest/gtest.h file:/usr/local/include/gtest/gtest.h"
  "libbenchmark-dev file:/usr/include/benchmark/benchmark.h file:/usr/local/include/benchmark/benchmark.h"
)
_ferry_deps_test=(
  "hipcc cmd:hipcc"
  "libamdhip64-dev file:/usr/include/hip/hip_runtime.h file:/opt/rocm/include/hip/hip_runtime.h"
  "clang-14 cmd:clang++-14"
  "libclang-rt-14-dev file:/usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.tsan-x86_64.a"
  "relacy-dev file:/usr/include/relacy/relacy.hpp"
  "spin cmd:spin"
)

_ferry_dep_present() {
  local probe g
  for probe in "${@:2}"; do
    case $probe in
      cmd:*) command -v "${probe#cmd:}" > /dev/null 2>&1 && return 0 ;;
      file:*) for g in ${probe#file:}; do [[ -e $g ]] && return 0; done ;;
    esac
  done
  command -v dpkg-query > /dev/null 2>&1 &&
    dpkg-query -W -f='${Status}' "$1" 2> /dev/null | grep -q "install ok installed"
}

ferry_install_deps() {
  local purpose=$1 entry
  local deps=("${_ferry_deps_bench[@]}")
  [[ $purpose == test ]] && deps+=("${_ferry_deps_test[@]}")
  local missing=()
  for entry in "${deps[@]}"; do
    # shellcheck disable=SC2086
    _ferry_dep_present $entry || missing+=("${entry%% *}")
  done
  ((${#missing[@]})) || return 0
  if [[ $(id -u) -ne 0 ]] || ! command -v apt-get > /dev/null; then
    echo "ferry: missing (${missing[*]}); install them, or run as root on Debian/Ubuntu" >&2
    return 0  # carry on and let CMake say what it cannot find
  fi
  echo "ferry: installing ${missing[*]}"
  if ! apt-get update -qq || ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" > /dev/null; then
    echo "ferry: could not install ${missing[*]} (offline?); continuing with what is installed" >&2
  fi
}

# The Python package's build and test dependencies (PyPI): nanobind, scikit-build-core, numpy, pytest.
# Installs only what `python3` cannot import; offline machines (the GPU image) already have them.
# Returns non-zero when they are still missing (the caller then builds without the Python package).
ferry_install_python_deps() {
  local py=${PYTHON:-python3}
  command -v "$py" > /dev/null 2>&1 || return 1
  local mods=(nanobind scikit_build_core numpy pytest) pkgs=(nanobind scikit-build-core numpy pytest)
  local missing=() i
  for i in "${!mods[@]}"; do
    "$py" -c "import ${mods[$i]}" > /dev/null 2>&1 || missing+=("${pkgs[$i]}")
  done
  ((${#missing[@]})) || return 0
  echo "ferry: pip installing ${missing[*]}"
  "$py" -m pip install -q "${missing[@]}" > /dev/null 2>&1 ||
    echo "ferry: could not pip install ${missing[*]} (offline?)" >&2
  for i in "${!mods[@]}"; do "$py" -c "import ${mods[$i]}" > /dev/null 2>&1 || return 1; done
}

# The Python fuzz stage's dependency (PyPI): atheris (binary wheels for CPython <= 3.11 on Linux; no source
# build, which would need clang's libFuzzer). Installs it only when `python3` cannot import it. Returns non-zero
# when it still cannot be imported (the caller then records the stage as skipped).
ferry_install_fuzz_deps() {
  local py=${PYTHON:-python3}
  command -v "$py" > /dev/null 2>&1 || return 1
  "$py" -c "import atheris" > /dev/null 2>&1 && return 0
  echo "ferry: pip installing atheris for the Python fuzz stage"
  "$py" -m pip install -q --only-binary=:all: atheris > /dev/null 2>&1 ||
    echo "ferry: could not pip install atheris (offline, or no wheel for $("$py" -V 2>&1)): the Python fuzz stage is skipped" >&2
  "$py" -c "import atheris" > /dev/null 2>&1
}

# The torch layer's test dependencies (PyPI): torch and transformers, pyarrow + datasets for the engine's
# Arrow format (its tests load the dataset with datasets.load_from_disk), accelerate for its tensor-parallel tests. Optional: the torch ops extension and
# its tests are built/run only where torch imports. Skipped with FERRY_SKIP_TORCH=1 or when offline.
# Returns non-zero when torch still cannot be imported.
ferry_install_torch_deps() {
  local py=${PYTHON:-python3}
  [[ "${FERRY_SKIP_TORCH:-0}" == 1 ]] && return 1
  command -v "$py" > /dev/null 2>&1 || return 1
  local missing=() m
  for m in torch transformers; do
    "$py" -c "import $m" > /dev/null 2>&1 || missing+=("$m")
  done
  if ((${#missing[@]})); then
    echo "ferry: pip installing ${missing[*]} for the torch layer's tests (several GB with the CUDA wheels; FERRY_SKIP_TORCH=1 skips them)"
    "$py" -m pip install -q "${missing[@]}" > /dev/null 2>&1 ||
      echo "ferry: could not pip install ${missing[*]} (offline?): the torch layer is not tested here" >&2
  fi
  missing=()
  for m in pyarrow datasets; do
    "$py" -c "import $m" > /dev/null 2>&1 || missing+=("$m")
  done
  if ((${#missing[@]})); then  # apart: a failure here leaves torch's tests in place
    echo "ferry: pip installing ${missing[*]} for the engine's Arrow format tests"
    "$py" -m pip install -q "${missing[@]}" > /dev/null 2>&1 ||
      echo "ferry: could not pip install ${missing[*]} (offline?): the Arrow format's tests are skipped" >&2
  fi
  if ! "$py" -c "import accelerate" > /dev/null 2>&1; then  # transformers' TP plan (from_pretrained(tp_plan=))
    echo "ferry: pip installing accelerate for the engine's tensor-parallel tests (transformers' TP plan needs it)"
    "$py" -m pip install -q accelerate > /dev/null 2>&1 ||
      echo "ferry: could not pip install accelerate (offline?): the engine's tensor-parallel tests are skipped" >&2
  fi
  "$py" -c "import torch" > /dev/null 2>&1
}
