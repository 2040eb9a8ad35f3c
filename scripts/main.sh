#!/usr/bin/env bash
# The README's main command: installs the dependencies (Debian 12, as root), builds, and
# runs strata's main job. Directory for NVMe-tier data: $STRATA_DIR (default /var/tmp/strata).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
BUILD_DIR=${STRATA_BUILD_DIR:-build}
DIR=${STRATA_DIR:-/var/tmp/strata}
mkdir -p "$DIR"
"$BUILD_DIR/strata" info --path "$DIR"
"$BUILD_DIR/strata" bench io --path "$DIR" --size 1GiB --block-size 1MiB --queue-depth 32 --op write
"$BUILD_DIR/strata" bench io --path "$DIR" --size 1GiB --block-size 1MiB --queue-depth 32 --op read
