// strata::store (private) — the memory tiers: the host and device LRU lists, eviction to
// make room (write-back of dirty copies, then a commit), promotion and demotion, move.
#include "store_impl.hpp"
#include "strata/base/gpu_libraries.hpp"

namespace strata::store_detail {

void StoreImpl::lru_add_locked(const ObjPtr& o) {
  // A version replaced by an overwrite (or removed) while it was being promoted is not
  // listed: the LRU's reference would keep its memory allocated for good, where nothing
  // could evict it.
  if (o->in_lru || !o->live || (!o->on_host && !o->on_device)) return;
  auto& l = o->on_device ? device_lru_ : host_lru_;
  o->lru_it = l.insert(l.end(), o);
  o->in_lru = true;
}

void StoreImpl::lru_remove_locked(const ObjPtr& o) {
  if (!o->in_lru) return;
  // The list an entry is in is decided by where it was added; erase from whichever holds it.
  auto& l = (o->on_device ? device_lru_ : host_lru_);
  l.erase(o->lru_it);
  o->in_lru = false;
}

void StoreImpl::lru_touch(const ObjPtr& o) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!o->in_lru || !o->live) return;
  auto& l = o->on_device ? device_lru_ : host_lru_;
  l.splice(l.end(), l, o->lru_it);
}

ObjPtr StoreImpl::pick_victim(bool device, const Obj* self) {
  std::lock_guard<std::mutex> lk(mu_);
  auto& l = device ? device_lru_ : host_lru_;
  for (auto& o : l) {
    if (o.get() == self || o->pins > 0 || !o->live) continue;
    if (o->io.try_lock()) return o;
  }
  return nullptr;
}

Result<PinnedBuffer> StoreImpl::alloc_host(uint64_t nbytes, const Obj* self) {
  if (!host_pool_ || align_up(nbytes, kAlign) > host_pool_->budget_bytes()) {
    return resource_exhausted("host tier: object '" + self->key + "' of " + format_bytes(nbytes) +
                              " exceeds the host budget of " +
                              format_bytes(host_pool_ ? host_pool_->budget_bytes() : 0));
  }
  if (nbytes == 0) return PinnedBuffer();
  for (;;) {
    auto r = host_pool_->try_allocate(align_up(nbytes, kAlign));
    if (r.ok()) return r;
    if (r.status().code() != StatusCode::kResourceExhausted) return r.status();
    STRATA_ASSIGN_OR_RETURN(const bool evicted, evict_one(false, self));
    if (!evicted) {
      return resource_exhausted("host tier budget " + format_bytes(host_pool_->budget_bytes()) +
                                " is full and nothing is evictable (" +
                                format_bytes(host_pool_->used_bytes()) + " used, pinned or busy): " +
                                "cannot place '" + self->key + "' (" + format_bytes(nbytes) + ")");
    }
  }
}

Result<std::shared_ptr<DeviceMem>> StoreImpl::alloc_device(uint64_t nbytes, const Obj* self) {
  if (!has_device_) {
#ifdef STRATA_HAVE_CUDA
    // Where the CUDA runtime could not be loaded, say why (each file tried and dlerror()).
    const GpuLibraryInfo& cudart = cuda_runtime_library();
    return invalid_argument("device tier: no GPU (device " + std::to_string(opts_.device_id) +
                            ") for object '" + self->key + "'" +
                            (cudart.loaded ? std::string() : " (" + cudart.error + ")"));
#else
    return unimplemented("device tier: strata was built without CUDA (object '" + self->key + "')");
#endif
  }
  if (nbytes > device_budget_) {
    return resource_exhausted("device tier: object '" + self->key + "' of " + format_bytes(nbytes) +
                              " exceeds the device budget of " + format_bytes(device_budget_));
  }
  for (;;) {
    uint64_t used = device_used_->load();
    if (used + nbytes <= device_budget_) {
      if (!device_used_->compare_exchange_weak(used, used + nbytes)) continue;
      auto m = std::make_shared<DeviceMem>();
      m->id = opts_.device_id;
      m->nbytes = nbytes;
      auto p = device_alloc(opts_.device_id, nbytes);
      if (!p.ok()) {
        device_used_->fetch_sub(nbytes);
        return p.status();
      }
      m->ptr = *p;
      m->used = device_used_;
      return m;
    }
    STRATA_ASSIGN_OR_RETURN(const bool evicted, evict_one(true, self));
    if (!evicted) {
      return resource_exhausted("device tier budget " + format_bytes(device_budget_) +
                                " is full and nothing is evictable: cannot place '" + self->key +
                                "' (" + format_bytes(nbytes) + ")");
    }
  }
}

Result<bool> StoreImpl::evict_one(bool device, const Obj* self) {
  ObjPtr v = pick_victim(device, self);
  if (!v) return false;
  Status st = demote_locked(v);
  v->io.unlock();
  if (st.ok()) counters_.lru_evictions.add(1);
  if (!st.ok()) {
    return st.with_context("evicting '" + v->key + "' from " + (device ? "device" : "host"));
  }
  return true;
}

Status StoreImpl::demote_locked(const ObjPtr& o) {
  bool dirty, on_dev;
  uint8_t* mem;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!o->on_host && !o->on_device) return Status::OK();
    dirty = o->dirty;
    on_dev = o->on_device;
    mem = static_cast<uint8_t*>(o->mem());
  }
  if (dirty) {
    STRATA_ASSIGN_OR_RETURN(LayoutPtr l, write_layout(o->key, mem, o->nbytes, o->first_dir, on_dev,
                                                             o->chunk));
    counters_.writebacks.add(1);
    counters_.writeback_bytes.add(o->nbytes);
    std::lock_guard<std::mutex> lk(mu_);
    o->current = l;
    o->dirty = false;
  }
  // Make the NVMe copy durable before the memory copy goes.
  LayoutPtr cur;
  bool need_commit;
  Future<void> commit;
  {
    std::lock_guard<std::mutex> lk(mu_);
    cur = o->current;
    auto it = durable_.find(o->key);
    // A commit in flight for this key (a newer put or a remove) supersedes this version.
    need_commit = o->live && !inflight_.count(o->key) && (it == durable_.end() || it->second != cur);
    if (need_commit) {
      std::vector<catalog::Op> ops(1);
      ops[0].row = row_of(*o, *cur);
      std::string key = o->key;
      ++inflight_[key];
      commit = enqueue_commit(std::move(ops), [this, key, cur](bool ok) {
        if (ok) durable_[key] = cur;
        end_inflight_locked(key);
      });
    }
  }
  if (need_commit) STRATA_RETURN_IF_ERROR(commit.result().status());
  std::lock_guard<std::mutex> lk(mu_);
  lru_remove_locked(o);
  o->on_host = false;
  o->on_device = false;
  o->host = PinnedBuffer();
  o->dev.reset();
  o->prefetched.store(false, std::memory_order_relaxed);
  counters_.evictions.add(1);
  counters_.eviction_bytes.add(o->nbytes);
  return Status::OK();
}

void StoreImpl::count_move_locked(const Obj& o, Tier from, Tier to) {
  if (static_cast<int>(to) < static_cast<int>(from)) {
    counters_.promotions.add(1);
    counters_.promotion_bytes.add(o.nbytes);
  } else {
    counters_.evictions.add(1);  // device -> host
    counters_.eviction_bytes.add(o.nbytes);
  }
}

Status StoreImpl::promote_locked(const ObjPtr& o, Tier tier) {
  STRATA_RETURN_IF_ERROR(check_damage(*o));
  Tier from;
  {
    std::lock_guard<std::mutex> lk(mu_);
    from = o->tier();
  }
  if (from == tier) return Status::OK();
  if (tier == Tier::kHost) {
    STRATA_ASSIGN_OR_RETURN(PinnedBuffer buf, alloc_host(o->nbytes, o.get()));
    if (from == Tier::kDevice) {
      STRATA_RETURN_IF_ERROR(copy_mem(buf.data(), o->dev->ptr, o->nbytes, true));
    } else {
      STRATA_RETURN_IF_ERROR(read_layout(o->key, o->current, 0, o->nbytes,
                                         static_cast<uint8_t*>(buf.data()), false,
                                         opts_.verify_checksums));
    }
    std::lock_guard<std::mutex> lk(mu_);
    lru_remove_locked(o);
    o->dev.reset();
    o->on_device = false;
    o->host = std::move(buf);
    o->on_host = true;
    lru_add_locked(o);
    count_move_locked(*o, from, tier);
    return Status::OK();
  }
  // tier == kDevice
  STRATA_ASSIGN_OR_RETURN(auto mem, alloc_device(o->nbytes, o.get()));
  if (from == Tier::kHost) {
    STRATA_RETURN_IF_ERROR(copy_mem(mem->ptr, o->host.data(), o->nbytes, true));
  } else {
    // NVMe -> pinned staging -> HBM, pipelined piece by piece (staged_read_async).
    STRATA_RETURN_IF_ERROR(read_layout(o->key, o->current, 0, o->nbytes,
                                       static_cast<uint8_t*>(mem->ptr), true,
                                       opts_.verify_checksums));
  }
  std::lock_guard<std::mutex> lk(mu_);
  lru_remove_locked(o);
  o->host = PinnedBuffer();
  o->on_host = false;
  o->dev = std::move(mem);
  o->on_device = true;
  lru_add_locked(o);
  count_move_locked(*o, from, tier);
  return Status::OK();
}

Status StoreImpl::move_impl(const std::string& key, Tier tier, bool prefetch_only) {
  if (static_cast<int>(tier) > static_cast<int>(Tier::kNvme)) {
    return invalid_argument(std::string(prefetch_only ? "prefetch" : "move") + " '" + key +
                            "': tier value " + std::to_string(static_cast<int>(tier)) +
                            " is not a Tier");
  }
  ObjPtr o = lock_live(key);
  if (!o) return missing(key);
  std::unique_lock<IoLock> held(o->io, std::adopt_lock);
  Tier from;
  int pins;
  {
    std::lock_guard<std::mutex> lk(mu_);
    from = o->tier();
    pins = o->pins;
  }
  if (prefetch_only && static_cast<int>(from) <= static_cast<int>(tier)) return Status::OK();
  if (tier == Tier::kNvme) {
    if (pins > 0 && from != Tier::kNvme) {
      return failed_precondition("object '" + key + "' is pinned in " +
                                 std::string(tier_name(from)) + "; unpin it before evicting");
    }
    return demote_locked(o);
  }
  STRATA_RETURN_IF_ERROR(promote_locked(o, tier));
  if (prefetch_only) {
    counters_.prefetches.add(1);
    o->prefetched.store(true, std::memory_order_relaxed);
  }
  return Status::OK();
}

}  // namespace strata::store_detail
