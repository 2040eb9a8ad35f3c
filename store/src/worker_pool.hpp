// strata::store (private) — the store's worker threads: a FIFO queue of tasks run by a
// fixed number of threads (StoreOptions::worker_threads).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace strata::store_detail {

/// \threadsafety submit() is safe to call concurrently; start() and stop() once each, from
/// one thread. stop() runs the tasks already queued, then joins the threads.
class WorkerPool {
 public:
  void start(uint32_t n) {
    for (uint32_t i = 0; i < n; ++i) threads_.emplace_back([this] { loop(); });
  }
  void submit(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      q_.push_back(std::move(f));
    }
    cv_.notify_one();
  }
  void stop() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> f;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
        if (q_.empty()) return;
        f = std::move(q_.front());
        q_.pop_front();
      }
      f();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
};

}  // namespace strata::store_detail
