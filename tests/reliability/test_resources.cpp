// Resource stability: open file descriptors (/proc/self/fd), locked memory (VmLck: the
// pinned pools) and resident memory (VmRSS) stay flat across 10,000 store operations,
// 1,000 open/close cycles of a store, and 1,000 offloaded optimizer steps. Each measures
// after a warm-up (allocator caches, SQLite's page cache, first-touch of the pools) and
// asserts: fds and VmLck unchanged, VmRSS grown by at most kRssSlackKib. Prints the figures.
// (STRATA_LONG_TESTS=1: ten times the operations, cycles and steps; STRATA_RESOURCE_OPS=N
// sets the store operations.)
#include <dirent.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "common/temp_dir.hpp"
#include "reliability/crash_loop.hpp"
#include "strata/optimizer/offload.hpp"

namespace strata {
namespace {

using crash_loop::bytes_of;

/// RSS growth allowed over a run after warm-up, in KiB: malloc arenas of the worker threads
/// and SQLite's page cache settle within it; a leak of even 1 KiB per operation exceeds it.
constexpr uint64_t kRssSlackKib = 8 * 1024;

struct Usage {
  int fds = 0;
  uint64_t vmlck_kib = 0, vmrss_kib = 0;
};

Usage usage_now() {
  Usage u;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (dirent* e = ::readdir(d)) u.fds += e->d_name[0] != '.';
    ::closedir(d);
    --u.fds;  // the directory stream's own descriptor
  }
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmLck:", 0) == 0) u.vmlck_kib = std::strtoull(line.c_str() + 6, nullptr, 10);
    if (line.rfind("VmRSS:", 0) == 0) u.vmrss_kib = std::strtoull(line.c_str() + 6, nullptr, 10);
  }
  return u;
}

uint64_t scale() {
  const char* v = std::getenv("STRATA_LONG_TESTS");
  return v && *v && std::string(v) != "0" ? 10 : 1;
}

void expect_flat(const char* what, uint64_t n, const Usage& a, const Usage& b) {
  std::printf("[resources] %s: %llu; fds %d -> %d, VmLck %llu -> %llu KiB, VmRSS %llu -> %llu KiB\n",
              what, static_cast<unsigned long long>(n), a.fds, b.fds,
              static_cast<unsigned long long>(a.vmlck_kib), static_cast<unsigned long long>(b.vmlck_kib),
              static_cast<unsigned long long>(a.vmrss_kib), static_cast<unsigned long long>(b.vmrss_kib));
  EXPECT_EQ(b.fds, a.fds) << what;
  EXPECT_EQ(b.vmlck_kib, a.vmlck_kib) << what;
#if defined(__SANITIZE_ADDRESS__)
  (void)kRssSlackKib;  // ASan's quarantine holds freed memory: RSS is not the program's
#else
  EXPECT_LE(b.vmrss_kib, a.vmrss_kib + kRssSlackKib) << what;
#endif
}

/// One operation of a mixed stream over 16 keys: put/overwrite, get, write_range, move,
/// prefetch, evict, remove, flush (errors: the test fails).
void mixed_op(Store& s, uint64_t i, std::vector<uint8_t>& buf) {
  const std::string key = "res/" + std::to_string(i % 16);
  const uint64_t n = 1 + (i * 7919) % (1500 * 1024);
  Status st;
  switch (s.contains(key) ? i % 8 : 0) {
    case 0: {
      buf = bytes_of(n, i);
      PutOptions po;
      po.overwrite = true;
      po.tier = i % 3 == 0 ? Tier::kHost : Tier::kNvme;
      st = s.put(key, buf.data(), TensorDesc::bytes(n), po);
      break;
    }
    case 1:
    case 2: {
      auto info = s.stat(key);
      ASSERT_TRUE(info.ok());
      buf.resize(info->nbytes);
      st = s.get_bytes(key, buf.data(), buf.size());
      break;
    }
    case 3: {
      auto info = s.stat(key);
      ASSERT_TRUE(info.ok());
      const uint64_t len = std::min<uint64_t>(info->nbytes, 300000);
      buf = bytes_of(len, i);
      st = s.write_range(key, info->nbytes - len, len, buf.data());
      break;
    }
    case 4: st = s.move(key, i % 16 < 8 ? Tier::kHost : Tier::kNvme); break;
    case 5: st = s.prefetch(key); break;
    case 6: st = s.evict(key); break;
    case 7: st = i % 32 == 7 ? s.flush() : s.remove(key); break;
  }
  ASSERT_TRUE(st.ok()) << "op " << i << " on " << key << ": " << st.to_string();
}

TEST(Resources, FlatAcrossTenThousandStoreOperations) {
  testing::TempDir dir;
  StoreOptions o = crash_loop::store_options(dir.path() + "/store");
  o.durability = Durability::kOnFlush;  // commits at the flushes of the stream: no fdatasync per put
  auto r = Store::open(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::vector<uint8_t> buf;
  for (uint64_t i = 0; i < 1000; ++i) {
    mixed_op(**r, i, buf);
    if (HasFatalFailure()) return;
  }
  ASSERT_TRUE((*r)->flush().ok());
  const Usage a = usage_now();
  const uint64_t n = std::getenv("STRATA_RESOURCE_OPS") ? std::strtoull(std::getenv("STRATA_RESOURCE_OPS"), nullptr, 10) : 10000 * scale();
  for (uint64_t i = 1000; i < 1000 + n; ++i) {
    mixed_op(**r, i, buf);
    if (HasFatalFailure()) return;
  }
  ASSERT_TRUE((*r)->flush().ok());
  expect_flat("store operations", n, a, usage_now());
}

TEST(Resources, FlatAcrossAThousandOpenCloseCycles) {
  testing::TempDir dir;
  StoreOptions o = crash_loop::store_options(dir.path() + "/store");
  o.host_budget_bytes = 4 << 20;
  auto v = bytes_of((1 << 20) + 77, 1);
  auto cycle = [&](uint64_t i) {
    auto r = Store::open(o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    if (i % 10 == 0) {
      PutOptions po;
      po.overwrite = true;
      ASSERT_TRUE((*r)->put("k" + std::to_string(i % 4), v.data(), TensorDesc::bytes(v.size()), po).ok());
    }
    std::vector<uint8_t> back(v.size());
    ASSERT_TRUE((*r)->get_bytes("k0", back.data(), back.size()).ok());
    ASSERT_TRUE((*r)->close().ok());
  };
  for (uint64_t i = 0; i < 50; ++i) {
    cycle(i);
    if (HasFatalFailure()) return;
  }
  const Usage a = usage_now();
  const uint64_t n = 1000 * scale();
  for (uint64_t i = 0; i < n; ++i) {
    cycle(i);
    if (HasFatalFailure()) return;
  }
  expect_flat("open/close cycles", n, a, usage_now());
}

TEST(Resources, FlatAcrossAThousandOptimizerSteps) {
  testing::TempDir dir;
  auto r = Store::open(crash_loop::store_options(dir.path() + "/store"));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::shared_ptr<Store> store = std::move(r).value();
  auto opt_r = optimizer::OffloadedOptimizer::create(
      store, *optimizer::builtin_rule_factory("adamw"), {{"lr", 1e-3}}, crash_loop::offload_options());
  ASSERT_TRUE(opt_r.ok()) << opt_r.status().to_string();
  auto& opt = **opt_r;
  std::vector<std::vector<float>> grads;
  ASSERT_TRUE(crash_loop::add_two_params(opt, grads).ok());
  auto steps = [&](uint64_t k) {
    for (uint64_t i = 0; i < k; ++i) {
      auto st = opt.step();
      ASSERT_TRUE(st.ok()) << st.status().to_string();
      if (i % 100 == 99) {
        ASSERT_TRUE(opt.checkpoint().ok());
      }
    }
  };
  steps(100);
  if (HasFatalFailure()) return;
  const Usage a = usage_now();
  const uint64_t n = 1000 * scale();
  steps(n);
  if (HasFatalFailure()) return;
  ASSERT_TRUE(opt.checkpoint().ok());
  EXPECT_EQ(*opt.step_count(0), static_cast<int64_t>(100 + n));
  expect_flat("optimizer steps", n, a, usage_now());
}

}  // namespace
}  // namespace strata
