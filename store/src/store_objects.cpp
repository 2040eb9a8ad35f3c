// strata::store (private) — the object table: key -> live version, the lookup every read
// goes through, locking a live version, and the conversions between versions and catalog rows.
#include "checksum.hpp"
#include "store_damage.hpp"
#include "store_impl.hpp"

namespace strata::store_detail {

ObjPtr StoreImpl::find(const std::string& key) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = objects_.find(key);
  return it == objects_.end() ? nullptr : it->second;
}

ObjPtr StoreImpl::lock_live_as(const std::string& key, bool shared) {
  for (;;) {
    ObjPtr o = find(key);
    if (!o) return nullptr;
    shared ? o->io.lock_shared() : o->io.lock();
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (o->live) return o;
    }
    shared ? o->io.unlock_shared() : o->io.unlock();  // replaced meanwhile: look again
  }
}

Status StoreImpl::missing(const std::string& key) const {
  return not_found("object '" + key + "' is not in store " + opts_.path);
}

Status StoreImpl::check_damage(const Obj& o) const {
  if (o.damage.empty()) return Status::OK();
  return data_loss("store " + opts_.path + ": " + o.damage);
}

Future<void> StoreImpl::with_current_object_async(
    const std::string& key, std::function<Future<void>(const ObjPtr&)> attempt, int retries) {
  ObjPtr o = find(key);
  Future<void> f = o ? attempt(o) : make_ready_future(Result<void>(missing(key)));
  if (!read_only_) return f;  // no catch-up: the result stands
  return f.then([this, key, o, attempt, retries](const Result<void>& r) -> Future<void> {
    return retry_after_catch_up(key, o, attempt, retries, r);
  });
}

StoreImpl::Copies StoreImpl::copies(const Obj& o) const {
  std::lock_guard<std::mutex> lk(mu_);
  return Copies{static_cast<uint8_t*>(o.mem()), o.on_device, o.on_host || o.on_device, o.current};
}

void StoreImpl::install_locked(const ObjPtr& obj) {
  auto it = objects_.find(obj->key);
  if (it != objects_.end()) {
    it->second->live = false;
    lru_remove_locked(it->second);
    it->second = obj;
  } else {
    objects_.emplace(obj->key, obj);
  }
  obj->live = true;
  lru_add_locked(obj);
}

ObjPtr StoreImpl::obj_from_row(const catalog::ObjectRow& r, const std::vector<bool>& adopt,
                               bool alloc) const {
  auto o = std::make_shared<Obj>();
  o->key = r.key;
  o->desc = TensorDesc{r.dtype, r.shape};
  o->nbytes = r.nbytes;
  o->first_dir = r.first_dir < dirs_.size() ? r.first_dir : 0;
  // A damaged row makes only that object unreadable (DataLoss), never the whole store.
  o->damage = row_damage(r, dirs_.size(), chunk_bytes_);
  o->chunk = row_chunk_bytes(r, chunk_bytes_);
  auto l = std::make_shared<Layout>();
  l->chunk_bytes = o->chunk;
  for (size_t j = 0; j < r.chunks.size(); ++j) {
    const auto& c = r.chunks[j];
    if (j < adopt.size() && !adopt[j]) continue;  // damaged: outside the store or overlapping
    std::shared_ptr<Extent> e;
    if (alloc) {
      e = alloc_->adopt(c.dir, c.offset, align_up(c.nbytes, kAlign));
    } else {
      e = std::make_shared<Extent>();  // no allocator: never released into a free list
      e->dir = c.dir;
      e->offset = c.offset;
      e->len = align_up(c.nbytes, kAlign);
    }
    l->push_back(ChunkRef{std::move(e), c.nbytes, c.checksum});
  }
  o->current = l;
  // Identity of the row as committed (read-only refresh compares rows, not layouts: a
  // layout without the chunks the overlap check refused still names the same row).
  std::string raw;
  auto add = [&raw](uint64_t v) { raw.append(reinterpret_cast<const char*>(&v), sizeof v); };
  add(static_cast<uint64_t>(r.dtype));
  add(r.shape.size());
  for (int64_t x : r.shape) add(static_cast<uint64_t>(x));
  add(r.nbytes);
  add(r.first_dir);
  for (const auto& c : r.chunks) {
    add(c.dir);
    add(c.offset);
    add(c.nbytes);
    add(c.checksum);
  }
  raw += r.damage;
  o->row_hash = xxh3_64(raw.data(), raw.size()) | 1;  // never 0
  return o;
}

catalog::ObjectRow StoreImpl::row_of(const Obj& o, const Layout& l) const {
  catalog::ObjectRow r;
  r.key = o.key;
  r.dtype = o.desc.dtype;
  r.shape = o.desc.shape;
  r.nbytes = o.nbytes;
  r.first_dir = o.first_dir;
  for (const auto& c : l) r.chunks.push_back({c.ext->dir, c.ext->offset, c.nbytes, c.checksum});
  return r;
}

}  // namespace strata::store_detail
