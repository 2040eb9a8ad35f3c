// strata::optimizer — the update kernels' worker threads: a base ThreadPool whose workers
// are bound to the CPUs of one NUMA node of the store's Topology.
//
// NUMA nodes are numbered as the store numbers them (Topology: the kernel's node numbers,
// hwloc "OS index", as StoreOptions::numa_node and numactl --cpunodebind=N), so one
// numa_node means the same node for the kernel threads and for the pinned memory of
// PinnedPool.
#pragma once

#include <memory>
#include <vector>

#include "strata/base/status.hpp"
#include "strata/base/thread_pool.hpp"
#include "strata/store/topology.hpp"

namespace strata::optimizer {

/// Options of make_kernel_pool().
struct KernelPoolOptions {
  /// Worker threads. 0 (default) = one per physical core of `numa_node` (of the machine
  /// when numa_node is -1).
  int num_threads = 0;
  /// Kernel node number (Topology's os_index) whose CPUs the workers are bound to; -1
  /// (default) = no binding (the workers may run anywhere).
  int numa_node = -1;
};

/// Where make_kernel_pool() put its workers.
struct KernelPoolPlacement {
  int numa_node = -1;     ///< KernelPoolOptions::numa_node
  /// The binding target: the node's CPUs (kernel CPU numbers, ascending) in the topology;
  /// empty when numa_node is -1 or the topology has no such node (or it has no CPUs).
  std::vector<int> cpus;
  /// Every worker was bound to `cpus`. False when unbound, when the topology is not this
  /// machine's (HWLOC_XMLFILE / HWLOC_SYNTHETIC: nothing is bound, as the store does), or
  /// when the OS refused (e.g. a restricted container); the pool works either way.
  bool bound = false;
};

/// Starts a base ThreadPool for apply_update(), init_states() and the gradient checks of
/// grad_utils.hpp, each worker bound (Topology::bind_thread_to_cpus) to the CPUs of
/// options.numa_node in `topology` before it runs anything. Fills *placement when given.
/// \error InvalidArgument for num_threads < 0, or (topology of this machine) a numa_node
///     the machine lacks, naming the node and the nodes there are; with a foreign topology
///     numa_node is not checked (nothing is bound); ResourceExhausted when a thread cannot
///     be started.
/// \threadsafety safe to call concurrently; the pool's own rules are base ThreadPool's.
Result<std::unique_ptr<ThreadPool>> make_kernel_pool(const KernelPoolOptions& options,
                                                     const Topology& topology,
                                                     KernelPoolPlacement* placement = nullptr);

/// make_kernel_pool() on Topology::system() (the topology the store places its data by).
/// \error as above; Internal when hwloc cannot load the topology.
Result<std::unique_ptr<ThreadPool>> make_kernel_pool(const KernelPoolOptions& options = {},
                                                     KernelPoolPlacement* placement = nullptr);

}  // namespace strata::optimizer
