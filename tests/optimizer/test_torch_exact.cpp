// make_torch_exact_adam / torch_exact_rule_factory: bit-identical to torch 1.13's fp32 Adam
// sequence (optimizer_test_util.hpp's torch_adam_element) for every Adam variant, gradient
// dtype, grad scale, thread count and sub-group split; the SIMD rule's checks and names;
// the offloaded optimizer with either arithmetic on one checkpoint. (test_torch_parity.py
// compares the same rule against torch itself.)
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "offload_test_util.hpp"
#include "optimizer_test_util.hpp"
#include "strata/optimizer/offload.hpp"
#include "strata/base/thread_pool.hpp"

namespace strata::optimizer {
namespace {

using namespace strata::optimizer::testing;

std::vector<Variant> adam_variants() {
  std::vector<Variant> out;
  for (const auto& v : all_variants()) {
    if (v.kind == Kind::kAdam) out.push_back(v);
  }
  return out;
}

TEST(TorchExactAdam, BitIdenticalToTorchsSequenceForEveryVariantDtypeScaleAndSplit) {
  const size_t n = 70001;
  auto pool = ThreadPool::create(3).value();
  for (const Variant& v : adam_variants()) {
    auto rule = make_torch_exact_adam(v.adam);
    ASSERT_TRUE(rule.ok()) << rule.status().to_string();
    const int ns = (*rule)->num_states();
    ASSERT_EQ(ns, v.adam.amsgrad ? 3 : 2);
    for (DType gt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      for (float scale : {1.0f, 0.37f}) {
        SCOPED_TRACE(v.name + " " + std::string(dtype_name(gt)) + " scale " + std::to_string(scale));
        Rng rng(17);
        std::vector<float> p(n), rp(n);
        std::vector<std::vector<float>> st(ns, std::vector<float>(n)), rs = st;
        std::vector<uint16_t> copy(n);
        for (size_t i = 0; i < n; ++i) p[i] = rp[i] = rng.uniform(-2, 2);
        GradBuffer g(gt, n, 1);
        for (int64_t t = 1; t <= 4; ++t) {
          for (size_t i = 0; i < n; ++i) g.set(i, rng.uniform(-1, 1) * (i % 7 == 0 ? 1e-5f : 1.0f));
          g.set(3, 0.0f);
          UpdateSpans sp{p.data(), g.data(), gt, {}, copy.data(), DType::kBFloat16, n};
          for (int k = 0; k < ns; ++k) sp.states[k] = st[k].data();
          const size_t cuts[] = {0, 1, 1025, 40000, n};
          for (int c = 0; c + 1 < 5; ++c) {
            ASSERT_TRUE(apply_update(**rule, sp.slice(cuts[c], cuts[c + 1] - cuts[c]),
                                     {t, scale}, pool.get())
                            .ok());
          }
          for (size_t i = 0; i < n; ++i) {
            float s[3];
            for (int k = 0; k < ns; ++k) s[k] = rs[k][i];
            torch_adam_element(v.adam, rp[i], g.exact[i] * scale, s, t);
            for (int k = 0; k < ns; ++k) rs[k][i] = s[k];
          }
        }
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(float_bits(p[i]), float_bits(rp[i])) << "param " << i;
          for (int k = 0; k < ns; ++k) ASSERT_EQ(float_bits(st[k][i]), float_bits(rs[k][i])) << k << " " << i;
          ASSERT_EQ(copy[i], bf16_bits(p[i])) << i;
        }
      }
    }
  }
}

TEST(TorchExactAdam, FollowsTheAdamFormulasAndHasTheSimdRulesNamesAndChecks) {
  for (const Variant& v : adam_variants()) {
    auto exact = make_torch_exact_adam(v.adam).value();
    auto simd = make_adam(v.adam).value();
    EXPECT_EQ(exact->name(), simd->name()) << v.name;
    ASSERT_EQ(exact->num_states(), simd->num_states()) << v.name;
    for (int k = 0; k < exact->num_states(); ++k) {
      EXPECT_EQ(exact->state_name(k), simd->state_name(k));
      EXPECT_EQ(exact->state_init_value(k), 0.0f);
    }
    // One element against the fp64 reference of optimizers.hpp's formulas.
    float p = 0.75f, s[3] = {0.01f, 0.002f, 0.003f};
    double rp = p, rs[3] = {s[0], s[1], s[2]};
    for (int64_t t = 1; t <= 5; ++t) {
      const float g = 0.1f * static_cast<float>(t) - 0.27f;
      UpdateSpans sp{&p, &g, DType::kFloat32, {&s[0], &s[1], &s[2]}, nullptr, DType::kBFloat16, 1};
      ASSERT_TRUE(apply_update(*exact, sp, {t, 1.0f}, nullptr).ok());
      v.reference(rp, g, rs, t, 1.0);
    }
    EXPECT_NEAR(p, rp, 1e-6 * std::abs(rp)) << v.name;
    EXPECT_NEAR(s[1], rs[1], 1e-5 * rs[1]) << v.name;
  }
  // The same range checks and messages as make_adam.
  std::vector<AdamOptions> bad(5);
  bad[0].lr = -1;
  bad[1].eps = -1e-8;
  bad[2].beta1 = 1.0;
  bad[3].beta2 = -0.1;
  bad[4].weight_decay = -0.01;
  for (AdamOptions o : bad) {
    for (bool decoupled : {false, true}) {
      o.decoupled_weight_decay = decoupled;
      auto e = make_torch_exact_adam(o);
      ASSERT_FALSE(e.ok());
      EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
      EXPECT_EQ(e.status().to_string(), make_adam(o).status().to_string());
    }
  }
}

TEST(TorchExactAdam, FactoryTakesTheBuiltinHyperparametersAndRefusesOtherOptimizers) {
  for (const char* other : {"sgd", "adagrad", "lion", "nope"}) {
    auto f = torch_exact_rule_factory(other);
    ASSERT_FALSE(f.ok()) << other;
    EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(f.status().message().find(other), std::string::npos);
  }
  for (const char* name : {"adam", "adamw"}) {
    auto exact = torch_exact_rule_factory(name).value();
    auto simd = builtin_rule_factory(name).value();
    const Hyperparams hp = {{"lr", 1e-2}, {"amsgrad", 1}};
    EXPECT_EQ(exact(hp).value()->name(), name);
    EXPECT_EQ(exact(hp).value()->num_states(), 3);
    for (const Hyperparams& wrong : std::vector<Hyperparams>{
             {{"momentum", 0.9}}, {{"amsgrad", 2}}, {{"lr", -1.0}}, {{"beta2", 1.0}}}) {
      auto a = exact(wrong);
      ASSERT_FALSE(a.ok());
      EXPECT_EQ(a.status().to_string(), simd(wrong).status().to_string());
    }
    // Defaults (torch.optim's): AdamW decays, Adam does not.
    AdamOptions o;
    o.decoupled_weight_decay = std::string(name) == "adamw";
    if (o.decoupled_weight_decay) o.weight_decay = kAdamWDefaultWeightDecay;
    auto from_factory = exact({}).value();
    auto direct = make_torch_exact_adam(o).value();
    float p1 = 0.5f, p2 = 0.5f, s1[2] = {}, s2[2] = {};
    const float g = 0.25f;
    UpdateSpans a{&p1, &g, DType::kFloat32, {&s1[0], &s1[1]}, nullptr, DType::kBFloat16, 1};
    UpdateSpans b{&p2, &g, DType::kFloat32, {&s2[0], &s2[1]}, nullptr, DType::kBFloat16, 1};
    for (int64_t t = 1; t <= 3; ++t) {
      ASSERT_TRUE(apply_update(*from_factory, a, {t, 1.0f}, nullptr).ok());
      ASSERT_TRUE(apply_update(*direct, b, {t, 1.0f}, nullptr).ok());
    }
    EXPECT_EQ(float_bits(p1), float_bits(p2)) << name;
  }
}

TEST(TorchExactAdam, OffloadedStepIsBitIdenticalAndTheCheckpointResumesWithEitherArithmetic) {
  using namespace offload_test;
  TempDir dir;
  const uint64_t n = 2 * kChunkNumel + 4321;
  const Hyperparams hp = {{"lr", 1e-2}, {"weight_decay", 0.05}};
  auto rule = make_torch_exact_adam([] {
                AdamOptions o;
                o.lr = 1e-2;
                o.weight_decay = 0.05;
                o.decoupled_weight_decay = true;
                return o;
              }()).value();
  RefTensor ref(*rule, values(1, n));
  {
    std::shared_ptr<Store> store = must(Store::open(small_store_options(dir.path())));
    OffloadOptions oo;
    oo.sub_group_numel = 5000;  // not a divisor of n nor of a chunk
    oo.num_threads = 2;
    auto opt = must(OffloadedOptimizer::create(store, must(torch_exact_rule_factory("adamw")), hp, oo));
    const auto init = values(1, n);
    const ParamHandle h = must(opt->add_param("w", n, init.data(), 0, Placement::kNvme));
    for (int64_t s = 1; s <= 3; ++s) {
      const auto g = grad_for(0, s, n);
      OFFLOAD_ASSERT_OK(opt->set_grad(h, g.data(), DType::kFloat32));
      OFFLOAD_ASSERT_OK(opt->step());
      OFFLOAD_ASSERT_OK(ref.step(*rule, g.data()));
    }
    const auto got = dump(*opt, h);
    ASSERT_TRUE(bit_equal(got[0], ref.param));
    ASSERT_TRUE(bit_equal(got[2], ref.states[1]));
    OFFLOAD_ASSERT_OK(opt->checkpoint());
  }
  // The record names rule "adamw": an empty factory (the SIMD built-in) and the torch-exact
  // factory both resume it.
  for (bool exact : {false, true}) {
    std::shared_ptr<Store> store = must(Store::open(small_store_options(dir.path())));
    RuleFactory f = exact ? must(torch_exact_rule_factory("adamw")) : RuleFactory();
    auto opt = must(OffloadedOptimizer::open(store, f));
    EXPECT_EQ(opt->rule_name(), "adamw");
    EXPECT_EQ(must(opt->step_count(0)), 3);
    ASSERT_TRUE(bit_equal(dump(*opt, 0)[0], ref.param));
  }
}

}  // namespace
}  // namespace strata::optimizer
