// Partitioned objects: the layout arithmetic, and put/fetch/reduce_scatter_grads in 1, 2, 3
// and 4 real processes over loopback (helper: partition_worker, one store per rank), a
// world-size change between put and fetch, and a killed rank.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <regex>

#include "common/multiprocess.hpp"
#include "strata/store/partitioned.hpp"
#include "test_store_util.hpp"

using namespace strata;
using namespace std::chrono_literals;

TEST(PartitionLayout, OwnedRangesCoverExactlyOnce) {
  for (uint64_t numel : {0ull, 1ull, 2ull, 3ull, 5ull, 10ull, 11ull, 12ull, 1000003ull}) {
    for (int n = 1; n <= 7; ++n) {
      auto l = partition_layout(numel, n);
      ASSERT_TRUE(l.ok());
      EXPECT_EQ(l->chunk_numel, (numel + n - 1) / n);
      EXPECT_GE(l->padded_numel(), numel);
      EXPECT_LT(l->padded_numel() - numel, static_cast<uint64_t>(n));
      uint64_t next = 0;
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(l->begin(r), std::min<uint64_t>(r * l->chunk_numel, numel));
        EXPECT_EQ(l->begin(r), next) << "numel " << numel << " n " << n << " r " << r;
        EXPECT_LE(l->owned_numel(r), l->chunk_numel);
        next = l->end(r);
      }
      EXPECT_EQ(next, numel);
    }
  }
}

TEST(PartitionLayout, ExactValues) {
  auto l = partition_layout(10, 4);  // c = 3: [0,3) [3,6) [6,9) [9,10)
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->chunk_numel, 3u);
  EXPECT_EQ(l->padded_numel(), 12u);
  EXPECT_EQ(l->owned_numel(3), 1u);
  auto s = partition_layout(2, 4);  // c = 1: ranks 2 and 3 own nothing
  EXPECT_EQ(s->owned_numel(1), 1u);
  EXPECT_EQ(s->owned_numel(2), 0u);
  EXPECT_EQ(s->begin(3), 2u);
  EXPECT_EQ(s->end(3), 2u);
  EXPECT_EQ(partition_layout(5, 0).status().code(), StatusCode::kInvalidArgument);
}

namespace {

using multiprocess::WorkerRun;

WorkerRun run_worker(int nproc, const std::string& mode, const std::string& dir,
                     const std::string& timeout_ms = "10000", bool stop_on_failure = true) {
  return multiprocess::run_workers(nproc, {STRATA_PARTITION_WORKER, mode, dir}, timeout_ms,
                                   stop_on_failure, 60s);
}

}  // namespace

class PartitionedWorld : public ::testing::TestWithParam<int> {};

TEST_P(PartitionedWorld, PutFetchReduceScatterExactBytes) {
  const int n = GetParam();
  store_test::TempDir dir;
  WorkerRun run = run_worker(n, "check", dir.path());
  ASSERT_TRUE(run.report.status().ok()) << run.report.status().to_string() << "\n" << run.dump();
  // 11 tensors x (2 + 3 pieces x 2 modes x 2 checks) + 5 error checks + 13 reduce-scatter
  // checks + 1 layout check.
  const int want = 11 * (2 + 12) + 5 + 13 + 1;
  for (int r = 0; r < n; ++r) {
    const std::string* l = run.line_starting(r, "CHECKS_PASSED ");
    ASSERT_NE(l, nullptr) << run.dump();
    EXPECT_EQ(std::stoi(l->substr(14)), want) << "rank " << r;
  }
  // Each rank kept only its own slice in its own store directory.
  for (int r = 0; r < n; ++r)
    EXPECT_TRUE(std::filesystem::exists(dir.sub("rank" + std::to_string(r)))) << r;
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, PartitionedWorld, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "np" + std::to_string(info.param); });

TEST(PartitionedWorldSize, FetchOverOtherWorldSizeFailsOnEveryRank) {
  store_test::TempDir dir;
  WorkerRun put = run_worker(3, "put", dir.path());
  ASSERT_TRUE(put.report.status().ok()) << put.dump();
  // Same world size, new processes: the slices persisted and gather back exactly.
  WorkerRun same = run_worker(3, "refetch", dir.path());
  ASSERT_TRUE(same.report.status().ok()) << same.dump();
  for (int r = 0; r < 3; ++r) EXPECT_NE(same.line_starting(r, "FETCHED_OK"), nullptr) << same.dump();
  // Two ranks: every rank refuses before any data moves, naming both world sizes.
  WorkerRun two = run_worker(2, "refetch", dir.path());
  ASSERT_TRUE(two.report.status().ok()) << two.dump();
  for (int r = 0; r < 2; ++r) {
    const std::string* l = two.line_starting(r, "EXPECTED_FAILURE ");
    ASSERT_NE(l, nullptr) << two.dump();
    EXPECT_NE(l->find("FailedPrecondition"), std::string::npos) << *l;
    EXPECT_NE(l->find("'w' was stored over 3 ranks, fetched over 2"), std::string::npos) << *l;
  }
}

TEST(PartitionedPeerFailure, KilledRankIsNamedWithinTheTimeout) {
  const int n = 3;
  store_test::TempDir dir;
  auto t0 = std::chrono::steady_clock::now();
  WorkerRun run = run_worker(n, "killed", dir.path(), "3000", /*stop_on_failure=*/false);
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(run.report.ranks.at(n - 1).term_signal, SIGKILL) << run.dump();
  std::regex line(R"(EXPECTED_FAILURE (\w+) (\d+) (.*))");
  for (int r = 0; r < n - 1; ++r) {
    EXPECT_EQ(run.report.ranks.at(r).exit_code, 0) << run.dump();
    const std::string* l = run.line_starting(r, "EXPECTED_FAILURE ");
    ASSERT_NE(l, nullptr) << run.dump();
    std::smatch m;
    ASSERT_TRUE(std::regex_match(*l, m, line)) << *l;
    EXPECT_EQ(m[1].str(), "Unavailable") << *l;
    EXPECT_LT(std::stoi(m[2].str()), 3000 + 1500) << *l;
    EXPECT_NE(m[3].str().find("fetch_partitioned 'k'"), std::string::npos) << *l;
    EXPECT_NE(m[3].str().find("rank 2"), std::string::npos) << *l;
  }
  EXPECT_LT(took, 15s);
}
