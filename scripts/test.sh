#!/usr/bin/env bash
# The README's test command: installs the dependencies (Debian 12, as root), builds, and
# runs every test (C++ GoogleTest suites, pytest suites, multi-process tests, the CMake
# package consumer). GPU tests skip where there is no GPU. Then the sanitizer runs
# (scripts/sanitizers.sh: ASan+UBSan suites, TSan concurrency tests, fuzz targets), which
# STRATA_SKIP_SANITIZERS=1 skips.
set -euo pipefail
cd "$(dirname "$0")/.."
sanitizers=1 deps=(--sanitizers)
if [[ ${STRATA_SKIP_SANITIZERS:-0} == 1 ]]; then sanitizers=0 deps=(); fi
bash scripts/install-deps.sh "${deps[@]}"
bash scripts/build.sh "$@"
BUILD_DIR=${STRATA_BUILD_DIR:-build}
(cd "$BUILD_DIR" && ctest --output-on-failure -j"$(nproc)" --timeout 900)
if ((sanitizers)); then
  bash scripts/sanitizers.sh
fi
