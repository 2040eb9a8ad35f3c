// strata::store (private) — checks of a tensor description. See store_shapes.hpp.
#include "store_shapes.hpp"

namespace strata::store_detail {

std::optional<uint64_t> checked_nbytes(DType dtype, const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return std::nullopt;
  }
  uint64_t bytes;
  if (__builtin_mul_overflow(n, static_cast<uint64_t>(dtype_size(dtype)), &bytes)) {
    return std::nullopt;
  }
  return bytes;
}

Status check_tensor_desc(std::string_view op, const std::string& key, const TensorDesc& desc) {
  if (!dtype_is_valid(desc.dtype)) {
    return invalid_argument(std::string(op) + " '" + key + "': dtype value " +
                            std::to_string(static_cast<int>(desc.dtype)) + " is not a DType");
  }
  for (int64_t d : desc.shape) {
    if (d < 0) {
      return invalid_argument(std::string(op) + " '" + key + "': negative extent " +
                              std::to_string(d) + " in shape " + to_string(desc));
    }
  }
  if (!checked_nbytes(desc.dtype, desc.shape)) {
    return invalid_argument(std::string(op) + " '" + key + "': shape " + to_string(desc) +
                            " overflows: numel * " + std::to_string(dtype_size(desc.dtype)) +
                            " bytes does not fit in 64 bits");
  }
  return Status::OK();
}

}  // namespace strata::store_detail
