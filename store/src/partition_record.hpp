// strata::store (private) — the record of a partitioned object (key + "#partmeta"):
//   magic "STRPART1" | version u32 | rank i32 | world_size i32 | dtype u32 | numel u64
//   | ndim u32 | shape i64[ndim]
// in host byte order (little-endian on every supported machine).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "strata/base/status.hpp"
#include "strata/store/partitioned.hpp"

namespace strata::store_detail {

/// The record of rank `rank`'s part of a tensor `d` laid out as `l`.
/// Pure function; thread-safe.
std::vector<uint8_t> encode_partition_meta(const PartitionLayout& l, int rank,
                                           const TensorDesc& d);

/// Decodes the `n` bytes at `b` (the record stored under `meta_key`) into the PartitionInfo
/// of `key`. `b` may be null when `n` is 0. Pure function; thread-safe.
/// \error DataLoss "partition record '<meta_key>' is malformed: <why>" when the bytes are
///     not a record encode_partition_meta() writes: short or bad magic, unknown version,
///     size not matching ndim, unknown dtype, rank outside [0, world_size), a negative
///     extent, a shape whose numel or nbytes overflows 64 bits, numel not matching the shape.
Result<PartitionInfo> decode_partition_meta(const std::string& key, const std::string& meta_key,
                                            const uint8_t* b, size_t n);

}  // namespace strata::store_detail
