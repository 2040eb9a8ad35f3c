// strata::store — the thread-pool pread/pwrite engine (EngineKind::kThreads): used where
// io_uring is unavailable (seccomp, old kernels) or when selected. queue_depth threads (at
// most 64) per worker take pieces from one queue and run them with blocking pread/pwrite.
#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "io_common.hpp"

namespace strata::io {
namespace {

class ThreadsEngine final : public EngineBase {
 public:
  explicit ThreadsEngine(const IoEngineOptions& o) : EngineBase(o) {
    options_.kind = EngineKind::kThreads;
    const uint32_t n = std::min<uint32_t>(64, std::max<uint32_t>(1, o.queue_depth * o.workers));
    threads_.reserve(n);
    auto cpus = numa_node_cpus(o.numa_node);  // checked by IoEngine::create
    cpus_ = cpus.ok() ? *cpus : std::vector<int>{};
    for (uint32_t i = 0; i < n; ++i) {
      threads_.emplace_back([this] {
        bind_engine_thread(cpus_, options_.numa_node);
        loop();
      });
    }
  }

  ~ThreadsEngine() override {
    drain();
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  EngineKind kind() const override { return EngineKind::kThreads; }
  Status register_buffer(void*, uint64_t) override { return Status::OK(); }
  Status unregister_buffer(void*) override { return Status::OK(); }

 protected:
  void enqueue(Request* r) override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto& p : r->pieces) queue_.push_back(&p);
    }
    if (r->pieces.size() == 1) {
      cv_.notify_one();
    } else {
      cv_.notify_all();
    }
  }

 private:
  void loop() {
    for (;;) {
      Piece* p;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_ and nothing left
        p = queue_.front();
        queue_.pop_front();
      }
      run_piece_sync(*p, &occupancy_);
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Piece*> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
  std::vector<int> cpus_;  // of options_.numa_node; empty: unbound
};

}  // namespace

std::shared_ptr<IoEngine> make_threads_engine(const IoEngineOptions& options) {
  return std::make_shared<ThreadsEngine>(options);
}

}  // namespace strata::io
