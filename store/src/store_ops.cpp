// strata::store (private) — the data operations: put (group-committed or in a memory
// tier), get / get_alloc / read_range, write_range (copy-on-write per NVMe chunk), pin,
// unpin, remove and flush.
#include <algorithm>
#include <optional>

#include "checksum.hpp"
#include "store_impl.hpp"
#include "store_validate.hpp"

namespace strata::store_detail {

/// OutOfRange for `n` bytes at offset `off` of an object of `size` bytes (off + n may not
/// fit 64 bits, so the message gives the offset and the length, not the end).
Status range_error(const char* op, const std::string& key, uint64_t off, uint64_t n,
                   uint64_t size) {
  return out_of_range(std::string(op) + " '" + key + "': " + std::to_string(n) +
                      " bytes at offset " + std::to_string(off) +
                      " go past the end of the object (" + std::to_string(size) + " bytes)");
}

Future<void> StoreImpl::put(const std::string& key, const void* src, const TensorDesc& desc,
                            const PutOptions& opts) {
  if (key.empty()) return make_ready_future(Result<void>(invalid_argument("put: empty key")));
  if (Status st = check_tensor_desc("put", key, desc); !st.ok()) {
    return make_ready_future(Result<void>(st));  // before anything is written
  }
  if (desc.nbytes() > 0 && src == nullptr) {
    return make_ready_future(Result<void>(invalid_argument("put '" + key + "': src is null")));
  }
  if (Status st = check_writable(); !st.ok()) return make_ready_future(Result<void>(st));
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!opts.overwrite && (objects_.count(key) || pending_creates_.count(key))) {
      return make_ready_future(Result<void>(
          already_exists("object '" + key + "' already exists in store " + opts_.path +
                         " (pass overwrite to replace it)")));
    }
    ++pending_creates_[key];
  }
  auto o = std::make_shared<Obj>();
  o->key = key;
  o->desc = desc;
  o->nbytes = desc.nbytes();
  o->first_dir = next_dir_.fetch_add(1) % static_cast<uint32_t>(dirs_.size());
  const uint8_t* s = static_cast<const uint8_t*>(src);
  auto release = [this, key] {  // under mu_
    if (--pending_creates_[key] == 0) pending_creates_.erase(key);
  };
  return run_op_async([=, this]() -> Future<void> {
    auto fail = [&](Status st) {
      std::lock_guard<std::mutex> lk(mu_);
      release();
      return make_ready_future(Result<void>(std::move(st)));
    };
    bool src_dev = is_device_pointer(s);
    if (opts.tier == Tier::kNvme) {
      if (opts.pin) return fail(invalid_argument("put '" + key + "': pin needs the host or device tier"));
      auto l = write_layout(key, s, o->nbytes, o->first_dir, src_dev);
      if (!l.ok()) return fail(l.status());
      o->current = *l;
      std::lock_guard<std::mutex> lk(mu_);
      if (opts_.durability == Durability::kOnFlush) {
        install_locked(o);
        release();
        return make_ready_future();
      }
      // The worker does not wait for the commit: the committer completes the future, so
      // many small puts share one fdatasync + one transaction (group commit).
      ++inflight_[key];
      std::vector<catalog::Op> ops(1);
      ops[0].row = row_of(*o, *o->current);
      return enqueue_commit(std::move(ops), [this, o, release](bool ok) {
        if (ok) {
          install_locked(o);
          durable_[o->key] = o->current;
        }
        end_inflight_locked(o->key);
        release();
      });
    }
    // Memory tiers: the object is dirty until flushed / evicted.
    if (opts.tier == Tier::kHost) {
      auto b = alloc_host(o->nbytes, o.get());
      if (!b.ok()) return fail(b.status());
      o->host = std::move(*b);
      if (Status st = copy_mem(o->host.data(), s, o->nbytes, src_dev); !st.ok()) return fail(st);
      o->on_host = true;
    } else {
      auto m = alloc_device(o->nbytes, o.get());
      if (!m.ok()) return fail(m.status());
      o->dev = *m;
      if (Status st = copy_mem(o->dev->ptr, s, o->nbytes, true); !st.ok()) return fail(st);
      o->on_device = true;
    }
    o->dirty = true;
    o->pins = opts.pin ? 1 : 0;
    std::lock_guard<std::mutex> lk(mu_);
    install_locked(o);
    release();
    return make_ready_future();
  });
}

Status StoreImpl::get_from(const ObjPtr& o, uint64_t off, uint64_t n, uint8_t* dst) {
  STRATA_RETURN_IF_ERROR(check_damage(*o));
  bool dst_dev = is_device_pointer(dst);
  const Copies c = copies_of(*o);
  if (o->on_host || o->on_device) return copy_mem(dst, c.mem + off, n, dst_dev || c.mem_dev);
  if (!c.current) return internal_error("object '" + o->key + "' has no copy in any tier");
  return read_layout(o->key, *c.current, off, n, dst, dst_dev, opts_.verify_checksums);
}

Status StoreImpl::read_version(const ObjPtr& o, uint64_t off, uint64_t n, void* dst) {
  std::shared_lock<std::shared_mutex> rl(o->io);
  Status st = get_from(o, off, n, static_cast<uint8_t*>(dst));
  lru_touch(o);
  return st;
}

Future<void> StoreImpl::get_impl(const std::string& key, void* dst, uint64_t nbytes,
                                 const TensorDesc* desc_ptr) {
  std::optional<TensorDesc> desc;
  if (desc_ptr) desc = *desc_ptr;
  return run_op(false, [=, this]() -> Status {
    return with_current_object(key, [&](const ObjPtr& o) -> Status {
      STRATA_RETURN_IF_ERROR(check_damage(*o));
      if (desc && (desc->dtype != o->desc.dtype || desc->shape != o->desc.shape)) {
        return invalid_argument("get '" + key + "': the object is " + to_string(o->desc) +
                                ", the destination is " + to_string(*desc));
      }
      if (nbytes != o->nbytes) {
        return invalid_argument("get '" + key + "': the object is " + std::to_string(o->nbytes) +
                                " bytes, the destination " + std::to_string(nbytes) + " bytes");
      }
      if (nbytes > 0 && dst == nullptr) return invalid_argument("get '" + key + "': dst is null");
      return read_version(o, 0, nbytes, dst);
    });
  });
}

Future<void> StoreImpl::get_alloc(const std::string& key,
                                  std::function<Result<void*>(const TensorDesc&)> allocate) {
  return run_op(false, [=, this, allocate = std::move(allocate)]() -> Status {
    return with_current_object(key, [&](const ObjPtr& o) -> Status {
      STRATA_RETURN_IF_ERROR(check_damage(*o));
      // `o` is one version: an overwrite installs a new Obj, and this one's memory and
      // extents stay valid while `o` is held and its io lock is shared.
      STRATA_ASSIGN_OR_RETURN(void* dst, allocate(o->desc));
      if (o->nbytes > 0 && dst == nullptr) {
        return invalid_argument("get '" + key + "': the allocator returned null for " +
                                std::to_string(o->nbytes) + " bytes");
      }
      return read_version(o, 0, o->nbytes, dst);
    });
  });
}

Future<void> StoreImpl::read_range(const std::string& key, uint64_t off, uint64_t n, void* dst) {
  return run_op(false, [=, this]() -> Status {
    return with_current_object(key, [&](const ObjPtr& o) -> Status {
      STRATA_RETURN_IF_ERROR(check_damage(*o));
      if (off > o->nbytes || n > o->nbytes - off) {
        return range_error("read_range", key, off, n, o->nbytes);
      }
      if (n > 0 && dst == nullptr) {
        return invalid_argument("read_range '" + key + "': dst is null");
      }
      return read_version(o, off, n, dst);
    });
  });
}

Status StoreImpl::write_range_impl(const ObjPtr& o, uint64_t off, uint64_t n, const uint8_t* src) {
  STRATA_RETURN_IF_ERROR(check_damage(*o));
  bool src_dev = is_device_pointer(src);
  const Copies copies = copies_of(*o);
  const LayoutPtr& cur = copies.current;
  if (o->on_host || o->on_device) {
    STRATA_RETURN_IF_ERROR(copy_mem(copies.mem + off, src, n, src_dev || copies.mem_dev));
    std::lock_guard<std::mutex> lk(mu_);
    o->dirty = true;
    return Status::OK();
  }
  // NVMe only: copy-on-write per chunk. The catalog keeps naming the old extents until the
  // next flush(); a crash restores them. The new chunks replace the old ones in the layout
  // only once all of them are written: a failure leaves the object as it was, and the new
  // extents are released with `written`.
  const uint64_t j0 = off / chunk_bytes_, j1 = (off + n - 1) / chunk_bytes_;
  std::vector<std::pair<uint64_t, ChunkRef>> written;
  written.reserve(j1 - j0 + 1);
  for (uint64_t j = j0; j <= j1; ++j) {
    const ChunkRef old = (*cur)[j];
    const uint64_t cs = j * chunk_bytes_;
    const uint64_t lo = std::max(off, cs) - cs, hi = std::min(off + n, cs + old.nbytes) - cs;
    STRATA_ASSIGN_OR_RETURN(auto ext, alloc_->allocate(old.ext->dir, old.ext->len, o->key));
    STRATA_RETURN_IF_ERROR(ensure_file_size(ext->dir, ext->offset + ext->len));
    const uint8_t* s = src + (cs + lo - off);
    ChunkRef nc{ext, old.nbytes, 0};
    const auto& file = files_[ext->dir];
    if (lo == 0 && hi == old.nbytes && !src_dev &&
        is_aligned_ptr(s, std::max<uint32_t>(file->memory_alignment(), 1)) &&
        old.nbytes % kAlign == 0) {
      mark_dir_dirty(ext->dir);
      std::vector<Future<uint64_t>> futs;
      std::vector<AlignedBlock> tails;
      write_direct(ext->dir, s, old.nbytes, ext->offset, futs, tails);
      nc.checksum = xxh3_64(s, old.nbytes);  // while the write is in flight
      Status wst;
      for (auto& f : futs) {
        const auto& r = f.result();
        if (wst.ok() && !r.ok()) wst = r.status();
      }
      STRATA_RETURN_IF_ERROR(wst);
    } else {
      // Read-modify-write piece by piece: old bytes outside [lo, hi) (verified), new inside.
      const bool partial = !(lo == 0 && hi == old.nbytes);
      std::optional<Xxh3Stream> vh;
      if (partial && opts_.verify_checksums) vh.emplace();
      const auto& ofile = files_[old.ext->dir];
      auto h = staged_write_chunk(*ext, old.nbytes, [&](uint8_t* buf, uint64_t p, uint64_t plen) {
        if (partial) {
          STRATA_RETURN_IF_ERROR(io(old.ext->dir).read(ofile, buf, align_up(plen, kAlign),
                                               old.ext->offset + p).result().status());
          if (vh) vh->update(buf, plen);
        }
        uint64_t a = std::max(p, lo), b = std::min(p + plen, hi);
        if (a < b) STRATA_RETURN_IF_ERROR(copy_mem(buf + (a - p), src + (cs + a - off), b - a, src_dev));
        return Status::OK();
      });
      const uint64_t got = vh ? vh->digest() : 0;
      if (!h.ok()) return h.status().with_context("write_range '" + o->key + "'");
      if (vh && got != old.checksum) return checksum_error(o->key, static_cast<uint32_t>(j), cs, old, got);
      nc.checksum = *h;
    }
    written.emplace_back(j, std::move(nc));
  }
  // Concurrent write_range calls on this object touch other chunks: start from the layout
  // as it is now, so their chunks are kept.
  std::lock_guard<std::mutex> lk(mu_);
  auto l = std::make_shared<Layout>(*o->current);
  for (auto& [j, nc] : written) (*l)[j] = std::move(nc);
  o->current = l;
  return Status::OK();
}

Future<void> StoreImpl::write_range(const std::string& key, uint64_t off, uint64_t n,
                                    const void* src) {
  return run_op(true, [=, this]() -> Status {
    ObjPtr o = lock_live_shared(key);
    if (!o) return missing(key);
    std::shared_lock<std::shared_mutex> held(o->io, std::adopt_lock);
    if (off > o->nbytes || n > o->nbytes - off) {
      return range_error("write_range", key, off, n, o->nbytes);
    }
    if (n > 0 && src == nullptr) return invalid_argument("write_range '" + key + "': src is null");
    if (n == 0) return Status::OK();
    Status st = write_range_impl(o, off, n, static_cast<const uint8_t*>(src));
    if (!st.ok()) trim_data_files();  // the failed copy-on-write extents are released
    lru_touch(o);
    return st;
  });
}

Future<void> StoreImpl::pin(const std::string& key) {
  return run_op(true, [=, this]() -> Status {
    ObjPtr o = lock_live(key);
    if (!o) return missing(key);
    std::unique_lock<std::shared_mutex> held(o->io, std::adopt_lock);
    if (!o->on_host && !o->on_device) STRATA_RETURN_IF_ERROR(promote_locked(o, Tier::kHost));
    std::lock_guard<std::mutex> lk(mu_);
    ++o->pins;
    return Status::OK();
  });
}

Future<void> StoreImpl::unpin(const std::string& key) {
  return run_op(true, [=, this]() -> Status {
    ObjPtr o = lock_live(key);
    if (!o) return missing(key);
    std::unique_lock<std::shared_mutex> held(o->io, std::adopt_lock);
    std::lock_guard<std::mutex> lk(mu_);
    if (o->pins == 0) return failed_precondition("unpin: object '" + key + "' is not pinned");
    --o->pins;
    return Status::OK();
  });
}

Future<void> StoreImpl::remove(const std::string& key) {
  return run_op(true, [=, this]() -> Status {
    ObjPtr o = lock_live(key);
    if (!o) return missing(key);
    std::unique_lock<std::shared_mutex> held(o->io, std::adopt_lock);
    auto drop = [this, o](bool ok) {
      if (!ok) {
        end_inflight_locked(o->key);
        return;
      }
      auto it = objects_.find(o->key);
      if (it != objects_.end() && it->second == o) objects_.erase(it);
      o->live = false;
      lru_remove_locked(o);
      durable_.erase(o->key);
      end_inflight_locked(o->key);
    };
    Future<void> f;
    {
      std::lock_guard<std::mutex> lk(mu_);
      ++inflight_[key];
      if (!durable_.count(key) && inflight_[key] == 1) {
        drop(true);
        return Status::OK();
      }
      std::vector<catalog::Op> ops(1);
      ops[0].kind = catalog::Op::kDelete;
      ops[0].row.key = key;
      f = enqueue_commit(std::move(ops), drop);
    }
    return f.result().status();
  });
}

Status StoreImpl::flush_impl() {
  // 1. Write back every dirty memory copy (each under its own lock). One that cannot be
  //    written (e.g. the NVMe budget is full) does not stop the others, nor the commit of
  //    everything written: the first such error is returned after the commit.
  Status first_error;
  std::vector<ObjPtr> snapshot;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& [k, o] : objects_) snapshot.push_back(o);
  }
  for (auto& o : snapshot) {
    bool dirty;
    {
      std::lock_guard<std::mutex> lk(mu_);
      dirty = o->dirty && o->live;
    }
    if (!dirty) continue;
    std::unique_lock<std::shared_mutex> held(o->io);
    uint8_t* mem;
    bool on_dev;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!o->dirty || !o->live) continue;
      mem = static_cast<uint8_t*>(o->mem());
      on_dev = o->on_device;
    }
    auto l = write_layout(o->key, mem, o->nbytes, o->first_dir, on_dev);
    if (!l.ok()) {
      if (first_error.ok()) first_error = l.status();
      continue;
    }
    std::lock_guard<std::mutex> lk(mu_);
    o->current = *l;
    o->dirty = false;
  }
  // 2. Lock every changed live version (key order), enqueue one batch, unlock.
  std::vector<catalog::Op> ops;
  std::vector<std::pair<std::string, LayoutPtr>> updates;
  // 2. Under mu_, one batch of every live version whose NVMe copy the catalog does not name
  //    yet. Keys with a commit in flight are skipped: that commit (a newer put or a
  //    remove) supersedes this version and is ordered after it anyway.
  Future<void> f;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& [key, o] : objects_) {
      auto it = durable_.find(key);
      if (!o->current || o->dirty || inflight_.count(key) ||
          (it != durable_.end() && it->second == o->current)) {
        continue;
      }
      catalog::Op op;
      op.row = row_of(*o, *o->current);
      ops.push_back(std::move(op));
      updates.emplace_back(key, o->current);
    }
    for (auto& u : updates) ++inflight_[u.first];
    f = enqueue_commit(std::move(ops), [this, updates](bool ok) {
      for (auto& [k, l] : updates) {
        if (ok) durable_[k] = l;
        end_inflight_locked(k);
      }
    });
  }
  Status committed = f.result().status();
  return first_error.ok() ? committed : first_error;
}

}  // namespace strata::store_detail
