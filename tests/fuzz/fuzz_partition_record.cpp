// Fuzz target: the record of a partitioned object (store/src/partition_record.hpp), the
// bytes under key + "#partmeta" that stat_partitioned() and fetch_partitioned() decode.
// Properties: decoding any bytes gives a PartitionInfo or DataLoss (never a crash, UB or
// leak); a decoded record has a valid shape, rank < world_size and an owned range inside
// the tensor, and encodes back to exactly the same bytes.
#include <cstring>

#include "fuzz_check.hpp"
#include "partition_record.hpp"
#include "store_shapes.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata;
  auto info = store_detail::decode_partition_meta("w", "w#partmeta", data, size);
  if (!info.ok()) {
    FUZZ_CHECK(info.status().code() == StatusCode::kDataLoss, "%s",
               info.status().to_string().c_str());
    FUZZ_CHECK(info.status().message().find("'w#partmeta'") != std::string::npos, "%s",
               info.status().to_string().c_str());
    return 0;
  }
  FUZZ_CHECK(store_detail::check_tensor_desc("decode", "w", info->desc).ok(), "%s",
             to_string(info->desc).c_str());
  FUZZ_CHECK(info->desc.numel() == info->numel, "numel %llu",
             static_cast<unsigned long long>(info->numel));
  FUZZ_CHECK(info->rank >= 0 && info->rank < info->world_size, "rank %d of %d", info->rank,
             info->world_size);
  FUZZ_CHECK(info->owned_begin <= info->numel &&
                 info->owned_numel <= info->numel - info->owned_begin,
             "owned [%llu, +%llu) of %llu", static_cast<unsigned long long>(info->owned_begin),
             static_cast<unsigned long long>(info->owned_numel),
             static_cast<unsigned long long>(info->numel));
  auto layout = partition_layout(info->numel, info->world_size);
  FUZZ_CHECK(layout.ok(), "%s", layout.status().to_string().c_str());
  std::vector<uint8_t> again = store_detail::encode_partition_meta(*layout, info->rank, info->desc);
  FUZZ_CHECK(again.size() == size && std::memcmp(again.data(), data, size) == 0,
             "re-encoding gives %zu bytes, the input has %zu", again.size(), size);
  return 0;
}
