// strata::store (private) — chunk checksums: XXH3-64 through libxxhash's run-time
// dispatched entry points, which pick the widest vector unit the CPU has (AVX-512 / AVX2 /
// SSE2). Debian builds the plain XXH3_64bits() for baseline x86-64 (SSE2): measured on the
// development VM, 3.9 GB/s per core against 12 GB/s dispatched (AVX2/AVX-512), on 64 MiB
// buffers. Same digests either way: the vector width is not part of the XXH3 definition.
#pragma once

#include <xxh_x86dispatch.h>
#include <xxhash.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "strata/base/status.hpp"

namespace strata::store_detail {

/// XXH3-64 of the `n` bytes at `p` (host memory).
/// \threadsafety pure; safe to call concurrently.
inline uint64_t xxh3_64(const void* p, uint64_t n) { return XXH3_64bits_dispatch(p, n); }

/// Streaming XXH3-64: the digest equals xxh3_64() over the concatenated updates.
/// \threadsafety one object per thread.
class Xxh3Stream {
 public:
  Xxh3Stream() : h_(XXH3_createState()) {
    STRATA_CHECK(h_ != nullptr);
    XXH3_64bits_reset(h_);
  }
  ~Xxh3Stream() { XXH3_freeState(h_); }
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;
  /// Adds the `n` bytes at `p` (host memory).
  void update(const void* p, uint64_t n) { (void)XXH3_64bits_update_dispatch(h_, p, n); }
  /// Digest of everything added so far (the stream may go on).
  uint64_t digest() const { return XXH3_64bits_digest(h_); }

 private:
  XXH3_state_t* h_;
};

/// `v` as 16 lower-case hex digits (how checksums and store ids are printed).
inline std::string hex64(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

}  // namespace strata::store_detail
