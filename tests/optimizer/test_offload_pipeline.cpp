// The offloaded optimizer's step: DRAM vs NVMe parity (bit-exact) against an in-memory
// reference, for buffer counts 1..8 and sub-group sizes that do not divide the tensors;
// custom rules through the pipeline; clipping and inf/nan skip; fp16 grads and bf16 copies;
// hyperparameter changes; flat RSS across steps.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "offload_test_util.hpp"
#include "strata/optimizer/grad_utils.hpp"
#include "strata/optimizer/optimizers.hpp"

namespace strata::optimizer {
namespace {

using namespace offload_test;

// Tensor sizes: one not a multiple of anything, one a whole number of chunks, one small.
const std::vector<uint64_t> kSizes = {100003, 3 * kChunkNumel, 777};

struct Run {
  TempDir dir;
  std::shared_ptr<Store> store;
  std::unique_ptr<OffloadedOptimizer> opt;
  std::vector<ParamHandle> handles;
};

// Creates a store + optimizer with kSizes tensors placed at `placement`.
std::unique_ptr<Run> make_run(const RuleFactory& factory, const Hyperparams& hp,
                              OffloadOptions oo, Placement placement) {
  auto run = std::make_unique<Run>();
  auto s = Store::open(small_store_options(run->dir.path()));
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  if (!s.ok()) return nullptr;
  run->store = std::move(s).value();
  auto o = OffloadedOptimizer::create(run->store, factory, hp, oo);
  EXPECT_TRUE(o.ok()) << o.status().to_string();
  if (!o.ok()) return nullptr;
  run->opt = std::move(o).value();
  for (uint32_t t = 0; t < kSizes.size(); ++t) {
    auto init = values(t, kSizes[t]);
    auto h = run->opt->add_param("t" + std::to_string(t), kSizes[t], init.data(), 0, placement);
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    if (!h.ok()) return nullptr;
    run->handles.push_back(*h);
  }
  return run;
}

// Runs `steps` steps with grad_for() gradients on both the run and a reference built from
// the same factory; expects bit-identical masters and states after every step.
void expect_parity(Run& run, const RuleFactory& factory, const Hyperparams& hp, int steps) {
  auto rule = factory(hp);
  ASSERT_TRUE(rule.ok());
  std::vector<RefTensor> ref;
  for (uint32_t t = 0; t < kSizes.size(); ++t) ref.emplace_back(**rule, values(t, kSizes[t]));
  for (int s = 1; s <= steps; ++s) {
    std::vector<std::vector<float>> grads;
    for (uint32_t t = 0; t < kSizes.size(); ++t) {
      grads.push_back(grad_for(t, s, kSizes[t]));
      OFFLOAD_ASSERT_OK(run.opt->set_grad(run.handles[t], grads.back().data(), DType::kFloat32));
      OFFLOAD_ASSERT_OK(ref[t].step(**rule, grads.back().data()));
    }
    auto st = run.opt->step();
    ASSERT_TRUE(st.ok()) << st.status().to_string();
    EXPECT_FALSE(st->skipped);
    EXPECT_EQ(st->tensors_updated, kSizes.size());
    for (uint32_t t = 0; t < kSizes.size(); ++t) {
      ASSERT_TRUE(matches_reference(*run.opt, run.handles[t], ref[t], t, s));
      EXPECT_EQ(*run.opt->step_count(run.handles[t]), s);
    }
  }
}

RuleFactory adam_factory() { return *builtin_rule_factory("adam"); }
const Hyperparams kAdamHp = {{"lr", 1e-2}, {"weight_decay", 0.01}};

// An Adam run (make_run) of kSizes NVMe tensors in sub-groups of `sub_group_numel`.
std::unique_ptr<Run> adam_nvme_run(uint64_t sub_group_numel) {
  OffloadOptions oo;
  oo.sub_group_numel = sub_group_numel;
  return make_run(adam_factory(), kAdamHp, oo, Placement::kNvme);
}

TEST(OffloadPipeline, HostTierMatchesReference) {
  OffloadOptions oo;
  auto run = make_run(adam_factory(), kAdamHp, oo, Placement::kHost);
  ASSERT_NE(run, nullptr);
  EXPECT_EQ(run->opt->param_info(0)->placement, Placement::kHost);
  expect_parity(*run, adam_factory(), kAdamHp, 3);
}

TEST(OffloadPipeline, NvmeMatchesReferenceForBufferCounts1To8) {
  for (int b = 1; b <= 8; ++b) {
    SCOPED_TRACE("num_buffers " + std::to_string(b));
    OffloadOptions oo;
    oo.num_buffers = b;
    oo.sub_group_numel = 20000;  // divides none of the tensors, not chunk-aligned
    auto run = make_run(adam_factory(), kAdamHp, oo, Placement::kNvme);
    ASSERT_NE(run, nullptr);
    EXPECT_EQ(run->opt->param_info(0)->placement, Placement::kNvme);
    expect_parity(*run, adam_factory(), kAdamHp, 2);
  }
}

TEST(OffloadPipeline, NvmeMatchesReferenceForSubGroupSizes) {
  // Tiny, prime, chunk-sized, multi-chunk, larger than every tensor, and auto (0).
  for (uint64_t sg : std::vector<uint64_t>{1000, 4099, kChunkNumel, 2 * kChunkNumel + 5, 1u << 20, 0}) {
    SCOPED_TRACE("sub_group_numel " + std::to_string(sg));
    OffloadOptions oo;
    oo.sub_group_numel = sg;
    oo.num_buffers = 3;
    auto run = make_run(adam_factory(), kAdamHp, oo, Placement::kNvme);
    ASSERT_NE(run, nullptr);
    if (sg == 0) {
      EXPECT_EQ(run->opt->sub_group_numel(), kChunkNumel);
    }
    expect_parity(*run, adam_factory(), kAdamHp, 2);
  }
}

TEST(OffloadPipeline, AmsgradAdagradLionSgdThroughThePipeline) {
  struct Case {
    const char* name;
    Hyperparams hp;
  };
  const std::vector<Case> cases = {
      {"adam", {{"amsgrad", 1}, {"lr", 3e-3}}},
      {"adamw", {}},
      {"adagrad", {{"initial_accumulator_value", 0.1}, {"lr_decay", 0.01}}},
      {"sgd", {{"momentum", 0.9}, {"nesterov", 1}, {"lr", 0.05}}},
      {"lion", {{"weight_decay", 0.1}}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto f = builtin_rule_factory(c.name);
    ASSERT_TRUE(f.ok());
    OffloadOptions oo;
    oo.sub_group_numel = 9000;
    auto run = make_run(*f, c.hp, oo, Placement::kNvme);
    ASSERT_NE(run, nullptr);
    expect_parity(*run, *f, c.hp, 2);
  }
}

TEST(OffloadPipeline, CustomElementwiseRuleThroughThePipeline) {
  // Momentum SGD with a decaying second buffer: two states, lr from the hyperparameters.
  RuleFactory factory = [](const Hyperparams& hp) -> Result<std::unique_ptr<UpdateRule>> {
    auto it = hp.find("lr");
    const float lr = static_cast<float>(it == hp.end() ? 0.1 : it->second);
    return make_elementwise_rule<2>(
        "my_rule", {"buf_a", "buf_b"}, [lr](int64_t step) { return lr / static_cast<float>(step); },
        [](float slr, float& p, float g, float* s) {
          s[0] = 0.9f * s[0] + g;
          s[1] = 0.5f * s[1] + g * g;
          p -= slr * s[0] / (1.0f + s[1]);
        },
        {0.0f, 0.25f});
  };
  const Hyperparams hp = {{"lr", 0.2}};
  OffloadOptions oo;
  oo.sub_group_numel = 12345;
  oo.num_buffers = 2;
  auto run = make_run(factory, hp, oo, Placement::kNvme);
  ASSERT_NE(run, nullptr);
  EXPECT_EQ(run->opt->rule_name(), "my_rule");
  EXPECT_EQ(run->opt->state_name(1), "buf_b");
  // The nonzero initial value of buf_b reached the NVMe object.
  std::vector<float> b(kSizes[0]);
  OFFLOAD_ASSERT_OK(run->opt->read_state(0, 1, b.data()));
  EXPECT_EQ(b[0], 0.25f);
  EXPECT_EQ(b[kSizes[0] - 1], 0.25f);
  expect_parity(*run, factory, hp, 3);
  // Resuming its checkpoint without the factory names the custom rule and what to pass.
  OFFLOAD_ASSERT_OK(run->opt->checkpoint());
  run->opt.reset();
  auto again = OffloadedOptimizer::open(run->store, nullptr, oo);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(again.status().message(),
            "checkpoint 'optim/meta' was written with the custom rule 'my_rule': pass its "
            "RuleFactory to OffloadedOptimizer::open() (the built-in rules, which open() finds "
            "by name, are adam, adamw, adagrad, sgd, lion)");
  auto resumed = OffloadedOptimizer::open(run->store, factory, oo);
  EXPECT_TRUE(resumed.ok()) << resumed.status().to_string();
}

TEST(OffloadPipeline, MixedPlacementAndHostBudget) {
  OffloadOptions oo;
  // Room for tensor 0 (100003 * 12 bytes) only: auto places it in DRAM, the rest on NVMe.
  oo.host_budget_bytes = 100003 * 12 + 100;
  auto run = make_run(adam_factory(), kAdamHp, oo, Placement::kAuto);
  ASSERT_NE(run, nullptr);
  EXPECT_EQ(run->opt->param_info(0)->placement, Placement::kHost);
  EXPECT_EQ(run->opt->param_info(1)->placement, Placement::kNvme);
  EXPECT_EQ(run->opt->param_info(2)->placement, Placement::kNvme);
  EXPECT_EQ(run->opt->host_bytes(), 100003u * 12);
  expect_parity(*run, adam_factory(), kAdamHp, 2);
}

/// Reference tensors beside `run`'s, and step 1's fp32 gradient of each, attached to it.
struct AttachedGrads {
  std::vector<RefTensor> ref;
  std::vector<std::vector<float>> grads;
};

AttachedGrads attach_reference_grads(Run& run, const UpdateRule& rule) {
  AttachedGrads a;
  for (uint32_t t = 0; t < kSizes.size(); ++t) {
    a.ref.emplace_back(rule, values(t, kSizes[t]));
    a.grads.push_back(grad_for(t, 1, kSizes[t]));
    EXPECT_TRUE(run.opt->set_grad(run.handles[t], a.grads.back().data(), DType::kFloat32).ok());
  }
  return a;
}

/// Every tensor of `run` is bit-identical to its reference stepped with gradient scale
/// `scale` (master and second moment).
void expect_stepped_with_scale(Run& run, const UpdateRule& rule, AttachedGrads& a,
                               float scale) {
  for (uint32_t t = 0; t < kSizes.size(); ++t) {
    ASSERT_TRUE(a.ref[t].step(rule, a.grads[t].data(), scale).ok());
    auto got = dump(*run.opt, run.handles[t]);
    EXPECT_TRUE(bit_equal(got[0], a.ref[t].param)) << "t" << t;
    EXPECT_TRUE(bit_equal(got[2], a.ref[t].states[1])) << "t" << t;
  }
}

TEST(OffloadPipeline, ClippingByGlobalNorm) {
  auto run = adam_nvme_run(30000);
  ASSERT_NE(run, nullptr);
  auto rule = must(adam_factory()(kAdamHp));
  AttachedGrads a = attach_reference_grads(*run, *rule);
  std::vector<GradView> views;
  double sumsq = 0.0;
  for (auto& g : a.grads) {
    for (float x : g) sumsq += static_cast<double>(x) * x;
    views.push_back({g.data(), DType::kFloat32, g.size()});
  }
  const float grad_scale = 0.5f;
  const double max_norm = 1.0;
  StepOptions so;
  so.grad_scale = grad_scale;
  so.max_grad_norm = max_norm;
  auto st = run->opt->step(so);
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  // Norm of the scaled gradients (sum of ~200k squares of U(-.5,.5) is ~ 16.7k: norm ~ 65).
  EXPECT_NEAR(st->grad_norm, std::sqrt(sumsq) * grad_scale, 1e-9 * st->grad_norm);
  EXPECT_GT(st->grad_norm, 10.0);
  EXPECT_DOUBLE_EQ(st->clip_coef, max_norm / (st->grad_norm + 1e-6));
  const double norm = *global_l2_norm(views) * grad_scale;
  const float scale = static_cast<float>(grad_scale * clip_coefficient(norm, max_norm));
  expect_stepped_with_scale(*run, *rule, a, scale);
}

TEST(OffloadPipeline, GivenGradSummaryDecidesTheGateWithoutAScan) {
  // The summary stands for gradients the step does not see (batches, ranks, torch's
  // norm): its norm drives the clipping, its nonfinite flag the skip, whatever the
  // attached gradients hold.
  auto run = adam_nvme_run(30000);
  ASSERT_NE(run, nullptr);
  auto rule = must(adam_factory()(kAdamHp));
  AttachedGrads a = attach_reference_grads(*run, *rule);
  StepOptions so;
  so.max_grad_norm = 0.5;
  so.grad_summary = StepOptions::GradSummary{3.25, true, NormArithmetic::kTorch};
  auto skipped = run->opt->step(so);
  ASSERT_TRUE(skipped.ok()) << skipped.status().to_string();
  EXPECT_TRUE(skipped->skipped);
  EXPECT_EQ(skipped->bytes_written, 0u);
  so.grad_summary->nonfinite = false;
  auto st = run->opt->step(so);
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  EXPECT_FALSE(st->skipped);
  EXPECT_EQ(st->grad_norm, 3.25);
  const float scale = torch_clip_coefficient(3.25f, 0.5);
  EXPECT_EQ(st->clip_coef, static_cast<double>(scale));
  expect_stepped_with_scale(*run, *rule, a, scale);
}

TEST(OffloadPipeline, NonFiniteGradientSkipsTheStep) {
  OffloadOptions oo;
  auto run = make_run(adam_factory(), kAdamHp, oo, Placement::kNvme);
  ASSERT_NE(run, nullptr);
  std::vector<std::vector<float>> before;
  for (uint32_t t = 0; t < kSizes.size(); ++t) before.push_back(dump(*run->opt, t)[0]);
  std::vector<std::vector<float>> grads;
  for (uint32_t t = 0; t < kSizes.size(); ++t) {
    grads.push_back(grad_for(t, 1, kSizes[t]));
    OFFLOAD_ASSERT_OK(run->opt->set_grad(t, grads.back().data(), DType::kFloat32));
  }
  grads[1][4321] = std::nanf("");
  for (double max_norm : {0.0, 1.0}) {
    StepOptions so;
    so.max_grad_norm = max_norm;
    auto st = run->opt->step(so);
    ASSERT_TRUE(st.ok()) << st.status().to_string();
    EXPECT_TRUE(st->skipped);
    EXPECT_EQ(st->bytes_written, 0u);
    for (uint32_t t = 0; t < kSizes.size(); ++t) {
      EXPECT_EQ(*run->opt->step_count(t), 0);
      EXPECT_TRUE(bit_equal(dump(*run->opt, t)[0], before[t]));
    }
  }
  grads[1][4321] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(run->opt->step()->skipped);
  grads[1][4321] = 0.0f;
  auto st = run->opt->step();
  ASSERT_TRUE(st.ok());
  EXPECT_FALSE(st->skipped);
  EXPECT_EQ(*run->opt->step_count(1), 1);
}

TEST(OffloadPipeline, HalfGradientsAndBf16CopyAndDetachedGrads) {
  auto run = adam_nvme_run(7000);
  ASSERT_NE(run, nullptr);
  auto rule = must(adam_factory()(kAdamHp));
  // Tensor 0: fp16 gradient + bf16 copy; tensor 1: no gradient (untouched); tensor 2: bf16.
  RefTensor ref0(*rule, values(0, kSizes[0]));
  RefTensor ref2(*rule, values(2, kSizes[2]));
  auto g0 = grad_for(0, 1, kSizes[0]);
  auto g2 = grad_for(2, 1, kSizes[2]);
  std::vector<uint16_t> h0(g0.size()), h2(g2.size());
  store_converted(g0.data(), DType::kFloat16, h0.data(), g0.size());
  store_converted(g2.data(), DType::kBFloat16, h2.data(), g2.size());
  std::vector<uint16_t> copy0(kSizes[0]);
  OFFLOAD_ASSERT_OK(run->opt->set_grad(0, h0.data(), DType::kFloat16));
  OFFLOAD_ASSERT_OK(run->opt->set_grad(2, h2.data(), DType::kBFloat16));
  OFFLOAD_ASSERT_OK(run->opt->set_param_copy(0, copy0.data(), DType::kBFloat16));
  EXPECT_EQ(run->opt->set_grad(0, h0.data(), DType::kInt8).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(run->opt->set_param_copy(0, copy0.data(), DType::kFloat64).code(),
            StatusCode::kInvalidArgument);
  auto st = run->opt->step();
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  EXPECT_EQ(st->tensors_updated, 2u);
  EXPECT_EQ(st->numel_updated, kSizes[0] + kSizes[2]);
  EXPECT_EQ(st->bytes_read, (kSizes[0] + kSizes[2]) * 12);
  EXPECT_EQ(st->bytes_written, (kSizes[0] + kSizes[2]) * 12);
  // Reference: convert the half gradients back to fp32 exactly.
  std::vector<float> f0(g0.size()), f2(g2.size());
  load_scaled_grad(h0.data(), DType::kFloat16, 1.0f, f0.data(), f0.size());
  load_scaled_grad(h2.data(), DType::kBFloat16, 1.0f, f2.data(), f2.size());
  OFFLOAD_ASSERT_OK(ref0.step(*rule, f0.data()));
  OFFLOAD_ASSERT_OK(ref2.step(*rule, f2.data()));
  EXPECT_TRUE(bit_equal(dump(*run->opt, 0)[0], ref0.param));
  EXPECT_TRUE(bit_equal(dump(*run->opt, 2)[0], ref2.param));
  EXPECT_TRUE(bit_equal(dump(*run->opt, 1)[0], values(1, kSizes[1])));
  EXPECT_EQ(*run->opt->step_count(1), 0);
  std::vector<uint16_t> want(kSizes[0]);
  store_converted(ref0.param.data(), DType::kBFloat16, want.data(), want.size());
  EXPECT_EQ(copy0, want);
}

TEST(OffloadPipeline, LearningRateChangeTakesEffectNextStep) {
  auto run = adam_nvme_run(50000);
  ASSERT_NE(run, nullptr);
  auto f = adam_factory();
  std::vector<RefTensor> ref;
  auto r1 = must(f(kAdamHp));
  Hyperparams hp2 = kAdamHp;
  hp2["lr"] = 5e-4;
  auto r2 = must(f(hp2));
  for (uint32_t t = 0; t < kSizes.size(); ++t) ref.emplace_back(*r1, values(t, kSizes[t]));
  for (int s = 1; s <= 2; ++s) {
    if (s == 2) OFFLOAD_ASSERT_OK(run->opt->set_lr(0, 5e-4));
    std::vector<std::vector<float>> grads;
    for (uint32_t t = 0; t < kSizes.size(); ++t) {
      grads.push_back(grad_for(t, s, kSizes[t]));
      OFFLOAD_ASSERT_OK(run->opt->set_grad(t, grads.back().data(), DType::kFloat32));
      OFFLOAD_ASSERT_OK(ref[t].step(s == 1 ? *r1 : *r2, grads.back().data()));
    }
    ASSERT_TRUE(run->opt->step().ok());
  }
  for (uint32_t t = 0; t < kSizes.size(); ++t) {
    EXPECT_TRUE(bit_equal(dump(*run->opt, t)[0], ref[t].param)) << t;
  }
  EXPECT_EQ(run->opt->hyperparams(0)->at("lr"), 5e-4);
  EXPECT_EQ(run->opt->set_lr(0, -1.0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(run->opt->hyperparams(0)->at("lr"), 5e-4);
  // A change of the state streams (amsgrad) is refused.
  EXPECT_EQ(run->opt->set_hyperparams(0, {{"amsgrad", 1}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(run->opt->set_lr(7, 1e-3).code(), StatusCode::kOutOfRange);
}

TEST(OffloadPipeline, ParamGroupsHaveTheirOwnHyperparameters) {
  TempDir dir;
  std::shared_ptr<Store> store = must(Store::open(small_store_options(dir.path())));
  auto f = adam_factory();
  auto opt = must(OffloadedOptimizer::create(store, f, kAdamHp, {}));
  auto g1 = opt->add_param_group({{"lr", 0.1}});
  ASSERT_TRUE(g1.ok());
  EXPECT_EQ(*g1, 1);
  EXPECT_EQ(opt->hyperparams(1)->at("weight_decay"), 0.01);  // inherited from group 0
  auto init = values(9, 5000);
  auto a = *opt->add_param("a", 5000, init.data(), 0, Placement::kNvme);
  auto b = *opt->add_param("b", 5000, init.data(), 1, Placement::kNvme);
  auto g = grad_for(0, 1, 5000);
  OFFLOAD_ASSERT_OK(opt->set_grad(a, g.data(), DType::kFloat32));
  OFFLOAD_ASSERT_OK(opt->set_grad(b, g.data(), DType::kFloat32));
  ASSERT_TRUE(opt->step().ok());
  RefTensor ra(**f(kAdamHp), init), rb(**f({{"lr", 0.1}, {"weight_decay", 0.01}}), init);
  OFFLOAD_ASSERT_OK(ra.step(**f(kAdamHp), g.data()));
  OFFLOAD_ASSERT_OK(rb.step(**f({{"lr", 0.1}, {"weight_decay", 0.01}}), g.data()));
  EXPECT_TRUE(bit_equal(dump(*opt, a)[0], ra.param));
  EXPECT_TRUE(bit_equal(dump(*opt, b)[0], rb.param));
  EXPECT_FALSE(bit_equal(ra.param, rb.param));
  EXPECT_EQ(opt->param_info(b)->group, 1);
}

TEST(OffloadPipeline, StateAccessorsRoundTripAndRanges) {
  OffloadOptions oo;
  auto run = make_run(adam_factory(), kAdamHp, oo, Placement::kNvme);
  ASSERT_NE(run, nullptr);
  auto& opt = *run->opt;
  EXPECT_EQ(opt.num_states(), 2);
  EXPECT_EQ(opt.state_name(0), "exp_avg");
  EXPECT_EQ(opt.state_name(1), "exp_avg_sq");
  auto v = values(77, 5000, 0.0f, 1.0f);
  OFFLOAD_ASSERT_OK(opt.write_state(0, 1, v.data(), 12345, 5000));
  std::vector<float> back(5000);
  OFFLOAD_ASSERT_OK(opt.read_state(0, 1, back.data(), 12345, 5000));
  EXPECT_TRUE(bit_equal(back, v));
  OFFLOAD_ASSERT_OK(opt.write_param(2, v.data()));  // tensor 2 has 777 elements: whole
  std::vector<float> p2(777);
  OFFLOAD_ASSERT_OK(opt.read_param(2, p2.data()));
  EXPECT_TRUE(bit_equal(p2, std::vector<float>(v.begin(), v.begin() + 777)));
  EXPECT_EQ(opt.read_param(2, p2.data(), 700, 100).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(opt.read_state(0, 2, back.data()).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(opt.read_param(9, p2.data()).code(), StatusCode::kOutOfRange);
  OFFLOAD_ASSERT_OK(opt.set_step_count(0, 41));
  EXPECT_EQ(*opt.step_count(0), 41);
  EXPECT_EQ(opt.set_step_count(0, -1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*opt.find_param("t1"), 1u);
  EXPECT_EQ(opt.find_param("nope").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(opt.add_param("t1", 10, nullptr).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(opt.add_param("has space", 10, nullptr).status().code(), StatusCode::kInvalidArgument);
  // Zero-size parameters are held (test_offload_resume.cpp: ZeroSizeParameters...).
  auto z = opt.add_param("z", 0, nullptr);
  ASSERT_TRUE(z.ok()) << z.status().to_string();
  EXPECT_EQ(opt.param_info(*z)->numel, 0u);
  EXPECT_EQ(opt.add_param("z", 0, nullptr).status().code(), StatusCode::kInvalidArgument);
  // nullptr init = zeros.
  auto hz = opt.add_param("zeros", 70000, nullptr, 0, Placement::kNvme);
  ASSERT_TRUE(hz.ok());
  EXPECT_TRUE(bit_equal(dump(opt, *hz)[0], std::vector<float>(70000, 0.0f)));
}

TEST(OffloadPipeline, OptionErrors) {
  TempDir dir;
  std::shared_ptr<Store> store = must(Store::open(small_store_options(dir.path())));
  OffloadOptions bad;
  bad.num_buffers = -1;  // (0 is auto: test_offload_auto_buffers.cpp)
  EXPECT_EQ(OffloadedOptimizer::create(store, adam_factory(), {}, bad).status().code(),
            StatusCode::kInvalidArgument);
  bad.num_buffers = 17;
  EXPECT_EQ(OffloadedOptimizer::create(store, adam_factory(), {}, bad).status().code(),
            StatusCode::kInvalidArgument);
  OffloadOptions tight;
  tight.sub_group_numel = 1 << 20;
  tight.pinned_budget_bytes = 1 << 20;
  EXPECT_EQ(OffloadedOptimizer::create(store, adam_factory(), {}, tight).status().code(),
            StatusCode::kInvalidArgument);
  OffloadOptions huge;  // 2^62 elements: the pinned size would overflow 64 bits
  huge.sub_group_numel = 1ull << 62;
  auto h = OffloadedOptimizer::create(store, adam_factory(), {}, huge);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(h.status().message().find("OffloadOptions.sub_group_numel 4611686018427387904 is too large"),
            std::string::npos)
      << h.status().to_string();
  // Auto sub-group shrinks to the budget: 4 buffers x 3 streams within 96 KiB -> 8 KiB/stream.
  OffloadOptions fit;
  fit.pinned_budget_bytes = 96 << 10;
  fit.key_prefix = "fit/";  // its close checkpoints under its own prefix
  auto o = OffloadedOptimizer::create(store, adam_factory(), {}, fit);
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  EXPECT_EQ((*o)->sub_group_numel(), 2048u);
  EXPECT_LE((*o)->pinned_bytes(), 96u << 10);
  EXPECT_EQ(OffloadedOptimizer::create(store, nullptr, {}, {}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(OffloadedOptimizer::create(store, adam_factory(), {{"lr", -1.0}}, {}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(OffloadedOptimizer::create(store, adam_factory(), {{"bogus", 1.0}}, {}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(builtin_rule_factory("rmsprop").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(OffloadedOptimizer::open(store, nullptr, {}).status().code(), StatusCode::kNotFound);
}

// Resident set size in bytes from /proc/self/statm.
uint64_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

TEST(OffloadPipeline, RssFlatAcrossSteps) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer changes what this test measures (locked memory, RSS)";
#endif
  // 4M elements (48 MB of master + states) streamed through 4 x 3 x 256 KiB of buffers:
  // growth proportional to the tensor (or a per-step leak) would show in the RSS.
  TempDir dir;
  auto so = small_store_options(dir.path());
  so.chunk_bytes = 256 << 10;
  std::shared_ptr<Store> store = must(Store::open(so));
  auto opt = must(OffloadedOptimizer::create(store, adam_factory(), kAdamHp, {}));
  const uint64_t n = 4ull << 20;
  auto h = opt->add_param("big", n, nullptr, 0, Placement::kNvme);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  std::vector<float> g(n, 0.01f);
  OFFLOAD_ASSERT_OK(opt->set_grad(*h, g.data(), DType::kFloat32));
  ASSERT_TRUE(opt->step().ok());
  ASSERT_TRUE(opt->step().ok());
  const uint64_t before = rss_bytes();
  for (int i = 0; i < 6; ++i) {
    auto st = opt->step();
    ASSERT_TRUE(st.ok()) << st.status().to_string();
    EXPECT_EQ(st->bytes_read, n * 12);
  }
  const uint64_t after = rss_bytes();
  EXPECT_LT(after, before + (4u << 20)) << "RSS grew from " << before << " to " << after;
  EXPECT_EQ(*opt->step_count(*h), 8);
}

TEST(OffloadPipeline, StepAsyncSerializesWithOtherCalls) {
  auto run = adam_nvme_run(10000);
  ASSERT_NE(run, nullptr);
  std::vector<std::vector<float>> grads;
  for (uint32_t t = 0; t < kSizes.size(); ++t) {
    grads.push_back(grad_for(t, 1, kSizes[t]));
    OFFLOAD_ASSERT_OK(run->opt->set_grad(t, grads.back().data(), DType::kFloat32));
  }
  auto f1 = run->opt->step_async();
  auto c = run->opt->step_count(0);  // waits for the step
  EXPECT_EQ(*c, 1);
  auto f2 = run->opt->step_async();
  auto r2 = f2.result();
  ASSERT_TRUE(f1.result().ok());
  ASSERT_TRUE(r2.ok()) << r2.status().to_string();
  EXPECT_EQ(*run->opt->step_count(2), 2);
}

}  // namespace
}  // namespace strata::optimizer
