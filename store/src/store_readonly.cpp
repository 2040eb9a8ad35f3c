// strata::store (private) — a read-only open beside another process's writer. The writer
// may create, replace or remove keys (and reuse their extents) at any time; this open's
// object table is a cached view of the committed catalog, which the catch-up step below
// refreshes: at the start of stat, contains, list and verify, and when a read of a version
// fails with NotFound or DataLoss (the writer may have replaced it since).
#include <unordered_set>

#include "store_impl.hpp"

namespace strata::store_detail {

bool StoreImpl::install_row_locked(const catalog::ObjectRow& row) const {
  ObjPtr o = obj_from_row(row, {}, false);
  for (const auto& c : *o->current) {
    if (c.ext->dir >= files_.size() || !files_[c.ext->dir]) {
      o->damage = "object '" + row.key + "' has a chunk in directory " +
                  std::to_string(c.ext->dir) + ", whose data file this open has not";
    }
  }
  auto it = objects_.find(row.key);
  if (it != objects_.end() && it->second->row_hash == o->row_hash) return false;  // same row
  objects_[row.key] = std::move(o);
  return true;
}

Result<bool> StoreImpl::catch_up(const std::string& key, const ObjPtr& seen) const {
  if (!read_only_) return false;
  std::lock_guard<std::mutex> rl(refresh_mu_);
  STRATA_ASSIGN_OR_RETURN(auto row, catalog_->load_one(key));
  std::lock_guard<std::mutex> lk(mu_);
  auto it = objects_.find(key);
  const ObjPtr& now = it == objects_.end() ? nullptr : it->second;
  if (now != seen) return true;  // another thread caught up already
  if (!row) {
    if (!seen) return false;
    objects_.erase(it);
    return true;
  }
  return install_row_locked(*row);
}

Status StoreImpl::catch_up_prefix(const std::string& prefix) const {
  if (!read_only_) return Status::OK();
  std::lock_guard<std::mutex> rl(refresh_mu_);
  STRATA_ASSIGN_OR_RETURN(auto rows, catalog_->load_all(prefix));
  std::lock_guard<std::mutex> lk(mu_);
  std::unordered_set<std::string> present;
  for (const auto& row : rows) {
    present.insert(row.key);
    install_row_locked(row);
  }
  for (auto it = objects_.lower_bound(prefix); it != objects_.end();) {
    if (it->first.compare(0, prefix.size(), prefix) != 0) break;
    it = present.count(it->first) ? std::next(it) : objects_.erase(it);
  }
  return Status::OK();
}

namespace {
/// A read-only open retries an attempt that failed with NotFound or DataLoss (at most 8
/// times) when the key's catalog row changed since.
bool may_retry(const Status& st, int retries) {
  return retries < 8 && (st.code() == StatusCode::kDataLoss || st.code() == StatusCode::kNotFound);
}
}  // namespace

Future<void> StoreImpl::retry_after_catch_up(
    const std::string& key, const ObjPtr& seen,
    const std::function<Future<void>(const ObjPtr&)>& attempt, int retries,
    const Result<void>& r) {
  if (!may_retry(r.status(), retries)) return make_ready_future(r);
  return pool_->async([this, key, o = seen, attempt, retries, st = r.status()]() -> Future<void> {
    auto changed = catch_up(key, o);
    if (!changed.ok() || !*changed) return make_ready_future(Result<void>(st));
    return with_current_object_async(key, attempt, retries + 1);
  });
}

}  // namespace strata::store_detail
