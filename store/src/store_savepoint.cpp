// strata::store (private) — savepoints (store.hpp, Savepoint): the NVMe layouts of some
// objects held at one moment, and rollback() to them. A write_range() of an NVMe-only object
// installs a new layout whose rewritten chunks are fresh extents (copy-on-write); holding
// the old layout keeps its extents allocated, so restoring it is a pointer swap.
#include <algorithm>
#include <set>
#include <shared_mutex>

#include "store_impl.hpp"

namespace strata::store_detail {

namespace {

struct SavedVersions {
  const StoreImpl* store = nullptr;
  struct Entry {
    ObjPtr obj;
    LayoutPtr layout;
  };
  std::vector<Entry> entries;  // same order as Savepoint::keys()
};

/// Exclusive io locks of several objects, taken in key order (no lock-order inversion
/// between two multi-object callers), released in reverse.
class ExclusiveLocks {
 public:
  ~ExclusiveLocks() {
    for (auto it = held_.rbegin(); it != held_.rend(); ++it) (*it)->io.unlock();
  }
  void lock(const ObjPtr& o) {
    o->io.lock();
    held_.push_back(o);
  }

 private:
  std::vector<ObjPtr> held_;
};

}  // namespace

Result<Savepoint> StoreImpl::savepoint(const std::vector<std::string>& keys) {
  STRATA_RETURN_IF_ERROR(begin_op(true));
  struct End {
    const StoreImpl* s;
    ~End() { s->end_op(); }
  } end{this};
  auto saved = std::make_shared<SavedVersions>();
  saved->store = this;
  std::set<std::string> seen;
  for (const auto& key : keys) {
    if (!seen.insert(key).second) {
      return invalid_argument("savepoint: key '" + key + "' is given twice");
    }
    ObjPtr o = lock_live_shared(key);
    if (!o) return missing(key).with_context("savepoint");
    std::shared_lock<IoLock> held(o->io, std::adopt_lock);
    STRATA_RETURN_IF_ERROR(check_damage(*o));
    std::lock_guard<std::mutex> lk(mu_);
    if (o->on_host || o->on_device || !o->current) {
      return failed_precondition("savepoint: object '" + key + "' has a " +
                                 std::string(tier_name(o->tier())) +
                                 " copy; savepoints hold NVMe-only objects");
    }
    saved->entries.push_back({o, o->current});
  }
  Savepoint sp;
  sp.keys_ = keys;
  sp.state_ = std::move(saved);
  return sp;
}

Status StoreImpl::rollback(const Savepoint& sp) {
  if (sp.empty()) return Status::OK();
  auto saved = std::static_pointer_cast<const SavedVersions>(sp.state_);
  if (!saved || saved->store != this) {
    return failed_precondition("rollback: the savepoint is of another store (this one: " +
                               opts_.path + ")");
  }
  STRATA_RETURN_IF_ERROR(begin_op(true));
  struct End {
    const StoreImpl* s;
    ~End() { s->end_op(); }
  } end{this};
  std::vector<size_t> order(saved->entries.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return sp.keys()[a] < sp.keys()[b]; });
  ExclusiveLocks locks;  // waits for write_range() calls in flight on these objects
  for (size_t i : order) locks.lock(saved->entries[i].obj);  // distinct keys (savepoint())
  // Every object checked before any is restored.
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (size_t i = 0; i < saved->entries.size(); ++i) {
      const auto& e = saved->entries[i];
      const std::string& key = sp.keys()[i];
      auto it = objects_.find(key);
      if (!e.obj->live || it == objects_.end() || it->second != e.obj) {
        return failed_precondition("rollback: object '" + key +
                                   "' was removed or replaced since the savepoint");
      }
      if (e.obj->on_host || e.obj->on_device) {
        return failed_precondition("rollback: object '" + key + "' got a " +
                                   std::string(tier_name(e.obj->tier())) +
                                   " copy since the savepoint");
      }
    }
    for (const auto& e : saved->entries) e.obj->current = e.layout;
  }
  return Status::OK();
}

}  // namespace strata::store_detail
