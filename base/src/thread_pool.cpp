// ThreadPool: worker threads fed from a FIFO queue, plus one-range-per-worker parallel_for.
#include "strata/base/thread_pool.hpp"

#include <string>
#include <system_error>

namespace strata {

namespace {
// The pool and index of the calling worker thread (null / -1 outside any pool).
thread_local const ThreadPool* tls_pool = nullptr;
thread_local int tls_index = -1;
}  // namespace

Result<std::unique_ptr<ThreadPool>> ThreadPool::create(int num_threads, StartHook on_start) {
  if (num_threads < 1) {
    return invalid_argument("ThreadPool: num_threads must be >= 1, got " +
                            std::to_string(num_threads));
  }
  std::unique_ptr<ThreadPool> pool(new ThreadPool());
  // The hook is shared by every worker and outlives their start: create() waits for them.
  auto hook = std::make_shared<StartHook>(std::move(on_start));
  pool->num_threads_ = num_threads;
  try {
    pool->workers_.reserve(static_cast<size_t>(num_threads));
    for (int i = 0; i < num_threads; ++i) {
      ThreadPool* raw = pool.get();
      pool->workers_.emplace_back([raw, i, hook] { raw->run(i, *hook); });
    }
  } catch (const std::system_error& e) {
    pool->shutdown();
    return resource_exhausted(std::string("ThreadPool: cannot start a worker thread: ") + e.what(),
                              e.code().value());
  }
  std::unique_lock<std::mutex> lk(pool->mu_);
  pool->done_cv_.wait(lk, [&] { return pool->started_ == num_threads; });
  lk.unlock();
  return pool;
}

ThreadPool::~ThreadPool() { shutdown(); }

int ThreadPool::worker_index() const noexcept { return tls_pool == this ? tls_index : -1; }

void ThreadPool::submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    STRATA_CHECK_MSG(!joined_, "ThreadPool::submit() after shutdown()");
    queue_.push_back(std::move(task));
  }
  work_cv_.notify_one();
}

void ThreadPool::parallel_for(size_t num_items, const std::function<void(size_t, size_t)>& fn) {
  if (num_items == 0) return;
  STRATA_CHECK_MSG(worker_index() < 0, "ThreadPool::parallel_for() called from its own worker");
  std::lock_guard<std::mutex> call(call_mu_);
  std::unique_lock<std::mutex> lk(mu_);
  STRATA_CHECK_MSG(!stop_, "ThreadPool::parallel_for() after shutdown()");
  body_ = &fn;
  num_items_ = num_items;
  pending_ = num_threads();
  ++generation_;
  work_cv_.notify_all();
  done_cv_.wait(lk, [&] { return pending_ == 0; });
  body_ = nullptr;
}

void ThreadPool::shutdown() {
  STRATA_CHECK_MSG(worker_index() < 0, "ThreadPool::shutdown() called from its own worker");
  std::lock_guard<std::mutex> once(shutdown_mu_);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (joined_) return;
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) {
    if (t.joinable()) t.join();
  }
  // A task that raced the last worker's exit runs here rather than being lost.
  for (;;) {
    std::function<void()> task;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (queue_.empty()) {
        joined_ = true;
        return;
      }
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

void ThreadPool::run(int index, const StartHook& on_start) {
  tls_pool = this;
  tls_index = index;
  if (on_start) on_start(index);
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++started_;
  }
  done_cv_.notify_all();
  const size_t nthreads = static_cast<size_t>(num_threads_);
  uint64_t seen = 0;
  for (;;) {
    std::unique_lock<std::mutex> lk(mu_);
    work_cv_.wait(lk, [&] { return generation_ != seen || !queue_.empty() || stop_; });
    if (generation_ != seen) {  // a parallel_for() range first: its caller is blocked on it
      seen = generation_;
      const auto* body = body_;
      const size_t n = num_items_;
      lk.unlock();
      const size_t begin = n * static_cast<size_t>(index) / nthreads;
      const size_t end = n * static_cast<size_t>(index + 1) / nthreads;
      if (begin < end) (*body)(begin, end);
      lk.lock();
      if (--pending_ == 0) done_cv_.notify_all();
      continue;
    }
    if (queue_.empty()) return;  // stop_ and drained
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    lk.unlock();
    task();
  }
}

}  // namespace strata
