// The array pool: freed AlignedBuffer memory kept for the next array of the same size.
//
// Why: on this project's VMs (and any host where a page fault costs 10-20 us), filling a
// freshly mapped 100 MB array costs more than reading it from the disk: Store.get into new
// memory measured 0.26-0.45 GB/s against 2.4-2.9 GB/s for get_into into memory already
// touched (1 MiB chunks, 105 MB objects, 2026-12-06). glibc maps every allocation above its
// mmap threshold (at most 32 MiB) afresh, so a parameter fetched again after its eviction
// faulted in every page again. The pool keeps the pages of a buffer whose last reference is
// gone (no array, tensor or view can still see it), up to a byte capacity that the users
// of large repeated reads reserve (ParameterOffload: its working-set budget), and hands
// them to the next buffer of exactly that size. Memory handed out is not zeroed (nor is
// posix_memalign's): every user overwrites the whole buffer (Store.get reads all of it).
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <utility>

namespace strata::py_bindings {

/// Process-wide pool of freed 4096-byte-aligned blocks, keyed by their exact size.
/// Thread-safe (one mutex, held across fork() so a child gets it unlocked); take/give are
/// O(blocks held).
class ArrayPool {
 public:
  /// Blocks smaller than this are never pooled (glibc's heap reuses them already).
  static constexpr uint64_t kMinBytes = 64 * 1024;

  static ArrayPool& instance();

  /// A held block of exactly `bytes` (a multiple of 4096), most recently given first; nullptr
  /// when none (a miss, counted when bytes >= kMinBytes).
  void* take(uint64_t bytes);
  /// Keeps `p` (from posix_memalign, `bytes` long) when it fits the capacity, evicting the
  /// oldest held blocks first; otherwise frees it.
  void give(void* p, uint64_t bytes);
  /// Raises (delta > 0) or lowers the capacity by |delta| bytes; lowering frees the oldest
  /// held blocks down to it. The capacity never goes below 0.
  void reserve(int64_t delta);

  struct Stats {
    uint64_t capacity_bytes, held_bytes, held_blocks, hits, misses;
  };
  Stats stats();

 private:
  ArrayPool() = default;
  /// Moves the oldest held blocks to `out` until the held bytes fit the capacity; the
  /// caller frees them after releasing the lock (munmap of a large block takes ~ms).
  void evict_locked(std::list<std::pair<uint64_t, void*>>& out);
  std::mutex mu_;
  std::list<std::pair<uint64_t, void*>> held_;  // oldest first
  uint64_t capacity_ = 0, bytes_ = 0, hits_ = 0, misses_ = 0;
};

}  // namespace strata::py_bindings
