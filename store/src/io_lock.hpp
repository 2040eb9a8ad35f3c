// strata::store (private) — IoLock, the reader/writer lock of one object version (Obj::io).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace strata::store_detail {

/// A reader/writer lock that any thread may release: a read or write_range takes it shared
/// on the worker that starts the operation and releases it in the operation's last
/// continuation, on whichever thread completes the I/O (a std::shared_mutex must be
/// unlocked by the thread that locked it). Readers are preferred, as with glibc's
/// std::shared_mutex: a shared lock waits only while the lock is held exclusively.
/// Meets Lockable and SharedLockable (std::unique_lock, std::shared_lock).
/// \threadsafety every member may be called from any thread.
class IoLock {
 public:
  void lock() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return !writer_ && readers_ == 0; });
    writer_ = true;
  }
  bool try_lock() {
    std::lock_guard<std::mutex> lk(mu_);
    if (writer_ || readers_ > 0) return false;
    writer_ = true;
    return true;
  }
  void unlock() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      writer_ = false;
    }
    cv_.notify_all();
  }
  void lock_shared() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return !writer_; });
    ++readers_;
  }
  bool try_lock_shared() {
    std::lock_guard<std::mutex> lk(mu_);
    if (writer_) return false;
    ++readers_;
    return true;
  }
  void unlock_shared() {
    bool last;
    {
      std::lock_guard<std::mutex> lk(mu_);
      last = --readers_ == 0;
    }
    if (last) cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t readers_ = 0;
  bool writer_ = false;
};

}  // namespace strata::store_detail
