// strata — fp16 and bf16 element storage and their conversions to and from fp32 (host side),
// shared by the collectives' reduction kernels and the store's checkpoint formats.
//
// Header-only, no dependency. fp16 goes through the compiler's _Float16 (IEEE 754 binary16,
// round to nearest even); bf16 is the upper half of a binary32, rounded to nearest even with
// NaN kept quiet (the payload's top bits kept, the quiet bit set).
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <cstring>

namespace strata::detail {

// Storage types of the dtypes that C++ has no arithmetic type for.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

/// fp16 -> fp32 (exact).
inline float to_float(Half h) {
  _Float16 x;
  std::memcpy(&x, &h.bits, 2);
  return static_cast<float>(x);
}
/// fp32 -> fp16, round to nearest even (overflow to inf).
inline Half to_half(float f) {
  _Float16 x = static_cast<_Float16>(f);
  Half h;
  std::memcpy(&h.bits, &x, 2);
  return h;
}
/// bf16 -> fp32 (exact).
inline float to_float(BFloat16 b) {
  uint32_t u = static_cast<uint32_t>(b.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
/// fp32 -> bf16, round to nearest even; a NaN stays a (quiet) NaN.
inline BFloat16 to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return BFloat16{static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return BFloat16{static_cast<uint16_t>(u >> 16)};
}

}  // namespace strata::detail
