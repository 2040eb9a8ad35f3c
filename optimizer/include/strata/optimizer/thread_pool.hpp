// strata::optimizer — a persistent worker pool bound to the cores of one NUMA node.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "strata/base/status.hpp"

namespace strata::optimizer {

/// Options of ThreadPool::create().
struct ThreadPoolOptions {
  /// Worker threads. 0 (default) = one per core of `numa_node` (all cores when -1).
  int num_threads = 0;
  /// NUMA node whose cores the workers are bound to (hwloc logical index). -1 (default) =
  /// no binding (the workers may run anywhere).
  int numa_node = -1;
};

/// A fixed set of worker threads that run parallel_for() bodies. Created once (by an
/// optimizer) and reused for every step, so no thread is created on the hot path.
/// \threadsafety parallel_for() may be called from any thread; concurrent calls are
///     serialized. The pool must outlive every call into it.
class ThreadPool {
 public:
  /// Starts the workers (bound with hwloc to the cores of options.numa_node).
  /// \error InvalidArgument for num_threads < 0 or a numa_node the machine does not have
  ///     (the message names the node and how many there are); ResourceExhausted when a
  ///     thread cannot be started; Internal when hwloc cannot load the topology.
  static Result<std::unique_ptr<ThreadPool>> create(const ThreadPoolOptions& options = {});

  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  /// Number of workers (>= 1).
  int num_threads() const;
  /// The NUMA node the workers are bound to, -1 when unbound.
  int numa_node() const;
  /// True when binding the workers to the node's cores succeeded (false when unbound or
  /// when the OS refused, e.g. in a restricted container; the pool works either way).
  bool bound() const;

  /// Splits [0, num_items) into num_threads() contiguous ranges (worker w gets
  /// [w*num_items/T, (w+1)*num_items/T)) and runs fn(begin, end) for each non-empty range
  /// on the workers; blocks until all are done. fn must not throw and must not call
  /// parallel_for on the same pool.
  void parallel_for(size_t num_items, const std::function<void(size_t, size_t)>& fn);

 private:
  struct Impl;
  explicit ThreadPool(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::optimizer
