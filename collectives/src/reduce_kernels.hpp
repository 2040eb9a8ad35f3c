// Element-wise reduction kernels for every DType (host side), used by the Gloo backend.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "strata/base/half.hpp"  // Half, BFloat16 and their fp32 conversions
#include "strata/collectives/communicator.hpp"

namespace strata::detail {

struct Bool8 {
  uint8_t v;
};

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
