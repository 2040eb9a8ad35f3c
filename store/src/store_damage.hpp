// strata::store (private) — damaged catalog rows: described (not fatal) so that one bad
// row leaves the rest of the store reachable, and the extents the sound rows claim (no
// extent claimed twice).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "catalog_sqlite.hpp"

namespace strata::store_detail {

/// Empty when catalog row `r` is sound for a store with `ndirs` directories and
/// `chunk_bytes`, else a description of the damage (names the key).
std::string row_damage(const catalog::ObjectRow& r, size_t ndirs, uint64_t chunk_bytes);

/// Bytes per chunk of the object of row `r` (PutOptions::chunk_bytes when it was put): the
/// first chunk's length when it has two chunks or more, else `store_chunk_bytes` (one
/// chunk reads and writes alike whatever the chunk size was).
uint64_t row_chunk_bytes(const catalog::ObjectRow& r, uint64_t store_chunk_bytes);
/// True when chunk `c` names a valid extent (its space is then kept out of reuse).
bool chunk_adoptable(const catalog::ChunkRow& c, size_t ndirs, uint64_t chunk_bytes);

/// Extents claimed by the catalog rows loaded so far, per directory: two committed rows
/// whose chunks overlap would otherwise make the store unopenable.
class ExtentClaims {
 public:
  ExtentClaims(size_t ndirs, uint64_t chunk_bytes) : dirs_(ndirs), chunk_bytes_(chunk_bytes) {}
  /// Claims the adoptable chunks of `r` that overlap no earlier claim; adopt[j] says which.
  /// \returns "" or a description of the first overlap (the row is then damaged).
  std::string claim(const catalog::ObjectRow& r, std::vector<bool>* adopt);

 private:
  struct Claim {
    uint64_t end;
    std::string key;
  };
  std::vector<std::map<uint64_t, Claim>> dirs_;  // offset -> claim
  uint64_t chunk_bytes_;
};

}  // namespace strata::store_detail
