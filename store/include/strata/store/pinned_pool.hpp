// strata::store — a fixed budget of pinned host memory for I/O and host<->device copies.
//
// CONTRACT (keep these signatures): one anonymous mmap of `budget_bytes`, backed by huge
// pages where possible (hugetlb, else transparent huge pages via madvise), bound to a NUMA
// node with hwloc, cudaHostRegister'ed when a GPU is present, registered with the io_uring
// engine. The budget is fixed at creation and reported; it never grows.
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
};

class PinnedPool;

/// A buffer from a PinnedPool; returned to the pool on destruction. Move-only.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(PinnedBuffer&&) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&&) noexcept;
  ~PinnedBuffer();
  void* data() const { return data_; }
  uint64_t size() const { return size_; }
  explicit operator bool() const { return data_ != nullptr; }

 private:
  friend class PinnedPool;
  std::shared_ptr<PinnedPool> pool_;
  void* data_ = nullptr;
  uint64_t size_ = 0;
};

class PinnedPool : public std::enable_shared_from_this<PinnedPool> {
 public:
  /// \error ResourceExhausted when the mapping or locking fails (errno kept).
  static Result<std::shared_ptr<PinnedPool>> create(const PinnedPoolOptions& options,
                                                    std::shared_ptr<IoEngine> engine = nullptr);
  virtual ~PinnedPool() = default;
  /// Non-blocking. \error ResourceExhausted when no free range of nbytes exists now;
  ///     InvalidArgument when nbytes > budget.
  virtual Result<PinnedBuffer> try_allocate(uint64_t nbytes) = 0;
  /// Blocks until nbytes are free (never fails for want of memory unless nbytes > budget
  /// or the timeout expires: DeadlineExceeded).
  virtual Result<PinnedBuffer> allocate(uint64_t nbytes,
                                        std::chrono::milliseconds timeout = std::chrono::hours(24)) = 0;
  virtual uint64_t budget_bytes() const = 0;
  virtual uint64_t used_bytes() const = 0;
  virtual bool huge_pages() const = 0;  ///< backed by hugetlb or THP
  virtual int numa_node() const = 0;

 protected:
  friend class PinnedBuffer;
  virtual void release(void* data, uint64_t nbytes) = 0;
  static PinnedBuffer make_buffer(std::shared_ptr<PinnedPool> pool, void* data, uint64_t nbytes);
};

}  // namespace strata
