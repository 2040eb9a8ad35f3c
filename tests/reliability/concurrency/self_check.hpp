// Self-validating object contents for the concurrency tests: a 16-byte header (seed, size)
// followed by bytes_of(size - 16, seed), so a reader that knows nothing of the writer can
// tell a whole version from a torn or mixed one, and which version it read.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "reliability/crash_loop.hpp"

namespace strata::concurrency {

/// A version of `size` (>= 16) bytes drawn from `seed`.
inline std::vector<uint8_t> version_bytes(uint64_t size, uint64_t seed) {
  std::vector<uint8_t> v = crash_loop::bytes_of(size, seed);
  std::memcpy(v.data(), &seed, 8);
  std::memcpy(v.data() + 8, &size, 8);
  return v;
}

/// The seed of the whole version `v` holds, or false when `v` is torn, mixed or malformed.
inline bool check_version(const std::vector<uint8_t>& v, uint64_t* seed) {
  if (v.size() < 16) return false;
  uint64_t s, n;
  std::memcpy(&s, v.data(), 8);
  std::memcpy(&n, v.data() + 8, 8);
  if (n != v.size()) return false;
  if (version_bytes(n, s) != v) return false;
  *seed = s;
  return true;
}

}  // namespace strata::concurrency
