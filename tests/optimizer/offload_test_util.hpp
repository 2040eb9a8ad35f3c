// Helpers of the offloaded-optimizer tests (test_offload_*.cpp, offload_crash_child.cpp):
// small stores in temporary directories, deterministic parameters and gradients, and an
// in-memory reference that runs the same UpdateRule with update.hpp's step().
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../common/store_options.hpp"
#include "../common/temp_dir.hpp"
#include "strata/optimizer/offload.hpp"
#include "strata/optimizer/update.hpp"
#include "strata/store/store.hpp"

namespace strata::optimizer::offload_test {

using strata::testing::TempDir;

/// Store options for tests: 64 KiB chunks (16384 fp32), small pinned budgets.
inline StoreOptions small_store_options(const std::string& path) {
  return strata::testing::test_store_options(path, 4ull << 20, 64ull << 10, 4);
}

inline constexpr uint64_t kChunkNumel = (64ull << 10) / 4;

/// Deterministic floats in [lo, hi) from (seed, index).
inline float value_at(uint64_t seed, uint64_t i, float lo, float hi) {
  uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull ^ (i + 0x632BE59BD9B4E019ull) * 0xD1B54A32D192ED03ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return lo + (hi - lo) * static_cast<float>(x >> 40) * (1.0f / 16777216.0f);
}

inline std::vector<float> values(uint64_t seed, uint64_t n, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = value_at(seed, i, lo, hi);
  return v;
}

/// Gradient of tensor `t` at step `s` (1-based).
inline std::vector<float> grad_for(uint32_t t, int64_t s, uint64_t n) {
  return values(1000 * (t + 1) + static_cast<uint64_t>(s), n, -0.5f, 0.5f);
}

/// A tensor updated in memory with update.hpp's step(): the reference.
struct RefTensor {
  std::vector<float> param;
  std::vector<std::vector<float>> states;
  ParamState state;

  RefTensor(const UpdateRule& rule, std::vector<float> init) : param(std::move(init)) {
    for (int k = 0; k < rule.num_states(); ++k) {
      states.emplace_back(param.size(), rule.state_init_value(k));
    }
  }
  Status step(const UpdateRule& rule, const float* grad, float grad_scale = 1.0f) {
    UpdateSpans s;
    s.param = param.data();
    s.grad = grad;
    s.grad_type = DType::kFloat32;
    for (size_t k = 0; k < states.size(); ++k) s.states[k] = states[k].data();
    s.numel = param.size();
    return optimizer::step(rule, s, state, nullptr, grad_scale);
  }
};

/// The value of `r`; prints the error and aborts when there is none.
template <class T>
T must(Result<T> r) {
  if (!r.ok()) {
    std::fprintf(stderr, "unexpected error: %s\n", r.status().to_string().c_str());
    std::abort();
  }
  return std::move(r).value();
}

inline bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  // (memcmp of an empty vector's null data() is undefined: UBSan)
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

/// Reads the master and every state of `h` as one vector (master first).
inline std::vector<std::vector<float>> dump(OffloadedOptimizer& opt, ParamHandle h,
                                            Status* status = nullptr) {
  auto info = opt.param_info(h);
  std::vector<std::vector<float>> out;
  if (!info.ok()) {
    if (status) *status = info.status();
    return out;
  }
  out.emplace_back(info->numel);
  Status st = opt.read_param(h, out.back().data());
  for (int k = 0; k < opt.num_states() && st.ok(); ++k) {
    out.emplace_back(info->numel);
    st = opt.read_state(h, k, out.back().data());
  }
  if (status) *status = st;
  return out;
}

/// Whether the master and every state of `h` in `opt` equal `ref`'s, bit for bit; the
/// failure names the stream, the tensor (`t`) and the step (`step`).
inline ::testing::AssertionResult matches_reference(OffloadedOptimizer& opt, ParamHandle h,
                                                    const RefTensor& ref, uint32_t t, int64_t step) {
  Status rs;
  auto got = dump(opt, h, &rs);
  if (!rs.ok()) return ::testing::AssertionFailure() << "reading t" << t << ": " << rs.to_string();
  if (!bit_equal(got[0], ref.param)) {
    return ::testing::AssertionFailure() << "master of t" << t << " at step " << step;
  }
  for (size_t k = 0; k < ref.states.size(); ++k) {
    if (!bit_equal(got[1 + k], ref.states[k])) {
      return ::testing::AssertionFailure() << "state " << k << " of t" << t << " at step " << step;
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace strata::optimizer::offload_test

#ifndef OFFLOAD_ASSERT_OK
#define OFFLOAD_ASSERT_OK(expr)                      \
  do {                                               \
    ::strata::Status s_ = ::strata::to_status(expr); \
    ASSERT_TRUE(s_.ok()) << s_.to_string();          \
  } while (0)
#endif
