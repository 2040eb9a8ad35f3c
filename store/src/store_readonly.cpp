// strata::store (private) — a read-only open beside another process's writer. The writer
// may create, replace or remove keys (and reuse their extents) at any time; this open's
// object table is a view of the committed catalog, refreshed from it here.
#include <unordered_set>

#include "store_impl.hpp"

namespace strata::store_detail {

Result<bool> StoreImpl::refresh_key(const std::string& key, const ObjPtr& seen) {
  std::lock_guard<std::mutex> rl(refresh_mu_);
  STRATA_ASSIGN_OR_RETURN(auto row, catalog_->load_one(key));
  std::lock_guard<std::mutex> lk(mu_);
  auto it = objects_.find(key);
  const ObjPtr& now = it == objects_.end() ? nullptr : it->second;
  if (now != seen) return true;  // another thread refreshed it already
  if (!row) {
    if (!seen) return false;
    objects_.erase(it);
    return true;
  }
  ObjPtr o = refreshed_obj(*row);
  if (seen && seen->row_hash == o->row_hash) return false;  // the same committed row
  objects_[key] = o;
  return true;
}

ObjPtr StoreImpl::refreshed_obj(const catalog::ObjectRow& row) {
  ObjPtr o = obj_from_row(row, {}, false);
  for (const auto& c : *o->current) {
    if (c.ext->dir >= files_.size() || !files_[c.ext->dir]) {
      o->damage = "object '" + row.key + "' has a chunk in directory " +
                  std::to_string(c.ext->dir) + ", whose data file this open has not";
    }
  }
  return o;
}

Status StoreImpl::refresh_prefix(const std::string& prefix) {
  std::lock_guard<std::mutex> rl(refresh_mu_);
  STRATA_ASSIGN_OR_RETURN(auto rows, catalog_->load_all(prefix));
  std::lock_guard<std::mutex> lk(mu_);
  std::unordered_set<std::string> present;
  for (const auto& row : rows) {
    present.insert(row.key);
    ObjPtr o = refreshed_obj(row);
    auto it = objects_.find(row.key);
    if (it != objects_.end() && it->second->row_hash == o->row_hash) continue;
    objects_[row.key] = std::move(o);
  }
  for (auto it = objects_.lower_bound(prefix); it != objects_.end();) {
    if (it->first.compare(0, prefix.size(), prefix) != 0) break;
    it = present.count(it->first) ? std::next(it) : objects_.erase(it);
  }
  return Status::OK();
}

Status StoreImpl::with_current_object(const std::string& key,
                                      const std::function<Status(const ObjPtr&)>& attempt) {
  for (int i = 0;; ++i) {
    ObjPtr o = find(key);
    Status st = o ? attempt(o) : not_found("object '" + key + "' is not in store " + opts_.path);
    if (!read_only_ || i == 8 ||
        (st.code() != StatusCode::kDataLoss && st.code() != StatusCode::kNotFound)) {
      return st;
    }
    auto changed = refresh_key(key, o);
    if (!changed.ok() || !*changed) return st;
  }
}

}  // namespace strata::store_detail
