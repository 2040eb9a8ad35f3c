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

#include "strata/store/store.hpp"

namespace strata::store_test {

/// A fresh directory under $TMPDIR (default /var/tmp: a real disk, so O_DIRECT works),
/// removed on destruction.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/var/tmp") + "/strata-store-test-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    char* p = ::mkdtemp(buf.data());
    EXPECT_NE(p, nullptr);
    path_ = p ? p : "";
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

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
inline StoreOptions small_options(const std::string& path) {
  StoreOptions o;
  o.path = path;
  o.host_budget_bytes = 8ull << 20;
  o.staging_bytes = 4ull << 20;
  o.chunk_bytes = 1ull << 20;
  o.worker_threads = 2;
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
  Status st = (*r)->put_sync(key, bytes.data(), TensorDesc::bytes(bytes.size()));
  Status cl = (*r)->close();
  return st.ok() ? cl : st;
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
