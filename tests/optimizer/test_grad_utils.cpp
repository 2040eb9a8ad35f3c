// Global gradient norm (accuracy, thread/split/SIMD invariance) and inf/nan detection.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "optimizer_test_util.hpp"
#include "strata/optimizer/grad_utils.hpp"
#include "strata/optimizer/simd.hpp"
#include "strata/base/thread_pool.hpp"

namespace strata::optimizer {
namespace {

using namespace strata::optimizer::testing;

struct Grads {
  std::vector<std::unique_ptr<GradBuffer>> bufs;
  std::vector<GradView> views;
  long double exact_sum = 0;
};

Grads make_grads(uint64_t seed) {
  Grads g;
  Rng rng(seed);
  const size_t sizes[] = {0, 1, 17, 4095, 4096, 4097, 100003, 250000};
  const DType types[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  int k = 0;
  for (size_t n : sizes) {
    const DType t = types[k++ % 3];
    auto b = std::make_unique<GradBuffer>(t, n, k % 5);
    for (size_t i = 0; i < n; ++i) {
      b->set(i, rng.uniform(-2.0f, 2.0f));
      g.exact_sum += static_cast<long double>(b->exact[i]) * b->exact[i];
    }
    g.views.push_back({b->data(), t, n});
    g.bufs.push_back(std::move(b));
  }
  return g;
}

TEST(GradUtils, GlobalNormMatchesLongDoubleSum) {
  auto g = make_grads(1);
  auto norm = global_l2_norm(g.views);
  ASSERT_TRUE(norm.ok());
  const double want = std::sqrt(static_cast<double>(g.exact_sum));
  EXPECT_NEAR(*norm, want, 1e-13 * want);
}

TEST(GradUtils, GlobalNormIsBitIdenticalAcrossThreadsTargetsAndChunks) {
  auto g = make_grads(2);
  const double base = global_l2_norm(g.views).value();
  for (int threads : {1, 2, 3}) {
    auto pool = ThreadPool::create(threads).value();
    EXPECT_EQ(global_l2_norm(g.views, pool.get()).value(), base) << threads << " threads";
  }
  for (const auto& target : available_simd_targets()) {
    ASSERT_TRUE(force_simd_target(target).ok());
    EXPECT_EQ(global_l2_norm(g.views).value(), base) << target;
  }
  ASSERT_TRUE(force_simd_target("").ok());
  // Chunks that are multiples of kNormTileNumel (except each tensor's last).
  auto pool = ThreadPool::create(2).value();
  GradNormAccumulator acc;
  for (const auto& v : g.views) {
    const size_t esize = dtype_size(v.type);
    size_t begin = 0;
    size_t chunk = kNormTileNumel;
    while (begin < v.numel) {
      const size_t n = std::min(chunk, v.numel - begin);
      ASSERT_TRUE(acc.add({static_cast<const char*>(v.data) + begin * esize, v.type, n},
                          pool.get())
                      .ok());
      begin += n;
      chunk = chunk * 3 % (20 * kNormTileNumel) + kNormTileNumel;  // varying sizes
    }
  }
  EXPECT_EQ(acc.l2_norm(), base);
  EXPECT_FALSE(acc.nonfinite());
}

TEST(GradUtils, ClipCoefficientFollowsTorch) {
  EXPECT_DOUBLE_EQ(clip_coefficient(10.0, 1.0), 1.0 / (10.0 + 1e-6));
  EXPECT_EQ(clip_coefficient(0.5, 1.0), 1.0);
  EXPECT_EQ(clip_coefficient(INFINITY, 1.0), 1.0);
  EXPECT_EQ(clip_coefficient(NAN, 1.0), 1.0);
}

TEST(GradUtils, TorchClipCoefficientIsTorchsFp32Arithmetic) {
  // torch: clamp(max_norm / (total + 1e-6), max=1) on a 0-d fp32 tensor, evaluated as
  // reciprocal(total + 1e-6f) * max_norm (Tensor.__rtruediv__).
  for (float total : {10.0f, 3.3333333f, 1.0000001f, 65.4321f, 1e-7f}) {
    const float want = (1.0f / (total + 1e-6f)) * 0.5f;
    EXPECT_EQ(torch_clip_coefficient(total, 0.5), want > 1.0f ? 1.0f : want) << total;
  }
  EXPECT_EQ(torch_clip_coefficient(0.25f, 1.0), 1.0f);
  EXPECT_EQ(torch_clip_coefficient(INFINITY, 1.0), 0.0f);  // torch zeroes the gradients
  EXPECT_TRUE(std::isnan(torch_clip_coefficient(NAN, 1.0)));
  // differs from the double formula in the last bits (the reason for both)
  EXPECT_NE(static_cast<double>(torch_clip_coefficient(3.3333333f, 0.5)),
            clip_coefficient(3.3333333f, 0.5));
}

TEST(GradUtils, DecideGateSkipsOnNonFiniteAndClips) {
  // no clipping: skip only on a non-finite gradient, no norm reported
  GateDecision d = decide_gate(0.0, 1.0f, true, 0.0, false, NormArithmetic::kStrata);
  EXPECT_FALSE(d.skip);
  EXPECT_TRUE(std::isnan(d.grad_norm));
  EXPECT_EQ(d.clip_coef, 1.0);
  EXPECT_EQ(d.grad_scale, 1.0f);
  EXPECT_TRUE(decide_gate(0.0, 1.0f, true, 0.0, true, NormArithmetic::kStrata).skip);
  EXPECT_FALSE(decide_gate(0.0, 1.0f, false, 0.0, true, NormArithmetic::kStrata).skip);
  // strata's arithmetic: the scaled norm, the double coefficient, the product as the scale
  d = decide_gate(1.0, 0.5f, true, 8.0, false, NormArithmetic::kStrata);
  EXPECT_FALSE(d.skip);
  EXPECT_EQ(d.grad_norm, 4.0);
  EXPECT_EQ(d.clip_coef, clip_coefficient(4.0, 1.0));
  EXPECT_EQ(d.grad_scale, static_cast<float>(0.5 * clip_coefficient(4.0, 1.0)));
  // an overflowing norm of finite values counts as non-finite with strata's arithmetic
  EXPECT_TRUE(decide_gate(1.0, 1.0f, true, INFINITY, false, NormArithmetic::kStrata).skip);
  d = decide_gate(1.0, 1.0f, false, INFINITY, false, NormArithmetic::kStrata);
  EXPECT_FALSE(d.skip);
  EXPECT_EQ(d.clip_coef, 1.0);
  EXPECT_EQ(d.grad_scale, 1.0f);
  // torch's arithmetic: the fp32 coefficient; an overflowing norm clips to 0 as torch does
  d = decide_gate(0.5, 1.0f, true, 3.3333332538604736, false, NormArithmetic::kTorch);
  EXPECT_FALSE(d.skip);
  EXPECT_EQ(d.clip_coef, static_cast<double>(torch_clip_coefficient(3.3333333f, 0.5)));
  EXPECT_EQ(d.grad_scale, torch_clip_coefficient(3.3333333f, 0.5));
  d = decide_gate(1.0, 1.0f, true, INFINITY, false, NormArithmetic::kTorch);
  EXPECT_FALSE(d.skip);
  EXPECT_EQ(d.grad_scale, 0.0f);
  EXPECT_TRUE(decide_gate(1.0, 1.0f, true, 2.0, true, NormArithmetic::kTorch).skip);
}

TEST(GradUtils, DetectsInfAndNanInEveryDtypeAndPosition) {
  auto pool = ThreadPool::create(2).value();
  for (const auto& target : available_simd_targets()) {
    ASSERT_TRUE(force_simd_target(target).ok());
    for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      for (size_t n : {1ul, 15ul, 33ul, 70001ul}) {
        GradBuffer b(t, n, 1);
        for (size_t i = 0; i < n; ++i) b.set(i, (i % 2 ? -1.0f : 1.0f) * 65504.0f);  // fp16 max
        const GradView v{b.data(), t, n};
        ThreadPool* p = n > 70000 ? pool.get() : nullptr;
        ASSERT_FALSE(has_inf_or_nan({&v, 1}, p).value()) << dtype_name(t) << " n=" << n;
        for (size_t pos : {size_t{0}, n / 2, n - 1}) {
          for (float bad : {INFINITY, -INFINITY, NAN}) {
            b.set(pos, bad);
            SCOPED_TRACE(target + " " + std::string(dtype_name(t)) + " n=" + std::to_string(n) +
                         " pos=" + std::to_string(pos) + " value=" + std::to_string(bad));
            EXPECT_TRUE(has_inf_or_nan({&v, 1}, p).value());
            GradNormAccumulator acc;
            ASSERT_TRUE(acc.add(v, p).ok());
            EXPECT_TRUE(acc.nonfinite());
            b.set(pos, 1.0f);
          }
        }
        ASSERT_FALSE(has_inf_or_nan({&v, 1}, p).value());
      }
    }
  }
  ASSERT_TRUE(force_simd_target("").ok());
}

TEST(GradUtils, RejectsBadViews) {
  const GradView null_data{nullptr, DType::kFloat32, 3};
  EXPECT_EQ(global_l2_norm({&null_data, 1}).status().code(), StatusCode::kInvalidArgument);
  int32_t ints[2] = {1, 2};
  const GradView wrong{ints, DType::kInt32, 2};
  auto r = has_inf_or_nan({&wrong, 1});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("int32"), std::string::npos);
  const GradView empty{nullptr, DType::kFloat16, 0};
  EXPECT_EQ(global_l2_norm({&empty, 1}).value(), 0.0);
}

}  // namespace
}  // namespace strata::optimizer
