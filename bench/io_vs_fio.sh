#!/usr/bin/env bash
# Compares `strata bench io` with fio on the same file, same shape: sequential, O_DIRECT,
# io_uring, block size BS, queue depth QD, SIZE bytes. fio runs twice per round, once with
# iomem=malloc (ordinary 4 KiB pages) and once with iomem=shmhuge (hugetlb pages), then
# strata; rounds alternate so machine noise hits all alike. Reports the median GB/s (1e9 B/s)
# of each and the ratio strata / better fio, for read and for write.
#
# Usage: bench/io_vs_fio.sh [--dir DIR] [--size 4G] [--bs 1M] [--qd 32] [--reps 3]
#                           [--strata PATH] [--keep]
# Env:   STRATA (path of the strata binary; default: build/strata, then `strata` on PATH).
# Needs: fio, python3. As root it reserves hugetlb pages (vm.nr_hugepages) for
#        iomem=shmhuge and for strata's pinned pool, and restores the old value on exit.
set -euo pipefail

DIR=/tmp/strata-io-vs-fio
SIZE=4G
BS=1M
QD=32
REPS=3
KEEP=0
STRATA_BIN=${STRATA:-}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dir) DIR=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --bs) BS=$2; shift 2 ;;
    --qd) QD=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --strata) STRATA_BIN=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "io_vs_fio.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

if [[ -z "$STRATA_BIN" ]]; then
  root=$(cd "$(dirname "$0")/.." && pwd)
  if [[ -x "$root/build/strata" ]]; then STRATA_BIN=$root/build/strata
  else STRATA_BIN=$(command -v strata || true); fi
fi
[[ -x "$STRATA_BIN" ]] || { echo "io_vs_fio.sh: strata binary not found (set STRATA or --strata)" >&2; exit 2; }
command -v fio >/dev/null || { echo "io_vs_fio.sh: fio not installed" >&2; exit 2; }
PY=/usr/bin/python3
[[ -x $PY ]] || PY=python3

mkdir -p "$DIR"
FILE=$DIR/strata-bench-io.dat
OLD_HUGE=""
cleanup() {
  if [[ -n "$OLD_HUGE" ]]; then echo "$OLD_HUGE" > /proc/sys/vm/nr_hugepages || true; fi
  if [[ $KEEP -eq 0 ]]; then rm -f "$FILE"; fi
}
trap cleanup EXIT

# Huge pages for fio's iomem=shmhuge (QD x BS plus alignment) and strata's pool (QD x BS).
if [[ $(id -u) -eq 0 && -w /proc/sys/vm/nr_hugepages ]]; then
  OLD_HUGE=$(cat /proc/sys/vm/nr_hugepages)
  bs_bytes=$($PY -c "import sys;s=sys.argv[1].upper().rstrip('IB');m={'K':1<<10,'M':1<<20,'G':1<<30}.get(s[-1:],1);print(int(float(s.rstrip('KMG'))*m))" "$BS")
  # fio: QD x BS; strata: 2 x QD x BS; plus headroom, since other processes on the machine
  # may take free hugetlb pages meanwhile (the figures say which memory strata got).
  need=$(( QD * bs_bytes / 2097152 * 6 + 32 ))
  echo $(( OLD_HUGE + need )) > /proc/sys/vm/nr_hugepages
  echo "reserved hugetlb pages: $(cat /proc/sys/vm/nr_hugepages) (was $OLD_HUGE)" >&2
else
  echo "not root: no hugetlb pages reserved; fio iomem=shmhuge may fail" >&2
fi
shmmax=$(cat /proc/sys/kernel/shmmax 2>/dev/null || echo 0)

# Lay the file out once (untimed), so reads read real blocks and writes overwrite in place.
"$STRATA_BIN" bench io --path "$DIR" --size "$SIZE" --block-size "$BS" --queue-depth "$QD" \
  --op write --keep --json >/dev/null

RESULTS=$(mktemp)
run_fio() {  # op iomem
  local out
  if out=$(fio --name=seq --filename="$FILE" --rw="$1" --bs="$BS" --iodepth="$QD" \
      --ioengine=io_uring --direct=1 --size="$SIZE" --iomem="$2" --invalidate=1 \
      --output-format=json 2>/dev/null); then
    echo "$out" | $PY -c "import json,sys;j=json.load(sys.stdin)['jobs'][0]['$1'];print(j['bw_bytes']/1e9)"
  else
    echo "nan"
  fi
}
run_strata() {  # op
  "$STRATA_BIN" bench io --path "$DIR" --size "$SIZE" --block-size "$BS" --queue-depth "$QD" \
    --op "$1" --json | $PY -c "import json,sys;j=json.load(sys.stdin);print(j['gbps']);print(j['memory'],file=sys.stderr)" 2>>"$MEMKIND"
}
MEMKIND=$(mktemp)

for op in read write; do
  for rep in $(seq 1 "$REPS"); do
    echo "$op fio-malloc $(run_fio "$op" malloc)" >> "$RESULTS"
    echo "$op fio-shmhuge $(run_fio "$op" shmhuge)" >> "$RESULTS"
    echo "$op strata $(run_strata "$op")" >> "$RESULTS"
    echo "  $op round $rep: $(grep "^$op " "$RESULTS" | tail -3 | awk '{printf "%s=%s ", $2, $3}')(strata memory: $(tail -1 "$MEMKIND"))" >&2
  done
done

$PY - "$RESULTS" "$SIZE" "$BS" "$QD" "$REPS" <<'EOF'
import math, statistics, sys
path, size, bs, qd, reps = sys.argv[1:]
rows = {}
for line in open(path):
    op, who, v = line.split()
    rows.setdefault((op, who), []).append(float(v))
def med(xs):
    xs = [x for x in xs if not math.isnan(x)]
    return statistics.median(xs) if xs else float("nan")
print(f"sequential, {size} bytes, bs={bs}, iodepth={qd}, O_DIRECT, io_uring; median of {reps} alternating rounds (GB/s = 1e9 B/s)")
print("| op    | fio malloc | fio shmhuge | strata | strata / best fio |")
print("|-------|-----------:|------------:|-------:|------------------:|")
for op in ("read", "write"):
    fm, fh, st = med(rows[(op, "fio-malloc")]), med(rows[(op, "fio-shmhuge")]), med(rows[(op, "strata")])
    best = max(x for x in (fm, fh) if not math.isnan(x)) if not (math.isnan(fm) and math.isnan(fh)) else float("nan")
    print(f"| {op:5} | {fm:10.2f} | {fh:11.2f} | {st:6.2f} | {st / best:17.2f} |")
EOF
echo "strata buffer memory per run: $(sort "$MEMKIND" | uniq -c | tr '\n' ' ')"
rm -f "$RESULTS" "$MEMKIND"
