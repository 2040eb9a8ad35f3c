// The offloaded optimizer's disk space (see offload.hpp, DISK SPACE): what the state needs
// on the store's NVMe directories with the copy-on-write headroom of a step, checked
// against each file system's free space at create() and add_param().
#include <algorithm>
#include <cerrno>
#include <map>
#include <string>

#include "offload_impl.hpp"
#include "strata/base/units.hpp"

namespace strata::optimizer {

using namespace offload_detail;

namespace {

/// Catalog growth (rows, write-ahead log) and rounding: a fixed allowance.
constexpr uint64_t kSpaceMargin = 1ull << 20;

/// Upper bound of the bytes one object of `nbytes` takes in any one of `k` directories:
/// its chunks (each rounded to 4 KiB) are striped over the directories.
uint64_t per_dir_bytes(uint64_t nbytes, uint64_t chunk, uint64_t k) {
  if (nbytes == 0) return 0;
  if (k <= 1) return nbytes / chunk * chunk + align_up(nbytes % chunk, kAlign);
  const uint64_t nchunks = (nbytes + chunk - 1) / chunk;
  return (nchunks + k - 1) / k * chunk;
}

/// Upper bound of the free gaps the store's extent placement may leave in one directory
/// next to one object's extents (NvmeDirSpace::extent_align_bytes = `align`): an extent of
/// at least 16 x align that would start off a multiple of align starts on the next one,
/// after a gap of less than align, and that happens only after an extent that ends off a
/// multiple of align. Of one object's extents, only its last chunk (the tail) can end so
/// when `chunk` is a multiple of align; any of them otherwise.
uint64_t per_dir_align_gaps(uint64_t nbytes, uint64_t chunk, uint64_t k, uint64_t align) {
  if (nbytes == 0 || align <= kAlign) return 0;
  const uint64_t nchunks = (nbytes + chunk - 1) / chunk;
  const uint64_t ends = chunk % align == 0 ? 1 : (nchunks + k - 1) / k;
  return ends * align;
}

}  // namespace

Result<DiskSpaceNeed> OffloadedOptimizer::Impl::disk_space_need(
    const std::vector<uint64_t>& more_numels) const {
  STRATA_ASSIGN_OR_RETURN(auto dirs, store->nvme_space());
  const uint64_t k = std::max<size_t>(dirs.size(), 1);
  const uint64_t ns = static_cast<uint64_t>(num_states);
  const uint64_t es = elem_bytes(1);  // bytes per state element: 4, or 2 (bf16 states)
  const uint64_t schunk = state_chunk_bytes();
  // The master (fp32) and the num_states state objects (es bytes per element).
  auto tensor_bytes = [&](uint64_t numel) {
    return per_dir_bytes(numel * 4, chunk_bytes, k) + ns * per_dir_bytes(numel * es, schunk, k);
  };
  uint64_t align = kAlign;
  for (const auto& d : dirs) align = std::max(align, d.extent_align_bytes);
  auto tensor_gaps = [&](uint64_t numel) {
    return per_dir_align_gaps(numel * 4, chunk_bytes, k, align) +
           ns * per_dir_align_gaps(numel * es, schunk, k, align);
  };
  DiskSpaceNeed n;
  uint64_t held = 0, nvme_state = 0, gaps = 0;  // per directory
  for (const auto& t : tensors) {
    const uint64_t b = tensor_bytes(t.numel);
    held += b;
    gaps += tensor_gaps(t.numel);
    if (t.placement == Placement::kNvme) nvme_state += b;
  }
  uint64_t state = held;
  for (uint64_t numel : more_numels) {
    const uint64_t b = tensor_bytes(numel);
    state += b;
    gaps += tensor_gaps(numel);
    nvme_state += b;  // the worst case: every new tensor in the NVMe tier
  }
  // In flight: the new extents of the batches being written while their chunks' previous
  // uncommitted copies still exist (at most num_buffers batches of one slot per stream).
  // A batch's writes start and end inside a chunk shared with the batch before and after
  // it: one such chunk when a slot holds one sub-group, two when it holds several.
  const uint64_t slot_numel = stream_stride / 4;
  const uint64_t shared = slot_numel > sg ? 2 : 1;
  uint64_t per_batch = stream_stride;
  if ((sg * 4) % chunk_bytes != 0) per_batch += shared * chunk_bytes;
  uint64_t state_batch = align_up(slot_numel * es, kAlign);  // bf16: half a slot's stream
  if ((sg * es) % schunk != 0) state_batch += shared * schunk;
  const uint64_t in_flight =
      std::min(nvme_state, static_cast<uint64_t>(slots.size()) *
                               ((per_batch + k - 1) / k + ns * ((state_batch + k - 1) / k)));
  // Alignment gaps: of both copies' extents, of the batches in flight (a tail each, per
  // stream) and of one extent of the store's own (the checkpoint record). None where no
  // chunk of the state is large enough to be aligned.
  uint64_t align_gaps = 0;
  if (align > kAlign &&
      std::max(chunk_bytes, schunk) >= kAlignedExtentFactor * align) {
    align_gaps = 2 * gaps + (static_cast<uint64_t>(slots.size()) * (1 + ns) + 1) * align;
  }
  n.state_bytes = state * k;
  n.in_flight_bytes = in_flight * k;
  n.margin_bytes = kSpaceMargin + align_gaps * k;
  n.need_bytes = 2 * n.state_bytes + n.in_flight_bytes + n.margin_bytes;
  n.held_bytes = held * k;
  // Per file system: the directories on it share its free space.
  struct Fs {
    std::string path;
    uint64_t dirs = 0, free = 0, reusable = 0;
  };
  std::map<uint64_t, Fs> by_fs;
  for (const auto& d : dirs) {
    Fs& f = by_fs[d.fs_id];
    if (f.dirs++ == 0) {
      f.path = d.path;
      f.free = d.free_bytes;
    }
    f.reusable += d.reusable_bytes;
  }
  n.free_bytes = 0;
  for (const auto& [id, f] : by_fs) {
    const uint64_t need = f.dirs * (2 * state + in_flight + align_gaps) + kSpaceMargin;
    const uint64_t have = f.free + f.reusable + f.dirs * held;  // held: already on disk
    n.free_bytes += f.free;
    if (need > have && n.short_path.empty()) {
      n.short_path = f.path;
      n.short_need = need - f.dirs * held;
      n.short_free = f.free + f.reusable;
    }
  }
  return n;
}

Status OffloadedOptimizer::Impl::check_disk_space(const std::vector<uint64_t>& more_numels,
                                                  const std::string& what) const {
  STRATA_ASSIGN_OR_RETURN(DiskSpaceNeed n, disk_space_need(more_numels));
  if (n.short_path.empty()) return Status::OK();
  return resource_exhausted(
      what + ": not enough disk space for the optimizer's state in " + n.short_path + ": it needs " +
      std::to_string(n.short_need) + " more bytes (" + format_bytes(n.short_need) +
      ") and the file system has " + std::to_string(n.short_free) + " bytes (" +
      format_bytes(n.short_free) + ") free. A store needs 2 x its state (" +
      std::to_string(n.state_bytes) + " bytes: masters and moments; a step writes new " +
      "copies of them beside the last checkpoint's) + " + std::to_string(n.in_flight_bytes) +
      " bytes in flight + " + std::to_string(n.margin_bytes) +
      " bytes for the catalog and the extents' alignment (see docs/offload.md, Disk space). "
      "Free space there, or put the "
      "store on a larger file system",
      ENOSPC);
}

Result<DiskSpaceNeed> OffloadedOptimizer::disk_space(const std::vector<uint64_t>& more_numels) const {
  Impl::Baton b(impl_.get());
  return impl_->disk_space_need(more_numels);
}

Status OffloadedOptimizer::check_disk_space(const std::vector<uint64_t>& more_numels) const {
  Impl::Baton b(impl_.get());
  return impl_->check_disk_space(more_numels, "offload");
}

}  // namespace strata::optimizer
