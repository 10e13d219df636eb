# SPDX-License-Identifier: Apache-2.0
# Sourced by tests/run.sh and bench/run.sh: installs ferry's build dependencies from Debian's packages
# when they are missing (as root, with apt-get; nothing is downloaded at configure time).
ferry_install_deps() {
  local purpose=$1
  local pkgs=(cmake ninja-build g++ libfmt-dev libgtest-dev libbenchmark-dev git)
  if [[ $purpose == test ]]; then
    pkgs+=(hipcc libamdhip64-dev clang-14 libclang-rt-14-dev relacy-dev spin)
  fi
  local missing=()
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2> /dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get > /dev/null; then
      echo "ferry: missing packages (${missing[*]}); install them or run as root on Debian/Ubuntu" >&2
      # on machines that ship the tools outside dpkg (e.g. a GPU image), carry on and let CMake decide
      return 0
    fi
    echo "ferry: installing ${missing[*]}"
    if ! apt-get update -qq || ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" > /dev/null; then
      echo "ferry: could not install ${missing[*]} (offline?); continuing with what is installed" >&2
    fi
  fi
}
