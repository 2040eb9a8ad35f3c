// strata::store (private) — damaged catalog rows and the extents sound rows claim. See
// store_damage.hpp.
#include "store_damage.hpp"

#include <algorithm>

#include "store_shapes.hpp"
#include "strata/base/units.hpp"

namespace strata::store_detail {

namespace {
constexpr uint64_t kAlign = 4096;
}  // namespace

bool chunk_adoptable(const catalog::ChunkRow& c, size_t ndirs, uint64_t chunk_bytes) {
  if (c.dir >= ndirs || c.offset % kAlign != 0 || c.nbytes == 0 || c.nbytes > chunk_bytes) {
    return false;
  }
  uint64_t end;
  return !__builtin_add_overflow(c.offset, align_up(c.nbytes, kAlign), &end) && end <= (1ull << 62);
}

uint64_t row_chunk_bytes(const catalog::ObjectRow& r, uint64_t store_chunk_bytes) {
  if (r.chunks.size() < 2) return store_chunk_bytes;
  return r.chunks[0].nbytes;
}

std::string row_damage(const catalog::ObjectRow& r, size_t ndirs, uint64_t store_chunk_bytes) {
  if (!r.damage.empty()) return r.damage;
  TensorDesc d{r.dtype, r.shape};
  auto want = checked_nbytes(r.dtype, r.shape);
  if (!want) {
    return "object '" + r.key + "' has shape " + to_string(d) + " whose size overflows 64 bits";
  }
  if (*want != r.nbytes) {
    return "object '" + r.key + "' is " + std::to_string(r.nbytes) + " bytes but " + to_string(d) +
           " needs " + std::to_string(*want);
  }
  // The object's chunk size: a multiple of 4 KiB up to the store's (PutOptions).
  const uint64_t chunk_bytes = row_chunk_bytes(r, store_chunk_bytes);
  if (chunk_bytes == 0 || chunk_bytes % kAlign != 0 || chunk_bytes > store_chunk_bytes) {
    return "object '" + r.key + "' has chunks of " + std::to_string(chunk_bytes) +
           " bytes (not a multiple of 4096 up to the store's " +
           std::to_string(store_chunk_bytes) + ")";
  }
  const uint64_t nchunks = (r.nbytes + chunk_bytes - 1) / chunk_bytes;
  if (r.chunks.size() != nchunks) {
    return "object '" + r.key + "' has " + std::to_string(r.chunks.size()) + " chunks, expected " +
           std::to_string(nchunks);
  }
  for (size_t j = 0; j < r.chunks.size(); ++j) {
    const auto& c = r.chunks[j];
    if (!chunk_adoptable(c, ndirs, chunk_bytes)) {
      return "object '" + r.key + "' has a chunk in directory " + std::to_string(c.dir) +
             " at offset " + std::to_string(c.offset) + " of " + std::to_string(c.nbytes) +
             " bytes outside the store";
    }
    uint64_t expect = std::min<uint64_t>(chunk_bytes, r.nbytes - j * chunk_bytes);
    if (c.nbytes != expect) {
      return "object '" + r.key + "' chunk " + std::to_string(j) + " holds " +
             std::to_string(c.nbytes) + " bytes, expected " + std::to_string(expect);
    }
  }
  return {};
}

std::string ExtentClaims::claim(const catalog::ObjectRow& r, std::vector<bool>* adopt) {
  std::string damage;
  adopt->assign(r.chunks.size(), false);
  for (size_t j = 0; j < r.chunks.size(); ++j) {
    const auto& c = r.chunks[j];
    if (!chunk_adoptable(c, dirs_.size(), chunk_bytes_)) continue;
    const uint64_t end = c.offset + align_up(c.nbytes, kAlign);
    auto& m = dirs_[c.dir];
    const Claim* hit = nullptr;
    auto it = m.upper_bound(c.offset);
    if (it != m.begin() && std::prev(it)->second.end > c.offset) hit = &std::prev(it)->second;
    if (!hit && it != m.end() && it->first < end) hit = &it->second;
    if (hit) {
      if (damage.empty()) {
        damage = "object '" + r.key + "' chunk " + std::to_string(j) + " (directory " +
                 std::to_string(c.dir) + " offset " + std::to_string(c.offset) + ", " +
                 std::to_string(c.nbytes) + " bytes) overlaps " +
                 (hit->key == r.key ? "another chunk of it" : "object '" + hit->key + "'");
      }
      continue;
    }
    m.emplace(c.offset, Claim{end, r.key});
    (*adopt)[j] = true;
  }
  return damage;
}

}  // namespace strata::store_detail
