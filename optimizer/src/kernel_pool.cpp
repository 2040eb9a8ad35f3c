// The update kernels' worker pool (see kernel_pool.hpp): a base ThreadPool bound through
// the store's Topology.
#include "strata/optimizer/kernel_pool.hpp"

#include <algorithm>
#include <atomic>
#include <string>

namespace strata::optimizer {

Result<std::unique_ptr<ThreadPool>> make_kernel_pool(const KernelPoolOptions& options,
                                                     const Topology& topology,
                                                     KernelPoolPlacement* placement) {
  if (options.num_threads < 0) {
    return invalid_argument("kernel threads: num_threads must be >= 0, got " +
                            std::to_string(options.num_threads));
  }
  KernelPoolPlacement where;
  where.numa_node = options.numa_node;
  int cores = topology.num_cores();
  if (options.numa_node >= 0) {
    const NumaNodeInfo* node = topology.numa_node(options.numa_node);
    if (node == nullptr && topology.is_this_system()) {
      std::string known;
      for (const auto& n : topology.numa_nodes()) {
        known += (known.empty() ? "" : ", ") + std::to_string(n.os_index);
      }
      return invalid_argument("kernel threads: NUMA node " + std::to_string(options.numa_node) +
                              " does not exist (this machine has " +
                              std::to_string(topology.numa_nodes().size()) + " node(s): " +
                              known + ")");
    }
    if (node != nullptr) {
      where.cpus = node->cpus;
      cores = node->cores;
    }
  }
  const int n = options.num_threads > 0 ? options.num_threads : std::max(1, cores);
  const bool bind = !where.cpus.empty() && topology.is_this_system();
  auto bound = std::make_shared<std::atomic<int>>(0);
  ThreadPool::StartHook hook;
  if (bind) {
    hook = [&topology, cpus = where.cpus, bound](int) {
      if (topology.bind_thread_to_cpus(cpus).ok()) bound->fetch_add(1);
    };
  }
  STRATA_ASSIGN_OR_RETURN(auto pool, ThreadPool::create(n, std::move(hook)));
  where.bound = bind && bound->load() == n;  // create() returns after every hook ran
  if (placement != nullptr) *placement = std::move(where);
  return pool;
}

Result<std::unique_ptr<ThreadPool>> make_kernel_pool(const KernelPoolOptions& options,
                                                     KernelPoolPlacement* placement) {
  STRATA_ASSIGN_OR_RETURN(auto topology, Topology::system());
  return make_kernel_pool(options, *topology, placement);
}

}  // namespace strata::optimizer
