// strata::store — pinned buffer pool (see pinned_pool.hpp and docs/pinned-memory.md).
#include "strata/store/pinned_pool.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>

#include "strata/base/env.hpp"
#include "strata/base/logging.hpp"
#include "strata/base/units.hpp"
#include "strata/store/gpu.hpp"
#include "strata/store/io_engine.hpp"
#include "strata/store/topology.hpp"

#ifndef MAP_HUGE_SHIFT
#define MAP_HUGE_SHIFT 26
#endif
#ifndef MAP_HUGE_2MB
#define MAP_HUGE_2MB (21 << MAP_HUGE_SHIFT)
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace strata {

namespace {

constexpr uint64_t kHugePage = 2ull << 20;

bool thp_enabled() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!in || !std::getline(in, line)) return false;
  return line.find("[never]") == std::string::npos;
}

std::string node_text(int node) { return node < 0 ? "none" : std::to_string(node); }

}  // namespace

const char* huge_page_kind_name(HugePageKind kind) noexcept {
  switch (kind) {
    case HugePageKind::kHugetlb:
      return "hugetlb";
    case HugePageKind::kTransparent:
      return "thp";
    case HugePageKind::kNone:
      break;
  }
  return "none";
}

Result<PinnedPoolOptions> PinnedPoolOptions::from_env() {
  PinnedPoolOptions o;
  STRATA_ASSIGN_OR_RETURN(o.budget_bytes, env_size("STRATA_PINNED_BUDGET", o.budget_bytes));
  if (env_string("STRATA_PINNED_NUMA_NODE")) {
    STRATA_ASSIGN_OR_RETURN(uint64_t node, env_uint("STRATA_PINNED_NUMA_NODE", 0));
    if (node > 4096) {
      return invalid_argument("STRATA_PINNED_NUMA_NODE=" + std::to_string(node) +
                              " is not a NUMA node number");
    }
    o.numa_node = static_cast<int>(node);
  }
  STRATA_ASSIGN_OR_RETURN(o.huge_pages, env_bool("STRATA_PINNED_HUGE_PAGES", o.huge_pages));
  STRATA_ASSIGN_OR_RETURN(o.require_mlock,
                          env_bool("STRATA_PINNED_REQUIRE_MLOCK", o.require_mlock));
  return o;
}

// ---------------------------------------------------------------------------------------
// PinnedBuffer

PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept
    : pool_(std::move(o.pool_)), data_(o.data_), size_(o.size_) {
  o.data_ = nullptr;
  o.size_ = 0;
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    pool_ = std::move(o.pool_);
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

PinnedBuffer::~PinnedBuffer() { reset(); }

void PinnedBuffer::reset() {
  if (data_ != nullptr && pool_) pool_->release(data_, size_);
  data_ = nullptr;
  size_ = 0;
  pool_.reset();  // may destroy the pool (last reference)
}

PinnedBuffer PinnedPool::make_buffer(std::shared_ptr<PinnedPool> pool, void* data,
                                     uint64_t nbytes) {
  PinnedBuffer b;
  b.pool_ = std::move(pool);
  b.data_ = data;
  b.size_ = nbytes;
  return b;
}

// ---------------------------------------------------------------------------------------
// The pool

namespace {

class PinnedPoolImpl final : public PinnedPool {
 public:
  PinnedPoolImpl() = default;
  ~PinnedPoolImpl() override { unmap(); }

  Status init(const PinnedPoolOptions& options, std::shared_ptr<IoEngine> engine);

  Result<PinnedBuffer> try_allocate(uint64_t nbytes) override {
    if (nbytes == 0) return PinnedBuffer();
    STRATA_RETURN_IF_ERROR(check_size(nbytes));
    const uint64_t n = align_up(nbytes, align_);
    uint64_t off = 0;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!take_locked(n, &off)) {
        return resource_exhausted("pinned pool: no free range of " + std::to_string(n) +
                                  " bytes (used " + std::to_string(used_) + " of " +
                                  std::to_string(budget_) + ", largest free " +
                                  std::to_string(largest_locked()) + ")");
      }
    }
    return make_buffer(shared_from_this(), base_ + off, nbytes);
  }

  Result<PinnedBuffer> allocate(uint64_t nbytes, std::chrono::milliseconds timeout) override {
    if (nbytes == 0) return PinnedBuffer();
    STRATA_RETURN_IF_ERROR(check_size(nbytes));
    const uint64_t n = align_up(nbytes, align_);
    uint64_t off = 0;
    {
      std::unique_lock<std::mutex> lk(mu_);
      if (!take_locked(n, &off)) {
        // Clamp so that now() + timeout cannot overflow.
        const auto limit = std::chrono::hours(24 * 365 * 100);
        const auto t = timeout > limit ? std::chrono::milliseconds(limit) : timeout;
        const auto deadline = std::chrono::steady_clock::now() + t;
        while (!take_locked(n, &off)) {
          if (cv_.wait_until(lk, deadline) == std::cv_status::timeout) {
            if (take_locked(n, &off)) break;
            return deadline_exceeded("pinned pool: " + std::to_string(n) +
                                     " bytes not free within " + std::to_string(timeout.count()) +
                                     " ms (used " + std::to_string(used_) + " of " +
                                     std::to_string(budget_) + ")");
          }
        }
      }
    }
    return make_buffer(shared_from_this(), base_ + off, nbytes);
  }

  uint64_t budget_bytes() const override { return budget_; }
  uint64_t used_bytes() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return used_;
  }
  uint64_t peak_used_bytes() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return peak_;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lk(mu_);
    peak_ = used_;
  }
  bool huge_pages() const override { return kind_ != HugePageKind::kNone; }
  int numa_node() const override { return numa_node_; }
  HugePageKind huge_page_kind() const override { return kind_; }
  uint64_t alignment() const override { return align_; }
  void* base() const override { return base_; }
  uint64_t mapped_bytes() const override { return map_len_; }
  bool locked() const override { return locked_; }
  bool cuda_registered() const override { return cuda_registered_; }
  bool engine_registered() const override { return engine_registered_; }
  uint64_t largest_free_bytes() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return largest_locked();
  }
  uint64_t free_ranges() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return by_offset_.size();
  }
  Result<uint64_t> resident_huge_page_bytes() const override;

 protected:
  void release(void* data, uint64_t nbytes) override {
    auto* p = static_cast<char*>(data);
    STRATA_CHECK_MSG(p >= base_ && p + nbytes <= base_ + budget_,
                     "pinned pool: released pointer is not from this pool");
    const uint64_t off = static_cast<uint64_t>(p - base_);
    const uint64_t n = align_up(nbytes, align_);
    {
      std::lock_guard<std::mutex> lk(mu_);
      insert_free_locked(off, n);
      used_ -= n;
    }
    cv_.notify_all();
  }

 private:
  static constexpr uint64_t kNone = ~0ull;

  Status check_size(uint64_t nbytes) const {
    if (nbytes > budget_ || align_up(nbytes, align_) > budget_) {
      return invalid_argument("pinned pool: request of " + std::to_string(nbytes) +
                              " bytes exceeds the budget of " + std::to_string(budget_) + " bytes");
    }
    return Status::OK();
  }

  // Best fit: the smallest free range of at least n bytes; the rest stays free. Tree nodes
  // are reused (extract/insert), so the common cases allocate no memory.
  bool take_locked(uint64_t n, uint64_t* off) {
    auto it = by_size_.lower_bound({n, 0});
    if (it == by_size_.end()) {
      *off = kNone;
      return false;
    }
    const uint64_t size = it->first;
    const uint64_t start = it->second;
    auto snode = by_size_.extract(it);
    auto onode = by_offset_.extract(start);
    if (size > n) {
      snode.value() = {size - n, start + n};
      by_size_.insert(std::move(snode));
      onode.key() = start + n;
      onode.mapped() = size - n;
      by_offset_.insert(std::move(onode));
    }
    used_ += n;
    peak_ = std::max(peak_, used_);
    *off = start;
    return true;
  }

  // Returns [off, off + n) to the free lists, merging it with free neighbours.
  void insert_free_locked(uint64_t off, uint64_t n) {
    auto next = by_offset_.lower_bound(off);
    STRATA_CHECK_MSG(next == by_offset_.end() || off + n <= next->first,
                     "pinned pool: double free or overlapping release");
    auto prev = by_offset_.end();
    if (next != by_offset_.begin()) {
      prev = std::prev(next);
      STRATA_CHECK_MSG(prev->first + prev->second <= off,
                       "pinned pool: double free or overlapping release");
    }
    const bool merge_prev = prev != by_offset_.end() && prev->first + prev->second == off;
    const bool merge_next = next != by_offset_.end() && off + n == next->first;
    if (merge_prev) {
      auto snode = by_size_.extract({prev->second, prev->first});
      uint64_t size = prev->second + n;
      if (merge_next) {
        size += next->second;
        by_size_.erase({next->second, next->first});
        by_offset_.erase(next);
      }
      prev->second = size;
      snode.value() = {size, prev->first};
      by_size_.insert(std::move(snode));
    } else if (merge_next) {
      auto onode = by_offset_.extract(next);
      auto snode = by_size_.extract({onode.mapped(), onode.key()});
      onode.key() = off;
      onode.mapped() += n;
      snode.value() = {onode.mapped(), off};
      by_offset_.insert(std::move(onode));
      by_size_.insert(std::move(snode));
    } else {
      by_offset_.emplace(off, n);
      by_size_.emplace(n, off);
    }
  }

  uint64_t largest_locked() const { return by_size_.empty() ? 0 : by_size_.rbegin()->first; }

  void unmap();

  char* base_ = nullptr;
  uint64_t map_len_ = 0;
  uint64_t budget_ = 0;
  uint64_t align_ = 4096;
  HugePageKind kind_ = HugePageKind::kNone;
  int numa_node_ = -1;
  bool locked_ = false;
  bool cuda_registered_ = false;
  bool engine_registered_ = false;
  std::shared_ptr<IoEngine> engine_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, uint64_t> by_offset_;           // offset -> size
  std::set<std::pair<uint64_t, uint64_t>> by_size_;  // (size, offset)
  uint64_t used_ = 0;
  uint64_t peak_ = 0;  // most of used_ since creation or reset_peak()
};

Status PinnedPoolImpl::init(const PinnedPoolOptions& options, std::shared_ptr<IoEngine> engine) {
  align_ = options.alignment;
  if (align_ == 0 || (align_ & (align_ - 1)) != 0) {
    return invalid_argument("pinned pool: alignment " + std::to_string(align_) +
                            " is not a power of two");
  }
  budget_ = align_down(options.budget_bytes, align_);
  if (budget_ == 0) {
    return invalid_argument("pinned pool: budget of " + std::to_string(options.budget_bytes) +
                            " bytes is smaller than the alignment " + std::to_string(align_));
  }
  std::shared_ptr<const Topology> topo;
  if (options.numa_node >= 0) {
    auto t = Topology::system();
    if (!t.ok()) {
      warn_once(
          "pinned-pool-topology",
          "pinned pool: cannot load the topology, memory is not bound: " + t.status().to_string());
    } else {
      topo = *t;
      if (topo->numa_node(options.numa_node) == nullptr) {
        return invalid_argument("pinned pool: NUMA node " + std::to_string(options.numa_node) +
                                " does not exist (this machine has " +
                                std::to_string(topo->numa_nodes().size()) + " nodes)");
      }
    }
  }

  // 1. Map.
  const uint64_t map_align = std::max(kHugePage, align_);
  map_len_ = align_up(budget_, kHugePage);
  if (options.huge_pages && map_align == kHugePage) {
    void* p = ::mmap(nullptr, map_len_, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | MAP_HUGE_2MB, -1, 0);
    if (p != MAP_FAILED) {
      base_ = static_cast<char*>(p);
      kind_ = HugePageKind::kHugetlb;
    }
  }
  if (base_ == nullptr) {
    // Over-map by the alignment, then trim head and tail so base_ is aligned.
    const uint64_t len = map_len_ + map_align;
    void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      map_len_ = 0;
      return resource_exhausted("pinned pool: mmap of " + std::to_string(len) + " bytes failed", e);
    }
    auto raw = reinterpret_cast<uintptr_t>(p);
    uintptr_t aligned = align_up(raw, map_align);
    if (aligned > raw) ::munmap(p, aligned - raw);
    uintptr_t end = aligned + map_len_;
    if (raw + len > end) ::munmap(reinterpret_cast<void*>(end), raw + len - end);
    base_ = reinterpret_cast<char*>(aligned);
    if (options.huge_pages && thp_enabled() && ::madvise(base_, map_len_, MADV_HUGEPAGE) == 0) {
      kind_ = HugePageKind::kTransparent;
    }
  }
  // Pinned, registered pages must not be shared copy-on-write with a forked child.
  (void)::madvise(base_, map_len_, MADV_DONTFORK);

  // 2. Bind before the first touch.
  if (topo) {
    if (Status st = topo->bind_memory_to_numa_node(base_, map_len_, options.numa_node); st.ok()) {
      numa_node_ = options.numa_node;
    } else {
      warn_once("pinned-pool-membind", "pinned pool: memory not bound to NUMA node " +
                                           std::to_string(options.numa_node) + ": " +
                                           st.to_string());
    }
  }

  // 3. Lock (faults the pages in).
  if (::mlock(base_, map_len_) == 0) {
    locked_ = true;
  } else {
    int e = errno;
    std::string what = "pinned pool: mlock of " + std::to_string(map_len_) +
                       " bytes refused (RLIMIT_MEMLOCK; raise `ulimit -l` or grant CAP_IPC_LOCK)";
    if (options.require_mlock) {
      unmap();
      return resource_exhausted(what, e);
    }
    warn_once("pinned-pool-mlock",
              what + ": " + std::strerror(e) + "; continuing with pre-faulted, unlocked pages");
    if (::madvise(base_, map_len_, MADV_POPULATE_WRITE) != 0) {
      const long page = ::sysconf(_SC_PAGESIZE);
      for (uint64_t o = 0; o < map_len_; o += static_cast<uint64_t>(page)) base_[o] = 0;
    }
  }

  // 4. CUDA.
  if (gpu_count() > 0) {
    if (Status st = host_register(base_, map_len_); st.ok()) {
      cuda_registered_ = true;
    } else {
      warn_once("pinned-pool-cuda", "pinned pool: cudaHostRegister failed: " + st.to_string());
    }
  }

  // 5. The I/O engine.
  if (engine) {
    if (Status st = engine->register_buffer(base_, map_len_); st.ok()) {
      engine_registered_ = true;
      engine_ = std::move(engine);
    } else {
      warn_once("pinned-pool-engine",
                "pinned pool: io engine buffer registration failed: " + st.to_string());
    }
  }

  by_offset_.emplace(0, budget_);
  by_size_.emplace(budget_, 0);

  if (log_level() >= LogLevel::kInfo) {
    log_info(
        "pinned pool: budget " + std::to_string(budget_) + " bytes (" + format_bytes(budget_) +
        "), huge pages " +
        (kind_ == HugePageKind::kNone ? std::string("no")
                                      : std::string("yes (") + huge_page_kind_name(kind_) + ")") +
        ", NUMA node " + node_text(numa_node_) + ", mlock " + (locked_ ? "yes" : "no") + ", cuda " +
        (cuda_registered_ ? "yes" : "no") + ", io_uring " + (engine_registered_ ? "yes" : "no"));
  }
  return Status::OK();
}

void PinnedPoolImpl::unmap() {
  if (base_ == nullptr) return;
  if (engine_registered_ && engine_) {
    if (Status st = engine_->unregister_buffer(base_); !st.ok()) {
      log_warn("pinned pool: io engine unregister failed: " + st.to_string());
    }
    engine_registered_ = false;
  }
  engine_.reset();
  if (cuda_registered_) {
    if (Status st = host_unregister(base_); !st.ok()) {
      log_warn("pinned pool: cudaHostUnregister failed: " + st.to_string());
    }
    cuda_registered_ = false;
  }
  if (locked_) {
    ::munlock(base_, map_len_);
    locked_ = false;
  }
  ::munmap(base_, map_len_);
  base_ = nullptr;
}

Result<uint64_t> PinnedPoolImpl::resident_huge_page_bytes() const {
  std::ifstream in("/proc/self/smaps");
  if (!in) return Status(StatusCode::kIoError, "cannot read /proc/self/smaps", errno);
  const auto start = reinterpret_cast<uintptr_t>(base_);
  const uintptr_t end = start + map_len_;
  std::string line;
  bool inside = false;
  uint64_t total_kib = 0;
  while (std::getline(in, line)) {
    unsigned long lo = 0, hi = 0;
    char dash = 0;
    // Mapping header: "7f...-7f... rw-p ..."; field lines start with a capital letter.
    if (std::sscanf(line.c_str(), "%lx%c%lx", &lo, &dash, &hi) == 3 && dash == '-') {
      inside = lo >= start && hi <= end;
      continue;
    }
    if (!inside) continue;
    uint64_t kib = 0;
    if (std::sscanf(line.c_str(), "AnonHugePages: %lu kB", &kib) == 1 ||
        std::sscanf(line.c_str(), "Private_Hugetlb: %lu kB", &kib) == 1 ||
        std::sscanf(line.c_str(), "Shared_Hugetlb: %lu kB", &kib) == 1) {
      total_kib += kib;
    }
  }
  return total_kib * 1024;
}

}  // namespace

Result<std::shared_ptr<PinnedPool>> PinnedPool::create(const PinnedPoolOptions& options,
                                                       std::shared_ptr<IoEngine> engine) {
  auto pool = std::make_shared<PinnedPoolImpl>();
  STRATA_RETURN_IF_ERROR(pool->init(options, std::move(engine)));
  return std::shared_ptr<PinnedPool>(std::move(pool));
}

}  // namespace strata
