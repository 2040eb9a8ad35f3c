// Gloo communicators in 1, 2, 3 and 4 real processes over loopback (helper: coll_worker),
// and what the survivors see when a rank is killed or hangs.
#include <gtest/gtest.h>

#include <regex>

#include "common/multiprocess.hpp"

using namespace strata;
using namespace std::chrono_literals;

namespace {

using multiprocess::WorkerRun;

WorkerRun run_worker(int nproc, const std::string& mode, const std::string& timeout_ms,
                     bool stop_on_failure = true) {
  return multiprocess::run_workers(nproc, {STRATA_COLL_WORKER, mode}, timeout_ms, stop_on_failure,
                                   40s);
}

}  // namespace

class GlooWorld : public ::testing::TestWithParam<int> {};

TEST_P(GlooWorld, AllCollectivesExactValues) {
  const int n = GetParam();
  WorkerRun run = run_worker(n, "check", "5000");
  ASSERT_TRUE(run.report.status().ok()) << run.report.status().to_string() << "\n" << run.dump();
  int first = run.checks_passed(0);
  EXPECT_GE(first, n == 1 ? 168 : 170) << run.dump();
  for (int r = 0; r < n; ++r) EXPECT_EQ(run.checks_passed(r), first) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooWorld, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "np" + std::to_string(info.param); });

TEST(GlooPeerFailure, KilledRankIsNamedWithinTheTimeout) {
  const int n = 3;
  auto t0 = std::chrono::steady_clock::now();
  WorkerRun run = run_worker(n, "killed", "3000", /*stop_on_failure=*/false);
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(run.report.ranks.at(2).term_signal, SIGKILL) << run.dump();
  std::regex line(R"(EXPECTED_FAILURE (\w+) (\d+) (.*))");
  for (int r = 0; r < n - 1; ++r) {
    EXPECT_EQ(run.report.ranks.at(r).exit_code, 0) << run.dump();
    std::smatch m;
    bool found = false;
    for (const auto& l : run.out[r]) {
      if (std::regex_match(l, m, line)) {
        found = true;
        EXPECT_EQ(m[1].str(), "Unavailable") << l;
        EXPECT_LT(std::stoi(m[2].str()), 3000 + 1500) << l;
        EXPECT_NE(m[3].str().find("peer rank 2 is gone"), std::string::npos) << l;
        EXPECT_NE(m[3].str().find("rank " + std::to_string(r) + ": all_gather"), std::string::npos) << l;
      }
    }
    EXPECT_TRUE(found) << run.dump();
    EXPECT_NE(std::find(run.out[r].begin(), run.out[r].end(), "AFTER FailedPrecondition"),
              run.out[r].end())
        << run.dump();
  }
  EXPECT_LT(took, 15s);
}

TEST(GlooPeerFailure, HungRankGivesDeadlineExceeded) {
  const int n = 2;
  WorkerRun run = run_worker(n, "hung", "2000", /*stop_on_failure=*/false);
  std::regex line(R"(EXPECTED_FAILURE (\w+) (\d+) (.*))");
  std::smatch m;
  bool found = false;
  for (const auto& l : run.out[0]) {
    if (std::regex_match(l, m, line)) {
      found = true;
      EXPECT_EQ(m[1].str(), "DeadlineExceeded") << l;
      EXPECT_GE(std::stoi(m[2].str()), 1900) << l;
      EXPECT_LT(std::stoi(m[2].str()), 2000 + 2500) << l;
      EXPECT_NE(m[3].str().find("2000 ms"), std::string::npos) << l;
    }
  }
  EXPECT_TRUE(found) << run.dump();
}
