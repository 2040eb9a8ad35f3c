#!/usr/bin/env bash
# The sanitizer runs of scripts/test.sh (docs/reliability.md "Sanitizers", "Fuzzing"):
#   asan  the C++ suites (labels base, store, optimizer, collectives) under AddressSanitizer
#         + UndefinedBehaviorSanitizer (CMake preset asan-ubsan, build-asan)
#   tsan  the tests labelled concurrency under ThreadSanitizer (preset tsan, build-tsan)
#   fuzz  every fuzz target's corpus replayed, then fuzzed STRATA_FUZZ_SECONDS each
#         (scripts/fuzz.sh, preset fuzz, build-fuzz)
# Each builds only the executables its tests run, at -O1, through ccache when installed.
# STRATA_SANITIZERS selects runs (default "asan tsan fuzz"). Prints each run's wall time.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${STRATA_SANITIZERS:-asan tsan fuzz}
JOBS=$(nproc)
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
configure() {  # <preset> <build dir>
  [[ -f $2/CMakeCache.txt ]] || cmake --preset "$1" "${launcher[@]}" >/dev/null
}
timed() {  # <name> <command...>
  local t0=$SECONDS
  "${@:2}"
  echo "sanitizers: $1 took $((SECONDS - t0)) s"
}
asan() {
  configure asan-ubsan build-asan
  cmake --build build-asan -j"$JOBS" --target test_base test_collectives test_store \
    test_optimizer optim_driver
  ctest --preset asan-ubsan -j"$JOBS" --timeout 1800
}
tsan() {
  configure tsan build-tsan
  cmake --build build-tsan -j"$JOBS" --target test_base test_store test_optimizer test_concurrency
  ctest --preset tsan -j"$JOBS"
}
fuzz() { bash scripts/fuzz.sh; }
for r in $RUNS; do timed "$r" "$r"; done
