#!/usr/bin/env bash
# The README's test command: installs the dependencies (Debian 12, as root), builds, and
# runs every test (C++ GoogleTest suites, pytest suites, multi-process tests, the CMake
# package consumer). GPU tests skip where there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh "$@"
BUILD_DIR=${STRATA_BUILD_DIR:-build}
cd "$BUILD_DIR"
ctest --output-on-failure -j"$(nproc)" --timeout 900
