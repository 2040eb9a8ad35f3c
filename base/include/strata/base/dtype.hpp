// strata — element types shared by the store, the communicator and the optimizer.
//
// Header-only and dependent only on status.hpp, so every component can include it without
// linking anything.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "strata/base/status.hpp"

namespace strata {

/// Element type of a tensor / buffer. Stable values (the C API exposes them 1:1).
enum class DType : uint8_t {
  kFloat32 = 0,   ///< IEEE 754 binary32 ("fp32")
  kFloat16 = 1,   ///< IEEE 754 binary16 ("fp16")
  kBFloat16 = 2,  ///< bfloat16: the upper 16 bits of a binary32 ("bf16")
  kFloat64 = 3,   ///< IEEE 754 binary64 ("fp64")
  kInt8 = 4,
  kInt16 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kUInt8 = 8,
  kBool = 9,  ///< one byte per element, 0 = false, anything else = true
};

/// Number of DType values (for tables and loops).
inline constexpr int kNumDTypes = 10;

/// Size of one element in bytes (fp32 -> 4, fp16/bf16 -> 2, bool -> 1, ...).
/// Thread-safety: pure function.
constexpr size_t dtype_size(DType t) noexcept {
  switch (t) {
    case DType::kFloat32: return 4;
    case DType::kFloat16: return 2;
    case DType::kBFloat16: return 2;
    case DType::kFloat64: return 8;
    case DType::kInt8: return 1;
    case DType::kInt16: return 2;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kUInt8: return 1;
    case DType::kBool: return 1;
  }
  return 0;
}

/// Short name as used on command lines and in catalogs: "fp32", "fp16", "bf16", "fp64",
/// "int8", "int16", "int32", "int64", "uint8", "bool". Unknown values give "invalid".
constexpr std::string_view dtype_name(DType t) noexcept {
  switch (t) {
    case DType::kFloat32: return "fp32";
    case DType::kFloat16: return "fp16";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat64: return "fp64";
    case DType::kInt8: return "int8";
    case DType::kInt16: return "int16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kUInt8: return "uint8";
    case DType::kBool: return "bool";
  }
  return "invalid";
}

/// True for a value that names one of the ten DTypes (guards casts from integers).
constexpr bool dtype_is_valid(DType t) noexcept { return dtype_size(t) != 0; }

/// True for fp32, fp16, bf16, fp64.
constexpr bool dtype_is_floating(DType t) noexcept {
  return t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kBFloat16 ||
         t == DType::kFloat64;
}

/// Parses a name of dtype_name() (also the aliases "float32", "float", "float16", "half",
/// "bfloat16", "float64", "double", "uint8_t"...: the torch spellings without "torch.").
/// \error InvalidArgument naming `text` when it is not a known dtype.
inline Result<DType> parse_dtype(std::string_view text) {
  struct Alias {
    std::string_view name;
    DType type;
  };
  static constexpr Alias kAliases[] = {
      {"fp32", DType::kFloat32},  {"float32", DType::kFloat32}, {"float", DType::kFloat32},
      {"fp16", DType::kFloat16},  {"float16", DType::kFloat16}, {"half", DType::kFloat16},
      {"bf16", DType::kBFloat16}, {"bfloat16", DType::kBFloat16},
      {"fp64", DType::kFloat64},  {"float64", DType::kFloat64}, {"double", DType::kFloat64},
      {"int8", DType::kInt8},     {"int16", DType::kInt16},     {"short", DType::kInt16},
      {"int32", DType::kInt32},   {"int", DType::kInt32},       {"int64", DType::kInt64},
      {"long", DType::kInt64},    {"uint8", DType::kUInt8},     {"bool", DType::kBool},
  };
  for (const auto& a : kAliases) {
    if (a.name == text) return a.type;
  }
  return invalid_argument("unknown dtype '" + std::string(text) +
                          "' (expected fp32, fp16, bf16, fp64, int8, int16, int32, int64, "
                          "uint8 or bool)");
}

}  // namespace strata
