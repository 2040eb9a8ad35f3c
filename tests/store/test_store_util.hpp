// Helpers shared by the store tests (tests/store/test_store_*.cpp).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "common/store_options.hpp"
#include "common/temp_dir.hpp"
#include "strata/store/store.hpp"

namespace strata::store_test {

using testing::TempDir;

/// Deterministic bytes: xorshift64* stream seeded by `seed`.
inline std::vector<uint8_t> pattern(uint64_t nbytes, uint64_t seed) {
  std::vector<uint8_t> v(nbytes);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (uint64_t i = 0; i < nbytes; ++i) {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    v[i] = static_cast<uint8_t>((x * 0x2545F4914F6CDD1Dull) >> 56);
  }
  return v;
}

/// Small budgets so tests run fast and exercise chunking/eviction.
/// 8 MiB of host tier, 1 MiB chunks, 2 pool threads (test_store_options()).
inline StoreOptions small_options(const std::string& path) {
  return testing::test_store_options(path, 8ull << 20, 1ull << 20, 2);
}

/// small_options(root) with `nvme_dir` as the store's one NVMe directory.
inline StoreOptions small_options(const std::string& root, const std::string& nvme_dir) {
  StoreOptions o = small_options(root);
  o.nvme_dirs = {nvme_dir};
  return o;
}

inline std::unique_ptr<Store> open_or_die(const StoreOptions& o) {
  auto r = Store::open(o);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (!r.ok()) return nullptr;
  return std::move(r).value();
}

/// Opens a store with `o`, puts `bytes` as `key` (uint8, one dimension) and closes it.
inline Status put_and_close(const StoreOptions& o, const std::string& key,
                            const std::vector<uint8_t>& bytes) {
  auto r = Store::open(o);
  if (!r.ok()) return r.status();
  Status st = (*r)->put(key, bytes.data(), TensorDesc::bytes(bytes.size()));
  Status cl = (*r)->close();
  return st.ok() ? cl : st;
}

/// Reads all of `key` (get_bytes() of expected.size() bytes) and checks that it holds
/// `expected`.
inline void expect_reads_back(Store& s, const std::string& key,
                              const std::vector<uint8_t>& expected) {
  std::vector<uint8_t> out(expected.size());
  Status st = s.get_bytes(key, out.data(), out.size());
  ASSERT_TRUE(st.ok()) << key << ": " << st.to_string();
  EXPECT_EQ(out, expected) << key;
}

}  // namespace strata::store_test

#define ASSERT_OK(expr)                                  \
  do {                                                   \
    ::strata::Status s_ = ::strata::to_status(expr);     \
    ASSERT_TRUE(s_.ok()) << s_.to_string();              \
  } while (0)
#define EXPECT_OK(expr)                                  \
  do {                                                   \
    ::strata::Status s_ = ::strata::to_status(expr);     \
    EXPECT_TRUE(s_.ok()) << s_.to_string();              \
  } while (0)
