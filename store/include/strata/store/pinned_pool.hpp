// strata::store — a budget of pinned host memory for I/O and host<->device copies, committed
// in segments as it is needed.
//
// The pool is a list of segments, each its own memory: an anonymous mmap (or a block from a
// caller's PinnedAllocator), backed by huge pages where possible (hugetlb, else transparent
// huge pages via madvise), bound to a NUMA node with hwloc, cudaHostRegister'ed when a GPU
// is present, registered with the io_uring engine. Creation commits `initial_bytes` (default:
// the whole budget, one segment); an allocation that finds no free range adds a segment of
// max(grow_bytes, the request rounded up to 2 MiB), capped by what is left of the budget,
// before it fails or waits. budget_bytes() is the cap on committed_bytes(); it never grows.
// A buffer always lies inside one segment (free ranges never coalesce across segments, so
// every buffer is inside one registered region and READ_FIXED/WRITE_FIXED apply to it).
// Segments stay until the pool is destroyed, except that when a request finds neither a
// free range nor enough uncommitted budget, segments with nothing allocated in them are
// released (newest first) to make room for a larger one: any request <= the budget can
// then be served once enough buffers are returned (docs/pinned-memory.md).
//
// A new segment, in order (docs/pinned-memory.md):
//  1. mmap its size rounded up to 2 MiB: MAP_HUGETLB (2 MiB pages) when huge_pages and
//     enough hugetlb pages are reserved (vm.nr_hugepages), else an anonymous mapping
//     aligned to 2 MiB with madvise(MADV_HUGEPAGE) (transparent huge pages) and
//     MADV_DONTFORK (a forked child never shares pinned, registered pages). With an
//     allocator: allocator.alloc(size, numa_node, ctx) instead, and steps 2-3 are skipped
//     (strata does not bind, lock or touch memory it does not own);
//  2. hwloc_set_area_membind to `numa_node` before any page is touched (best effort: a
//     refusal, e.g. mbind blocked by a container's seccomp profile, is one warning and
//     numa_node() then reports -1);
//  3. mlock (faults every page in, on the bound node). RLIMIT_MEMLOCK refusing it is an
//     error only with require_mlock; otherwise one warning, the pages are pre-faulted with
//     MADV_POPULATE_WRITE instead and the segment is not locked (io_uring and CUDA still pin
//     the pages they register);
//  4. cudaHostRegister when gpu_count() > 0 and the memory is not already registered
//     (allocator.cuda_registered) (a failure is one warning; cuda_registered());
//  5. IoEngine::register_buffer over the segment when an engine is given (a failure is one
//     warning; engine_registered()).
// Releasing a segment (at destruction) undoes all of it: engine unregister,
// cudaHostUnregister, munlock, munmap (or allocator.free).
// Buffers hold a reference to their pool, so the pool lives until the last buffer is gone.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/base/status.hpp"

namespace strata {

class IoEngine;

/// A caller's source of pinned host memory (a framework's caching host allocator), used for
/// each segment of a pool instead of mmap. Both functions or neither (InvalidArgument).
///  - alloc(nbytes, numa_node, ctx): nbytes (a multiple of 2 MiB) of memory aligned to at
///    least 4096 bytes (and to the pool's alignment), numa_node the node the pool wants
///    (-1: any); NULL when it cannot (the pool then fails with ResourceExhausted naming
///    itself and the size). Memory aligned to less is freed again and is InvalidArgument.
///  - free(p, nbytes, ctx): returns a block alloc gave, with the same nbytes; called when the
///    segment is released (at the latest when the pool is destroyed).
/// strata neither binds, locks nor touches the memory; it registers it with the I/O engine,
/// and with CUDA (cudaHostRegister) unless cuda_registered says it already is (memory from
/// cudaHostAlloc / cudaMallocHost). Both functions may be called from any thread that
/// allocates from or releases the pool's last buffer; never concurrently for one pool.
struct PinnedAllocator {
  void* (*alloc)(size_t nbytes, int numa_node, void* ctx) = nullptr;
  void (*free)(void* p, size_t nbytes, void* ctx) = nullptr;
  void* ctx = nullptr;             ///< passed to both, untouched
  bool cuda_registered = false;    ///< the memory is already page-locked for CUDA
  /// Set when alloc and free are set.
  bool enabled() const { return alloc != nullptr || free != nullptr; }
};

struct PinnedPoolOptions {
  /// The most bytes the pool commits (STRATA_PINNED_BUDGET); rounded down to `alignment`.
  uint64_t budget_bytes = 256ull << 20;
  /// Bytes committed at creation, rounded up to 2 MiB and capped by the budget; 0 = none
  /// until the first allocation. kWholeBudget (the default): the whole budget, one segment.
  uint64_t initial_bytes = kWholeBudget;
  /// Least bytes a growth commits (rounded up to 2 MiB; a larger request commits itself
  /// rounded up to 2 MiB); capped by what is left of the budget. Default 64 MiB; > 0.
  uint64_t grow_bytes = 64ull << 20;
  static constexpr uint64_t kWholeBudget = ~0ull;
  int numa_node = -1;                    ///< -1: no binding
  bool huge_pages = true;                ///< try hugetlb, then THP
  uint64_t alignment = 4096;             ///< minimum alignment of every buffer
  /// Fail with ResourceExhausted (errno kept) when mlock is refused (RLIMIT_MEMLOCK without
  /// CAP_IPC_LOCK). Default false: warn once and pre-fault instead. (STRATA_PINNED_REQUIRE_MLOCK)
  bool require_mlock = false;
  /// Where segments come from; default (disabled): mmap.
  PinnedAllocator allocator{};
  /// Names the pool in its log line and errors ("staging pool (node 0)"). Default "pinned pool".
  std::string name = "pinned pool";

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

/// One segment of a pool (PinnedPool::segments()).
struct PinnedSegment {
  void* base = nullptr;       ///< start: aligned to max(2 MiB, alignment) when mmap'ed
  uint64_t bytes = 0;         ///< bytes buffers may use (counted by committed_bytes())
  uint64_t mapped_bytes = 0;  ///< bytes mapped / allocated: `bytes` rounded up to 2 MiB
  HugePageKind huge_page_kind = HugePageKind::kNone;  ///< kNone for allocator memory
  bool from_allocator = false;     ///< PinnedAllocator memory
  bool locked = false;             ///< mlock succeeded
  bool cuda_registered = false;    ///< registered with CUDA (by strata or the allocator)
  bool engine_registered = false;  ///< IoEngine::register_buffer succeeded
};

/// Allocator: best-fit over a free list kept by address (adjacent free ranges of one
/// segment coalesce on release) and by size, O(log n) per allocate/release, under one
/// mutex; growth (mapping, locking and registering a segment) runs under it too. Every
/// request is rounded up to a multiple of the alignment; used_bytes() counts the rounded
/// sizes, so used_bytes() <= committed_bytes() <= budget_bytes() always.
/// \threadsafety all members are safe to call concurrently.
class PinnedPool : public std::enable_shared_from_this<PinnedPool> {
 public:
  /// Commits the initial segment (see the steps above; none when initial_bytes is 0) and
  /// logs at info level one line with the budget, the committed bytes, the huge-page kind,
  /// the NUMA node and what was registered. The budget is options.budget_bytes rounded down
  /// to a multiple of options.alignment.
  /// \param engine optional; kept alive by the pool while a segment is registered.
  /// \error InvalidArgument when the budget rounds to 0, grow_bytes is 0, the alignment is
  ///     not a power of two, numa_node names a node this machine lacks, the allocator has
  ///     only one of its functions or returns memory aligned to less than 4096 bytes (or the
  ///     alignment); ResourceExhausted when the mapping, the allocator (NULL) or (with
  ///     require_mlock) locking fails (errno kept).
  static Result<std::shared_ptr<PinnedPool>> create(const PinnedPoolOptions& options,
                                                    std::shared_ptr<IoEngine> engine = nullptr);
  virtual ~PinnedPool() = default;
  /// Non-blocking (but may commit a segment: see growth above).
  /// \error ResourceExhausted when no free range of nbytes exists now and the budget left
  ///     cannot hold a new segment for it, or when committing that segment fails (mmap, the
  ///     allocator, require_mlock); InvalidArgument when nbytes > budget, or when the
  ///     allocator's memory is misaligned.
  /// nbytes == 0 returns an empty buffer (no memory).
  virtual Result<PinnedBuffer> try_allocate(uint64_t nbytes) = 0;
  /// Blocks until nbytes are free (growing the pool first when the budget allows; never
  /// fails for want of memory unless nbytes > budget or the timeout expires:
  /// DeadlineExceeded). A failure to commit a segment is returned at once (as try_allocate).
  /// Waiters are woken on every release and retry (no FIFO fairness: a large request may
  /// wait while smaller ones are served).
  virtual Result<PinnedBuffer> allocate(uint64_t nbytes,
                                        std::chrono::milliseconds timeout = std::chrono::hours(24)) = 0;
  virtual uint64_t budget_bytes() const = 0;
  /// Bytes of the segments (usable by buffers) now: <= budget_bytes().
  virtual uint64_t committed_bytes() const = 0;
  /// The most committed_bytes() has been since creation (reset_peak() leaves it).
  virtual uint64_t peak_committed_bytes() const = 0;
  virtual uint64_t used_bytes() const = 0;
  /// The most used_bytes() has been since creation or the last reset_peak().
  virtual uint64_t peak_used_bytes() const = 0;
  /// Sets peak_used_bytes() to used_bytes() now.
  virtual void reset_peak() = 0;
  virtual bool huge_pages() const = 0;  ///< huge_page_kind() != kNone
  /// The node the memory is bound to; -1 when unbound or when binding a segment failed.
  virtual int numa_node() const = 0;

  // Where the memory came from and how it is pinned (what committing the segments achieved).
  /// The first segment's kind (the options' choice before any segment exists: kNone).
  virtual HugePageKind huge_page_kind() const = 0;
  virtual uint64_t alignment() const = 0;
  /// The segments now, oldest first: each is one range registered with CUDA and the engine.
  virtual std::vector<PinnedSegment> segments() const = 0;
  /// Sum of the segments' mapped_bytes.
  virtual uint64_t mapped_bytes() const = 0;
  /// True when at least one segment exists and every one satisfies it.
  virtual bool locked() const = 0;             ///< mlock succeeded
  virtual bool cuda_registered() const = 0;    ///< registered with CUDA
  virtual bool engine_registered() const = 0;  ///< IoEngine::register_buffer succeeded
  /// Size of the largest free range, and the number of free ranges (one per segment when
  /// nothing is allocated: free ranges coalesce within a segment).
  virtual uint64_t largest_free_bytes() const = 0;
  virtual uint64_t free_ranges() const = 0;
  /// Bytes of the segments resident on huge pages now, from /proc/self/smaps
  /// (AnonHugePages for THP, Private_Hugetlb for hugetlb). \error IoError reading smaps.
  virtual Result<uint64_t> resident_huge_page_bytes() const = 0;

 protected:
  friend class PinnedBuffer;
  virtual void release(void* data, uint64_t nbytes) = 0;
  static PinnedBuffer make_buffer(std::shared_ptr<PinnedPool> pool, void* data, uint64_t nbytes);
};

}  // namespace strata
