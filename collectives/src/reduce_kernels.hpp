// Element-wise reduction kernels for every DType (host side), used by the Gloo backend.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "strata/collectives/communicator.hpp"

namespace strata::detail {

// Storage types of the dtypes that C++ has no arithmetic type for.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};
struct Bool8 {
  uint8_t v;
};

// fp16 <-> fp32 through the compiler's _Float16 (IEEE round to nearest even).
inline float to_float(Half h) {
  _Float16 x;
  std::memcpy(&x, &h.bits, 2);
  return static_cast<float>(x);
}
inline Half to_half(float f) {
  _Float16 x = static_cast<_Float16>(f);
  Half h;
  std::memcpy(&h.bits, &x, 2);
  return h;
}
// bf16 is the upper half of an fp32; rounding to nearest even, NaN kept quiet.
inline float to_float(BFloat16 b) {
  uint32_t u = static_cast<uint32_t>(b.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline BFloat16 to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return BFloat16{static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return BFloat16{static_cast<uint16_t>(u >> 16)};
}

template <class T>
struct Arith {
  static T sum(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else {
      return a + b;
    }
  }
  static T max(T a, T b) { return std::max(a, b); }
};
template <>
struct Arith<Half> {
  static Half sum(Half a, Half b) { return to_half(to_float(a) + to_float(b)); }
  static Half max(Half a, Half b) { return to_float(a) >= to_float(b) ? a : b; }
};
template <>
struct Arith<BFloat16> {
  static BFloat16 sum(BFloat16 a, BFloat16 b) { return to_bf16(to_float(a) + to_float(b)); }
  static BFloat16 max(BFloat16 a, BFloat16 b) { return to_float(a) >= to_float(b) ? a : b; }
};
template <>
struct Arith<Bool8> {
  static Bool8 sum(Bool8 a, Bool8 b) { return Bool8{static_cast<uint8_t>(a.v || b.v)}; }
  static Bool8 max(Bool8 a, Bool8 b) { return sum(a, b); }
};

template <class T, ReduceOp Op>
void reduce3(void* c_, const void* a_, const void* b_, size_t n) {
  T* c = static_cast<T*>(c_);
  const T* a = static_cast<const T*>(a_);
  const T* b = static_cast<const T*>(b_);
  for (size_t i = 0; i < n; ++i)
    c[i] = Op == ReduceOp::kSum ? Arith<T>::sum(a[i], b[i]) : Arith<T>::max(a[i], b[i]);
}
template <class T, ReduceOp Op>
void reduce_inplace(T* x, const T* y, size_t n) {
  reduce3<T, Op>(x, x, y, n);
}

template <class T>
struct TypeTag {
  using type = T;
};

/// Calls f(TypeTag<storage type>{}) for `dtype`.
template <class F>
decltype(auto) visit_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32: return f(TypeTag<float>{});
    case DType::kFloat16: return f(TypeTag<Half>{});
    case DType::kBFloat16: return f(TypeTag<BFloat16>{});
    case DType::kFloat64: return f(TypeTag<double>{});
    case DType::kInt8: return f(TypeTag<int8_t>{});
    case DType::kInt16: return f(TypeTag<int16_t>{});
    case DType::kInt32: return f(TypeTag<int32_t>{});
    case DType::kInt64: return f(TypeTag<int64_t>{});
    case DType::kUInt8: return f(TypeTag<uint8_t>{});
    case DType::kBool: return f(TypeTag<Bool8>{});
  }
  return f(TypeTag<uint8_t>{});
}

}  // namespace strata::detail
