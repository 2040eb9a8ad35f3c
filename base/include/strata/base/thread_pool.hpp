// strata::base — ThreadPool: the one worker pool / task queue of the library.
//
// A fixed set of worker threads fed from one FIFO queue (submit(), async()) and able to run
// one data-parallel body split evenly across every worker (parallel_for()). Used by the store
// (its I/O workers), the communicators (one thread: operations run in submission order) and
// the optimizer (parallel_for over a step's elements, workers bound to a NUMA node through
// the start hook). Binding policy lives with the caller: base knows nothing of hwloc.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "strata/base/future.hpp"
#include "strata/base/status.hpp"

namespace strata {

/// A fixed set of worker threads with a FIFO task queue and a parallel_for().
///
/// Tasks (submit(), async()) are taken from the queue in submission order by whichever worker
/// is free; with one worker they therefore also *run* in submission order, one at a time.
/// parallel_for() hands every worker its own contiguous range; a worker busy with a queued task
/// takes its range when that task returns.
///
/// Tasks and parallel_for() bodies must not throw (an escaping exception terminates the
/// process).
/// \threadsafety submit(), async() and parallel_for() may be called concurrently from any
///     thread; concurrent parallel_for() calls are serialized. Tasks may submit further tasks.
class ThreadPool {
 public:
  /// Called once on each worker thread, with the worker's index in [0, num_threads()),
  /// before that worker runs anything (e.g. to bind the thread to cores).
  using StartHook = std::function<void(int worker_index)>;

  /// Starts `num_threads` workers; runs `on_start` (when set) on each of them and returns
  /// once every worker has returned from it.
  /// \error InvalidArgument for num_threads < 1; ResourceExhausted when the OS refuses a
  ///     thread (the workers already started are joined first).
  static Result<std::unique_ptr<ThreadPool>> create(int num_threads, StartHook on_start = {});

  /// Same as shutdown(): runs every queued task, then joins the workers.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  /// Number of workers (>= 1).
  int num_threads() const noexcept { return num_threads_; }

  /// Index in [0, num_threads()) of the calling thread when it is a worker of *this* pool,
  /// -1 otherwise.
  int worker_index() const noexcept;

  /// Queues `task` to run once on a worker (FIFO). Submitting after shutdown() has returned
  /// is a bug (aborts); tasks may still submit while the pool drains.
  void submit(std::function<void()> task);

  /// Queues `fn` like submit() and returns a future of its outcome. `fn` takes no argument
  /// and returns Status (-> Future<void>), Result<U> (-> Future<U>), void (-> an OK
  /// Future<void>), Future<U> (-> Future<U>, completing with that future) or a plain U
  /// (-> Future<U>). `fn` must be copyable (it is held in a std::function).
  template <class F>
  auto async(F fn);

  /// Splits [0, num_items) into num_threads() contiguous ranges (worker w gets
  /// [w*num_items/T, (w+1)*num_items/T), T = num_threads()) and runs fn(begin, end) on
  /// worker w for each non-empty range; blocks until all are done. num_items == 0 returns at
  /// once without calling fn. Must not be called from a worker of this pool (aborts: it
  /// would wait on itself).
  void parallel_for(size_t num_items, const std::function<void(size_t, size_t)>& fn);

  /// Stops accepting work once the queue is empty: runs every queued task (and whatever
  /// those tasks submit), then joins the workers. Idempotent; must not be called from a
  /// worker of this pool (aborts).
  void shutdown();

 private:
  ThreadPool() = default;
  void run(int index, const StartHook& on_start);

  int num_threads_ = 0;  // set before any worker starts
  std::vector<std::thread> workers_;
  std::mutex call_mu_;  // serializes parallel_for callers
  std::mutex shutdown_mu_;  // serializes shutdown callers

  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;    // drain and exit
  bool joined_ = false;  // workers are gone: submit() is a bug
  int started_ = 0;      // workers that returned from the start hook
  // The parallel_for() in progress: a new generation wakes every worker once.
  uint64_t generation_ = 0;
  const std::function<void(size_t, size_t)>* body_ = nullptr;
  size_t num_items_ = 0;
  int pending_ = 0;  // workers yet to finish their range
};

template <class F>
auto ThreadPool::async(F fn) {
  using R = std::remove_cvref_t<std::invoke_result_t<F&>>;
  using U = typename detail::ContinuationValue<R>::type;
  auto p = std::make_shared<Promise<U>>();
  Future<U> f = p->future();
  submit([p, fn = std::move(fn)]() mutable { detail::complete_with(p, fn); });
  return f;
}

}  // namespace strata
