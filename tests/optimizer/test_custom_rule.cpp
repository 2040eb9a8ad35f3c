// Custom element-wise rules through the same engine as the built-ins.
#include <gtest/gtest.h>

#include <cmath>

#include "optimizer_test_util.hpp"
#include "strata/base/thread_pool.hpp"

namespace strata::optimizer {
namespace {

using namespace strata::optimizer::testing;

// Adam written as a custom rule, in scalar C++ (the way a researcher would plug one in).
std::unique_ptr<UpdateRule> custom_adam(double lr, double b1, double b2, double eps) {
  struct Scalars {
    float neg_step_size, bc2_sqrt;
  };
  struct Consts {
    float b1, omb1, b2, omb2, eps;
  };
  const Consts c{static_cast<float>(b1), static_cast<float>(1.0 - b1), static_cast<float>(b2),
                 static_cast<float>(1.0 - b2), static_cast<float>(eps)};
  return make_elementwise_rule<2>(
      "custom_adam", {"exp_avg", "exp_avg_sq"},
      [=](int64_t t) {
        const double bc1 = 1.0 - std::pow(b1, static_cast<double>(t));
        const double bc2 = 1.0 - std::pow(b2, static_cast<double>(t));
        return Scalars{static_cast<float>(-(lr / bc1)), static_cast<float>(std::sqrt(bc2))};
      },
      [c](const Scalars& s, float& p, float g, float* st) {
        st[0] = c.b1 * st[0] + c.omb1 * g;
        st[1] = c.b2 * st[1] + c.omb2 * g * g;
        p += s.neg_step_size * (st[0] / (std::sqrt(st[1]) / s.bc2_sqrt + c.eps));
      });
}

TEST(CustomRule, AdamAsLambdaMatchesBuiltinAndReference) {
  const size_t n = 200003;
  AdamOptions o;
  o.lr = 1e-2;
  auto builtin = make_adam(o).value();
  auto custom = custom_adam(1e-2, 0.9, 0.999, 1e-8);
  EXPECT_EQ(custom->name(), "custom_adam");
  EXPECT_EQ(custom->num_states(), 2);
  EXPECT_EQ(custom->state_name(1), "exp_avg_sq");
  auto pool = ThreadPool::create(2).value();
  for (DType gt : {DType::kFloat32, DType::kFloat16}) {
    GradBuffer g(gt, n, 1);
    Rng rng(5);
    std::vector<float> p1(n), p2(n), m1(n), v1(n), m2(n), v2(n);
    std::vector<uint16_t> c2(n);
    for (size_t i = 0; i < n; ++i) p1[i] = p2[i] = rng.uniform(-1, 1);
    ParamState s1, s2;
    for (int t = 0; t < 3; ++t) {
      for (size_t i = 0; i < n; ++i) g.set(i, rng.uniform(-1, 1));
      UpdateSpans a{p1.data(), g.data(), gt, {m1.data(), v1.data()}, nullptr, DType::kBFloat16, n};
      UpdateSpans b{p2.data(), g.data(), gt, {m2.data(), v2.data()}, c2.data(), DType::kBFloat16, n};
      ASSERT_TRUE(step(*builtin, a, s1, pool.get(), 0.5f).ok());
      ASSERT_TRUE(step(*custom, b, s2, pool.get(), 0.5f).ok());
    }
    for (size_t i = 0; i < n; ++i) {
      ASSERT_NEAR(p2[i], p1[i], 1e-6 * std::abs(p1[i]) + 1e-7) << i;
      ASSERT_NEAR(v2[i], v1[i], 1e-5 * v1[i] + 1e-12) << i;
      ASSERT_EQ(c2[i], bf16_bits(p2[i])) << i;
    }
  }
}

TEST(CustomRule, SplitAndThreadInvariant) {
  const size_t n = 150001;
  auto rule = make_elementwise_rule<1>(
      "momentum_sign", {"buf"}, [](int64_t t) { return 0.01f / static_cast<float>(t); },
      [](float lr, float& p, float g, float* s) {
        s[0] = 0.9f * s[0] + g;
        p -= lr * (s[0] > 0 ? 1.0f : -1.0f);
      },
      {0.25f});
  EXPECT_EQ(rule->state_init_value(0), 0.25f);
  std::vector<float> g(n);
  Rng rng(11);
  for (auto& x : g) x = rng.uniform(-1, 1);
  auto run = [&](ThreadPool* pool, std::vector<size_t> cuts) {
    std::vector<float> p(n, 1.0f), s(n);
    UpdateSpans sp{p.data(), g.data(), DType::kFloat32, {s.data()}, nullptr, DType::kFloat16, n};
    EXPECT_TRUE(init_states(*rule, sp, pool).ok());
    for (int64_t t = 1; t <= 2; ++t) {
      size_t b = 0;
      for (size_t c : cuts) {
        EXPECT_TRUE(apply_update(*rule, sp.slice(b, c - b), {t, 1.0f}, pool).ok());
        b = c;
      }
    }
    p.insert(p.end(), s.begin(), s.end());
    return p;
  };
  const auto whole = run(nullptr, {n});
  auto pool = ThreadPool::create(3).value();
  EXPECT_EQ(run(pool.get(), {n}), whole);
  EXPECT_EQ(run(pool.get(), {3, 1027, 99999, n}), whole);
  // Spot-check element 0 by hand: s = 0.25*0.9 + g0, p = 1 - 0.01*sign(s) at t=1 ...
  float s = 0.9f * 0.25f + g[0];
  float p = 1.0f - 0.01f * (s > 0 ? 1.0f : -1.0f);
  s = 0.9f * s + g[0];
  p -= 0.005f * (s > 0 ? 1.0f : -1.0f);
  EXPECT_EQ(whole[0], p);
  EXPECT_EQ(whole[n], s);
}

}  // namespace
}  // namespace strata::optimizer
