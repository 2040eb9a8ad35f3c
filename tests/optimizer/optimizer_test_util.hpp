// Shared helpers of the optimizer tests: fp64 reference optimizers, independent fp16/bf16
// conversions, deterministic data and misaligned buffers.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/base/dtype.hpp"
#include "strata/optimizer/optimizers.hpp"
#include "strata/optimizer/update.hpp"

namespace strata::optimizer::testing {

// Independent conversions: the compiler's _Float16 (IEEE binary16, round to nearest even)
// and c10's bf16 rounding written out in scalar code.
inline uint16_t f16_bits(float x) { return std::bit_cast<uint16_t>(static_cast<_Float16>(x)); }
inline float f16_value(uint16_t b) { return static_cast<float>(std::bit_cast<_Float16>(b)); }
inline uint32_t float_bits(float x) { return std::bit_cast<uint32_t>(x); }
inline uint16_t bf16_bits(float x) {
  if (std::isnan(x)) return 0x7FC0;
  const uint32_t u = float_bits(x);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
inline float bf16_value(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

// Deterministic uniform numbers in [lo, hi).
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    s_ ^= s_ << 13;
    s_ ^= s_ >> 7;
    s_ ^= s_ << 17;
    return s_;
  }
  float uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(next() >> 40) * (1.0f / 16777216.0f);
  }

 private:
  uint64_t s_;
};

// `n` elements starting `offset_elems` past a 64-byte boundary (misaligned on purpose).
template <class T>
class OffsetBuffer {
 public:
  OffsetBuffer(size_t n, size_t offset_elems)
      : storage_(n + offset_elems + 64 / sizeof(T)), n_(n) {
    auto base = reinterpret_cast<uintptr_t>(storage_.data());
    const uintptr_t aligned = (base + 63) / 64 * 64;
    data_ = reinterpret_cast<T*>(aligned) + offset_elems;
  }
  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return n_; }
  T& operator[](size_t i) { return data_[i]; }

 private:
  std::vector<T> storage_;
  T* data_;
  size_t n_;
};

// Gradients in one of the three dtypes, plus their exact fp32 values.
struct GradBuffer {
  GradBuffer(DType t, size_t n, size_t offset) : type(t), f32(n, offset), u16(n, offset), exact(n) {}
  DType type;
  OffsetBuffer<float> f32;
  OffsetBuffer<uint16_t> u16;
  std::vector<float> exact;
  const void* data() const {
    return type == DType::kFloat32 ? static_cast<const void*>(f32.data())
                                   : static_cast<const void*>(u16.data());
  }
  void set(size_t i, float v) {
    if (type == DType::kFloat32) {
      f32[i] = v;
      exact[i] = v;
    } else if (type == DType::kFloat16) {
      u16[i] = f16_bits(v);
      exact[i] = f16_value(u16[i]);
    } else {
      u16[i] = bf16_bits(v);
      exact[i] = bf16_value(u16[i]);
    }
  }
};

enum class Kind { kAdam, kAdagrad, kSgd, kLion };

// One optimizer configuration, buildable as a strata rule and runnable as an fp64 reference.
struct Variant {
  std::string name;
  Kind kind = Kind::kAdam;
  AdamOptions adam;
  AdagradOptions adagrad;
  SgdOptions sgd;
  LionOptions lion;

  std::unique_ptr<UpdateRule> make() const {
    Result<std::unique_ptr<UpdateRule>> r = invalid_argument("kind");
    switch (kind) {
      case Kind::kAdam: r = make_adam(adam); break;
      case Kind::kAdagrad: r = make_adagrad(adagrad); break;
      case Kind::kSgd: r = make_sgd(sgd); break;
      case Kind::kLion: r = make_lion(lion); break;
    }
    return std::move(r).value();
  }

  // One step of element (p, s[]) with gradient g (already the exact fp32 value) at step t,
  // in fp64, following the formulas in optimizers.hpp.
  void reference(double& p, double g, double* s, int64_t t, double grad_scale) const {
    g *= grad_scale;
    switch (kind) {
      case Kind::kAdam: {
        const auto& o = adam;
        if (o.maximize) g = -g;
        if (o.decoupled_weight_decay) {
          p *= 1.0 - o.lr * o.weight_decay;
        } else if (o.weight_decay != 0.0) {
          g += o.weight_decay * p;
        }
        s[0] = o.beta1 * s[0] + (1.0 - o.beta1) * g;
        s[1] = o.beta2 * s[1] + (1.0 - o.beta2) * g * g;
        double vmax = s[1];
        if (o.amsgrad) {
          s[2] = std::max(s[2], s[1]);
          vmax = s[2];
        }
        const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(t));
        const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(t));
        p -= o.lr / bc1 * s[0] / (std::sqrt(vmax) / std::sqrt(bc2) + o.eps);
        break;
      }
      case Kind::kAdagrad: {
        const auto& o = adagrad;
        if (o.maximize) g = -g;
        if (o.weight_decay != 0.0) g += o.weight_decay * p;
        const double clr = o.lr / (1.0 + static_cast<double>(t - 1) * o.lr_decay);
        s[0] += g * g;
        p -= clr * g / (std::sqrt(s[0]) + o.eps);
        break;
      }
      case Kind::kSgd: {
        const auto& o = sgd;
        if (o.maximize) g = -g;
        if (o.weight_decay != 0.0) g += o.weight_decay * p;
        if (o.momentum != 0.0) {
          s[0] = t == 1 ? g : o.momentum * s[0] + (1.0 - o.dampening) * g;
          g = o.nesterov ? g + o.momentum * s[0] : s[0];
        }
        p -= o.lr * g;
        break;
      }
      case Kind::kLion: {
        const auto& o = lion;
        if (o.maximize) g = -g;
        const double c = o.beta1 * s[0] + (1.0 - o.beta1) * g;
        p *= 1.0 - o.lr * o.weight_decay;
        p -= o.lr * (c > 0 ? 1.0 : (c < 0 ? -1.0 : 0.0));
        s[0] = o.beta2 * s[0] + (1.0 - o.beta2) * g;
        break;
      }
    }
  }

  // |c| of Lion's sign argument (elements with tiny |c| may legitimately flip sign).
  double lion_c(double g, const double* s, double grad_scale) const {
    g *= grad_scale;
    if (lion.maximize) g = -g;
    return lion.beta1 * s[0] + (1.0 - lion.beta1) * g;
  }
};

// One element of torch 1.13's `_single_tensor_adam(w)` in fp32, operation by operation (the
// sequence make_torch_exact_adam must reproduce bit for bit): `g` is the gradient already
// multiplied by the grad scale, s[] = exp_avg, exp_avg_sq[, max_exp_avg_sq]. Only the
// explicit fmaf are fused: this header is compiled without FMA contraction (ISO C++, and
// -ffp-contract=off on the files that include it for bit comparisons).
inline void torch_adam_element(const AdamOptions& o, float& p, float g, float* s, int64_t t) {
  const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(t));
  if (o.maximize) g = -g;
  if (o.decoupled_weight_decay) {
    p = p * static_cast<float>(1.0 - o.lr * o.weight_decay);               // param.mul_
  } else if (o.weight_decay != 0.0) {
    g = std::fmaf(p, static_cast<float>(o.weight_decay), g);               // grad.add(param)
  }
  s[0] = std::fmaf(g, static_cast<float>(1.0 - o.beta1), s[0] * static_cast<float>(o.beta1));
  s[1] = std::fmaf(static_cast<float>(1.0 - o.beta2) * g, g, s[1] * static_cast<float>(o.beta2));
  float vmax = s[1];
  if (o.amsgrad) {
    const float larger = s[2] > s[1] ? s[2] : s[1];  // torch.maximum: NaN propagates
    s[2] = std::isnan(s[2]) ? s[2] : (std::isnan(s[1]) ? s[1] : larger);
    vmax = s[2];
  }
  const float den = std::sqrt(vmax) / static_cast<float>(std::sqrt(bc2)) + static_cast<float>(o.eps);
  p = p + (static_cast<float>(-(o.lr / bc1)) * s[0]) / den;                // addcdiv_
}

// A Variant named `name` of options `o` (AdamOptions, AdagradOptions, SgdOptions or
// LionOptions).
template <class O>
Variant variant(std::string name, const O& o) {
  Variant x;
  x.name = std::move(name);
  if constexpr (std::is_same_v<O, AdamOptions>) {
    x.kind = Kind::kAdam;
    x.adam = o;
  } else if constexpr (std::is_same_v<O, AdagradOptions>) {
    x.kind = Kind::kAdagrad;
    x.adagrad = o;
  } else if constexpr (std::is_same_v<O, SgdOptions>) {
    x.kind = Kind::kSgd;
    x.sgd = o;
  } else {
    x.kind = Kind::kLion;
    x.lion = o;
  }
  return x;
}

inline std::vector<Variant> all_variants() {
  using A = AdamOptions;
  using S = SgdOptions;
  return {
      variant("adam", A{.lr = 1e-2}),
      variant("adam_l2_amsgrad", A{.lr = 1e-2, .weight_decay = 0.05, .amsgrad = true}),
      variant("adam_maximize",
              A{.lr = 3e-3, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .maximize = true}),
      variant("adamw", A{.lr = 1e-2, .weight_decay = 0.1, .decoupled_weight_decay = true}),
      variant("adamw_amsgrad",
              A{.lr = 1e-2, .weight_decay = 0.1, .amsgrad = true, .decoupled_weight_decay = true}),
      variant("adagrad", AdagradOptions{.lr = 0.05, .lr_decay = 0.01, .weight_decay = 0.02,
                                        .initial_accumulator_value = 0.1}),
      variant("adagrad_plain", AdagradOptions{.maximize = true}),
      variant("sgd_plain", S{.lr = 0.1}),
      variant("sgd_momentum", S{.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01}),
      variant("sgd_nesterov", S{.lr = 0.1, .momentum = 0.9, .dampening = 0.0, .weight_decay = 0.01,
                                .nesterov = true, .maximize = true}),
      variant("lion", LionOptions{.lr = 1e-3, .weight_decay = 0.1}),
  };
}

}  // namespace strata::optimizer::testing
