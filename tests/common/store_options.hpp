// StoreOptions for the small stores tests open (the store's and the offloaded optimizer's).
#pragma once

#include <cstdint>
#include <string>

#include "strata/store/store.hpp"

namespace strata::testing {

/// Options of a store at `path` small enough for a test: `host_budget_bytes` of host tier,
/// 4 MiB of staging buffers, chunks of `chunk_bytes`, `worker_threads` pool threads; the
/// other fields at their defaults.
inline StoreOptions test_store_options(const std::string& path, uint64_t host_budget_bytes,
                                       uint64_t chunk_bytes, uint32_t worker_threads) {
  StoreOptions o;
  o.path = path;
  o.host_budget_bytes = host_budget_bytes;
  o.staging_bytes = 4ull << 20;
  o.chunk_bytes = chunk_bytes;
  o.worker_threads = worker_threads;
  return o;
}

}  // namespace strata::testing
