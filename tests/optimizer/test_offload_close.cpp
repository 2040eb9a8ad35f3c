// The one resume rule of the offloaded optimizer (offload.hpp, CHECKPOINT CONTRACT): a
// resume restores the state of the last checkpoint, and close() -- explicit or the
// destructor -- is a checkpoint, for every tier. Ending without a close (close(false), what
// a killed process gets) resumes at the last checkpoint. Failures: a close whose checkpoint
// fails, a step that fails part-way, a store closed under the optimizer.
// (A real SIGKILL: test_offload_resume.cpp; Python and C: tests/bindings.)
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "offload_test_util.hpp"

namespace strata::optimizer {
namespace {

using namespace offload_test;

constexpr uint64_t kNa = 2 * kChunkNumel;  // tensor "a": two chunks per stream
constexpr uint64_t kNb = 4 * kChunkNumel;  // tensor "b": four chunks per stream

constexpr uint64_t kSlackForTheStepOnly = 17;

enum class End { kDestructor, kClose, kNoClose };

// Creates an optimizer over `store` with "a" and "b" placed by `tier` ("auto": the host
// budget fits "a" only, so a is host and b nvme).
std::unique_ptr<OffloadedOptimizer> make(std::shared_ptr<Store> store, const std::string& tier) {
  OffloadOptions oo;
  oo.sub_group_numel = 10000;  // not chunk-aligned: read-modify-write too
  Placement p = tier == "host" ? Placement::kHost : tier == "nvme" ? Placement::kNvme
                                                                   : Placement::kAuto;
  oo.host_budget_bytes = kNa * 12;
  auto opt = must(OffloadedOptimizer::create(store, *torch_exact_rule_factory("adamw"),
                                             {{"lr", 1e-2}}, oo));
  auto ia = values(1, kNa), ib = values(2, kNb);
  must(opt->add_param("a", kNa, ia.data(), 0, p));
  must(opt->add_param("b", kNb, ib.data(), 0, p));
  return opt;
}

// Step s of both tensors (gradients grad_for(t, s)).
Status step(OffloadedOptimizer& opt, int s) {
  std::vector<float> ga = grad_for(0, s, kNa), gb = grad_for(1, s, kNb);
  STRATA_RETURN_IF_ERROR(opt.set_grad(0, ga.data(), DType::kFloat32));
  STRATA_RETURN_IF_ERROR(opt.set_grad(1, gb.data(), DType::kFloat32));
  auto r = opt.step();
  opt.clear_grads();
  return r.status();
}

using Dump = std::vector<std::vector<std::vector<float>>>;  // [tensor][stream]
Dump dump_all(OffloadedOptimizer& opt) { return {dump(opt, 0), dump(opt, 1)}; }

// Reopens the store at `dir` and checks the optimizer resumes at `steps` with `want`.
void expect_resumes_at(const std::string& dir, int64_t steps, const Dump& want,
                       const std::string& what) {
  std::shared_ptr<Store> store = must(Store::open(small_store_options(dir)));
  auto opt = must(OffloadedOptimizer::open(store, *torch_exact_rule_factory("adamw"), {}));
  ASSERT_EQ(opt->num_params(), 2u) << what;
  Dump got = dump_all(*opt);
  for (ParamHandle h = 0; h < 2; ++h) {
    EXPECT_EQ(must(opt->step_count(h)), steps) << what << " tensor " << h;
    for (size_t s = 0; s < got[h].size(); ++s) {
      EXPECT_TRUE(bit_equal(got[h][s], want[h][s])) << what << " tensor " << h << " stream " << s;
    }
  }
}

TEST(OffloadClose, CloseIsACheckpointForEveryTierAndANoCloseEndResumesAtTheLast) {
  for (const std::string tier : {"nvme", "host", "auto"}) {
    for (End end : {End::kDestructor, End::kClose, End::kNoClose}) {
      const std::string what = tier + " end " + std::to_string(static_cast<int>(end));
      TempDir dir;
      Dump at2, at3;
      {
        std::shared_ptr<Store> store = must(Store::open(small_store_options(dir.path())));
        auto opt = make(store, tier);
        if (tier == "auto") {
          EXPECT_EQ(must(opt->param_info(0)).placement, Placement::kHost);
          EXPECT_EQ(must(opt->param_info(1)).placement, Placement::kNvme);
        }
        for (int s = 1; s <= 2; ++s) OFFLOAD_ASSERT_OK(step(*opt, s));
        OFFLOAD_ASSERT_OK(opt->checkpoint());
        at2 = dump_all(*opt);
        OFFLOAD_ASSERT_OK(step(*opt, 3));
        OFFLOAD_ASSERT_OK(store->flush());  // the owner's flush moves nothing
        at3 = dump_all(*opt);
        if (end == End::kClose) {
          OFFLOAD_ASSERT_OK(opt->close());
          OFFLOAD_ASSERT_OK(opt->close());  // idempotent
          EXPECT_EQ(step(*opt, 4).code(), StatusCode::kFailedPrecondition);
          EXPECT_EQ(opt->checkpoint().code(), StatusCode::kFailedPrecondition);
          EXPECT_EQ(opt->num_params(), 2u);  // introspection still answers
        } else if (end == End::kNoClose) {
          OFFLOAD_ASSERT_OK(opt->close(/*checkpoint=*/false));
        }
        opt.reset();
        OFFLOAD_ASSERT_OK(store->close());
      }
      if (end == End::kNoClose) {
        expect_resumes_at(dir.path(), 2, at2, what);
      } else {
        expect_resumes_at(dir.path(), 3, at3, what);
      }
    }
  }
}

// A store whose NVMe budget leaves `slack_chunks` chunks free after the first checkpoint.
struct TightStore {
  TempDir dir;
  std::shared_ptr<Store> store;
  std::unique_ptr<OffloadedOptimizer> opt;
  Dump at1;

  explicit TightStore(uint64_t slack_chunks) {
    StoreOptions so = small_store_options(dir.path());
    so.nvme_budget_bytes = 64ull << 20;
    store = must(Store::open(so));
    opt = make(store, "auto");  // a host, b nvme
    EXPECT_TRUE(step(*opt, 1).ok());
    EXPECT_TRUE(opt->checkpoint().ok());
    at1 = dump_all(*opt);
    const uint64_t used = store->usage().nvme_bytes;
    const uint64_t fill = so.nvme_budget_bytes - used - slack_chunks * kChunkNumel * 4;
    std::vector<char> filler(fill);
    EXPECT_TRUE(store->put("filler", filler.data(), TensorDesc::bytes(fill)).ok());
  }
};

TEST(OffloadClose, ACloseWhoseCheckpointFailsReportsReleasesAndKeepsTheLastCheckpoint) {
  // Room for step 2's copy-on-write of b (NVMe: 12 chunks, up to 16 while two sub-groups
  // share a chunk) but not for the checkpoint's rewrite of a's DRAM streams (6 chunks): the close's checkpoint fails
  // (ResourceExhausted, like a full disk).
  TightStore t(kSlackForTheStepOnly);
  OFFLOAD_ASSERT_OK(step(*t.opt, 2));
  Status st = t.opt->close();
  ASSERT_EQ(st.code(), StatusCode::kResourceExhausted) << st.to_string();
  EXPECT_NE(st.message().find("last checkpoint"), std::string::npos) << st.to_string();
  EXPECT_EQ(t.opt->close().code(), StatusCode::kOk);  // released: a second close is a no-op
  EXPECT_EQ(step(*t.opt, 3).code(), StatusCode::kFailedPrecondition);
  // The changes since the last checkpoint were rolled back: an in-process resume on the
  // same Store object restores the last checkpoint at once.
  {
    auto again = OffloadedOptimizer::open(t.store, *torch_exact_rule_factory("adamw"), {});
    ASSERT_TRUE(again.ok()) << again.status().to_string();
    Dump got = dump_all(**again);
    for (ParamHandle h = 0; h < 2; ++h) {
      EXPECT_EQ(must((*again)->step_count(h)), 1) << h;
      for (size_t s = 0; s < got[h].size(); ++s) {
        EXPECT_TRUE(bit_equal(got[h][s], t.at1[h][s])) << "in process, tensor " << h << " stream " << s;
      }
    }
    OFFLOAD_ASSERT_OK((*again)->close(/*checkpoint=*/false));
  }
  // The owner's flush and close commit nothing of the dropped step.
  OFFLOAD_ASSERT_OK(t.store->flush());
  t.opt.reset();
  OFFLOAD_ASSERT_OK(t.store->close());
  expect_resumes_at(t.dir.path(), 1, t.at1, "after a failed close");
}

TEST(OffloadClose, AStepThatFailsPartWayMakesCheckpointAndCloseRefuse) {
  TightStore t(1);  // b's step needs 3 chunks: ResourceExhausted part-way
  Status st = step(*t.opt, 2);
  ASSERT_EQ(st.code(), StatusCode::kResourceExhausted) << st.to_string();
  st = t.opt->checkpoint();
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("resume"), std::string::npos) << st.to_string();
  EXPECT_EQ(t.opt->close().code(), StatusCode::kFailedPrecondition);
  t.opt.reset();
  OFFLOAD_ASSERT_OK(t.store->close());
  expect_resumes_at(t.dir.path(), 1, t.at1, "after a failed step");
}

TEST(OffloadClose, AStoreClosedUnderTheOptimizerDropsOnlyWhatCameAfterTheCheckpoint) {
  TempDir dir;
  Dump at1;
  {
    std::shared_ptr<Store> store = must(Store::open(small_store_options(dir.path())));
    auto opt = make(store, "auto");
    OFFLOAD_ASSERT_OK(step(*opt, 1));
    OFFLOAD_ASSERT_OK(opt->checkpoint());
    at1 = dump_all(*opt);
    OFFLOAD_ASSERT_OK(step(*opt, 2));
    OFFLOAD_ASSERT_OK(store->close());  // the owner closes first: step 2 is not committed
    Status st = opt->close();
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.to_string();
  }
  expect_resumes_at(dir.path(), 1, at1, "store closed first");
}

TEST(OffloadClose, AnOptimizerClosedWithoutChangesNeedsNoStore) {
  // Nothing changed since the checkpoint: close() writes nothing, so it succeeds even on a
  // store its owner closed meanwhile.
  TempDir dir;
  std::shared_ptr<Store> store = must(Store::open(small_store_options(dir.path())));
  auto opt = make(store, "nvme");
  OFFLOAD_ASSERT_OK(step(*opt, 1));
  OFFLOAD_ASSERT_OK(opt->checkpoint());
  std::vector<float> ga = values(9, 10);  // a skipped step changes nothing either
  ga[3] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> gfull(kNa, 0.0f);
  std::copy(ga.begin(), ga.end(), gfull.begin());
  OFFLOAD_ASSERT_OK(opt->set_grad(0, gfull.data(), DType::kFloat32));
  EXPECT_TRUE(must(opt->step()).skipped);
  OFFLOAD_ASSERT_OK(store->close());
  OFFLOAD_ASSERT_OK(opt->close());
}

}  // namespace
}  // namespace strata::optimizer
