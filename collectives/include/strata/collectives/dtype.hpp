// strata — element types shared by the store (object dtypes), the collectives (buffers to
// gather/reduce) and the optimizer (gradient dtypes). Header-only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace strata {

/// Element type of a tensor. Stable values (persisted in store catalogs; exposed in the C
/// API as strata_dtype_t): never renumber.
enum class DType : uint8_t {
  kFloat32 = 0,
  kFloat16 = 1,   ///< IEEE 754 binary16
  kBFloat16 = 2,  ///< bfloat16 (8-bit exponent, 7-bit mantissa)
  kFloat64 = 3,
  kInt8 = 4,
  kInt16 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kUInt8 = 8,
  kBool = 9,  ///< one byte per element, 0 or 1
};

/// Bytes per element.
constexpr size_t dtype_size(DType t) {
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

/// Canonical names, as numpy/torch spell them: "float32", "float16", "bfloat16",
/// "float64", "int8", "int16", "int32", "int64", "uint8", "bool".
constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat64: return "float64";
    case DType::kInt8: return "int8";
    case DType::kInt16: return "int16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kUInt8: return "uint8";
    case DType::kBool: return "bool";
  }
  return "unknown";
}

/// Parses a canonical name or a short alias (fp32, fp16, bf16, fp64, f32, half, float,
/// double). nullopt when unknown.
constexpr std::optional<DType> dtype_from_name(std::string_view s) {
  if (s == "float32" || s == "fp32" || s == "f32" || s == "float") return DType::kFloat32;
  if (s == "float16" || s == "fp16" || s == "f16" || s == "half") return DType::kFloat16;
  if (s == "bfloat16" || s == "bf16") return DType::kBFloat16;
  if (s == "float64" || s == "fp64" || s == "f64" || s == "double") return DType::kFloat64;
  if (s == "int8") return DType::kInt8;
  if (s == "int16") return DType::kInt16;
  if (s == "int32") return DType::kInt32;
  if (s == "int64") return DType::kInt64;
  if (s == "uint8") return DType::kUInt8;
  if (s == "bool") return DType::kBool;
  return std::nullopt;
}

}  // namespace strata
