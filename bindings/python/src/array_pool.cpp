#include "array_pool.hpp"

#include <pthread.h>

#include <cstdlib>

namespace strata::py_bindings {

ArrayPool& ArrayPool::instance() {
  // Leaked on purpose: buffers may be freed by C++ exit handlers after static destruction.
  static ArrayPool* pool = [] {
    auto* p = new ArrayPool();
    // fork() (e.g. a DataLoader's workers) while another thread holds the lock would
    // leave the child's pool locked forever: the lock is held across the fork, as glibc's
    // malloc does with its own.
    pthread_atfork([] { instance().mu_.lock(); }, [] { instance().mu_.unlock(); },
                   [] { instance().mu_.unlock(); });
    return p;
  }();
  return *pool;
}

void* ArrayPool::take(uint64_t bytes) {
  if (bytes < kMinBytes) return nullptr;
  std::lock_guard<std::mutex> lk(mu_);
  for (auto it = held_.rbegin(); it != held_.rend(); ++it) {
    if (it->first != bytes) continue;
    void* p = it->second;
    bytes_ -= bytes;
    held_.erase(std::next(it).base());
    ++hits_;
    return p;
  }
  ++misses_;
  return nullptr;
}

void ArrayPool::give(void* p, uint64_t bytes) {
  if (p == nullptr) return;
  std::list<std::pair<uint64_t, void*>> evicted;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (bytes >= kMinBytes && bytes <= capacity_) {
      held_.emplace_back(bytes, p);
      bytes_ += bytes;
      p = nullptr;
      evict_locked(evicted);
    }
  }
  std::free(p);
  for (auto& [n, q] : evicted) std::free(q);  // munmap outside the lock
}

void ArrayPool::reserve(int64_t delta) {
  std::list<std::pair<uint64_t, void*>> evicted;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (delta >= 0) {
      capacity_ += static_cast<uint64_t>(delta);
    } else {
      const uint64_t d = static_cast<uint64_t>(-delta);
      capacity_ = d >= capacity_ ? 0 : capacity_ - d;
    }
    evict_locked(evicted);
  }
  for (auto& [n, q] : evicted) std::free(q);
}

void ArrayPool::evict_locked(std::list<std::pair<uint64_t, void*>>& out) {
  while (bytes_ > capacity_ && !held_.empty()) {
    bytes_ -= held_.front().first;
    out.splice(out.end(), held_, held_.begin());
  }
}

ArrayPool::Stats ArrayPool::stats() {
  std::lock_guard<std::mutex> lk(mu_);
  return Stats{capacity_, bytes_, static_cast<uint64_t>(held_.size()), hits_, misses_};
}

}  // namespace strata::py_bindings
