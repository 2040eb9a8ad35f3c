// NUMA placement of a store: which node's CPUs and memory serve each NVMe directory, the
// host tier and the GPU.
//
// Rule (as ZeRO-Infinity and KvikIO place their bounce buffers): the pinned staging memory
// and the I/O threads serving a directory live on the node nearest the directory's block
// device, so DMA from the drive lands in local memory and completions run on local CPUs.
// The host tier's pinned memory lives on the node nearest the GPU when the device tier is
// in use (host <-> HBM copies are the tier's hot path), else on the node most of the
// directories are nearest to. A node that cannot be known (tmpfs, a virtio disk without
// NUMA information on a multi-node machine) is -1: no binding, memory and threads float.
#pragma once

#include <string>
#include <vector>

#include "strata/base/status.hpp"
#include "strata/store/topology.hpp"

namespace strata {

/// StoreOptions::numa_node values besides a node number.
inline constexpr int kNumaAuto = -1;  ///< place by the topology (the rule above)
inline constexpr int kNumaNone = -2;  ///< bind nothing

/// Where a store's pinned memory and I/O threads go. Node numbers are the kernel's; -1 = no
/// binding.
struct StorePlacement {
  std::vector<std::string> dir_devices;  ///< block device behind each directory ("" none)
  std::vector<int> dir_nodes;            ///< node serving each directory (staging, I/O threads)
  int gpu_node = -1;                     ///< node nearest the store's GPU (-1: none/unknown)
  int host_node = -1;                    ///< node of the host tier's pinned memory
  /// The distinct values of dir_nodes in order of first appearance: one I/O engine and one
  /// staging pool each.
  std::vector<int> groups() const;
  /// One line per directory and tier, e.g. "nvme dir /mnt/a (nvme0n1): node 0".
  std::string describe(const std::vector<std::string>& dirs) const;
};

/// OK when `numa_node` is kNumaAuto, kNumaNone or a node of `topo`.
/// \error InvalidArgument "StoreOptions.numa_node=N: ..." otherwise.
Status check_numa_node_option(const Topology& topo, int numa_node);

/// Plans the placement for NVMe directories on `dir_devices` (block device names as in
/// Topology::block_devices(), e.g. "nvme1n1"; "" when a directory is on no block device)
/// and the GPU `cuda_index` (-1: no device tier).
/// \param numa_node kNumaAuto: by the rule above; kNumaNone: everything -1; a node number:
///     everything on that node.
/// \error InvalidArgument for a node number the topology lacks or another negative value.
/// Thread-safety: pure; any thread.
Result<StorePlacement> plan_store_placement(const Topology& topo,
                                            const std::vector<std::string>& dir_devices,
                                            int cuda_index, int numa_node);

/// plan_store_placement() for directories of the running machine: the block device behind
/// each is found with Topology::path_info() (a path on no block device: ""; its node -1
/// unless the machine has a single node).
/// \error as plan_store_placement(); errno_status naming a directory path_info cannot stat.
Result<StorePlacement> plan_store_placement_for_paths(const Topology& topo,
                                                      const std::vector<std::string>& dirs,
                                                      int cuda_index, int numa_node);

}  // namespace strata
