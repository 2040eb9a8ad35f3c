// PinnedPool: exact byte accounting, alignment, coalescing, blocking allocation, lifetime,
// no fd / locked-memory leaks over 1,000 cycles, NUMA binding, mlock refusal, io engine
// registration.
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "store/test_io_util.hpp"
#include "strata/base/units.hpp"
#include "strata/store/gpu.hpp"
#include "strata/store/io_engine.hpp"
#include "strata/store/pinned_pool.hpp"
#include "strata/store/topology.hpp"

namespace strata {
namespace {

std::shared_ptr<PinnedPool> make_pool(uint64_t budget, uint64_t alignment = 4096,
                                      int numa_node = -1) {
  PinnedPoolOptions o;
  o.budget_bytes = budget;
  o.alignment = alignment;
  o.numa_node = numa_node;
  return testing::value_or_null(PinnedPool::create(o));
}

uint64_t status_kib(const char* field) {  // "VmLck" from /proc/self/status, in KiB
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string key = std::string(field) + ":";
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::stoull(line.substr(key.size()));
  }
  ADD_FAILURE() << field << " not in /proc/self/status";
  return 0;
}

size_t open_fds() {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)e;
    ++n;
  }
  return n;
}

bool kernel_at_least(int major, int minor) {
  struct utsname u {};
  if (::uname(&u) != 0) return false;
  int ma = 0, mi = 0;
  if (std::sscanf(u.release, "%d.%d", &ma, &mi) != 2) return false;
  return ma > major || (ma == major && mi >= minor);
}

bool thp_enabled() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(in, line);
  return !line.empty() && line.find("[never]") == std::string::npos;
}

TEST(PinnedPool, CreateReportsBudgetAndBacking) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ASan and TSan make mlock a no-op: this test measures locked memory, RSS";
#endif
  const uint64_t vmlck0 = status_kib("VmLck");
  auto pool = make_pool(8 * kMiB);
  ASSERT_TRUE(pool);
  EXPECT_EQ(pool->budget_bytes(), 8 * kMiB);
  EXPECT_EQ(pool->mapped_bytes(), 8 * kMiB);
  EXPECT_EQ(pool->used_bytes(), 0u);
  EXPECT_EQ(pool->free_ranges(), 1u);
  EXPECT_EQ(pool->largest_free_bytes(), 8 * kMiB);
  EXPECT_EQ(pool->alignment(), 4096u);
  EXPECT_EQ(pool->numa_node(), -1);
  EXPECT_TRUE(is_aligned_ptr(pool->segments().at(0).base, 2 * kMiB));
  EXPECT_FALSE(pool->engine_registered());
  EXPECT_EQ(pool->cuda_registered(), gpu_count() > 0);
  if (pool->huge_page_kind() == HugePageKind::kNone) {
    EXPECT_FALSE(thp_enabled()) << "THP is enabled but the pool did not use it";
  }
  EXPECT_EQ(pool->huge_pages(), pool->huge_page_kind() != HugePageKind::kNone);
  // Locked memory grows by exactly the mapping when mlock succeeded.
  EXPECT_EQ(status_kib("VmLck") - vmlck0, pool->locked() ? pool->mapped_bytes() / 1024 : 0);
  auto huge = pool->resident_huge_page_bytes();
  ASSERT_TRUE(huge.ok()) << huge.status().to_string();
  EXPECT_LE(*huge, pool->mapped_bytes());
  EXPECT_EQ(*huge % (2 * kMiB), 0u);
  if (pool->huge_page_kind() == HugePageKind::kHugetlb) {
    EXPECT_EQ(*huge, pool->mapped_bytes());
  }
  pool.reset();
  EXPECT_EQ(status_kib("VmLck"), vmlck0);
}

TEST(PinnedPool, BudgetRoundsDownToAlignmentAndMappingUpTo2MiB) {
  auto pool = make_pool(3 * kMiB + 5000);
  ASSERT_TRUE(pool);
  EXPECT_EQ(pool->budget_bytes(), 3 * kMiB + 4096);
  EXPECT_EQ(pool->mapped_bytes(), 4 * kMiB);
}

TEST(PinnedPool, InvalidOptions) {
  PinnedPoolOptions o;
  o.budget_bytes = 4095;
  EXPECT_EQ(PinnedPool::create(o).status().code(), StatusCode::kInvalidArgument);
  o.budget_bytes = kMiB;
  o.alignment = 3000;
  EXPECT_EQ(PinnedPool::create(o).status().code(), StatusCode::kInvalidArgument);
  o.alignment = 0;
  EXPECT_EQ(PinnedPool::create(o).status().code(), StatusCode::kInvalidArgument);
  o.alignment = 4096;
  o.numa_node = 4000;
  auto r = PinnedPool::create(o);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("4000"), std::string::npos);
}

TEST(PinnedPool, ExactByteAccounting) {
  auto pool = make_pool(4 * kMiB);
  ASSERT_TRUE(pool);
  auto a = pool->try_allocate(1);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->size(), 1u);
  EXPECT_EQ(pool->used_bytes(), 4096u);
  auto b = pool->try_allocate(4097);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(pool->used_bytes(), 4096u + 8192u);
  auto c = pool->try_allocate(4096);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(pool->used_bytes(), 4096u + 8192u + 4096u);
  // Consecutive, non-overlapping, aligned, inside the pool.
  auto* base = static_cast<char*>(pool->segments().at(0).base);
  EXPECT_EQ(static_cast<char*>(a->data()), base);
  EXPECT_EQ(static_cast<char*>(b->data()), base + 4096);
  EXPECT_EQ(static_cast<char*>(c->data()), base + 4096 + 8192);
  EXPECT_EQ(pool->largest_free_bytes(), 4 * kMiB - 16384);
  b->reset();
  EXPECT_EQ(pool->used_bytes(), 8192u);
  EXPECT_EQ(pool->free_ranges(), 2u);
  EXPECT_FALSE(*b);
  a->reset();
  EXPECT_EQ(pool->used_bytes(), 4096u);
  EXPECT_EQ(pool->free_ranges(), 2u);  // [0, 12 KiB) merged, and the tail
  c->reset();
  EXPECT_EQ(pool->used_bytes(), 0u);
  EXPECT_EQ(pool->free_ranges(), 1u);
  EXPECT_EQ(pool->largest_free_bytes(), 4 * kMiB);
  // Zero bytes: an empty buffer, no memory.
  auto z = pool->try_allocate(0);
  ASSERT_TRUE(z.ok());
  EXPECT_FALSE(*z);
  EXPECT_EQ(pool->used_bytes(), 0u);
}

TEST(PinnedPool, CoalescesNeighboursOnRelease) {
  auto pool = make_pool(4 * kMiB);
  ASSERT_TRUE(pool);
  std::vector<PinnedBuffer> b;
  for (int i = 0; i < 4; ++i) {
    auto r = pool->try_allocate(kMiB);
    ASSERT_TRUE(r.ok()) << i;
    b.push_back(std::move(*r));
  }
  EXPECT_EQ(pool->used_bytes(), 4 * kMiB);
  EXPECT_EQ(pool->free_ranges(), 0u);
  auto full = pool->try_allocate(1);
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted);
  void* first = b[1].data();
  b[1].reset();
  b[3].reset();
  EXPECT_EQ(pool->free_ranges(), 2u);
  EXPECT_EQ(pool->largest_free_bytes(), kMiB);
  EXPECT_EQ(pool->try_allocate(2 * kMiB).status().code(), StatusCode::kResourceExhausted);
  b[2].reset();  // joins b1 and b3: [1 MiB, 4 MiB)
  EXPECT_EQ(pool->free_ranges(), 1u);
  EXPECT_EQ(pool->largest_free_bytes(), 3 * kMiB);
  auto big = pool->try_allocate(3 * kMiB);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->data(), first);
  EXPECT_EQ(pool->used_bytes(), 4 * kMiB);
}

TEST(PinnedPool, BestFitKeepsLargeRangesWhole) {
  auto pool = make_pool(4 * kMiB);
  ASSERT_TRUE(pool);
  PinnedBuffer a = pool->try_allocate(64 * kKiB).value();    // [0, 64K)
  PinnedBuffer gap = pool->try_allocate(64 * kKiB).value();  // [64K, 128K)
  PinnedBuffer c = pool->try_allocate(64 * kKiB).value();    // [128K, 192K)
  ASSERT_TRUE(a && gap && c);
  void* hole = gap.data();
  gap.reset();  // free: a 64 KiB hole and the 3.8 MiB tail
  auto d = pool->try_allocate(16 * kKiB);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->data(), hole);  // the smallest range that fits, not the first or largest
  EXPECT_EQ(pool->largest_free_bytes(), 4 * kMiB - 192 * kKiB);
}

TEST(PinnedPool, AlignmentOption) {
  auto pool = make_pool(8 * kMiB, 64 * kKiB);
  ASSERT_TRUE(pool);
  std::vector<PinnedBuffer> bufs;
  for (uint64_t n : {1ull, 65537ull, 4096ull, 100000ull}) {
    auto r = pool->try_allocate(n);
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(is_aligned_ptr(r->data(), 64 * kKiB)) << n;
    bufs.push_back(std::move(*r));
  }
  EXPECT_EQ(pool->used_bytes(), (1 + 2 + 1 + 2) * 64 * kKiB);
  // Alignment larger than a huge page: the base itself is aligned to it.
  auto big = make_pool(8 * kMiB, 4 * kMiB);
  ASSERT_TRUE(big);
  EXPECT_TRUE(is_aligned_ptr(big->segments().at(0).base, 4 * kMiB));
  auto x = big->try_allocate(1);
  auto y = big->try_allocate(1);
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_EQ(static_cast<char*>(y->data()) - static_cast<char*>(x->data()),
            static_cast<ptrdiff_t>(4 * kMiB));
  EXPECT_EQ(big->try_allocate(1).status().code(), StatusCode::kResourceExhausted);
}

TEST(PinnedPool, RequestLargerThanBudgetIsInvalid) {
  auto pool = make_pool(2 * kMiB);
  ASSERT_TRUE(pool);
  EXPECT_EQ(pool->try_allocate(2 * kMiB + 1).status().code(), StatusCode::kInvalidArgument);
  auto t0 = std::chrono::steady_clock::now();
  auto r = pool->allocate(2 * kMiB + 1);  // must not block
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  auto whole = pool->allocate(2 * kMiB);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(pool->used_bytes(), 2 * kMiB);
}

TEST(PinnedPool, AllocateBlocksUntilAnotherThreadFrees) {
  auto pool = make_pool(2 * kMiB);
  ASSERT_TRUE(pool);
  auto hold = pool->try_allocate(2 * kMiB);
  ASSERT_TRUE(hold.ok());
  std::atomic<bool> done{false};
  Result<PinnedBuffer> got = PinnedBuffer();
  std::thread waiter([&] {
    got = pool->allocate(kMiB, std::chrono::seconds(30));
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(done.load());
  void* expect = hold->data();
  hold->reset();
  waiter.join();
  EXPECT_TRUE(done.load());
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(got->data(), expect);
  EXPECT_EQ(pool->used_bytes(), kMiB);
}

TEST(PinnedPool, AllocateTimesOut) {
  auto pool = make_pool(2 * kMiB);
  ASSERT_TRUE(pool);
  auto hold = pool->try_allocate(2 * kMiB);
  ASSERT_TRUE(hold.ok());
  auto t0 = std::chrono::steady_clock::now();
  auto r = pool->allocate(4096, std::chrono::milliseconds(30));
  auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_GE(waited, std::chrono::milliseconds(30));
  EXPECT_EQ(pool->used_bytes(), 2 * kMiB);
}

TEST(PinnedPool, BudgetNeverExceededUnderConcurrency) {
  const uint64_t budget = 4 * kMiB;
  auto pool = make_pool(budget);
  ASSERT_TRUE(pool);
  std::atomic<uint64_t> max_used{0};
  std::atomic<int> corrupt{0};
  auto worker = [&](uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<std::pair<PinnedBuffer, uint8_t>> live;
    for (int i = 0; i < 3000; ++i) {
      if (live.empty() || rng() % 2 == 0) {
        uint64_t n = 1 + rng() % (256 * kKiB);
        auto r = pool->try_allocate(n);
        uint64_t used = pool->used_bytes();
        uint64_t m = max_used.load();
        while (used > m && !max_used.compare_exchange_weak(m, used)) {
        }
        if (!r.ok()) {
          if (r.status().code() != StatusCode::kResourceExhausted) ++corrupt;
          continue;
        }
        uint8_t tag = static_cast<uint8_t>(rng());
        std::memset(r->data(), tag, r->size());
        live.emplace_back(std::move(*r), tag);
      } else {
        size_t k = rng() % live.size();
        auto& [buf, tag] = live[k];
        const auto* p = static_cast<const uint8_t*>(buf.data());
        for (uint64_t j = 0; j < buf.size(); j += 997) {
          if (p[j] != tag) {
            ++corrupt;
            break;
          }
        }
        if (p[buf.size() - 1] != tag) ++corrupt;
        live.erase(live.begin() + static_cast<ptrdiff_t>(k));
      }
    }
  };
  std::thread t1(worker, 1), t2(worker, 2);
  t1.join();
  t2.join();
  EXPECT_EQ(corrupt.load(), 0);  // no overlapping buffers, only ResourceExhausted errors
  EXPECT_LE(max_used.load(), budget);
  EXPECT_EQ(pool->used_bytes(), 0u);
  EXPECT_EQ(pool->free_ranges(), 1u);
  EXPECT_EQ(pool->largest_free_bytes(), budget);
}

TEST(PinnedPool, BufferKeepsPoolAlive) {
  const uint64_t vmlck0 = status_kib("VmLck");
  auto pool = make_pool(2 * kMiB);
  ASSERT_TRUE(pool);
  std::weak_ptr<PinnedPool> weak = pool;
  auto r = pool->try_allocate(kMiB);
  ASSERT_TRUE(r.ok());
  PinnedBuffer buf = std::move(*r);
  pool.reset();
  EXPECT_FALSE(weak.expired());
  std::memset(buf.data(), 0x5a, buf.size());  // still mapped
  EXPECT_EQ(static_cast<uint8_t*>(buf.data())[kMiB - 1], 0x5a);
  PinnedBuffer moved = std::move(buf);
  EXPECT_FALSE(buf);
  EXPECT_TRUE(moved);
  moved = PinnedBuffer();  // move-assign releases the old buffer, and with it the pool
  EXPECT_TRUE(weak.expired());
  EXPECT_EQ(status_kib("VmLck"), vmlck0);
}

TEST(PinnedPool, NoLeaksOver1000CreateDestroyCycles) {
  const size_t fds0 = open_fds();
  const uint64_t vmlck0 = status_kib("VmLck");
  for (int i = 0; i < 1000; ++i) {
    auto pool = make_pool(2 * kMiB);
    ASSERT_TRUE(pool) << "cycle " << i;
    auto b = pool->try_allocate(4096);
    ASSERT_TRUE(b.ok());
    static_cast<char*>(b->data())[0] = 1;
  }
  EXPECT_EQ(open_fds(), fds0);
  EXPECT_EQ(status_kib("VmLck"), vmlck0);
}

TEST(PinnedPool, BindsToNumaNode) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ASan and TSan make mlock a no-op: this test measures locked memory, RSS";
#endif
  auto topo = Topology::system();
  ASSERT_TRUE(topo.ok());
  const int node = (*topo)->numa_nodes().back().os_index;
  auto pool = make_pool(4 * kMiB, 4096, node);
  ASSERT_TRUE(pool);
  if (pool->numa_node() == -1) GTEST_SKIP() << "mbind refused here (see the warning)";
  EXPECT_EQ(pool->numa_node(), node);
  auto where = (*topo)->memory_location(pool->segments().at(0).base, pool->mapped_bytes());
  ASSERT_TRUE(where.ok()) << where.status().to_string();
  EXPECT_EQ(*where, std::vector<int>{node});
}

TEST(PinnedPool, OptionsFromEnv) {
  ::setenv("STRATA_PINNED_BUDGET", "64MiB", 1);
  ::setenv("STRATA_PINNED_NUMA_NODE", "1", 1);
  ::setenv("STRATA_PINNED_HUGE_PAGES", "off", 1);
  auto o = PinnedPoolOptions::from_env();
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  EXPECT_EQ(o->budget_bytes, 64 * kMiB);
  EXPECT_EQ(o->numa_node, 1);
  EXPECT_FALSE(o->huge_pages);
  EXPECT_FALSE(o->require_mlock);
  ::setenv("STRATA_PINNED_BUDGET", "lots", 1);
  auto bad = PinnedPoolOptions::from_env();
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("STRATA_PINNED_BUDGET"), std::string::npos);
  ::unsetenv("STRATA_PINNED_BUDGET");
  ::unsetenv("STRATA_PINNED_NUMA_NODE");
  ::unsetenv("STRATA_PINNED_HUGE_PAGES");
  auto d = PinnedPoolOptions::from_env();
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->budget_bytes, 256 * kMiB);
  EXPECT_EQ(d->numa_node, -1);
}

// Runs only where 2 MiB hugetlb pages are reserved (sysctl vm.nr_hugepages=N): then a pool
// that fits uses them, all of its bytes resident on them.
TEST(PinnedPool, UsesReservedHugetlbPages) {
  uint64_t free_pages = 0, page_kib = 0;
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    unsigned long long v = 0;
    if (std::sscanf(line.c_str(), "HugePages_Free: %llu", &v) == 1) free_pages = v;
    if (std::sscanf(line.c_str(), "Hugepagesize: %llu kB", &v) == 1) page_kib = v;
  }
  if (page_kib != 2048 || free_pages < 2) {
    GTEST_SKIP() << "fewer than 2 free 2 MiB hugetlb pages (vm.nr_hugepages)";
  }
  auto pool = make_pool(4 * kMiB);
  ASSERT_TRUE(pool);
  EXPECT_EQ(pool->huge_page_kind(), HugePageKind::kHugetlb);
  EXPECT_STREQ(huge_page_kind_name(pool->huge_page_kind()), "hugetlb");
  auto huge = pool->resident_huge_page_bytes();
  ASSERT_TRUE(huge.ok());
  EXPECT_EQ(*huge, 4 * kMiB);
}

TEST(PinnedPool, HugePagesOffUsesOrdinaryPages) {
  PinnedPoolOptions o;
  o.budget_bytes = 2 * kMiB;
  o.huge_pages = false;
  auto p = PinnedPool::create(o);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)->huge_page_kind(), HugePageKind::kNone);
  EXPECT_FALSE((*p)->huge_pages());
  EXPECT_STREQ(huge_page_kind_name((*p)->huge_page_kind()), "none");
}

// In a child process without CAP_IPC_LOCK and with RLIMIT_MEMLOCK = 64 KiB: mlock of 4 MiB
// is refused. require_mlock -> ResourceExhausted with errno; default -> usable, unlocked.
TEST(PinnedPool, MlockRefusedByRlimit) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ASan and TSan make mlock a no-op: this test measures locked memory, RSS";
#endif
  (void)gpu_count();  // probe CUDA before fork, never in the child
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct data[2]{};
    if (::syscall(SYS_capget, &hdr, data) != 0) ::_exit(100);
    data[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
    data[CAP_IPC_LOCK / 32].permitted &= ~(1u << (CAP_IPC_LOCK % 32));
    if (::syscall(SYS_capset, &hdr, data) != 0) ::_exit(100);
    struct rlimit rl {
      64 * 1024, 64 * 1024
    };
    if (::setrlimit(RLIMIT_MEMLOCK, &rl) != 0) ::_exit(100);
    int code = 0;
    PinnedPoolOptions o;
    o.budget_bytes = 4 * kMiB;
    o.require_mlock = true;
    auto strict = PinnedPool::create(o);
    if (strict.ok()) code |= 1;
    if (!strict.ok() && strict.status().code() != StatusCode::kResourceExhausted) code |= 2;
    if (!strict.ok() && strict.status().sys_errno() != ENOMEM &&
        strict.status().sys_errno() != EPERM) {
      code |= 4;
    }
    o.require_mlock = false;
    auto lenient = PinnedPool::create(o);
    if (!lenient.ok()) {
      code |= 8;
    } else {
      if ((*lenient)->locked()) code |= 16;
      auto b = (*lenient)->try_allocate(4 * kMiB);
      if (b.ok()) {
        std::memset(b->data(), 1, b->size());
      } else {
        code |= 32;
      }
    }
    ::_exit(code);
  }
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus));
  if (WEXITSTATUS(wstatus) == 100) GTEST_SKIP() << "cannot drop CAP_IPC_LOCK here";
  EXPECT_EQ(WEXITSTATUS(wstatus), 0) << "bitmask: 1 strict succeeded, 2 wrong code, "
                                        "4 wrong errno, 8 lenient failed, 16 locked, 32 alloc";
}

TEST(PinnedPool, RegistersWithIoEngineAndDoesFixedBufferIo) {
  IoEngineOptions eo;
  eo.kind = EngineKind::kUring;
  auto engine = IoEngine::create(eo);
  if (!engine.ok()) GTEST_SKIP() << "no I/O engine: " << engine.status().to_string();
  const uint64_t vmlck0 = status_kib("VmLck");
  const size_t fds0 = open_fds();
  {
    PinnedPoolOptions o;
    o.budget_bytes = 8 * kMiB;
    auto pool = PinnedPool::create(o, *engine);
    ASSERT_TRUE(pool.ok()) << pool.status().to_string();
    EXPECT_TRUE((*pool)->engine_registered());
    // The region is registered: registering it again is refused by a uring engine that
    // has fixed buffers (sparse buffer tables: Linux >= 5.19).
    if ((*engine)->kind() == EngineKind::kUring && kernel_at_least(5, 19)) {
      auto again = (*engine)->register_buffer((*pool)->segments().at(0).base,
                                              (*pool)->mapped_bytes());
      EXPECT_EQ(again.code(), StatusCode::kAlreadyExists) << again.to_string();
    }
    // Round trip through the engine from and into pool buffers.
    char tmpl[] = "/tmp/strata_pool_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    const std::string path = std::string(tmpl) + "/data";
    auto file = (*engine)->open(path, OpenMode::kTruncate);
    ASSERT_TRUE(file.ok()) << file.status().to_string();
    auto src = (*pool)->try_allocate(3 * kMiB + 12345);
    auto dst = (*pool)->try_allocate(3 * kMiB + 12345);
    ASSERT_TRUE(src.ok() && dst.ok());
    auto* s = static_cast<uint8_t*>(src->data());
    for (uint64_t i = 0; i < src->size(); ++i) s[i] = static_cast<uint8_t>(i * 131 + (i >> 13));
    auto w = (*engine)->write_async(*file, src->data(), src->size(), 4096).result();
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    EXPECT_EQ(*w, src->size());
    auto r = (*engine)->read_async(*file, dst->data(), dst->size(), 4096).result();
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(*r, dst->size());
    EXPECT_EQ(std::memcmp(src->data(), dst->data(), src->size()), 0);
    file->reset();
    std::filesystem::remove_all(tmpl);
  }
  // The pool unregistered its region on destruction: it can be registered again.
  for (int i = 0; i < 200; ++i) {
    PinnedPoolOptions o;
    o.budget_bytes = 2 * kMiB;
    auto pool = PinnedPool::create(o, *engine);
    ASSERT_TRUE(pool.ok()) << "cycle " << i << ": " << pool.status().to_string();
    ASSERT_TRUE((*pool)->engine_registered()) << "cycle " << i;
  }
  EXPECT_EQ(open_fds(), fds0);
  EXPECT_EQ(status_kib("VmLck"), vmlck0);
}

}  // namespace
}  // namespace strata
