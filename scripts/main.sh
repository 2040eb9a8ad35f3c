#!/usr/bin/env bash
# The README's main command: installs the dependencies (Debian 12, as root), builds, and
# runs strata's main job: train a GPT-style language model whose parameters, gradients and
# optimizer state (2.07 GiB) are 4x the memory its process may use (a 512 MiB memory cgroup
# this job creates), its parameters, gradients, fp32 masters and Adam moments in strata's
# NVMe tier (strata.torch.offload_init / OffloadAdamW), next to the same training with
# torch.optim.AdamW in memory (bit-identical losses and parameters) and the same in-memory
# training under the limit (killed for memory): examples/train_offload.py, figures in
# docs/offload.md. Before it: the machine's topology and the NVMe engine's bandwidth in the
# same directory (its read and write bandwidths give the I/O bound of the offloaded step,
# printed before the last line). Extra arguments go to train_offload.py (--preset large: a
# model whose training state exceeds 24 GiB, offloaded run only).
# Directory for NVMe-tier data: $STRATA_DIR (default /var/tmp/strata-<uid>, mode 0700, as
# strata.default_data_dir()).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
BUILD_DIR=${STRATA_BUILD_DIR:-build}
if [[ -n "${STRATA_DIR:-}" ]]; then
  DIR=$STRATA_DIR
  mkdir -p "$DIR"
else
  DIR=/var/tmp/strata-$(id -u)
  mkdir -p -m 700 "$DIR"
  if [[ -L "$DIR" || ! -O "$DIR" ]]; then
    echo "main.sh: $DIR belongs to another user; remove it or set STRATA_DIR" >&2
    exit 1
  fi
fi
"$BUILD_DIR/strata" info --path "$DIR"
# The write keeps its 1 GiB file for the read; removed when this script ends, however it ends.
trap 'rm -f "$DIR/strata-bench-io.dat"' EXIT
# bench_io ARGS...: strata bench io on $DIR, its report printed; GBPS is its bandwidth (GB/s)
bench_io() {
  local out
  out=$("$BUILD_DIR/strata" bench io --path "$DIR" --size 1GiB --block-size 1MiB \
    --queue-depth 32 "$@")
  echo "$out"
  GBPS=$(sed -n 's/.* BW=\([0-9.]*\) GB\/s.*/\1/p' <<<"$out")
  if [[ -z "$GBPS" ]]; then
    echo "main.sh: no 'BW=... GB/s' in strata bench io's report" >&2
    exit 1
  fi
}
bench_io --op write --keep
WRITE_GBPS=$GBPS
bench_io --op read
READ_GBPS=$GBPS
rm -f "$DIR/strata-bench-io.dat"
# Debian's numpy and torch belong to /usr/bin/python3; the module is built in $BUILD_DIR/python.
# The bandwidths just measured give the I/O bound of the offloaded step it prints.
STRATA_DIR="$DIR" PYTHONPATH="$BUILD_DIR/python${PYTHONPATH:+:$PYTHONPATH}" \
  /usr/bin/python3 examples/train_offload.py --drive-read-gbps "$READ_GBPS" \
  --drive-write-gbps "$WRITE_GBPS" "$@"
