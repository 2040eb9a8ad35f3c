#!/usr/bin/env bash
# Fuzzing (tests/fuzz; docs/reliability.md "Fuzzing"): builds the libFuzzer targets
# (CMake preset fuzz: clang 16, ASan + UBSan) in build-fuzz, replays every seed corpus and
# regression input (ctest -L fuzz), then fuzzes each target for STRATA_FUZZ_SECONDS
# (default 20) seconds starting from its corpus.
#   STRATA_FUZZ_SECONDS=3600 bash scripts/fuzz.sh    the longer run (an hour per target)
#   STRATA_FUZZ_TARGETS="catalog c_api" ...          a subset
#   STRATA_FUZZ_MERGE=1 ...                          merge inputs that add coverage into
#                                                    tests/fuzz/corpus (then commit them)
# New inputs go to build-fuzz/fuzz-work/<target>/ (not the repository); a crash, leak,
# timeout or UB report stops that target and is saved as build-fuzz/findings/<target>/*.
# Prints executions per target. Exit status: non-zero when anything was found.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER=${STRATA_FUZZ_SECONDS:-20}
TARGETS=${STRATA_FUZZ_TARGETS:-catalog c_api checkpoint_record key_text partition_record safetensors}
B=build-fuzz
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
[[ -f $B/CMakeCache.txt ]] || cmake --preset fuzz "${launcher[@]}" >/dev/null
cmake --build $B -j"$(nproc)" --target $(printf 'fuzz_%s ' $TARGETS)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export ASAN_SYMBOLIZER_PATH=${ASAN_SYMBOLIZER_PATH:-/usr/lib/llvm-16/bin/llvm-symbolizer}
ctest --test-dir $B -L fuzz --output-on-failure -R "^fuzz\.($(echo $TARGETS | tr ' ' '|'))$"
status=0
printf '%-18s %8s %12s %10s %8s\n' target seconds executions exec/s corpus
for t in $TARGETS; do
  work=$B/fuzz-work/$t findings=$B/findings/$t
  mkdir -p "$work" "$findings"
  log=$B/fuzz-work/$t.log
  rc=0
  $B/tests/fuzz/fuzz_$t -max_total_time="$SECONDS_PER" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$findings/" "$work" tests/fuzz/corpus/$t \
    >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  printf '%-18s %8s %12s %10s %8s\n' "$t" "$SECONDS_PER" "${execs:-?}" "${rate:-?}" \
    "$(ls "$work" tests/fuzz/corpus/$t | wc -l)"
  if ((rc != 0)); then
    status=1
    echo "fuzz_$t found a defect (exit $rc); input saved in $findings/:" >&2
    grep -E "ERROR|runtime error|property failed|SUMMARY" "$log" | head -20 >&2 || tail -40 "$log" >&2
  fi
  if [[ ${STRATA_FUZZ_MERGE:-0} == 1 ]]; then
    $B/tests/fuzz/fuzz_$t -merge=1 tests/fuzz/corpus/$t "$work" >/dev/null 2>&1
  fi
done
exit $status
