// strata::store (private) — the NVMe tier's extent allocator (see extent_allocator.hpp).
#include "extent_allocator.hpp"

#include <algorithm>
#include <iterator>

#include "strata/base/units.hpp"

namespace strata::store_detail {

Extent::~Extent() {
  if (alloc) alloc->release(dir, offset, len);
}

Result<std::shared_ptr<Extent>> ExtentAllocator::allocate(uint32_t dir, uint64_t len,
                                                          const std::string& key) {
  std::lock_guard<std::mutex> lk(mu_);
  if (budget_ && used_ + len > budget_) {
    return resource_exhausted("nvme tier budget " + format_bytes(budget_) + " full (" +
                              format_bytes(used_) + " used): cannot place " + format_bytes(len) +
                              " of object '" + key + "'");
  }
  Dir& d = dirs_[dir];
  const uint64_t align = len >= kAlignedExtentFactor * align_ ? align_ : 1;
  uint64_t off = 0;
  bool found = false;
  for (auto it = d.free.begin(); it != d.free.end(); ++it) {
    const auto [lo, n] = *it;
    off = align_up(lo, align);
    if (off + len <= lo + n) {
      d.punched.erase(*it);
      d.free.erase(it);
      if (off > lo) d.free.emplace(lo, off - lo);                    // the head
      if (lo + n > off + len) d.free.emplace(off + len, lo + n - off - len);  // the tail
      found = true;
      break;
    }
  }
  if (!found) {
    off = align_up(d.end, align);
    if (off > d.end) d.free.emplace(d.end, off - d.end);
    d.end = off + len;
  }
  used_ += len;
  d.used += len;
  return make(dir, off, len);
}

std::shared_ptr<Extent> ExtentAllocator::adopt(uint32_t dir, uint64_t off, uint64_t len) {
  std::lock_guard<std::mutex> lk(mu_);
  dirs_[dir].loaded.emplace_back(off, len);
  dirs_[dir].used += len;
  used_ += len;
  return make(dir, off, len);
}

Status ExtentAllocator::finish_load() {
  std::lock_guard<std::mutex> lk(mu_);
  for (size_t di = 0; di < dirs_.size(); ++di) {
    Dir& d = dirs_[di];
    std::sort(d.loaded.begin(), d.loaded.end());
    uint64_t pos = 0;
    for (auto [off, len] : d.loaded) {
      if (off < pos) {
        return data_loss("catalog: extents overlap in directory " + std::to_string(di) +
                         " at offset " + std::to_string(off));
      }
      if (off > pos) d.free.emplace(pos, off - pos);
      pos = off + len;
    }
    d.end = pos;
    d.loaded.clear();
    d.loaded.shrink_to_fit();
  }
  return Status::OK();
}

void ExtentAllocator::release(uint32_t dir, uint64_t off, uint64_t len) {
  std::lock_guard<std::mutex> lk(mu_);
  used_ -= len;
  Dir& d = dirs_[dir];
  d.used -= len;
  auto next = d.free.lower_bound(off);
  if (next != d.free.end() && off + len == next->first) {  // merge with the next
    len += next->second;
    d.punched.erase(*next);
    next = d.free.erase(next);
  }
  if (next != d.free.begin()) {  // merge with the previous
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      off = prev->first;
      len += prev->second;
      d.punched.erase(*prev);
      d.free.erase(prev);
    }
  }
  if (off + len == d.end) {
    d.end = off;
  } else {
    d.free.emplace(off, len);
  }
}

uint64_t ExtentAllocator::used() const {
  std::lock_guard<std::mutex> lk(mu_);
  return used_;
}

uint64_t ExtentAllocator::used(uint32_t dir) const {
  std::lock_guard<std::mutex> lk(mu_);
  return dirs_[dir].used;
}

uint64_t ExtentAllocator::punch_free(uint32_t dir, uint64_t file_end, uint64_t keep_bytes,
                                     const std::function<bool(uint64_t, uint64_t)>& punch) {
  std::lock_guard<std::mutex> lk(mu_);
  Dir& d = dirs_[dir];
  uint64_t kept = 0;
  for (const auto& r : d.free) {
    if (d.punched.count(r)) continue;
    if (kept + r.second <= keep_bytes) {  // warm reserve: stays allocated in the file
      kept += r.second;
      continue;
    }
    if (!punch(r.first, r.second)) return file_end;
    d.punched.insert(r);
  }
  if (file_end <= d.end) return file_end;
  // The tail [end, file_end) is free space too: what is left of the reserve keeps its
  // start allocated (the next growth reuses it), and only the rest is punched, once --
  // the caller's file end moves down to the cut, so the same tail is not punched again.
  const uint64_t cut = d.end + std::min(file_end - d.end, keep_bytes - kept);
  if (cut == file_end) return file_end;
  return punch(cut, file_end - cut) ? cut : file_end;
}

uint64_t ExtentAllocator::end(uint32_t dir) const {
  std::lock_guard<std::mutex> lk(mu_);
  return dirs_[dir].end;
}

std::vector<std::pair<uint64_t, uint64_t>> ExtentAllocator::free_ranges(uint32_t dir) const {
  std::lock_guard<std::mutex> lk(mu_);
  return {dirs_[dir].free.begin(), dirs_[dir].free.end()};
}

std::shared_ptr<Extent> ExtentAllocator::make(uint32_t dir, uint64_t off, uint64_t len) {
  auto e = std::make_shared<Extent>();
  e->alloc = shared_from_this();
  e->dir = dir;
  e->offset = off;
  e->len = len;
  return e;
}

}  // namespace strata::store_detail
