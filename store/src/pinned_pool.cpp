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

struct Segment {
  PinnedSegment info;
  uint64_t id = 0;  // creation order
};

// A free range: its segment, so that ranges of two segments never merge even when the
// mappings happen to be adjacent.
struct FreeRange {
  uint64_t size = 0;
  uint64_t seg = 0;
};

class PinnedPoolImpl final : public PinnedPool {
 public:
  PinnedPoolImpl() = default;
  ~PinnedPoolImpl() override {
    for (auto& [addr, seg] : segs_) release_segment(seg);
    segs_.clear();
  }

  Status init(const PinnedPoolOptions& options, std::shared_ptr<IoEngine> engine);

  Result<PinnedBuffer> try_allocate(uint64_t nbytes) override {
    if (nbytes == 0) return PinnedBuffer();
    STRATA_RETURN_IF_ERROR(check_size(nbytes));
    const uint64_t n = align_up(nbytes, align_);
    uintptr_t addr = 0;
    {
      std::lock_guard<std::mutex> lk(mu_);
      STRATA_ASSIGN_OR_RETURN(const bool got, take_or_grow_locked(n, &addr));
      if (!got) {
        return resource_exhausted(name_ + ": no free range of " + std::to_string(n) +
                                  " bytes (used " + std::to_string(used_) + " of " +
                                  std::to_string(committed_) + " committed, budget " +
                                  std::to_string(budget_) + ", largest free " +
                                  std::to_string(largest_locked()) + ")");
      }
    }
    return make_buffer(shared_from_this(), reinterpret_cast<void*>(addr), nbytes);
  }

  Result<PinnedBuffer> allocate(uint64_t nbytes, std::chrono::milliseconds timeout) override {
    if (nbytes == 0) return PinnedBuffer();
    STRATA_RETURN_IF_ERROR(check_size(nbytes));
    const uint64_t n = align_up(nbytes, align_);
    uintptr_t addr = 0;
    {
      std::unique_lock<std::mutex> lk(mu_);
      STRATA_ASSIGN_OR_RETURN(bool got, take_or_grow_locked(n, &addr));
      if (!got) {
        // Clamp so that now() + timeout cannot overflow.
        const auto limit = std::chrono::hours(24 * 365 * 100);
        const auto t = timeout > limit ? std::chrono::milliseconds(limit) : timeout;
        const auto deadline = std::chrono::steady_clock::now() + t;
        for (;;) {
          const bool timed_out = cv_.wait_until(lk, deadline) == std::cv_status::timeout;
          STRATA_ASSIGN_OR_RETURN(got, take_or_grow_locked(n, &addr));
          if (got) break;
          if (timed_out) {
            return deadline_exceeded(name_ + ": " + std::to_string(n) +
                                     " bytes not free within " + std::to_string(timeout.count()) +
                                     " ms (used " + std::to_string(used_) + " of " +
                                     std::to_string(committed_) + " committed, budget " +
                                     std::to_string(budget_) + ")");
          }
        }
      }
    }
    return make_buffer(shared_from_this(), reinterpret_cast<void*>(addr), nbytes);
  }

  uint64_t budget_bytes() const override { return budget_; }
  uint64_t committed_bytes() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return committed_;
  }
  uint64_t peak_committed_bytes() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return peak_committed_;
  }
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
  bool huge_pages() const override { return huge_page_kind() != HugePageKind::kNone; }
  int numa_node() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return numa_node_;
  }
  HugePageKind huge_page_kind() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return kind_;
  }
  uint64_t alignment() const override { return align_; }
  std::vector<PinnedSegment> segments() const override {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<std::pair<uint64_t, PinnedSegment>> v;
    for (const auto& [a, seg] : segs_) v.emplace_back(seg.id, seg.info);
    std::sort(v.begin(), v.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    std::vector<PinnedSegment> out;
    for (auto& [id, info] : v) out.push_back(info);
    return out;
  }
  uint64_t mapped_bytes() const override {
    std::lock_guard<std::mutex> lk(mu_);
    uint64_t n = 0;
    for (const auto& [a, seg] : segs_) n += seg.info.mapped_bytes;
    return n;
  }
  bool locked() const override {
    return all_segments([](const PinnedSegment& s) { return s.locked; });
  }
  bool cuda_registered() const override {
    return all_segments([](const PinnedSegment& s) { return s.cuda_registered; });
  }
  bool engine_registered() const override {
    return all_segments([](const PinnedSegment& s) { return s.engine_registered; });
  }
  uint64_t largest_free_bytes() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return largest_locked();
  }
  uint64_t free_ranges() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return by_addr_.size();
  }
  Result<uint64_t> resident_huge_page_bytes() const override;

 protected:
  void release(void* data, uint64_t nbytes) override {
    const auto p = reinterpret_cast<uintptr_t>(data);
    const uint64_t n = align_up(nbytes, align_);
    {
      std::lock_guard<std::mutex> lk(mu_);
      const Segment* seg = segment_of_locked(p);
      STRATA_CHECK_MSG(seg != nullptr && p + n <= base_of(*seg) + seg->info.bytes,
                       "pinned pool: released pointer is not from this pool");
      insert_free_locked(p, n, seg->id);
      used_ -= n;
    }
    cv_.notify_all();
  }

 private:
  static uintptr_t base_of(const Segment& s) { return reinterpret_cast<uintptr_t>(s.info.base); }

  template <typename F>
  bool all_segments(F f) const {
    std::lock_guard<std::mutex> lk(mu_);
    if (segs_.empty()) return false;
    for (const auto& [a, seg] : segs_) {
      if (!f(seg.info)) return false;
    }
    return true;
  }

  Status check_size(uint64_t nbytes) const {
    if (nbytes > budget_ || align_up(nbytes, align_) > budget_) {
      return invalid_argument(name_ + ": request of " + std::to_string(nbytes) +
                              " bytes exceeds the budget of " + std::to_string(budget_) + " bytes");
    }
    return Status::OK();
  }

  const Segment* segment_of_locked(uintptr_t p) const {
    auto it = segs_.upper_bound(p);
    if (it == segs_.begin()) return nullptr;
    --it;
    if (p >= base_of(it->second) + it->second.info.bytes) return nullptr;
    return &it->second;
  }

  // Serves n bytes from a free range, else commits a segment for them when the budget
  // allows (releasing idle segments first when only that makes room). false: neither is
  // possible now. An error: committing a segment failed.
  Result<bool> take_or_grow_locked(uint64_t n, uintptr_t* addr) {
    if (take_locked(n, addr)) return true;
    const uint64_t want = std::max(grow_, align_up(n, kHugePage));
    if (budget_ - committed_ < n) release_idle_segments_locked(n);
    const uint64_t left = budget_ - committed_;
    if (left < n) return false;
    STRATA_RETURN_IF_ERROR(add_segment_locked(std::min(want, left)));
    STRATA_CHECK_MSG(take_locked(n, addr), "pinned pool: a new segment cannot serve its request");
    return true;
  }

  // Releases segments with nothing allocated, newest first, until the budget left holds n.
  void release_idle_segments_locked(uint64_t n) {
    std::vector<uintptr_t> idle;  // segment bases, newest first
    uint64_t idle_bytes = 0;
    {
      std::vector<std::pair<uint64_t, uintptr_t>> v;
      for (const auto& [a, seg] : segs_) {
        auto f = by_addr_.find(a);
        if (f != by_addr_.end() && f->second.size == seg.info.bytes) {
          v.emplace_back(seg.id, a);
          idle_bytes += seg.info.bytes;
        }
      }
      std::sort(v.rbegin(), v.rend());
      for (auto& [id, a] : v) idle.push_back(a);
    }
    if (budget_ - committed_ + idle_bytes < n) return;  // releasing them would not help
    for (uintptr_t a : idle) {
      if (budget_ - committed_ >= n) break;
      auto it = segs_.find(a);
      by_size_.erase({it->second.info.bytes, a});
      by_addr_.erase(a);
      committed_ -= it->second.info.bytes;
      release_segment(it->second);
      segs_.erase(it);
      ++segments_released_;
    }
  }

  // Best fit: the smallest free range of at least n bytes; the rest stays free. Tree nodes
  // are reused (extract/insert), so the common cases allocate no memory.
  bool take_locked(uint64_t n, uintptr_t* addr) {
    auto it = by_size_.lower_bound({n, 0});
    if (it == by_size_.end()) return false;
    const uint64_t size = it->first;
    const uintptr_t start = it->second;
    auto snode = by_size_.extract(it);
    auto anode = by_addr_.extract(start);
    if (size > n) {
      snode.value() = {size - n, start + n};
      by_size_.insert(std::move(snode));
      anode.key() = start + n;
      anode.mapped().size = size - n;
      by_addr_.insert(std::move(anode));
    }
    used_ += n;
    peak_ = std::max(peak_, used_);
    *addr = start;
    return true;
  }

  // Returns [p, p + n) of segment `seg` to the free lists, merging it with free neighbours
  // of the same segment.
  void insert_free_locked(uintptr_t p, uint64_t n, uint64_t seg) {
    auto next = by_addr_.lower_bound(p);
    STRATA_CHECK_MSG(next == by_addr_.end() || p + n <= next->first,
                     "pinned pool: double free or overlapping release");
    auto prev = by_addr_.end();
    if (next != by_addr_.begin()) {
      prev = std::prev(next);
      STRATA_CHECK_MSG(prev->first + prev->second.size <= p,
                       "pinned pool: double free or overlapping release");
    }
    const bool merge_prev = prev != by_addr_.end() && prev->second.seg == seg &&
                            prev->first + prev->second.size == p;
    const bool merge_next = next != by_addr_.end() && next->second.seg == seg && p + n == next->first;
    if (merge_prev) {
      auto snode = by_size_.extract({prev->second.size, prev->first});
      uint64_t size = prev->second.size + n;
      if (merge_next) {
        size += next->second.size;
        by_size_.erase({next->second.size, next->first});
        by_addr_.erase(next);
      }
      prev->second.size = size;
      snode.value() = {size, prev->first};
      by_size_.insert(std::move(snode));
    } else if (merge_next) {
      auto anode = by_addr_.extract(next);
      auto snode = by_size_.extract({anode.mapped().size, anode.key()});
      anode.key() = p;
      anode.mapped().size += n;
      snode.value() = {anode.mapped().size, p};
      by_addr_.insert(std::move(anode));
      by_size_.insert(std::move(snode));
    } else {
      by_addr_.emplace(p, FreeRange{n, seg});
      by_size_.emplace(n, p);
    }
  }

  uint64_t largest_locked() const { return by_size_.empty() ? 0 : by_size_.rbegin()->first; }

  Status add_segment_locked(uint64_t bytes);
  void release_segment(Segment& seg);

  std::string name_ = "pinned pool";
  uint64_t budget_ = 0;
  uint64_t grow_ = 0;
  uint64_t align_ = 4096;
  bool want_huge_ = true;
  bool require_mlock_ = false;
  int want_node_ = -1;
  PinnedAllocator allocator_{};
  std::shared_ptr<const Topology> topo_;
  std::shared_ptr<IoEngine> engine_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  HugePageKind kind_ = HugePageKind::kNone;  // the first segment's
  int numa_node_ = -1;
  std::map<uintptr_t, Segment> segs_;                  // base -> segment
  uint64_t next_id_ = 0;
  uint64_t segments_released_ = 0;
  std::map<uintptr_t, FreeRange> by_addr_;             // address -> range
  std::set<std::pair<uint64_t, uintptr_t>> by_size_;   // (size, address)
  uint64_t committed_ = 0;
  uint64_t peak_committed_ = 0;
  uint64_t used_ = 0;
  uint64_t peak_ = 0;  // most of used_ since creation or reset_peak()
  std::set<uintptr_t> cuda_registered_by_us_;  // segment bases strata cudaHostRegister'ed
};

Status PinnedPoolImpl::init(const PinnedPoolOptions& options, std::shared_ptr<IoEngine> engine) {
  name_ = options.name.empty() ? std::string("pinned pool") : options.name;
  align_ = options.alignment;
  if (align_ == 0 || (align_ & (align_ - 1)) != 0) {
    return invalid_argument(name_ + ": alignment " + std::to_string(align_) +
                            " is not a power of two");
  }
  budget_ = align_down(options.budget_bytes, align_);
  if (budget_ == 0) {
    return invalid_argument(name_ + ": budget of " + std::to_string(options.budget_bytes) +
                            " bytes is smaller than the alignment " + std::to_string(align_));
  }
  if (options.grow_bytes == 0) {
    return invalid_argument(name_ + ": grow_bytes is 0 (the least bytes a growth commits; "
                            "use initial_bytes = kWholeBudget for a pool that never grows)");
  }
  // A multiple of the alignment too, so every segment's bytes are.
  grow_ = align_up(align_up(std::min(options.grow_bytes, budget_), kHugePage), align_);
  if ((options.allocator.alloc == nullptr) != (options.allocator.free == nullptr)) {
    return invalid_argument(name_ + ": the pinned-memory allocator needs both alloc and free (" +
                            std::string(options.allocator.alloc ? "free" : "alloc") + " is null)");
  }
  allocator_ = options.allocator;
  want_huge_ = options.huge_pages;
  require_mlock_ = options.require_mlock;
  if (options.numa_node >= 0) {
    auto t = Topology::system();
    if (!t.ok()) {
      warn_once(
          "pinned-pool-topology",
          "pinned pool: cannot load the topology, memory is not bound: " + t.status().to_string());
    } else {
      topo_ = *t;
      if (topo_->numa_node(options.numa_node) == nullptr) {
        return invalid_argument(name_ + ": NUMA node " + std::to_string(options.numa_node) +
                                " does not exist (this machine has " +
                                std::to_string(topo_->numa_nodes().size()) + " nodes)");
      }
      want_node_ = options.numa_node;
      numa_node_ = options.numa_node;
    }
  }
  // numa_node_ drops to -1 when a segment's binding fails; the allocator's memory is not
  // bound by strata (the allocator is told the node).
  if (allocator_.enabled()) numa_node_ = -1;
  engine_ = std::move(engine);

  const uint64_t initial = options.initial_bytes == PinnedPoolOptions::kWholeBudget
                               ? budget_
                               : std::min(budget_, align_up(align_up(options.initial_bytes,
                                                                     kHugePage), align_));
  if (initial > 0) {
    std::lock_guard<std::mutex> lk(mu_);
    STRATA_RETURN_IF_ERROR(add_segment_locked(initial));
  }

  if (log_level() >= LogLevel::kInfo) {
    const auto segs = segments();
    const PinnedSegment s0 = segs.empty() ? PinnedSegment{} : segs.front();
    log_info(
        name_ + ": budget " + std::to_string(budget_) + " bytes (" + format_bytes(budget_) +
        "), committed " + std::to_string(committed_bytes()) + " (grows by " +
        format_bytes(grow_) + "), " +
        (allocator_.enabled() ? std::string("memory from the caller's allocator")
         : "huge pages " + (kind_ == HugePageKind::kNone
                                ? std::string("no")
                                : std::string("yes (") + huge_page_kind_name(kind_) + ")")) +
        ", NUMA node " + node_text(numa_node()) + ", mlock " + (s0.locked ? "yes" : "no") +
        ", cuda " + (s0.cuda_registered ? "yes" : "no") + ", io_uring " +
        (s0.engine_registered ? "yes" : "no"));
  }
  return Status::OK();
}

Status PinnedPoolImpl::add_segment_locked(uint64_t bytes) {
  Segment seg;
  seg.id = next_id_;
  PinnedSegment& in = seg.info;
  in.bytes = bytes;
  in.mapped_bytes = align_up(bytes, kHugePage);
  const uint64_t map_align = std::max(kHugePage, align_);
  char* base = nullptr;

  if (allocator_.enabled()) {
    // 1'. The caller's memory.
    void* p = allocator_.alloc(in.mapped_bytes, want_node_, allocator_.ctx);
    if (p == nullptr) {
      return resource_exhausted(name_ + ": the pinned-memory allocator returned NULL for " +
                                std::to_string(in.mapped_bytes) + " bytes (" +
                                format_bytes(in.mapped_bytes) + ")");
    }
    const uint64_t need = std::max<uint64_t>(4096, align_);
    if (reinterpret_cast<uintptr_t>(p) % need != 0) {
      allocator_.free(p, in.mapped_bytes, allocator_.ctx);
      return invalid_argument(name_ + ": the pinned-memory allocator returned " +
                              std::to_string(reinterpret_cast<uintptr_t>(p)) + " for " +
                              std::to_string(in.mapped_bytes) + " bytes, not aligned to " +
                              std::to_string(need) + " bytes");
    }
    base = static_cast<char*>(p);
    in.from_allocator = true;
    in.cuda_registered = allocator_.cuda_registered;
  } else {
    // 1. Map.
    if (want_huge_ && map_align == kHugePage) {
      void* p = ::mmap(nullptr, in.mapped_bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | MAP_HUGE_2MB, -1, 0);
      if (p != MAP_FAILED) {
        base = static_cast<char*>(p);
        in.huge_page_kind = HugePageKind::kHugetlb;
      }
    }
    if (base == nullptr) {
      // Over-map by the alignment, then trim head and tail so base is aligned.
      const uint64_t len = in.mapped_bytes + map_align;
      void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) {
        int e = errno;
        return resource_exhausted(name_ + ": mmap of " + std::to_string(len) + " bytes failed", e);
      }
      auto raw = reinterpret_cast<uintptr_t>(p);
      uintptr_t aligned = align_up(raw, map_align);
      if (aligned > raw) ::munmap(p, aligned - raw);
      uintptr_t end = aligned + in.mapped_bytes;
      if (raw + len > end) ::munmap(reinterpret_cast<void*>(end), raw + len - end);
      base = reinterpret_cast<char*>(aligned);
      if (want_huge_ && thp_enabled() && ::madvise(base, in.mapped_bytes, MADV_HUGEPAGE) == 0) {
        in.huge_page_kind = HugePageKind::kTransparent;
      }
    }
    // Pinned, registered pages must not be shared copy-on-write with a forked child.
    (void)::madvise(base, in.mapped_bytes, MADV_DONTFORK);

    // 2. Bind before the first touch.
    if (topo_ && want_node_ >= 0) {
      if (Status st = topo_->bind_memory_to_numa_node(base, in.mapped_bytes, want_node_);
          !st.ok()) {
        numa_node_ = -1;
        warn_once("pinned-pool-membind", "pinned pool: memory not bound to NUMA node " +
                                             std::to_string(want_node_) + ": " + st.to_string());
      }
    }

    // 3. Lock (faults the pages in).
    if (::mlock(base, in.mapped_bytes) == 0) {
      in.locked = true;
    } else {
      int e = errno;
      std::string what = name_ + ": mlock of " + std::to_string(in.mapped_bytes) +
                         " bytes refused (RLIMIT_MEMLOCK; raise `ulimit -l` or grant CAP_IPC_LOCK)";
      if (require_mlock_) {
        ::munmap(base, in.mapped_bytes);
        return resource_exhausted(what, e);
      }
      warn_once("pinned-pool-mlock",
                what + ": " + std::strerror(e) + "; continuing with pre-faulted, unlocked pages");
      if (::madvise(base, in.mapped_bytes, MADV_POPULATE_WRITE) != 0) {
        const long page = ::sysconf(_SC_PAGESIZE);
        for (uint64_t o = 0; o < in.mapped_bytes; o += static_cast<uint64_t>(page)) base[o] = 0;
      }
    }
  }
  in.base = base;

  // 4. CUDA.
  if (!in.cuda_registered && gpu_count() > 0) {
    if (Status st = host_register(base, in.mapped_bytes); st.ok()) {
      in.cuda_registered = true;
      cuda_registered_by_us_.insert(reinterpret_cast<uintptr_t>(base));
    } else {
      warn_once("pinned-pool-cuda", "pinned pool: cudaHostRegister failed: " + st.to_string());
    }
  }

  // 5. The I/O engine.
  if (engine_) {
    if (Status st = engine_->register_buffer(base, in.mapped_bytes); st.ok()) {
      in.engine_registered = true;
    } else {
      warn_once("pinned-pool-engine",
                "pinned pool: io engine buffer registration failed: " + st.to_string());
    }
  }

  if (segs_.empty() && next_id_ == 0) kind_ = in.huge_page_kind;
  ++next_id_;
  const auto a = reinterpret_cast<uintptr_t>(base);
  by_addr_.emplace(a, FreeRange{in.bytes, seg.id});
  by_size_.emplace(in.bytes, a);
  committed_ += in.bytes;
  peak_committed_ = std::max(peak_committed_, committed_);
  segs_.emplace(a, std::move(seg));
  return Status::OK();
}

void PinnedPoolImpl::release_segment(Segment& seg) {
  PinnedSegment& in = seg.info;
  if (in.base == nullptr) return;
  if (in.engine_registered && engine_) {
    if (Status st = engine_->unregister_buffer(in.base); !st.ok()) {
      log_warn("pinned pool: io engine unregister failed: " + st.to_string());
    }
    in.engine_registered = false;
  }
  if (cuda_registered_by_us_.erase(reinterpret_cast<uintptr_t>(in.base)) > 0) {
    if (Status st = host_unregister(in.base); !st.ok()) {
      log_warn("pinned pool: cudaHostUnregister failed: " + st.to_string());
    }
  }
  in.cuda_registered = false;
  if (in.from_allocator) {
    allocator_.free(in.base, in.mapped_bytes, allocator_.ctx);
  } else {
    if (in.locked) ::munlock(in.base, in.mapped_bytes);
    ::munmap(in.base, in.mapped_bytes);
  }
  in.locked = false;
  in.base = nullptr;
}

Result<uint64_t> PinnedPoolImpl::resident_huge_page_bytes() const {
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  for (const PinnedSegment& s : segments()) {
    if (s.from_allocator) continue;
    const auto b = reinterpret_cast<uintptr_t>(s.base);
    ranges.emplace_back(b, b + s.mapped_bytes);
  }
  std::ifstream in("/proc/self/smaps");
  if (!in) return Status(StatusCode::kIoError, "cannot read /proc/self/smaps", errno);
  std::string line;
  bool inside = false;
  uint64_t total_kib = 0;
  while (std::getline(in, line)) {
    unsigned long lo = 0, hi = 0;
    char dash = 0;
    // Mapping header: "7f...-7f... rw-p ..."; field lines start with a capital letter.
    if (std::sscanf(line.c_str(), "%lx%c%lx", &lo, &dash, &hi) == 3 && dash == '-') {
      inside = false;
      for (const auto& [start, end] : ranges) {
        if (lo >= start && hi <= end) inside = true;
      }
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
