// strata::store (private) — the data operations: put (group-committed or in a memory
// tier), get / get_alloc / read_range, write_range (copy-on-write per NVMe chunk), pin,
// unpin, remove, flush, and hold / commit (flush of a chosen set of keys).
#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "checksum.hpp"
#include "piece_pipeline.hpp"
#include "store_impl.hpp"
#include "store_shapes.hpp"

namespace strata::store_detail {

/// OutOfRange for `n` bytes at offset `off` of an object of `size` bytes (off + n may not
/// fit 64 bits, so the message gives the offset and the length, not the end).
Status range_error(const char* op, const std::string& key, uint64_t off, uint64_t n,
                   uint64_t size) {
  return out_of_range(std::string(op) + " '" + key + "': " + std::to_string(n) +
                      " bytes at offset " + std::to_string(off) +
                      " go past the end of the object (" + std::to_string(size) + " bytes)");
}

Future<void> StoreImpl::put_async(const std::string& key, const void* src, const TensorDesc& desc,
                                  const PutOptions& opts) {
  if (key.empty()) return make_ready_future(Result<void>(invalid_argument("put: empty key")));
  if (Status st = check_tensor_desc("put", key, desc); !st.ok()) {
    return make_ready_future(Result<void>(st));  // before anything is written
  }
  if (desc.nbytes() > 0 && src == nullptr) {
    return make_ready_future(Result<void>(invalid_argument("put '" + key + "': src is null")));
  }
  if (static_cast<int>(opts.tier) > static_cast<int>(Tier::kNvme)) {
    return make_ready_future(Result<void>(invalid_argument(
        "put '" + key + "': tier value " + std::to_string(static_cast<int>(opts.tier)) +
        " is not a Tier")));
  }
  if (opts.chunk_bytes % kAlign != 0 || opts.chunk_bytes > chunk_bytes_) {
    return make_ready_future(Result<void>(invalid_argument(
        "put '" + key + "': PutOptions.chunk_bytes " + std::to_string(opts.chunk_bytes) +
        " is not a multiple of 4096 up to the store's chunk_bytes " +
        std::to_string(chunk_bytes_))));
  }
  if (opts.repeat_bytes != 0) {
    const uint64_t chunk = opts.chunk_bytes != 0 ? opts.chunk_bytes : chunk_bytes_;
    if (opts.tier != Tier::kNvme || opts.repeat_bytes % chunk != 0) {
      return make_ready_future(Result<void>(invalid_argument(
          "put '" + key + "': PutOptions.repeat_bytes " + std::to_string(opts.repeat_bytes) +
          " needs the nvme tier and a multiple of the object's chunk bytes " +
          std::to_string(chunk))));
    }
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
  o->chunk = opts.chunk_bytes != 0 ? opts.chunk_bytes : chunk_bytes_;
  const uint8_t* s = static_cast<const uint8_t*>(src);
  auto release = [this, key] {  // under mu_
    if (--pending_creates_[key] == 0) pending_creates_.erase(key);
  };
  return run_op_async(true, [=, this]() -> Future<void> {
    auto fail = [&](Status st) {
      std::lock_guard<std::mutex> lk(mu_);
      release();
      return make_ready_future(Result<void>(std::move(st)));
    };
    bool src_dev = is_device_pointer(s);
    if (opts.tier == Tier::kNvme) {
      if (opts.pin) return fail(invalid_argument("put '" + key + "': pin needs the host or device tier"));
      auto l = write_layout(key, s, o->nbytes, o->first_dir, src_dev, o->chunk,
                            opts.repeat_bytes);
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
      counters_.of(Tier::kHost).write(o->nbytes);
    } else {
      auto m = alloc_device(o->nbytes, o.get());
      if (!m.ok()) return fail(m.status());
      o->dev = *m;
      if (Status st = copy_mem(o->dev->ptr, s, o->nbytes, true); !st.ok()) return fail(st);
      o->on_device = true;
      counters_.of(Tier::kDevice).write(o->nbytes);
    }
    o->dirty = true;
    o->pins = opts.pin ? 1 : 0;
    std::lock_guard<std::mutex> lk(mu_);
    install_locked(o);
    release();
    return make_ready_future();
  });
}

Future<void> StoreImpl::read_async(const ObjPtr& o, uint64_t off, uint64_t n, uint8_t* dst) {
  // `o` is one version: an overwrite installs a new Obj, and this one's memory and extents
  // stay valid while `o` is held and its io lock is shared, until the read's last step.
  o->io.lock_shared();
  Future<void> f;
  bool dst_dev = is_device_pointer(dst);
  Copies c = copies(*o);
  if (c.mem_tier) {
    f = make_ready_future(Result<void>(copy_mem(dst, c.mem + off, n, dst_dev || c.mem_dev)));
    counters_.of(c.mem_dev ? Tier::kDevice : Tier::kHost).read(n);
    if (o->prefetched.load(std::memory_order_relaxed) && o->prefetched.exchange(false)) {
      counters_.prefetch_hits.add(1);
    }
  } else if (!c.nvme) {
    f = make_ready_future(
        Result<void>(internal_error("object '" + o->key + "' has no copy in any tier")));
  } else {
    counters_.prefetch_misses.add(1);
    f = read_layout_async(o->key, std::move(c.nvme), off, n, dst, dst_dev, opts_.verify_checksums);
  }
  return f.then([this, o](const Result<void>& r) -> Status {
    o->io.unlock_shared();
    lru_touch(o);
    return r.status();
  });
}

Future<void> StoreImpl::get_impl(const std::string& key, void* dst, uint64_t nbytes,
                                 const TensorDesc* desc_ptr) {
  std::optional<TensorDesc> desc;
  if (desc_ptr) desc = *desc_ptr;
  return run_op_async(false, [=, this] {
    return with_current_object_async(key, [=, this](const ObjPtr& o) -> Future<void> {
      auto fail = [](Status st) { return make_ready_future(Result<void>(std::move(st))); };
      if (Status st = check_damage(*o); !st.ok()) return fail(st);
      if (desc && (desc->dtype != o->desc.dtype || desc->shape != o->desc.shape)) {
        return fail(invalid_argument("get '" + key + "': the object is " + to_string(o->desc) +
                                     ", the destination is " + to_string(*desc)));
      }
      if (nbytes != o->nbytes) {
        return fail(invalid_argument("get '" + key + "': the object is " +
                                     std::to_string(o->nbytes) + " bytes, the destination " +
                                     std::to_string(nbytes) + " bytes"));
      }
      if (nbytes > 0 && dst == nullptr) return fail(invalid_argument("get '" + key + "': dst is null"));
      return read_async(o, 0, nbytes, static_cast<uint8_t*>(dst));
    });
  });
}

Future<void> StoreImpl::get_alloc_async(const std::string& key,
                                        std::function<Result<void*>(const TensorDesc&)> allocate) {
  if (!allocate) {
    return make_ready_future(Result<void>(invalid_argument("get '" + key + "': no allocate function")));
  }
  return run_op_async(false, [=, this] {
    return with_current_object_async(key, [=, this](const ObjPtr& o) -> Future<void> {
      auto fail = [](Status st) { return make_ready_future(Result<void>(std::move(st))); };
      if (Status st = check_damage(*o); !st.ok()) return fail(st);
      auto dst = allocate(o->desc);
      if (!dst.ok()) return fail(dst.status());
      if (o->nbytes > 0 && *dst == nullptr) {
        return fail(invalid_argument("get '" + key + "': the allocator returned null for " +
                                     std::to_string(o->nbytes) + " bytes"));
      }
      return read_async(o, 0, o->nbytes, static_cast<uint8_t*>(*dst));
    });
  });
}

Future<void> StoreImpl::read_range_async(const std::string& key, uint64_t off, uint64_t n, void* dst) {
  return run_op_async(false, [=, this] {
    return with_current_object_async(key, [=, this](const ObjPtr& o) -> Future<void> {
      auto fail = [](Status st) { return make_ready_future(Result<void>(std::move(st))); };
      if (Status st = check_damage(*o); !st.ok()) return fail(st);
      if (off > o->nbytes || n > o->nbytes - off) {
        return fail(range_error("read_range", key, off, n, o->nbytes));
      }
      if (n > 0 && dst == nullptr) {
        return fail(invalid_argument("read_range '" + key + "': dst is null"));
      }
      return read_async(o, off, n, static_cast<uint8_t*>(dst));
    });
  });
}

Future<void> StoreImpl::write_range_nvme(const ObjPtr& o, LayoutPtr cur, uint64_t off,
                                         uint64_t n, const uint8_t* src, bool src_dev) {
  // Copy-on-write per chunk. The catalog keeps naming the old extents until the next
  // flush(); a crash restores them. The new chunks replace the old ones in the layout only
  // once all of them are written: a failure leaves the object as it was, and the new
  // extents are released with the job. Whole chunks from aligned host memory are written
  // straight from `src` (a partial last 4 KiB block through a copy), all at once (hashed
  // here, while they are in flight); the others are read-modify-written through staging
  // memory, one chunk after another per staging pool.
  const auto t_io = StatsClock::now();
  const uint64_t chunk_bytes = cur->chunk_bytes != 0 ? cur->chunk_bytes : chunk_bytes_;
  const uint64_t j0 = off / chunk_bytes, j1 = (off + n - 1) / chunk_bytes;
  struct Job {
    LayoutPtr cur;
    std::vector<std::pair<uint64_t, ChunkRef>> written;
    std::vector<AlignedBlock> tails;
    std::vector<PinnedBuffer> bufs;
    FirstError error;
  };
  auto job = std::make_shared<Job>();
  job->cur = std::move(cur);
  job->written.reserve(j1 - j0 + 1);
  std::vector<size_t> direct;
  std::map<uint32_t, std::vector<size_t>> staged;  // staging group -> entries of `written`
  for (uint64_t j = j0; j <= j1; ++j) {
    const ChunkRef& old = (*job->cur)[j];
    const uint64_t cs = j * chunk_bytes;
    const uint64_t lo = std::max(off, cs) - cs, hi = std::min(off + n, cs + old.nbytes) - cs;
    auto ext = alloc_->allocate(old.ext->dir, old.ext->len, o->key);
    if (!ext.ok()) return make_ready_future(Result<void>(ext.status()));
    Status gs = ensure_file_size((*ext)->dir, (*ext)->offset + (*ext)->len);
    if (!gs.ok()) return make_ready_future(Result<void>(gs));
    const uint8_t* s = src + (cs + lo - off);
    const auto& file = files_[(*ext)->dir];
    const bool whole = lo == 0 && hi == old.nbytes;
    // (A partial last 4 KiB block goes through an aligned tail block: write_direct.)
    if (whole && !src_dev && is_aligned_ptr(s, std::max<uint32_t>(file->memory_alignment(), 1))) {
      direct.push_back(job->written.size());
    } else {
      staged[dir_group_[(*ext)->dir]].push_back(job->written.size());
    }
    job->written.emplace_back(j, ChunkRef{std::move(*ext), old.nbytes, 0});
  }
  std::vector<std::pair<uint32_t, uint64_t>> pieces;  // staging group -> piece size
  for (const auto& [g, entries] : staged) {
    uint64_t longest = 0;
    for (size_t e : entries) longest = std::max(longest, job->written[e].second.nbytes);
    const uint64_t piece = staged_piece(longest);
    auto buf = staging(job->written[entries.front()].second.ext->dir, 2 * piece);
    if (!buf.ok()) {
      return make_ready_future(
          Result<void>(buf.status().with_context("write_range '" + o->key + "'")));
    }
    job->bufs.push_back(std::move(buf).value());
    pieces.emplace_back(g, piece);
  }
  std::vector<Future<void>> parts;
  for (size_t e : direct) {
    auto& [j, nc] = job->written[e];
    std::vector<Future<uint64_t>> futs;
    const uint8_t* s = src + (j * chunk_bytes - off);
    mark_dir_dirty(nc.ext->dir);
    write_direct(nc.ext->dir, s, nc.nbytes, nc.ext->offset, futs, job->tails);
    nc.checksum = xxh3_64(s, nc.nbytes);  // while the write is in flight
    const uint64_t jj = j;
    parts.push_back(when_all(futs).then([job, jj, key = o->key](const Result<void>& r) -> Status {
      // (named as the staged chunks' errors are: which chunk fails first depends on timing)
      Status st = r.ok() ? Status::OK() : r.status().with_context("write_range '" + key + "'");
      job->error.note(jj, st);
      return st;
    }));
  }
  const std::string key = o->key;
  for (size_t k = 0; k < pieces.size(); ++k) {
    const auto [g, piece] = pieces[k];
    uint8_t* buf = static_cast<uint8_t*>(job->bufs[k].data());
    std::vector<std::function<Future<void>()>> chain;
    for (size_t e : staged[g]) {
      chain.push_back([this, job, e, key, off, n, src, src_dev, buf, piece,
                       chunk_bytes]() -> Future<void> {
        const uint64_t j = job->written[e].first;
        const ChunkRef old = (*job->cur)[j];
        const uint64_t cs = j * chunk_bytes;
        const uint64_t lo = std::max(off, cs) - cs, hi = std::min(off + n, cs + old.nbytes) - cs;
        // Read-modify-write piece by piece: old bytes outside [lo, hi) (verified), new inside.
        const bool partial = !(lo == 0 && hi == old.nbytes);
        auto vh = std::make_shared<std::optional<Xxh3Stream>>();
        if (partial && opts_.verify_checksums) vh->emplace();
        PieceLoad load;
        if (partial) {
          counters_.nvme().read(align_up(old.nbytes, kAlign));
          const std::shared_ptr<IoFile>* ofile = &files_[old.ext->dir];
          IoEngine* engine = &io(old.ext->dir);
          const uint64_t ooff = old.ext->offset;
          load = [ofile, engine, ooff](uint8_t* b, uint64_t p, uint64_t plen) {
            return engine->read_async(*ofile, b, align_up(plen, kAlign), ooff + p);
          };
        }
        auto fill = [this, vh, partial, lo, hi, src, cs, off, src_dev](uint8_t* b, uint64_t p,
                                                                        uint64_t plen) -> Status {
          if (partial && *vh) (*vh)->update(b, plen);
          const uint64_t a = std::max(p, lo), z = std::min(p + plen, hi);
          if (a < z) return copy_mem(b + (a - p), src + (cs + a - off), z - a, src_dev);
          return Status::OK();
        };
        return staged_write_async(*job->written[e].second.ext, old.nbytes, buf, piece,
                                  std::move(load), std::move(fill))
            .then([this, job, e, j, cs, old, vh, key](const Result<uint64_t>& h) -> Status {
              Status st;
              if (!h.ok()) {
                st = h.status().with_context("write_range '" + key + "'");
              } else if (*vh && (*vh)->digest() != old.checksum) {
                st = checksum_error(key, static_cast<uint32_t>(j), cs, old, (*vh)->digest());
              } else {
                job->written[e].second.checksum = *h;
              }
              job->error.note(j, st);
              return st;
            });
      });
    }
    parts.push_back(run_in_sequence(std::move(chain)));
  }
  return when_all(parts).then([this, o, job, t_io](const Result<void>&) -> Status {
    counters_.nvme_write_wait_ns.add(ns_since(t_io));
    Status st = job->error.status();
    if (st.ok()) {
      // Concurrent write_range calls on this object touch other chunks: start from the
      // layout as it is now, so their chunks are kept.
      std::lock_guard<std::mutex> lk(mu_);
      auto l = std::make_shared<Layout>(*o->current);
      for (auto& [j, nc] : job->written) (*l)[j] = std::move(nc);
      o->current = l;
    }
    job->written.clear();  // a failure's new extents go back to the allocator
    job->tails.clear();
    job->bufs.clear();
    job->cur.reset();
    return st;
  });
}

Future<void> StoreImpl::write_range_async(const std::string& key, uint64_t off, uint64_t n,
                                          const void* src) {
  return run_op_async(true, [=, this]() -> Future<void> {
    auto fail = [](Status st) { return make_ready_future(Result<void>(std::move(st))); };
    ObjPtr o = lock_live_shared(key);
    if (!o) return fail(missing(key));
    std::shared_lock<IoLock> held(o->io, std::adopt_lock);
    if (off > o->nbytes || n > o->nbytes - off) {
      return fail(range_error("write_range", key, off, n, o->nbytes));
    }
    if (n > 0 && src == nullptr) return fail(invalid_argument("write_range '" + key + "': src is null"));
    if (n == 0) return fail(Status::OK());
    if (Status st = check_damage(*o); !st.ok()) return fail(st);
    const uint8_t* s = static_cast<const uint8_t*>(src);
    bool src_dev = is_device_pointer(s);
    Copies c = copies(*o);
    if (c.mem_tier) {
      Status st = copy_mem(c.mem + off, s, n, src_dev || c.mem_dev);
      counters_.of(c.mem_dev ? Tier::kDevice : Tier::kHost).write(n);
      if (st.ok()) {
        std::lock_guard<std::mutex> lk(mu_);
        o->dirty = true;
      }
      lru_touch(o);
      return fail(st);
    }
    held.release();  // from here the last step unlocks, on whichever thread runs it
    return write_range_nvme(o, std::move(c.nvme), off, n, s, src_dev)
        .then([this, o](const Result<void>& r) -> Future<void> {
          o->io.unlock_shared();
          lru_touch(o);
          if (r.ok()) return make_ready_future();
          // The failed copy-on-write extents are released: give back the space, on a worker
          // (file system calls stay off the completion thread).
          return pool_->async([this, st = r.status()]() -> Status {
            trim_data_files();
            return st;
          });
        });
  });
}

Future<void> StoreImpl::pin_async(const std::string& key) {
  return run_op(true, [=, this]() -> Status {
    ObjPtr o = lock_live(key);
    if (!o) return missing(key);
    std::unique_lock<IoLock> held(o->io, std::adopt_lock);
    if (!o->on_host && !o->on_device) STRATA_RETURN_IF_ERROR(promote_locked(o, Tier::kHost));
    std::lock_guard<std::mutex> lk(mu_);
    ++o->pins;
    return Status::OK();
  });
}

Future<void> StoreImpl::unpin_async(const std::string& key) {
  return run_op(true, [=, this]() -> Status {
    ObjPtr o = lock_live(key);
    if (!o) return missing(key);
    std::unique_lock<IoLock> held(o->io, std::adopt_lock);
    std::lock_guard<std::mutex> lk(mu_);
    if (o->pins == 0) return failed_precondition("unpin: object '" + key + "' is not pinned");
    --o->pins;
    return Status::OK();
  });
}

Future<void> StoreImpl::remove_async(const std::string& key) {
  return run_op(true, [=, this]() -> Status {
    ObjPtr o = lock_live(key);
    if (!o) return missing(key);
    std::unique_lock<IoLock> held(o->io, std::adopt_lock);
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

Status StoreImpl::hold(const std::vector<std::string>& keys) {
  STRATA_RETURN_IF_ERROR(begin_op(true));
  {
    std::lock_guard<std::mutex> lk(mu_);
    held_.insert(keys.begin(), keys.end());
  }
  end_op();
  return Status::OK();
}

void StoreImpl::release(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& k : keys) held_.erase(k);
}

Status StoreImpl::flush_impl(const std::vector<std::string>* only) {
  // The versions concerned (under mu_): every live one not held, or those of `only`.
  auto concerned_locked = [&] {
    std::vector<ObjPtr> v;
    if (only == nullptr) {
      for (auto& [k, o] : objects_) {
        if (!held_.count(k)) v.push_back(o);
      }
    } else {
      for (const auto& k : std::set<std::string>(only->begin(), only->end())) {
        auto it = objects_.find(k);
        if (it != objects_.end()) v.push_back(it->second);
      }
    }
    return v;
  };
  // 1. Write back every dirty memory copy (each under its own lock). One that cannot be
  //    written (e.g. the NVMe budget is full) does not stop the others, nor the commit of
  //    everything written: the first such error is returned after the commit.
  Status first_error;
  std::vector<ObjPtr> snapshot;
  {
    std::lock_guard<std::mutex> lk(mu_);
    snapshot = concerned_locked();
  }
  for (auto& o : snapshot) {
    bool dirty;
    {
      std::lock_guard<std::mutex> lk(mu_);
      dirty = o->dirty && o->live;
    }
    if (!dirty) continue;
    std::unique_lock<IoLock> held(o->io);
    uint8_t* mem;
    bool on_dev;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!o->dirty || !o->live) continue;
      mem = static_cast<uint8_t*>(o->mem());
      on_dev = o->on_device;
    }
    auto l = write_layout(o->key, mem, o->nbytes, o->first_dir, on_dev, o->chunk);
    if (!l.ok()) {
      if (first_error.ok()) first_error = l.status();
      continue;
    }
    counters_.writebacks.add(1);
    counters_.writeback_bytes.add(o->nbytes);
    std::lock_guard<std::mutex> lk(mu_);
    o->current = *l;
    o->dirty = false;
  }
  // 2. Under mu_, one batch of every concerned live version whose NVMe copy the catalog
  //    does not name yet. Keys with a commit in flight are skipped: that commit (a newer
  //    put or a remove) supersedes this version and is ordered after it anyway.
  std::vector<catalog::Op> ops;
  std::vector<std::pair<std::string, LayoutPtr>> updates;
  Future<void> f;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& o : concerned_locked()) {
      const std::string& key = o->key;
      auto it = durable_.find(key);
      if (!o->live || !o->current || o->dirty || inflight_.count(key) ||
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
