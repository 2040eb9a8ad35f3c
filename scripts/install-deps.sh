#!/usr/bin/env bash
# Installs strata's build, test and benchmark dependencies from Debian 12 packages.
# Idempotent: re-running installs nothing new. Must run as root (or via sudo).
#   --sanitizers  also what the sanitizer and fuzz runs of scripts/test.sh need: clang 16
#                 with libFuzzer (Debian 12's clang 14 lacks _Float16 on x86-64),
#                 llvm-symbolizer (stack traces), ccache.
set -euo pipefail
PKGS=(
  build-essential cmake ninja-build pkg-config git
  liburing-dev libhwloc-dev hwloc libboost-dev libgloo-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libxxhash-dev libhwy-dev nlohmann-json3-dev libcli11-dev libsqlite3-dev
  pybind11-dev python3-dev python3-numpy python3-torch python3-pytest
  python3-matplotlib  # scripts/plot_bench.py: the charts in docs/img
  fio procps util-linux
  e2fsprogs  # mkfs.ext4 for the emulated drives (cli/emulated_drives.hpp)
  # torch's matrix products: Debian's python3-torch links libblas.so.3, whose default is
  # the reference BLAS (1.2 GFLOPS here); OpenBLAS takes over that alternative (~15 GFLOPS)
  libopenblas0-pthread
)
if [[ " $* " == *" --sanitizers "* ]]; then
  PKGS+=(clang-16 libclang-rt-16-dev llvm-16 ccache)
fi
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
echo "strata dependencies: all present"
