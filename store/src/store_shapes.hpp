// strata::store (private) — checks of a tensor description: a valid dtype, no negative
// extent, and numel and nbytes overflow-checked before anything is written.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/base/status.hpp"
#include "strata/store/store.hpp"

namespace strata::store_detail {

/// numel * dtype_size(dtype) of `desc`, or nullopt when an extent is negative or the
/// product overflows uint64.
std::optional<uint64_t> checked_nbytes(DType dtype, const std::vector<int64_t>& shape);

/// InvalidArgument "<op> '<key>': ..." naming the shape when an extent is negative or
/// numel / nbytes overflows 64 bits.
Status check_tensor_desc(std::string_view op, const std::string& key, const TensorDesc& desc);

}  // namespace strata::store_detail
