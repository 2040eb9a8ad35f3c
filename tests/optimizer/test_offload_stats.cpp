// The offloaded optimizer's totals (OffloadedOptimizer::stats()): exact counts after known
// steps (NVMe and host tensors, a skipped step), reset, and the store's counters beneath.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "offload_test_util.hpp"
#include "strata/optimizer/optimizers.hpp"

namespace strata::optimizer {
namespace {

using namespace offload_test;

TEST(OffloadStats, TotalsAfterStepsAndASkip) {
  TempDir dir;
  auto s = Store::open(small_store_options(dir.path()));
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  std::shared_ptr<Store> store = std::move(s).value();
  OffloadOptions oo;
  oo.sub_group_numel = 1000;
  oo.num_threads = 1;
  auto o = OffloadedOptimizer::create(store, *builtin_rule_factory("adam"), {{"lr", 1e-2}}, oo);
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  OffloadedOptimizer& opt = **o;
  const uint64_t kNvme = 3000, kHost = 500;  // 3 sub-groups; the host tensor: none
  auto a = values(1, kNvme), b = values(2, kHost);
  ParamHandle hn = must(opt.add_param("n", kNvme, a.data(), 0, Placement::kNvme));
  ParamHandle hh = must(opt.add_param("h", kHost, b.data(), 0, Placement::kHost));
  auto gn = values(3, kNvme), gh = values(4, kHost);
  ASSERT_TRUE(opt.set_grad(hn, gn.data(), DType::kFloat32).ok());
  ASSERT_TRUE(opt.set_grad(hh, gh.data(), DType::kFloat32).ok());
  store->reset_stats();
  for (int i = 0; i < 2; ++i) {
    StepStats st = must(opt.step());
    EXPECT_EQ(st.sub_groups, 3u);
  }
  OptimizerStats t = opt.stats();
  EXPECT_EQ(t.steps, 2u);
  EXPECT_EQ(t.steps_skipped, 0u);
  EXPECT_EQ(t.sub_groups, 6u);
  EXPECT_EQ(t.tensors_updated, 4u);
  EXPECT_EQ(t.numel_updated, 2 * (kNvme + kHost));
  EXPECT_EQ(t.bytes_read, 2 * 3 * kNvme * 4);  // master + exp_avg + exp_avg_sq, fp32
  EXPECT_EQ(t.bytes_written, t.bytes_read);
  EXPECT_GT(t.update_seconds, 0.0);
  EXPECT_GE(t.step_seconds, t.update_seconds);
  EXPECT_GT(t.overlap(), 0.0);
  EXPECT_LE(t.overlap(), 1.0);
  // The store counted the pipeline's chunk transfers: 3 objects (master, exp_avg,
  // exp_avg_sq) of 12000 bytes, one chunk each, so each of the 3 sub-groups per step and
  // object reads the chunk (verified whole) and writes it back through a read-modify-write.
  const StoreStats ss = store->stats();
  EXPECT_EQ(ss.nvme.read_ops, 2u * 3u * 3u * 2u);
  EXPECT_EQ(ss.nvme.write_ops, 2u * 3u * 3u);
  EXPECT_EQ(ss.nvme.write_bytes, 2u * 3u * 3u * 12288u);

  // A non-finite gradient: the step is skipped and counted as such, nothing moves.
  gh[7] = std::numeric_limits<float>::quiet_NaN();
  StepStats st = must(opt.step());
  EXPECT_TRUE(st.skipped);
  t = opt.stats();
  EXPECT_EQ(t.steps, 3u);
  EXPECT_EQ(t.steps_skipped, 1u);
  EXPECT_EQ(t.sub_groups, 6u);
  EXPECT_EQ(t.bytes_read, 2 * 3 * kNvme * 4);

  opt.reset_stats();
  t = opt.stats();
  EXPECT_EQ(t.steps, 0u);
  EXPECT_EQ(t.bytes_read, 0u);
  EXPECT_EQ(t.update_seconds, 0.0);
  EXPECT_EQ(t.overlap(), 0.0);
  ASSERT_TRUE(opt.close().ok());
}

}  // namespace
}  // namespace strata::optimizer
