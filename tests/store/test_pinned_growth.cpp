// Pinned pools that grow on demand (pinned_pool.hpp, docs/pinned-memory.md): exact segment
// sizes, the budget cap, buffers inside one segment, idle segments released for a larger
// request, VmLck per segment, fixed-buffer I/O through grown segments; a caller's
// PinnedAllocator (exact sizes, frees, bad allocators); a store's pools (committed at open,
// growth by host-tier puts, the allocator through StoreOptions, the options' checks).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "store/test_io_util.hpp"
#include "store/test_store_util.hpp"
#include "strata/base/units.hpp"
#include "strata/store/io_engine.hpp"
#include "strata/store/pinned_pool.hpp"
#include "strata/store/store.hpp"

namespace strata {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kKiB = 1ull << 10;

uint64_t vmlck_kib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmLck:", 0) == 0) return std::stoull(line.substr(6));
  }
  ADD_FAILURE() << "VmLck not in /proc/self/status";
  return 0;
}

std::shared_ptr<PinnedPool> grow_pool(uint64_t budget, uint64_t initial, uint64_t grow,
                                      std::shared_ptr<IoEngine> engine = nullptr) {
  PinnedPoolOptions o;
  o.budget_bytes = budget;
  o.initial_bytes = initial;
  o.grow_bytes = grow;
  return testing::value_or_null(PinnedPool::create(o, std::move(engine)));
}

std::vector<uint64_t> segment_sizes(const PinnedPool& p) {
  std::vector<uint64_t> v;
  for (const PinnedSegment& s : p.segments()) v.push_back(s.bytes);
  return v;
}

// The buffer lies inside exactly one segment.
bool inside_one_segment(const PinnedPool& p, const PinnedBuffer& b) {
  int n = 0;
  const auto* d = static_cast<const char*>(b.data());
  for (const PinnedSegment& s : p.segments()) {
    const auto* base = static_cast<const char*>(s.base);
    if (d >= base && d + b.size() <= base + s.bytes) ++n;
  }
  return n == 1;
}

TEST(PinnedPoolGrowth, DefaultCommitsTheWholeBudget) {
  auto p = grow_pool(8 * kMiB, PinnedPoolOptions::kWholeBudget, 64 * kMiB);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->committed_bytes(), 8 * kMiB);
  EXPECT_EQ(segment_sizes(*p), std::vector<uint64_t>{8 * kMiB});
  PinnedPoolOptions d;
  EXPECT_EQ(d.initial_bytes, PinnedPoolOptions::kWholeBudget);
  EXPECT_EQ(d.grow_bytes, 64 * kMiB);
}

TEST(PinnedPoolGrowth, GrowsByExactSegmentsUpToTheBudget) {
  // initial 3 MiB -> 4 MiB (2 MiB granularity); grow 5 MiB -> 6 MiB.
  auto p = grow_pool(20 * kMiB, 3 * kMiB, 5 * kMiB);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->budget_bytes(), 20 * kMiB);
  EXPECT_EQ(p->committed_bytes(), 4 * kMiB);
  EXPECT_EQ(p->mapped_bytes(), 4 * kMiB);
  std::vector<PinnedBuffer> held;
  auto take = [&](uint64_t n) {
    auto b = p->try_allocate(n);
    EXPECT_TRUE(b.ok()) << b.status().to_string();
    if (b.ok()) {
      EXPECT_TRUE(inside_one_segment(*p, *b)) << n;
      held.push_back(std::move(*b));
    }
  };
  take(4 * kMiB);  // the initial segment, whole
  EXPECT_EQ(p->committed_bytes(), 4 * kMiB);
  take(4 * kKiB);  // grows by grow_bytes
  EXPECT_EQ(segment_sizes(*p), (std::vector<uint64_t>{4 * kMiB, 6 * kMiB}));
  take(9 * kMiB);  // larger than grow_bytes: its own size rounded up to 2 MiB
  EXPECT_EQ(segment_sizes(*p), (std::vector<uint64_t>{4 * kMiB, 6 * kMiB, 10 * kMiB}));
  EXPECT_EQ(p->committed_bytes(), 20 * kMiB);
  take(4 * kKiB);  // best fit: the 1 MiB left in the third segment
  take(6 * kMiB - 8 * kKiB);  // the rest of the second
  EXPECT_EQ(p->used_bytes(), 19 * kMiB);
  // Nothing fits, and the budget is committed: no growth beyond it.
  auto r = p->try_allocate(2 * kMiB);
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("budget 20971520"), std::string::npos) << r.status().to_string();
  EXPECT_EQ(p->committed_bytes(), 20 * kMiB);
  EXPECT_EQ(p->peak_committed_bytes(), 20 * kMiB);
  EXPECT_EQ(p->mapped_bytes(), 20 * kMiB);
  held.clear();
  // Free ranges coalesce within a segment only: one per segment.
  EXPECT_EQ(p->free_ranges(), 3u);
  EXPECT_EQ(p->largest_free_bytes(), 10 * kMiB);
  EXPECT_EQ(p->used_bytes(), 0u);
  EXPECT_EQ(p->committed_bytes(), 20 * kMiB);  // segments are kept
}

TEST(PinnedPoolGrowth, LastSegmentIsCappedByTheBudget) {
  auto p = grow_pool(12 * kMiB, 4 * kMiB, 6 * kMiB);
  ASSERT_TRUE(p);
  auto a = p->try_allocate(4 * kMiB);
  auto b = p->try_allocate(6 * kMiB);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(p->committed_bytes(), 10 * kMiB);
  auto c = p->try_allocate(kMiB);  // min(grow 6 MiB, 2 MiB left)
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(segment_sizes(*p), (std::vector<uint64_t>{4 * kMiB, 6 * kMiB, 2 * kMiB}));
  EXPECT_EQ(p->committed_bytes(), 12 * kMiB);
  EXPECT_EQ(p->try_allocate(2 * kMiB).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(p->try_allocate(12 * kMiB + 4096).status().code(), StatusCode::kInvalidArgument);
}

TEST(PinnedPoolGrowth, InitialZeroCommitsNothingUntilFirstUse) {
  auto p = grow_pool(8 * kMiB, 0, 2 * kMiB);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->committed_bytes(), 0u);
  EXPECT_TRUE(p->segments().empty());
  EXPECT_FALSE(p->locked());
  EXPECT_EQ(p->free_ranges(), 0u);
  auto b = p->allocate(4096);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(p->committed_bytes(), 2 * kMiB);
}

TEST(PinnedPoolGrowth, IdleSegmentsAreReleasedForALargerRequest) {
  auto p = grow_pool(8 * kMiB, 0, 2 * kMiB);
  ASSERT_TRUE(p);
  std::vector<PinnedBuffer> held;
  for (int i = 0; i < 4; ++i) {
    auto b = p->try_allocate(2 * kMiB);
    ASSERT_TRUE(b.ok());
    held.push_back(std::move(*b));
  }
  EXPECT_EQ(segment_sizes(*p), (std::vector<uint64_t>(4, 2 * kMiB)));
  void* oldest = p->segments()[0].base;
  // Busy: 6 MiB can never fit now.
  EXPECT_EQ(p->try_allocate(6 * kMiB).status().code(), StatusCode::kResourceExhausted);
  held.erase(held.begin() + 1, held.end());  // the three newest segments become idle
  auto big = p->try_allocate(6 * kMiB);
  ASSERT_TRUE(big.ok()) << big.status().to_string();
  EXPECT_EQ(segment_sizes(*p), (std::vector<uint64_t>{2 * kMiB, 6 * kMiB}));
  EXPECT_EQ(p->segments()[0].base, oldest);
  EXPECT_EQ(p->committed_bytes(), 8 * kMiB);
  EXPECT_TRUE(inside_one_segment(*p, *big));
}

TEST(PinnedPoolGrowth, BlockingAllocateGrowsBeforeWaiting) {
  auto p = grow_pool(4 * kMiB, 2 * kMiB, 2 * kMiB);
  ASSERT_TRUE(p);
  auto a = p->allocate(2 * kMiB, std::chrono::milliseconds(10));
  auto b = p->allocate(2 * kMiB, std::chrono::milliseconds(10));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(p->committed_bytes(), 4 * kMiB);
  auto c = p->allocate(4096, std::chrono::milliseconds(20));
  EXPECT_EQ(c.status().code(), StatusCode::kDeadlineExceeded);
}

TEST(PinnedPoolGrowth, VmLckCountsEachLockedSegment) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ASan and TSan make mlock a no-op";
#endif
  const uint64_t vmlck0 = vmlck_kib();
  {
    auto p = grow_pool(16 * kMiB, 2 * kMiB, 4 * kMiB);
    ASSERT_TRUE(p);
    auto a = p->try_allocate(2 * kMiB);
    auto b = p->try_allocate(kMiB);  // + 4 MiB
    auto c = p->try_allocate(5 * kMiB);  // + 6 MiB
    ASSERT_TRUE(a.ok() && b.ok() && c.ok());
    uint64_t locked = 0;
    for (const PinnedSegment& s : p->segments()) {
      if (s.locked) locked += s.mapped_bytes;
      EXPECT_FALSE(s.from_allocator);
    }
    EXPECT_EQ(p->mapped_bytes(), 12 * kMiB);
    EXPECT_EQ(vmlck_kib() - vmlck0, locked / 1024);
    if (p->locked()) {
      EXPECT_EQ(locked, 12 * kMiB);
    }
  }
  EXPECT_EQ(vmlck_kib(), vmlck0);
}

TEST(PinnedPoolGrowth, FixedBufferIoThroughGrownSegments) {
  IoEngineOptions eo;
  eo.kind = EngineKind::kUring;
  auto engine = IoEngine::create(eo);
  if (!engine.ok()) GTEST_SKIP() << "no I/O engine: " << engine.status().to_string();
  auto p = grow_pool(16 * kMiB, 2 * kMiB, 2 * kMiB, *engine);
  ASSERT_TRUE(p);
  auto first = p->try_allocate(2 * kMiB);  // fills the initial segment
  auto src = p->try_allocate(kMiB + 12288);  // a 2 MiB segment
  auto dst = p->try_allocate(3 * kMiB + 4096);  // a 4 MiB segment
  ASSERT_TRUE(first.ok() && src.ok() && dst.ok());
  EXPECT_EQ(segment_sizes(*p), (std::vector<uint64_t>{2 * kMiB, 2 * kMiB, 4 * kMiB}));
  for (const PinnedSegment& s : p->segments()) EXPECT_TRUE(s.engine_registered);
  EXPECT_TRUE(p->engine_registered());
  EXPECT_TRUE(inside_one_segment(*p, *src));
  EXPECT_TRUE(inside_one_segment(*p, *dst));
  testing::TempDir d;
  const std::string path = d.path() + "/data";
  auto file = (*engine)->open(path, OpenMode::kTruncate);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  auto* s = static_cast<uint8_t*>(src->data());
  for (uint64_t i = 0; i < src->size(); ++i) s[i] = static_cast<uint8_t>(i * 131 + (i >> 13));
  auto w = (*engine)->write_async(*file, src->data(), src->size(), 0).result();
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(*w, src->size());
  std::memset(dst->data(), 0, dst->size());
  auto r = (*engine)->read_async(*file, dst->data(), src->size(), 0).result();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r, src->size());
  EXPECT_EQ(std::memcmp(src->data(), dst->data(), src->size()), 0);
  file->reset();
}

// ---- a caller's allocator ------------------------------------------------------------------

struct CountingAllocator {
  std::mutex mu;
  std::map<void*, size_t> live;  // block -> size
  std::vector<size_t> alloc_sizes, free_sizes;
  std::vector<int> nodes;
  int mode = 0;  // 0 ok, 1 NULL, 2 misaligned
  std::vector<void*> raw;  // mode 2: what to free for real

  static void* alloc(size_t n, int node, void* ctx) {
    auto* self = static_cast<CountingAllocator*>(ctx);
    std::lock_guard<std::mutex> lk(self->mu);
    self->alloc_sizes.push_back(n);
    self->nodes.push_back(node);
    if (self->mode == 1) return nullptr;
    void* p = std::aligned_alloc(2 * kMiB, n + (self->mode == 2 ? 2 * kMiB : 0));
    if (p == nullptr) return nullptr;
    if (self->mode == 2) {
      self->raw.push_back(p);
      p = static_cast<char*>(p) + 64;
    }
    self->live[p] = n;
    return p;
  }
  static void release(void* p, size_t n, void* ctx) {
    auto* self = static_cast<CountingAllocator*>(ctx);
    std::lock_guard<std::mutex> lk(self->mu);
    self->free_sizes.push_back(n);
    auto it = self->live.find(p);
    EXPECT_NE(it, self->live.end());
    if (it == self->live.end()) return;
    EXPECT_EQ(it->second, n);
    self->live.erase(it);
    if (self->mode == 2) {
      std::free(static_cast<char*>(p) - 64);
    } else {
      std::free(p);
    }
  }
  PinnedAllocator hooks() {
    PinnedAllocator a;
    a.alloc = &CountingAllocator::alloc;
    a.free = &CountingAllocator::release;
    a.ctx = this;
    return a;
  }
};

TEST(PinnedPoolAllocator, SegmentsComeFromTheAllocatorWithExactSizes) {
  CountingAllocator ca;
  IoEngineOptions eo;
  eo.kind = EngineKind::kUring;
  auto engine = testing::value_or_null(IoEngine::create(eo));
  {
    PinnedPoolOptions o;
    o.budget_bytes = 16 * kMiB;
    o.initial_bytes = 4 * kMiB;
    o.grow_bytes = 2 * kMiB;
    o.allocator = ca.hooks();
    auto p = testing::value_or_null(PinnedPool::create(o, engine));
    ASSERT_TRUE(p);
    EXPECT_EQ(ca.alloc_sizes, std::vector<size_t>{4 * kMiB});
    EXPECT_EQ(ca.nodes, std::vector<int>{-1});
    auto a = p->try_allocate(4 * kMiB);
    auto b = p->try_allocate(100);
    auto c = p->try_allocate(5 * kMiB);
    ASSERT_TRUE(a.ok() && b.ok() && c.ok());
    EXPECT_EQ(ca.alloc_sizes, (std::vector<size_t>{4 * kMiB, 2 * kMiB, 6 * kMiB}));
    EXPECT_EQ(p->committed_bytes(), 12 * kMiB);
    for (const PinnedSegment& s : p->segments()) {
      EXPECT_TRUE(s.from_allocator);
      EXPECT_FALSE(s.locked);  // strata does not lock memory it does not own
      EXPECT_EQ(ca.live.count(s.base), 1u);
      if (engine) {
        EXPECT_TRUE(s.engine_registered);
      }
    }
    EXPECT_FALSE(p->locked());
    std::memset(c->data(), 7, c->size());
    EXPECT_TRUE(ca.free_sizes.empty());
  }
  // Every block back, once, with its size (in any order).
  std::sort(ca.free_sizes.begin(), ca.free_sizes.end());
  EXPECT_EQ(ca.free_sizes, (std::vector<size_t>{2 * kMiB, 4 * kMiB, 6 * kMiB}));
  EXPECT_TRUE(ca.live.empty());
}

TEST(PinnedPoolAllocator, BadAllocators) {
  CountingAllocator ca;
  PinnedPoolOptions o;
  o.budget_bytes = 8 * kMiB;
  o.initial_bytes = 2 * kMiB;
  o.grow_bytes = 2 * kMiB;
  o.name = "test pool";
  o.allocator = ca.hooks();
  o.allocator.free = nullptr;
  auto half = PinnedPool::create(o);
  EXPECT_EQ(half.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(half.status().message().find("free"), std::string::npos) << half.status().to_string();
  EXPECT_TRUE(ca.alloc_sizes.empty());

  o.allocator = ca.hooks();
  ca.mode = 1;  // NULL
  auto null = PinnedPool::create(o);
  EXPECT_EQ(null.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(null.status().message().find("test pool"), std::string::npos) << null.status().to_string();
  EXPECT_NE(null.status().message().find("2097152 bytes"), std::string::npos)
      << null.status().to_string();
  // NULL on growth: the allocation fails the same way; the pool stays usable.
  ca.mode = 0;
  auto p = testing::value_or_null(PinnedPool::create(o));
  ASSERT_TRUE(p);
  auto a = p->try_allocate(2 * kMiB);
  ASSERT_TRUE(a.ok());
  ca.mode = 1;
  auto g = p->try_allocate(3 * kMiB);
  EXPECT_EQ(g.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(g.status().message().find("4194304 bytes"), std::string::npos) << g.status().to_string();
  EXPECT_EQ(p->committed_bytes(), 2 * kMiB);
  a->reset();
  p.reset();

  ca.mode = 2;  // misaligned: freed again
  const size_t frees0 = ca.free_sizes.size();
  auto mis = PinnedPool::create(o);
  EXPECT_EQ(mis.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(mis.status().message().find("not aligned to 4096"), std::string::npos)
      << mis.status().to_string();
  EXPECT_EQ(ca.free_sizes.size(), frees0 + 1);
  EXPECT_TRUE(ca.live.empty());
  o.grow_bytes = 0;
  ca.mode = 0;
  EXPECT_EQ(PinnedPool::create(o).status().code(), StatusCode::kInvalidArgument);
}

// ---- a store's pools ---------------------------------------------------------------------------

using store_test::open_or_die;
using store_test::pattern;
using testing::TempDir;

TEST(StorePinned, DefaultsCommitOnlyTheInitialBytes) {
  TempDir d;
  StoreOptions o;
  o.path = d.path();
  EXPECT_EQ(o.pinned_initial_bytes, 8 * kMiB);
  EXPECT_EQ(o.pinned_grow_bytes, 64 * kMiB);
  auto s = open_or_die(o);
  ASSERT_TRUE(s);
  const StoreStats st = s->stats();
  EXPECT_EQ(st.host_pool.capacity_bytes, 1024 * kMiB);
  EXPECT_EQ(st.host_pool.committed_bytes, 8 * kMiB);
  ASSERT_EQ(st.staging_pool.capacity_bytes % (256 * kMiB), 0u);
  const uint64_t groups = st.staging_pool.capacity_bytes / (256 * kMiB);
  ASSERT_GE(groups, 1u);
  EXPECT_EQ(st.staging_pool.committed_bytes, groups * 8 * kMiB);
  const std::string line = format_stats_line(st);
  EXPECT_NE(line.find("host_pool_committed_bytes=8388608"), std::string::npos) << line;
  ASSERT_TRUE(s->close().ok());
}

TEST(StorePinned, HostTierPutsGrowThePoolBySegments) {
  TempDir d;
  StoreOptions o = testing::test_store_options(d.path(), 80 * kMiB, kMiB, 2);
  auto s = open_or_die(o);
  ASSERT_TRUE(s);
  PutOptions host;
  host.tier = Tier::kHost;
  const uint64_t sizes[] = {6 * kMiB, 6 * kMiB, 50 * kMiB, 10 * kMiB};
  const uint64_t committed[] = {8 * kMiB, 72 * kMiB, 72 * kMiB, 80 * kMiB};
  std::vector<std::vector<uint8_t>> data;
  for (int i = 0; i < 4; ++i) {
    data.push_back(pattern(sizes[i], 10 + i));
    const std::string key = "k" + std::to_string(i);
    ASSERT_TRUE(s->put(key, data[i].data(), TensorDesc::bytes(sizes[i]), host).ok()) << key;
    EXPECT_EQ(s->stats().host_pool.committed_bytes, committed[i]) << key;
  }
  // The last put evicted k0 (LRU) to NVMe: its idle 8 MiB segment made room for a 16 MiB one.
  EXPECT_EQ(s->stat("k0")->tier, Tier::kNvme);
  EXPECT_EQ(s->stat("k3")->tier, Tier::kHost);
  EXPECT_EQ(s->stats().host_pool.capacity_bytes, 80 * kMiB);
  for (int i = 0; i < 4; ++i) {
    std::vector<uint8_t> got(sizes[i]);
    ASSERT_TRUE(s->get_bytes("k" + std::to_string(i), got.data(), got.size()).ok());
    EXPECT_EQ(got, data[i]) << i;
  }
  ASSERT_TRUE(s->close().ok());
}

TEST(StorePinned, AllocatorSuppliesEverySegmentAndGetsThemBackAtClose) {
  TempDir d;
  CountingAllocator ca;
  StoreOptions o = testing::test_store_options(d.path(), 16 * kMiB, kMiB, 2);
  o.pinned_initial_bytes = 2 * kMiB;
  o.pinned_grow_bytes = 4 * kMiB;
  o.pinned_allocator = ca.hooks();
  auto s = open_or_die(o);
  ASSERT_TRUE(s);
  const size_t at_open = ca.alloc_sizes.size();  // staging pools + the host pool
  ASSERT_GE(at_open, 2u);
  EXPECT_EQ(ca.alloc_sizes, std::vector<size_t>(at_open, 2 * kMiB));
  auto v = pattern(3 * kMiB, 3);
  PutOptions host;
  host.tier = Tier::kHost;
  ASSERT_TRUE(s->put("h", v.data(), TensorDesc::bytes(v.size()), host).ok());
  ASSERT_EQ(ca.alloc_sizes.size(), at_open + 1);
  EXPECT_EQ(ca.alloc_sizes.back(), 4 * kMiB);
  std::vector<uint8_t> got(v.size());
  ASSERT_TRUE(s->get_bytes("h", got.data(), got.size()).ok());
  EXPECT_EQ(got, v);
  ASSERT_TRUE(s->put("n", v.data(), TensorDesc::bytes(v.size())).ok());  // NVMe, staged
  EXPECT_TRUE(ca.free_sizes.empty());
  ASSERT_TRUE(s->close().ok());
  s.reset();
  EXPECT_EQ(ca.free_sizes.size(), ca.alloc_sizes.size());
  EXPECT_TRUE(ca.live.empty());
}

TEST(StorePinned, BadAllocatorsAndOptions) {
  TempDir d;
  CountingAllocator ca;
  StoreOptions o = testing::test_store_options(d.path(), 16 * kMiB, kMiB, 2);
  o.pinned_allocator = ca.hooks();
  o.pinned_allocator.alloc = nullptr;
  auto r = Store::open(o);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("StoreOptions.pinned_allocator"), std::string::npos)
      << r.status().to_string();
  o.pinned_allocator = ca.hooks();
  ca.mode = 1;
  r = Store::open(o);
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("staging pool"), std::string::npos) << r.status().to_string();
  EXPECT_NE(r.status().message().find("4194304 bytes"), std::string::npos) << r.status().to_string();
  ca.mode = 2;
  r = Store::open(o);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("not aligned"), std::string::npos) << r.status().to_string();
  EXPECT_TRUE(ca.live.empty());
  ca.mode = 0;
  o.pinned_allocator = {};
  o.pinned_grow_bytes = 0;
  r = Store::open(o);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("pinned_grow_bytes"), std::string::npos);
}

TEST(StorePinned, OptionsFromEnvironment) {
  ::setenv("STRATA_PINNED_INITIAL", "2MiB", 1);
  ::setenv("STRATA_PINNED_GROW", "32MiB", 1);
  auto o = StoreOptions::from_env();
  ::unsetenv("STRATA_PINNED_INITIAL");
  ::unsetenv("STRATA_PINNED_GROW");
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  EXPECT_EQ(o->pinned_initial_bytes, 2 * kMiB);
  EXPECT_EQ(o->pinned_grow_bytes, 32 * kMiB);
  ::setenv("STRATA_PINNED_GROW", "lots", 1);
  auto bad = StoreOptions::from_env();
  ::unsetenv("STRATA_PINNED_GROW");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("STRATA_PINNED_GROW"), std::string::npos);
}

TEST(StorePinned, DeviceStreamWithoutAGpuIsRefused) {
  TempDir d;
  StoreOptions o = testing::test_store_options(d.path(), 4 * kMiB, kMiB, 2);
  {
    auto s = open_or_die(o);
    ASSERT_TRUE(s);
    if (s->has_device()) GTEST_SKIP() << "a GPU is present: this checks the CPU-only refusal";
    // No GPU: setting a stream later is refused the same way; clearing it is fine.
    int fake_stream = 0;
    Status st = s->set_device_stream(&fake_stream);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_TRUE(s->set_device_stream(nullptr).ok());
    ASSERT_TRUE(s->close().ok());
  }
  int fake_stream = 0;
  o.device_stream = &fake_stream;
  auto r = Store::open(o);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("StoreOptions.device_stream"), std::string::npos)
      << r.status().to_string();
}

}  // namespace
}  // namespace strata
