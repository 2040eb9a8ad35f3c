// The multi-process test harness, test side: a GoogleTest test starts a helper program N
// times through launch_local() (real processes talking over loopback) and reads what each
// rank printed. The helper reports with multiprocess_worker.hpp, on stdout:
// "CHECKS_PASSED <n>" and "EXPECTED_FAILURE <code> [<ms>] <message>".
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "strata/collectives/launcher.hpp"

namespace strata::multiprocess {

/// What the ranks of one launch did: their exit status and every line they printed.
struct WorkerRun {
  LaunchReport report;
  std::map<int, std::vector<std::string>> out, err;

  /// Every rank's exit status and lines, for a failure message.
  std::string dump() const {
    std::string s;
    for (size_t r = 0; r < report.ranks.size(); ++r) {
      s += "[rank " + std::to_string(r) + " status] exit " +
           std::to_string(report.ranks[r].exit_code) + " signal " +
           std::to_string(report.ranks[r].term_signal) + "\n";
    }
    for (auto& [r, lines] : err)
      for (auto& l : lines) s += "[rank " + std::to_string(r) + " err] " + l + "\n";
    for (auto& [r, lines] : out)
      for (auto& l : lines) s += "[rank " + std::to_string(r) + "] " + l + "\n";
    return s;
  }

  /// The first stdout line of `rank` that starts with `prefix`, null when none.
  const std::string* line_starting(int rank, const std::string& prefix) const {
    auto it = out.find(rank);
    if (it == out.end()) return nullptr;
    for (const auto& l : it->second)
      if (l.rfind(prefix, 0) == 0) return &l;
    return nullptr;
  }

  /// The <n> of rank's "CHECKS_PASSED <n>" line, -1 when it printed none.
  int checks_passed(int rank) const {
    const std::string* l = line_starting(rank, "CHECKS_PASSED ");
    return l == nullptr ? -1 : std::stoi(l->substr(14));
  }
};

/// Starts `argv` as `nproc` ranks with STRATA_COLL_TIMEOUT_MS=`coll_timeout_ms` and waits
/// for them (at most `timeout`). A launch that could not run fails the calling test.
inline WorkerRun run_workers(int nproc, std::vector<std::string> argv,
                             const std::string& coll_timeout_ms, bool stop_on_failure,
                             std::chrono::seconds timeout) {
  WorkerRun run;
  std::mutex mu;
  LaunchOptions o;
  o.nproc = nproc;
  o.argv = std::move(argv);
  o.env = {{"STRATA_COLL_TIMEOUT_MS", coll_timeout_ms}};
  o.stop_on_failure = stop_on_failure;
  o.timeout = timeout;
  o.on_line = [&](int r, bool e, std::string_view l) {
    std::lock_guard<std::mutex> lk(mu);
    (e ? run.err : run.out)[r].emplace_back(l);
  };
  auto rep = launch_local(o);
  EXPECT_TRUE(rep.ok()) << rep.status().to_string();
  if (rep.ok()) run.report = *rep;
  return run;
}

}  // namespace strata::multiprocess
