// The multi-process test harness, helper side: a helper program started N times by a test
// (multiprocess.hpp) checks its results with these and reports on stdout:
// "CHECKS_PASSED <n>" and "EXPECTED_FAILURE <code> [<ms>] <message>"; any failed check exits 1
// at once with "FAIL rank <r>: <what>" on stderr.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "strata/base/status.hpp"

namespace strata::multiprocess {

/// Checks passed so far by this worker, and its rank for messages (-1 until known).
inline int g_checks = 0;
inline int g_rank = -1;

/// Prints "FAIL rank <r>: <msg>" on stderr and exits 1 at once.
[[noreturn]] inline void die(const std::string& msg) {
  std::fprintf(stderr, "FAIL rank %d: %s\n", g_rank, msg.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

inline void ok_or_die(const Status& s, const std::string& what) {
  if (!s.ok()) die(what + ": " + s.to_string());
}

/// Counts one passed check, or dies with `what`.
inline void expect(bool cond, const std::string& what) {
  if (!cond) die(what);
  ++g_checks;
}

/// Prints "CHECKS_PASSED <g_checks>".
inline void print_checks_passed() {
  std::printf("CHECKS_PASSED %d\n", g_checks);
  std::fflush(stdout);
}

/// Prints "EXPECTED_FAILURE <code> <ms> <message>" (without <ms> when ms < 0).
inline void print_expected_failure(const Status& s, long long ms = -1) {
  const std::string code(status_code_name(s.code()));
  if (ms >= 0) {
    std::printf("EXPECTED_FAILURE %s %lld %s\n", code.c_str(), ms, s.message().c_str());
  } else {
    std::printf("EXPECTED_FAILURE %s %s\n", code.c_str(), s.message().c_str());
  }
  std::fflush(stdout);
}

/// Milliseconds since `t0`.
inline long long ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               t0)
      .count();
}

}  // namespace strata::multiprocess
