// strata::store (private) — the queries: stat, list, contains, usage, nvme_space, and
// verify (every chunk read back and its checksum compared).
#include <sys/stat.h>
#include <sys/statvfs.h>

#include "store_impl.hpp"
#include "strata/base/logging.hpp"

namespace strata::store_detail {

ObjectInfo StoreImpl::info_locked(const Obj& o) const {
  ObjectInfo i;
  i.key = o.key;
  i.dtype = o.desc.dtype;
  i.shape = o.desc.shape;
  i.nbytes = o.nbytes;
  i.tier = o.tier();
  i.on_nvme = o.current != nullptr;
  auto it = durable_.find(o.key);
  i.dirty = o.dirty || it == durable_.end() || it->second != o.current;
  i.pinned = o.pins > 0;
  i.num_chunks = o.current ? static_cast<uint32_t>(o.current->size()) : 0;
  i.chunk_bytes = o.chunk != 0 ? o.chunk : chunk_bytes_;
  i.damage = o.damage;
  return i;
}

Result<ObjectInfo> StoreImpl::stat(const std::string& key) const {
  CallScope call(this);  // close() waits for it; a closed store: FailedPrecondition
  STRATA_RETURN_IF_ERROR(call.status);
  // Read-only open: the catalog's current row, not the one loaded at open (a writer may
  // have replaced, removed or created the key since). A catalog read error leaves the view
  // as it was.
  (void)catch_up(key, find(key));
  std::lock_guard<std::mutex> lk(mu_);
  auto it = objects_.find(key);
  if (it == objects_.end()) return missing(key);
  return info_locked(*it->second);
}

bool StoreImpl::contains(const std::string& key) const {
  CallScope call(this);
  if (!call.status.ok()) return false;  // closed
  (void)catch_up(key, find(key));  // as stat()
  std::lock_guard<std::mutex> lk(mu_);
  return objects_.count(key) != 0;
}

std::vector<ObjectInfo> StoreImpl::list(std::string_view prefix) const {
  CallScope call(this);
  if (!call.status.ok()) return {};  // closed
  // As stat(): another process may be writing; list what is committed now. On a catalog
  // read error, list what this open knows (stat/get of a listed key report the error).
  if (Status st = catch_up_prefix(std::string(prefix)); !st.ok()) {
    log_warn("store " + opts_.path + ": list: " + st.to_string());
  }
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<ObjectInfo> out;
  for (auto it = objects_.lower_bound(std::string(prefix)); it != objects_.end(); ++it) {
    if (it->first.compare(0, prefix.size(), prefix) != 0) break;
    out.push_back(info_locked(*it->second));
  }
  return out;
}

StoreUsage StoreImpl::usage() const {
  StoreUsage u;
  CallScope call(this);
  if (!call.status.ok()) return u;  // closed: all zero
  u.device_budget_bytes = device_budget_;
  u.device_bytes = device_used_->load();
  u.host_budget_bytes = host_pool_ ? host_pool_->budget_bytes() : 0;
  u.host_bytes = host_pool_ ? host_pool_->used_bytes() : 0;
  u.nvme_budget_bytes = opts_.nvme_budget_bytes;
  u.nvme_bytes = alloc_->used();
  std::lock_guard<std::mutex> lk(mu_);
  u.objects = objects_.size();
  return u;
}

StoreStats StoreImpl::stats() const {
  StoreStats s = counters_.snapshot();
  CallScope call(this);
  if (!call.status.ok()) return s;  // closed or closing: the pools are gone
  if (host_pool_) {
    s.host_pool = {host_pool_->used_bytes(), host_pool_->budget_bytes(),
                   host_pool_->peak_used_bytes(), host_pool_->committed_bytes()};
  }
  for (const auto& g : groups_) {
    if (!g.staging) continue;
    s.staging_pool.in_use_bytes += g.staging->used_bytes();
    s.staging_pool.capacity_bytes += g.staging->budget_bytes();
    s.staging_pool.peak_bytes += g.staging->peak_used_bytes();
    s.staging_pool.committed_bytes += g.staging->committed_bytes();
  }
  return s;
}

void StoreImpl::reset_stats() {
  counters_.reset();
  CallScope call(this);
  if (!call.status.ok()) return;
  if (host_pool_) host_pool_->reset_peak();
  for (const auto& g : groups_) {
    if (g.staging) g.staging->reset_peak();
  }
}

Result<std::vector<NvmeDirSpace>> StoreImpl::nvme_space() const {
  CallScope call(this);
  STRATA_RETURN_IF_ERROR(call.status);
  std::vector<NvmeDirSpace> out;
  for (uint32_t d = 0; d < dirs_.size(); ++d) {
    NvmeDirSpace s;
    s.path = dirs_[d];
    struct statvfs vfs;
    struct stat sb;
    if (::statvfs(s.path.c_str(), &vfs) != 0) return errno_status(errno, "statvfs " + s.path);
    if (::stat(s.path.c_str(), &sb) != 0) return errno_status(errno, "stat " + s.path);
    s.fs_id = static_cast<uint64_t>(sb.st_dev);
    s.free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    s.used_bytes = alloc_->used(d);
    s.extent_align_bytes = alloc_->align();
    if (d < grow_fds_.size() && grow_fds_[d] >= 0 && ::fstat(grow_fds_[d], &sb) == 0) {
      const uint64_t held = static_cast<uint64_t>(sb.st_blocks) * 512;
      s.reusable_bytes = held > s.used_bytes ? held - s.used_bytes : 0;
    }
    out.push_back(std::move(s));
  }
  return out;
}

Result<VerifyReport> StoreImpl::verify() {
  CallScope call(this);
  STRATA_RETURN_IF_ERROR(call.status);
  VerifyReport rep;
  STRATA_RETURN_IF_ERROR(catch_up_prefix(""));  // as list()
  std::vector<ObjPtr> snapshot;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& [k, o] : objects_) snapshot.push_back(o);
  }
  for (const auto& first : snapshot) {
    ObjPtr o = first;
    for (int attempt = 0;; ++attempt) {
      VerifyReport one;  // this object's figures and errors
      LayoutPtr cur;
      {
        std::lock_guard<std::mutex> lk(mu_);
        cur = o->current;
      }
      one.objects = 1;
      if (!o->damage.empty()) {
        one.errors.push_back(data_loss("store " + opts_.path + ": " + o->damage));
      }
      for (uint32_t j = 0; o->damage.empty() && cur && j < cur->size(); ++j) {
        const ChunkRef& c = (*cur)[j];
        ++one.chunks;
        one.bytes += c.nbytes;
        if (!files_[c.ext->dir]) {
          one.errors.push_back(not_found("object '" + o->key + "' chunk " + std::to_string(j) +
                                         ": data file in " + dirs_[c.ext->dir] + " is missing"));
          continue;
        }
        const uint64_t cs = uint64_t{j} * (cur->chunk_bytes != 0 ? cur->chunk_bytes : chunk_bytes_);
        Status st = staged_read_chunk(o->key, j, cs, c, 0, 0, true,
                                      [](const uint8_t*, uint64_t, uint64_t) { return Status::OK(); });
        if (!st.ok()) one.errors.push_back(st);
      }
      // Read-only open beside a writer: an error against a row the writer has replaced
      // since (reusing the old extents) is not damage; check the current version instead.
      if (!one.errors.empty() && attempt < 8) {
        auto changed = catch_up(o->key, o);  // false in a writable open
        if (changed.ok() && *changed) {
          o = find(first->key);
          if (!o) break;  // removed by the writer: nothing to verify
          continue;
        }
      }
      rep.objects += one.objects;
      rep.chunks += one.chunks;
      rep.bytes += one.bytes;
      for (auto& e : one.errors) rep.errors.push_back(std::move(e));
      break;
    }
  }
  return rep;
}

}  // namespace strata::store_detail
