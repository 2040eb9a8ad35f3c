#!/usr/bin/env bash
# Configures and builds strata in ${STRATA_BUILD_DIR:-build} (Release with debug info).
# Extra arguments go to CMake's configure step (e.g. -DSTRATA_WITH_CUDA=OFF).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${STRATA_BUILD_DIR:-build}
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
elif (($#)); then
  cmake -S . -B "$BUILD_DIR" "$@"
fi
cmake --build "$BUILD_DIR" -j"$(nproc)"
