// strata::store (private) — encoding of the partitioned objects' record. See
// partition_record.hpp.
#include "partition_record.hpp"

#include <cstring>

#include "store_shapes.hpp"

namespace strata::store_detail {
namespace {
constexpr char kMagic[8] = {'S', 'T', 'R', 'P', 'A', 'R', 'T', '1'};
constexpr uint32_t kMetaVersion = 1;
constexpr size_t kMetaFixed = 8 + 4 + 4 + 4 + 4 + 8 + 4;
}  // namespace

std::vector<uint8_t> encode_partition_meta(const PartitionLayout& l, int rank,
                                           const TensorDesc& d) {
  std::vector<uint8_t> out(kMetaFixed + 8 * d.shape.size(), 0);
  uint8_t* p = out.data();
  auto put = [&](const void* v, size_t n) {
    std::memcpy(p, v, n);
    p += n;
  };
  const uint32_t version = kMetaVersion, ndim = static_cast<uint32_t>(d.shape.size());
  const int32_t r = rank, ws = l.world_size;
  const uint32_t dt = static_cast<uint32_t>(d.dtype);
  put(kMagic, 8);
  put(&version, 4);
  put(&r, 4);
  put(&ws, 4);
  put(&dt, 4);
  put(&l.numel, 8);
  put(&ndim, 4);
  for (int64_t e : d.shape) put(&e, 8);
  return out;
}

Result<PartitionInfo> decode_partition_meta(const std::string& key, const std::string& meta_key,
                                            const uint8_t* b, size_t n) {
  auto bad = [&](const std::string& why) {
    return data_loss("partition record '" + meta_key + "' is malformed: " + why);
  };
  if (n < kMetaFixed || std::memcmp(b, kMagic, 8) != 0) return bad("bad magic");
  uint32_t version, dt, ndim;
  int32_t rank, ws;
  uint64_t numel;
  const uint8_t* p = b + 8;
  std::memcpy(&version, p, 4);
  std::memcpy(&rank, p + 4, 4);
  std::memcpy(&ws, p + 8, 4);
  std::memcpy(&dt, p + 12, 4);
  std::memcpy(&numel, p + 16, 8);
  std::memcpy(&ndim, p + 24, 4);
  if (version != kMetaVersion) return bad("unknown version");
  if (n != kMetaFixed + 8ull * ndim) return bad("size does not match its rank count");
  if (dt >= static_cast<uint32_t>(kNumDTypes)) return bad("bad dtype");
  if (ws < 1 || rank < 0 || rank >= ws) return bad("bad rank / world size");
  PartitionInfo info;
  info.key = key;
  info.desc.dtype = static_cast<DType>(dt);
  info.desc.shape.resize(ndim);
  if (ndim > 0) std::memcpy(info.desc.shape.data(), b + kMetaFixed, 8ull * ndim);  // 0-d: no data()
  // TensorDesc::numel() counts a negative extent as 0 and wraps on overflow: such a shape
  // would pass the numel comparison below with a small recorded numel.
  if (!checked_nbytes(info.desc.dtype, info.desc.shape)) {
    return bad("shape " + to_string(info.desc) + " has a negative extent or overflows 64 bits");
  }
  if (info.desc.numel() != numel) return bad("shape does not match numel");
  info.numel = numel;
  info.world_size = ws;
  info.rank = rank;
  auto l = partition_layout(numel, ws);
  info.owned_begin = l->begin(rank);
  info.owned_numel = l->owned_numel(rank);
  return info;
}

}  // namespace strata::store_detail
