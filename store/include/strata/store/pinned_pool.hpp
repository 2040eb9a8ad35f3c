// strata::store — a fixed budget of pinned host memory for I/O and host<->device copies.
//
// One anonymous mmap of `budget_bytes`, backed by huge pages where possible (hugetlb, else
// transparent huge pages via madvise), bound to a NUMA node with hwloc, cudaHostRegister'ed
// when a GPU is present, registered with the io_uring engine. The budget is fixed at creation and reported; it never grows.
//
// Creation, in order (docs/pinned-memory.md):
//  1. mmap the budget rounded up to 2 MiB: MAP_HUGETLB (2 MiB pages) when huge_pages and
//     enough hugetlb pages are reserved (vm.nr_hugepages), else an anonymous mapping
//     aligned to 2 MiB with madvise(MADV_HUGEPAGE) (transparent huge pages) and
//     MADV_DONTFORK (a forked child never shares pinned, registered pages);
//  2. hwloc_set_area_membind to `numa_node` before any page is touched (best effort: a
//     refusal, e.g. mbind blocked by a container's seccomp profile, is one warning and
//     numa_node() then reports -1);
//  3. mlock (faults every page in, on the bound node). RLIMIT_MEMLOCK refusing it is an
//     error only with require_mlock; otherwise one warning, the pages are pre-faulted with
//     MADV_POPULATE_WRITE instead and locked() reports false (io_uring and CUDA still pin
//     the pages they register);
//  4. cudaHostRegister when gpu_count() > 0 (a failure is one warning; cuda_registered());
//  5. IoEngine::register_buffer over the whole mapping when an engine is given (a failure
//     is one warning; engine_registered()).
// Destruction undoes all of it: engine unregister, cudaHostUnregister, munlock, munmap.
// Buffers hold a reference to their pool, so the pool lives until the last buffer is gone.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include "strata/base/status.hpp"

namespace strata {

class IoEngine;

struct PinnedPoolOptions {
  uint64_t budget_bytes = 256ull << 20;  ///< total bytes (STRATA_PINNED_BUDGET)
  int numa_node = -1;                    ///< -1: no binding
  bool huge_pages = true;                ///< try hugetlb, then THP
  uint64_t alignment = 4096;             ///< minimum alignment of every buffer
  /// Fail with ResourceExhausted (errno kept) when mlock is refused (RLIMIT_MEMLOCK without
  /// CAP_IPC_LOCK). Default false: warn once and pre-fault instead. (STRATA_PINNED_REQUIRE_MLOCK)
  bool require_mlock = false;

  /// Defaults seeded from STRATA_PINNED_BUDGET (size, suffixes allowed),
  /// STRATA_PINNED_NUMA_NODE (node number; unset: -1), STRATA_PINNED_HUGE_PAGES (bool),
  /// STRATA_PINNED_REQUIRE_MLOCK (bool).
  /// \error InvalidArgument naming the variable on a malformed value.
  static Result<PinnedPoolOptions> from_env();
};

/// How the pool's memory is backed.
enum class HugePageKind {
  kNone,         ///< ordinary 4 KiB pages
  kHugetlb,      ///< MAP_HUGETLB, 2 MiB pages reserved through vm.nr_hugepages
  kTransparent,  ///< madvise(MADV_HUGEPAGE): the kernel backs it with 2 MiB pages it can get
};
/// "none" | "hugetlb" | "thp".
const char* huge_page_kind_name(HugePageKind kind) noexcept;

class PinnedPool;

/// A buffer from a PinnedPool; returned to the pool on destruction. Move-only.
/// data() is aligned to the pool's alignment and stays valid while the buffer lives; the
/// buffer keeps its pool alive. A default-constructed (or moved-from) buffer is empty:
/// data() == nullptr, size() == 0.
/// \threadsafety a buffer is owned by one thread at a time; buffers of one pool may be
///     created and destroyed concurrently.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(PinnedBuffer&&) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&&) noexcept;
  ~PinnedBuffer();
  void* data() const { return data_; }
  uint64_t size() const { return size_; }
  explicit operator bool() const { return data_ != nullptr; }
  /// The pool it came from (nullptr when empty).
  const std::shared_ptr<PinnedPool>& pool() const { return pool_; }
  /// Returns the memory to the pool now (as the destructor does); the buffer becomes empty.
  void reset();

 private:
  friend class PinnedPool;
  std::shared_ptr<PinnedPool> pool_;
  void* data_ = nullptr;
  uint64_t size_ = 0;
};

/// Allocator: best-fit over a free list kept by address (adjacent free ranges coalesce on
/// release) and by size, O(log n) per allocate/release, under one mutex. Every request is
/// rounded up to a multiple of the alignment; used_bytes() counts the rounded sizes, so
/// used_bytes() <= budget_bytes() always.
/// \threadsafety all members are safe to call concurrently.
class PinnedPool : public std::enable_shared_from_this<PinnedPool> {
 public:
  /// Maps, binds, locks and registers the pool (see the steps above) and logs at info level
  /// one line with the budget, the huge-page kind, the NUMA node and what was registered.
  /// The budget is options.budget_bytes rounded down to a multiple of options.alignment.
  /// \param engine optional; kept alive by the pool while its buffer is registered.
  /// \error InvalidArgument when the budget rounds to 0, the alignment is not a power of two
  ///     or numa_node names a node this machine lacks; ResourceExhausted when the mapping
  ///     or (with require_mlock) locking fails (errno kept).
  static Result<std::shared_ptr<PinnedPool>> create(const PinnedPoolOptions& options,
                                                    std::shared_ptr<IoEngine> engine = nullptr);
  virtual ~PinnedPool() = default;
  /// Non-blocking. \error ResourceExhausted when no free range of nbytes exists now;
  ///     InvalidArgument when nbytes > budget.
  /// nbytes == 0 returns an empty buffer (no memory).
  virtual Result<PinnedBuffer> try_allocate(uint64_t nbytes) = 0;
  /// Blocks until nbytes are free (never fails for want of memory unless nbytes > budget
  /// or the timeout expires: DeadlineExceeded).
  /// Waiters are woken on every release and retry (no FIFO fairness: a large request may
  /// wait while smaller ones are served).
  virtual Result<PinnedBuffer> allocate(uint64_t nbytes,
                                        std::chrono::milliseconds timeout = std::chrono::hours(24)) = 0;
  virtual uint64_t budget_bytes() const = 0;
  virtual uint64_t used_bytes() const = 0;
  /// The most used_bytes() has been since creation or the last reset_peak().
  virtual uint64_t peak_used_bytes() const = 0;
  /// Sets peak_used_bytes() to used_bytes() now.
  virtual void reset_peak() = 0;
  virtual bool huge_pages() const = 0;  ///< backed by hugetlb or THP
  virtual int numa_node() const = 0;

  // Where the memory came from and how it is pinned (what creation achieved).
  virtual HugePageKind huge_page_kind() const = 0;
  virtual uint64_t alignment() const = 0;
  /// Start and length of the whole mapping (budget rounded up to 2 MiB); this is the range
  /// registered with CUDA and the engine.
  virtual void* base() const = 0;
  virtual uint64_t mapped_bytes() const = 0;
  virtual bool locked() const = 0;             ///< mlock succeeded
  virtual bool cuda_registered() const = 0;    ///< cudaHostRegister succeeded
  virtual bool engine_registered() const = 0;  ///< IoEngine::register_buffer succeeded
  /// Size of the largest free range, and the number of free ranges (1 when nothing is
  /// allocated: free ranges always coalesce).
  virtual uint64_t largest_free_bytes() const = 0;
  virtual uint64_t free_ranges() const = 0;
  /// Bytes of the mapping resident on huge pages now, from /proc/self/smaps
  /// (AnonHugePages for THP, Private_Hugetlb for hugetlb). \error IoError reading smaps.
  virtual Result<uint64_t> resident_huge_page_bytes() const = 0;

 protected:
  friend class PinnedBuffer;
  virtual void release(void* data, uint64_t nbytes) = 0;
  static PinnedBuffer make_buffer(std::shared_ptr<PinnedPool> pool, void* data, uint64_t nbytes);
};

}  // namespace strata
