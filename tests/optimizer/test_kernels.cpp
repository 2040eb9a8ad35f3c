// Optimizer kernels against an fp64 reference: every optimizer variant, gradient dtype,
// SIMD target, a range of sizes (vector tails), misaligned buffers and the optional
// fp16/bf16 parameter copy. Plus thread-count and sub-group-split invariance (bit-exact).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "optimizer_test_util.hpp"
#include "strata/optimizer/simd.hpp"
#include "strata/base/thread_pool.hpp"

namespace strata::optimizer {
namespace {

using namespace strata::optimizer::testing;

// Restores automatic SIMD selection when a test ends.
class SimdGuard {
 public:
  ~SimdGuard() { EXPECT_TRUE(force_simd_target("").ok()); }
};

struct RunResult {
  size_t checked = 0;
  size_t lion_ties = 0;
};

// Runs `steps` steps of `variant` on n elements and checks every element of param, states
// and copy against the fp64 reference.
void run_against_reference(const Variant& variant, DType grad_type, size_t n, DType copy_type,
                           bool with_copy, ThreadPool* pool, uint64_t seed, RunResult* out) {
  auto rule = variant.make();
  const int ns = rule->num_states();
  OffsetBuffer<float> p(n, 1);
  std::vector<OffsetBuffer<float>> st;
  for (int k = 0; k < ns; ++k) st.emplace_back(n, 3 + k);
  OffsetBuffer<uint16_t> copy(n, 1);
  GradBuffer g(grad_type, n, 1);
  Rng rng(seed);
  std::vector<double> rp(n), rs(static_cast<size_t>(ns) * n);
  for (size_t i = 0; i < n; ++i) {
    p[i] = rng.uniform(-1.0f, 1.0f);
    rp[i] = p[i];
  }
  UpdateSpans spans;
  spans.param = p.data();
  spans.grad = g.data();
  spans.grad_type = grad_type;
  for (int k = 0; k < ns; ++k) spans.states[k] = st[k].data();
  spans.param_copy = with_copy ? copy.data() : nullptr;
  spans.param_copy_type = copy_type;
  spans.numel = n;
  ASSERT_TRUE(init_states(*rule, spans, pool).ok());
  for (int k = 0; k < ns; ++k) {
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(st[k][i], rule->state_init_value(k));
      rs[k * n + i] = st[k][i];
    }
  }
  ParamState state;
  const float grad_scale = variant.name == "adam" ? 0.5f : 1.0f;
  std::vector<char> tie(n, 0);
  for (int t = 1; t <= 3; ++t) {
    for (size_t i = 0; i < n; ++i) g.set(i, rng.uniform(-1.0f, 1.0f));
    ASSERT_TRUE(step(*rule, spans, state, pool, grad_scale).ok());
    ASSERT_EQ(state.step(), t);
    for (size_t i = 0; i < n; ++i) {
      double s[kMaxStateStreams];
      for (int k = 0; k < ns; ++k) s[k] = rs[k * n + i];
      if (variant.kind == Kind::kLion &&
          std::abs(variant.lion_c(g.exact[i], s, grad_scale)) < 1e-5) {
        tie[i] = 1;  // fp32 and fp64 may disagree on sign(c) here
      }
      variant.reference(rp[i], g.exact[i], s, t, grad_scale);
      for (int k = 0; k < ns; ++k) rs[k * n + i] = s[k];
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (tie[i]) {
      ++out->lion_ties;
      continue;
    }
    ASSERT_NEAR(p[i], rp[i], 2e-6 * std::abs(rp[i]) + 3e-7)
        << variant.name << " param " << i << " of " << n;
    for (int k = 0; k < ns; ++k) {
      const double r = rs[k * n + i];
      // States like exp_avg are sums with cancellation: absolute slack of fp32 rounding of
      // terms of size up to ~4 (a few ulps of 4 over 3 steps).
      ASSERT_NEAR(st[k][i], r, 2e-6 * std::abs(r) + 1e-6)
          << variant.name << " state " << rule->state_name(k) << " element " << i;
    }
    if (with_copy) {
      const uint16_t want = copy_type == DType::kFloat16 ? f16_bits(p[i]) : bf16_bits(p[i]);
      ASSERT_EQ(copy[i], want) << "copy of param " << i << " = " << p[i];
    }
    ++out->checked;
  }
}

const size_t kSizes[] = {0, 1, 7, 15, 16, 17, 55, 127, 1023, 1025, 100003};

TEST(OptimizerKernels, MatchFp64ReferenceOnEverySimdTarget) {
  SimdGuard guard;
  const auto targets = available_simd_targets();
  ASSERT_FALSE(targets.empty());
  EXPECT_EQ(targets.back(), "SCALAR");
  auto pool = ThreadPool::create(2);
  ASSERT_TRUE(pool.ok());
  for (const auto& target : targets) {
    ASSERT_TRUE(force_simd_target(target).ok());
    ASSERT_EQ(active_simd_target(), target);
    for (const auto& v : all_variants()) {
      for (DType gt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
        RunResult res;
        size_t expected = 0;
        int which = 0;
        for (size_t n : kSizes) {
          SCOPED_TRACE(target + " " + v.name + " " + std::string(dtype_name(gt)) + " n=" +
                       std::to_string(n));
          const bool with_copy = (which++ % 3) != 0;
          const DType ct = which % 2 ? DType::kFloat16 : DType::kBFloat16;
          run_against_reference(v, gt, n, ct, with_copy, n > 50000 ? pool->get() : nullptr,
                                n * 31 + static_cast<uint64_t>(gt), &res);
          if (HasFatalFailure()) return;
          expected += n;
        }
        EXPECT_EQ(res.checked + res.lion_ties, expected);
        EXPECT_LE(res.lion_ties, expected / 1000);
      }
    }
  }
}

// Bit-exact results for 1..4 threads and for arbitrary sub-group splits.
TEST(OptimizerKernels, ThreadCountAndSplitInvariance) {
  SimdGuard guard;
  const size_t n = 300'007;
  for (const auto& target : available_simd_targets()) {
    if (target != available_simd_targets().front() && target != "SCALAR") continue;
    ASSERT_TRUE(force_simd_target(target).ok());
    for (const auto& v : all_variants()) {
      for (DType gt : {DType::kFloat32, DType::kBFloat16}) {
        SCOPED_TRACE(target + " " + v.name + " " + std::string(dtype_name(gt)));
        auto rule = v.make();
        const int ns = rule->num_states();
        GradBuffer g(gt, n, 0);
        Rng rng(7);
        std::vector<float> p0(n);
        for (size_t i = 0; i < n; ++i) {
          g.set(i, rng.uniform(-1.0f, 1.0f));
          p0[i] = rng.uniform(-1.0f, 1.0f);
        }
        // Runs 2 steps with a given pool and split; returns param, states, copy.
        auto run = [&](ThreadPool* pool, const std::vector<size_t>& cuts) {
          std::vector<float> p = p0;
          std::vector<std::vector<float>> st(ns, std::vector<float>(n));
          std::vector<uint16_t> copy(n);
          UpdateSpans s;
          s.param = p.data();
          s.grad = g.data();
          s.grad_type = gt;
          for (int k = 0; k < ns; ++k) s.states[k] = st[k].data();
          s.param_copy = copy.data();
          s.param_copy_type = DType::kFloat16;
          s.numel = n;
          EXPECT_TRUE(init_states(*rule, s, pool).ok());
          ParamState state;
          for (int t = 0; t < 2; ++t) {
            const StepInfo info{state.advance(), 0.75f};
            size_t begin = 0;
            for (size_t cut : cuts) {
              EXPECT_TRUE(apply_update(*rule, s.slice(begin, cut - begin), info, pool).ok());
              begin = cut;
            }
          }
          std::vector<uint32_t> bits;
          for (float x : p) bits.push_back(float_bits(x));
          for (auto& sv : st) {
            for (float x : sv) bits.push_back(float_bits(x));
          }
          for (uint16_t c : copy) bits.push_back(c);
          return bits;
        };
        const auto whole = run(nullptr, {n});
        for (int threads : {1, 2, 3, 4}) {
          auto pool = ThreadPool::create(threads);
          ASSERT_TRUE(pool.ok());
          EXPECT_EQ(run(pool->get(), {n}), whole) << threads << " threads";
        }
        auto pool = ThreadPool::create(3);
        ASSERT_TRUE(pool.ok());
        // Uneven sub-groups with odd boundaries (not multiples of any vector width).
        EXPECT_EQ(run(pool->get(), {1, 17, 65537, 65540, 200001, 299999, n}), whole);
        EXPECT_EQ(run(nullptr, {100000, 200003, n}), whole);
      }
    }
  }
}

TEST(OptimizerKernels, ConversionsAreRoundToNearestEvenOnEveryTarget) {
  SimdGuard guard;
  // All 2^16 fp16 and bf16 bit patterns -> fp32, and a sweep of fp32 values -> fp16/bf16.
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> src;
  Rng rng(3);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t u = static_cast<uint32_t>(rng.next());
    float f;
    std::memcpy(&f, &u, 4);
    src.push_back(f);
  }
  for (float f : {0.0f, -0.0f, 1.0f, 65504.0f, 65519.99f, 65520.0f, 1e10f, -1e10f, 5.96e-8f,
                  2.98e-8f, 2.99e-8f, 6.1e-5f, INFINITY, -INFINITY, NAN, 1.00048828125f,
                  1.001953125f, 1.0029296875f}) {
    src.push_back(f);
  }
  for (const auto& target : available_simd_targets()) {
    SCOPED_TRACE(target);
    ASSERT_TRUE(force_simd_target(target).ok());
    std::vector<float> out(all.size());
    load_scaled_grad(all.data(), DType::kFloat16, 1.0f, out.data(), all.size());
    for (uint32_t i = 0; i < 65536; ++i) {
      const float want = f16_value(static_cast<uint16_t>(i));
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(out[i])) << i;
      } else {
        ASSERT_EQ(float_bits(out[i]), float_bits(want)) << "fp16 bits " << i;
      }
    }
    load_scaled_grad(all.data(), DType::kBFloat16, 1.0f, out.data(), all.size());
    for (uint32_t i = 0; i < 65536; ++i) {
      if (std::isnan(bf16_value(static_cast<uint16_t>(i)))) {
        ASSERT_TRUE(std::isnan(out[i])) << i;  // signalling NaNs come back quiet
      } else {
        ASSERT_EQ(float_bits(out[i]), i << 16) << "bf16 bits " << i;
      }
    }
    std::vector<uint16_t> h(src.size());
    store_converted(src.data(), DType::kFloat16, h.data(), src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      if (std::isnan(src[i])) {
        ASSERT_TRUE(std::isnan(f16_value(h[i]))) << i;
      } else {
        ASSERT_EQ(h[i], f16_bits(src[i])) << "fp16 of " << src[i];
      }
    }
    store_converted(src.data(), DType::kBFloat16, h.data(), src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      ASSERT_EQ(h[i], bf16_bits(src[i])) << "bf16 of " << src[i];
    }
  }
  // Spot values with known encodings.
  const float v[] = {1.0f, 65520.0f, 2.9802322387695312e-8f /* 2^-25: ties to 0 */};
  uint16_t h[3];
  store_converted(v, DType::kFloat16, h, 3);
  EXPECT_EQ(h[0], 0x3C00);
  EXPECT_EQ(h[1], 0x7C00);
  EXPECT_EQ(h[2], 0x0000);
  const float b[] = {1.0f, 1.00390625f /* tie, even stays */, 1.01171875f /* tie, rounds up */};
  store_converted(b, DType::kBFloat16, h, 3);
  EXPECT_EQ(h[0], 0x3F80);
  EXPECT_EQ(h[1], 0x3F80);
  EXPECT_EQ(h[2], 0x3F82);
}

TEST(OptimizerKernels, ForcingAnUnknownTargetFails) {
  SimdGuard guard;
  const Status s = force_simd_target("AVX9000");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("AVX9000"), std::string::npos);
}

TEST(OptimizerKernels, InvalidHyperparametersAndSpans) {
  AdamOptions a;
  a.beta1 = 1.0;
  auto r = make_adam(a);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("beta parameter at index 0"), std::string::npos);
  a = {};
  a.lr = -1;
  EXPECT_EQ(make_adamw(a).status().code(), StatusCode::kInvalidArgument);
  SgdOptions s;
  s.nesterov = true;
  EXPECT_EQ(make_sgd(s).status().code(), StatusCode::kInvalidArgument);
  AdagradOptions g;
  g.eps = -1;
  EXPECT_EQ(make_adagrad(g).status().code(), StatusCode::kInvalidArgument);
  LionOptions l;
  l.beta2 = 1.5;
  EXPECT_EQ(make_lion(l).status().code(), StatusCode::kInvalidArgument);

  auto rule = make_adam({}).value();
  float p[4] = {}, m[4] = {}, v[4] = {}, grad[4] = {};
  UpdateSpans spans;
  spans.param = p;
  spans.grad = grad;
  spans.states[0] = m;  // exp_avg_sq missing
  spans.numel = 4;
  Status st = apply_update(*rule, spans, {1, 1.0f}, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("exp_avg_sq"), std::string::npos);
  spans.states[1] = v;
  spans.grad_type = DType::kInt32;
  EXPECT_EQ(apply_update(*rule, spans, {1, 1.0f}, nullptr).code(), StatusCode::kInvalidArgument);
  spans.grad_type = DType::kFloat32;
  EXPECT_EQ(apply_update(*rule, spans, {0, 1.0f}, nullptr).code(), StatusCode::kInvalidArgument);
  ParamState ps;
  spans.param = nullptr;
  EXPECT_EQ(step(*rule, spans, ps, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ps.step(), 0);  // unchanged on error
  spans.numel = 0;          // empty spans may have null pointers
  EXPECT_TRUE(step(*rule, spans, ps, nullptr).ok());
  EXPECT_EQ(ps.step(), 1);
}

TEST(OptimizerKernels, BytesPerElement) {
  auto adam = make_adam({}).value();
  EXPECT_EQ(bytes_per_element(*adam, DType::kFloat32, false), 28u);
  EXPECT_EQ(bytes_per_element(*adam, DType::kBFloat16, true), 28u);
  SgdOptions s;
  EXPECT_EQ(bytes_per_element(*make_sgd(s).value(), DType::kFloat16, false), 10u);
  AdamOptions ams;
  ams.amsgrad = true;
  EXPECT_EQ(bytes_per_element(*make_adam(ams).value(), DType::kFloat32, false), 36u);
}

}  // namespace
}  // namespace strata::optimizer
