// Rules that take whole spans and may fail (UpdateRule::whole_spans / may_fail, the C++
// side of the Python update rule): one call per sub-group, where it is and what tensor, and
// a failing step rolled back on every tier (offload.hpp, "A RULE THAT FAILS").
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "offload_test_util.hpp"
#include "strata/base/thread_pool.hpp"

namespace strata::optimizer {
namespace {

using namespace strata::optimizer::offload_test;

/// x -= lr * g; s = 0.5 * s + g: an SGD-like rule with one state that records every call
/// (tensor name, offset, numel, step) and fails when the call's (name, step) is `fail_at`,
/// after having written garbage into its spans (a callable that raises half-way).
class RecordingRule final : public UpdateRule {
 public:
  struct Call {
    std::string name;
    uint64_t offset, numel;
    int64_t step;
    bool operator==(const Call&) const = default;
  };
  RecordingRule(bool whole, std::string fail_name, int64_t fail_step, uint64_t fail_offset)
      : whole_(whole), fail_name_(std::move(fail_name)), fail_step_(fail_step),
        fail_offset_(fail_offset) {}
  std::string_view name() const override { return "recording"; }
  int num_states() const override { return 1; }
  std::string_view state_name(int) const override { return "buf"; }
  bool whole_spans() const override { return whole_; }
  bool may_fail() const override { return true; }
  void update(const UpdateSpans&, const StepInfo&) const override { ADD_FAILURE(); }
  Status update_or_fail(const UpdateSpans& s, const StepInfo& info) const override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      calls_.push_back({std::string(info.param_name), info.offset, s.numel, info.step});
    }
    const auto* g = static_cast<const float*>(s.grad);
    if (info.param_name == fail_name_ && info.step == fail_step_ && info.offset >= fail_offset_) {
      for (size_t i = 0; i < s.numel; ++i) s.param[i] = s.states[0][i] = 1e30f;
      return invalid_argument("boom at " + std::to_string(info.offset));
    }
    for (size_t i = 0; i < s.numel; ++i) {
      s.states[0][i] = 0.5f * s.states[0][i] + g[i] * info.grad_scale;
      s.param[i] -= 0.25f * s.states[0][i];
    }
    return Status::OK();
  }
  void disarm() { fail_step_ = -1; }
  std::vector<Call> take_calls() const {
    std::lock_guard<std::mutex> lk(mu_);
    return std::exchange(calls_, {});
  }

 private:
  bool whole_;
  std::string fail_name_;
  int64_t fail_step_;
  uint64_t fail_offset_;
  mutable std::mutex mu_;
  mutable std::vector<Call> calls_;
};

TEST(FailingRule, ApplyUpdateGivesWholeSpansOneCallAndReturnsTheRuleError) {
  const size_t n = 5 * kTileNumel + 7;
  std::vector<float> p(n, 1.0f), g(n, 2.0f), st(n, 0.0f), copy(n, 0.0f);
  UpdateSpans s;
  s.param = p.data();
  s.grad = g.data();
  s.states[0] = st.data();
  s.param_copy = copy.data();
  s.param_copy_type = DType::kFloat32;
  s.numel = n;
  auto pool = ThreadPool::create(2).value();
  RecordingRule whole(true, "", 0, 0);
  StepInfo info(3);
  info.param_name = "w";
  info.offset = 100;
  OFFLOAD_ASSERT_OK(apply_update(whole, s, info, pool.get()));
  EXPECT_EQ(whole.take_calls(), (std::vector<RecordingRule::Call>{{"w", 100, n, 3}}));
  EXPECT_EQ(p[n - 1], 1.0f - 0.25f * 2.0f);
  EXPECT_TRUE(bit_equal(copy, p));  // the fp32 copy is taken after the one call
  // Tiled (whole_spans false): each tile's offset is the span's plus its start; a failing
  // tile's error is apply_update()'s.
  RecordingRule tiled(false, "w", 3, 100 + 2 * kTileNumel);
  Status st2 = apply_update(tiled, s, info, pool.get());
  EXPECT_EQ(st2.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st2.message().find("boom at"), std::string::npos) << st2.to_string();
  auto calls = tiled.take_calls();
  uint64_t total = 0;
  for (const auto& c : calls) {
    EXPECT_EQ((c.offset - 100) % kTileNumel, 0u);
    total += c.numel;
  }
  EXPECT_EQ(total, n);
}

struct Run {
  TempDir dir;
  std::shared_ptr<Store> store;
  std::unique_ptr<OffloadedOptimizer> opt;
};

// Two NVMe tensors (3.5 sub-groups and one small) and one host tensor.
constexpr uint64_t kSub = kChunkNumel;
const std::vector<std::tuple<std::string, uint64_t, Placement>> kTensors = {
    {"big", 3 * kSub + kSub / 2, Placement::kNvme},
    {"small", 1000, Placement::kNvme},
    {"host", 2 * kSub + 5, Placement::kHost}};

std::unique_ptr<Run> make_run(std::shared_ptr<RecordingRule> rule) {
  auto run = std::make_unique<Run>();
  run->store = must(Store::open(small_store_options(run->dir.path())));
  RuleFactory f = [rule](const Hyperparams&) -> Result<std::unique_ptr<UpdateRule>> {
    struct Fwd final : UpdateRule {  // a view of the shared recording rule
      std::shared_ptr<RecordingRule> r;
      std::string_view name() const override { return r->name(); }
      int num_states() const override { return 1; }
      std::string_view state_name(int i) const override { return r->state_name(i); }
      bool whole_spans() const override { return true; }
      bool may_fail() const override { return true; }
      void update(const UpdateSpans&, const StepInfo&) const override {}
      Status update_or_fail(const UpdateSpans& s, const StepInfo& i) const override {
        return r->update_or_fail(s, i);
      }
    };
    auto w = std::make_unique<Fwd>();
    w->r = rule;
    return std::unique_ptr<UpdateRule>(std::move(w));
  };
  OffloadOptions oo;
  oo.sub_group_numel = kSub;
  run->opt = must(OffloadedOptimizer::create(run->store, f, {}, oo));
  for (size_t t = 0; t < kTensors.size(); ++t) {
    const auto& [name, n, pl] = kTensors[t];
    auto init = values(t, n);
    must(run->opt->add_param(name, n, init.data(), 0, pl));
  }
  return run;
}

TEST(FailingRule, OffloadedStepCallsOncePerSubGroupAndRollsBackAFailedStep) {
  // Fails on "big" at step 2 from its third sub-group: "small" and "host" (and big's first
  // two sub-groups, written to NVMe already) were updated when it fails.
  auto rule = std::make_shared<RecordingRule>(true, "big", 2, 2 * kSub);
  auto run = make_run(rule);
  std::vector<std::vector<float>> grads;
  for (size_t t = 0; t < kTensors.size(); ++t) {
    grads.push_back(values(50 + t, std::get<1>(kTensors[t])));
    OFFLOAD_ASSERT_OK(run->opt->set_grad(t, grads[t].data(), DType::kFloat32));
  }
  OFFLOAD_ASSERT_OK(run->opt->step({}).status());
  // One call per sub-group of the NVMe tensors, one for the whole host tensor.
  auto calls = rule->take_calls();
  std::sort(calls.begin(), calls.end(), [](const auto& a, const auto& b) {
    return std::tie(a.name, a.offset) < std::tie(b.name, b.offset);
  });
  const std::vector<RecordingRule::Call> want = {{"big", 0, kSub, 1},
                                                 {"big", kSub, kSub, 1},
                                                 {"big", 2 * kSub, kSub, 1},
                                                 {"big", 3 * kSub, kSub / 2, 1},
                                                 {"host", 0, 2 * kSub + 5, 1},
                                                 {"small", 0, 1000, 1}};
  EXPECT_EQ(calls, want);
  std::vector<std::vector<std::vector<float>>> before;
  for (size_t t = 0; t < kTensors.size(); ++t) before.push_back(dump(*run->opt, t));

  auto failed = run->opt->step({});
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(failed.status().message().find("boom at"), std::string::npos);
  EXPECT_NE(failed.status().message().find("rolled back"), std::string::npos)
      << failed.status().to_string();
  for (size_t t = 0; t < kTensors.size(); ++t) {
    auto after = dump(*run->opt, t);
    ASSERT_EQ(after.size(), before[t].size());
    for (size_t k = 0; k < after.size(); ++k) {
      EXPECT_TRUE(bit_equal(after[k], before[t][k])) << std::get<0>(kTensors[t]) << " stream " << k;
    }
    EXPECT_EQ(must(run->opt->step_count(t)), 1);
  }
  // Still usable: a checkpoint, then with the rule no longer failing, the step again
  // gives step 2 of an in-memory run of the same rule and gradients.
  OFFLOAD_ASSERT_OK(run->opt->checkpoint());
  rule->disarm();
  OFFLOAD_ASSERT_OK(run->opt->step({}).status());
  RecordingRule plain(true, "", 0, 0);
  for (size_t t = 0; t < kTensors.size(); ++t) {
    std::vector<float> p = before[t][0], s = before[t][1];
    UpdateSpans sp;
    sp.param = p.data();
    sp.grad = grads[t].data();
    sp.states[0] = s.data();
    sp.numel = p.size();
    OFFLOAD_ASSERT_OK(apply_update(plain, sp, StepInfo(2), nullptr));
    auto got = dump(*run->opt, t);
    EXPECT_TRUE(bit_equal(got[0], p)) << std::get<0>(kTensors[t]);
    EXPECT_TRUE(bit_equal(got[1], s)) << std::get<0>(kTensors[t]);
    EXPECT_EQ(must(run->opt->step_count(t)), 2);
  }
}

}  // namespace
}  // namespace strata::optimizer
