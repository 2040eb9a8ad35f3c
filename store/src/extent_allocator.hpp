// strata::store (private) — the NVMe tier's space: one free list of 4 KiB-aligned extents
// per NVMe directory's data file, and the byte budget of the tier.
//
// An Extent is reference-counted: it goes back to its allocator when the last reference
// (the catalog mirror, a version's layout, a reader's snapshot) drops, so space that the
// committed catalog names is never reused while anything still names it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "strata/base/status.hpp"
#include "strata/store/store.hpp"

namespace strata::store_detail {

class ExtentAllocator;

/// A range [offset, offset + len) of the data file of NVMe directory `dir` (offset and
/// len multiples of 4 KiB). Returned to `alloc` on destruction; with a null `alloc` (a
/// read-only open's view of another process's extents) it is never released anywhere.
struct Extent {
  std::shared_ptr<ExtentAllocator> alloc;
  uint32_t dir = 0;
  uint64_t offset = 0;
  uint64_t len = 0;
  ~Extent();
};

/// First-fit allocator over `ndirs` data files that grow at their end. Freed extents merge
/// with their free neighbours; a free range that reaches the end of a file shortens the
/// file's allocated end instead of entering the free list (so end() is where the file can
/// be trimmed).
///
/// Large extents are aligned: one of at least kAlignedExtentFactor x `align_bytes` starts
/// at a multiple of `align_bytes` (the I/O engine's block size), so each block-size piece
/// of a chunk's transfer starts on a block-size boundary of the file (and of the device,
/// where the file system's extents are aligned) instead of straddling two. Measured on the
/// development VM's virtio disk (docs/offload.md, "Aligned extents"): the same 1 MiB
/// O_DIRECT requests at queue depth 32 were served 20-60% slower at 4 KiB-aligned offsets
/// than at 1 MiB-aligned ones. The gap an aligned extent leaves before it stays free
/// (smaller extents fill it); it is less than `align_bytes`, so at most 1 /
/// kAlignedExtentFactor of the extent.
/// \threadsafety every member is safe to call concurrently (one internal mutex).
class ExtentAllocator : public std::enable_shared_from_this<ExtentAllocator> {
 public:
  /// \param ndirs number of data files (directories 0 .. ndirs - 1).
  /// \param budget_bytes most bytes allocated at once over all files; 0 = no limit.
  /// \param align_bytes alignment of large extents: a power of two, at least 4096 (4096:
  ///     only the 4 KiB alignment every extent has).
  ExtentAllocator(uint32_t ndirs, uint64_t budget_bytes, uint64_t align_bytes = 4096)
      : dirs_(ndirs), budget_(budget_bytes), align_(align_bytes) {}

  /// `len` bytes (a multiple of 4 KiB, > 0) in directory `dir`: the lowest-offset free
  /// range that is large enough (its head; the rest stays free), else the end of the file;
  /// when len >= kAlignedExtentFactor x align_bytes, the lowest-offset free range that
  /// holds `len` bytes from a multiple of align_bytes (the range's head before that
  /// multiple and its tail stay free), else the first multiple of align_bytes at or past
  /// the end of the file (the gap before it becomes a free range).
  /// \param key names the object in the error message.
  /// \error ResourceExhausted when used() + len would pass the budget.
  Result<std::shared_ptr<Extent>> allocate(uint32_t dir, uint64_t len, const std::string& key);

  /// Marks [off, off + len) of `dir` used while a catalog is loaded (before finish_load()).
  std::shared_ptr<Extent> adopt(uint32_t dir, uint64_t off, uint64_t len);

  /// Ends loading: the gaps between adopted extents become the free lists and each file's
  /// end is the end of its last adopted extent.
  /// \error DataLoss naming the directory and offset when two adopted extents overlap.
  Status finish_load();

  /// Frees [off, off + len) of `dir` (Extent's destructor calls it).
  void release(uint32_t dir, uint64_t off, uint64_t len);

  /// Bytes allocated (or adopted) and not released, over all directories / in `dir`.
  uint64_t used() const;
  uint64_t used(uint32_t dir) const;

  /// Calls `punch(offset, length)` for every free range of `dir` not handed to it since
  /// it last became free, except the lowest-offset ones that fit whole in `keep_bytes`
  /// together (the warm reserve: allocation is lowest-offset first, so those are reused
  /// next, at overwrite speed), then for the part of the file's tail [end(dir), file_end)
  /// that the rest of the reserve does not cover, holding the allocator's lock: no range
  /// is allocated while it is punched. `punch` returns false to stop (e.g. the file system
  /// cannot punch holes). Returns the file's allocated end afterwards: the start of the
  /// tail's punched part, else `file_end` (bytes; the caller keeps it as the file end,
  /// so a tail is punched once). `keep_bytes` and every range are multiples of 4096.
  uint64_t punch_free(uint32_t dir, uint64_t file_end, uint64_t keep_bytes,
                  const std::function<bool(uint64_t, uint64_t)>& punch);

  /// The alignment of large extents (the constructor's align_bytes).
  uint64_t align() const { return align_; }

  /// End of the allocated part of `dir`'s data file: no extent lies at or past it.
  uint64_t end(uint32_t dir) const;

  /// The free ranges of `dir` as (offset, length), by offset (for tests and diagnostics).
  std::vector<std::pair<uint64_t, uint64_t>> free_ranges(uint32_t dir) const;

 private:
  std::shared_ptr<Extent> make(uint32_t dir, uint64_t off, uint64_t len);
  struct Dir {
    std::map<uint64_t, uint64_t> free;  // offset -> length
    std::set<std::pair<uint64_t, uint64_t>> punched;  // free ranges given to punch_free
    uint64_t end = 0;
    uint64_t used = 0;
    std::vector<std::pair<uint64_t, uint64_t>> loaded;  // adopt() until finish_load()
  };
  mutable std::mutex mu_;
  std::vector<Dir> dirs_;
  uint64_t used_ = 0;
  uint64_t budget_;
  uint64_t align_;
};

}  // namespace strata::store_detail
