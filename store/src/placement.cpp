// NUMA placement of a store (see placement.hpp).
#include "strata/store/placement.hpp"

#include <algorithm>
#include <map>

namespace strata {
namespace {

int single_node(const Topology& topo) {
  return topo.numa_nodes().size() == 1 ? topo.numa_nodes()[0].os_index : -1;
}

/// Fills gpu_node/host_node and applies `numa_node` to a placement whose dir_nodes are the
/// nearest nodes.
Result<StorePlacement> finish(const Topology& topo, StorePlacement p, int cuda_index,
                              int numa_node) {
  STRATA_RETURN_IF_ERROR(check_numa_node_option(topo, numa_node));
  if (cuda_index >= 0) {
    auto g = topo.numa_node_of_gpu(cuda_index);
    p.gpu_node = g.ok() ? *g : single_node(topo);
  }
  if (numa_node >= 0 || numa_node == kNumaNone) {
    const int n = numa_node >= 0 ? numa_node : -1;
    std::fill(p.dir_nodes.begin(), p.dir_nodes.end(), n);
    p.host_node = n;
    if (numa_node == kNumaNone) p.gpu_node = -1;
    return p;
  }
  if (p.gpu_node >= 0) {
    p.host_node = p.gpu_node;
    return p;
  }
  // The node most directories are nearest to; a tie goes to the lower node number.
  std::map<int, int> count;
  for (int n : p.dir_nodes) {
    if (n >= 0) ++count[n];
  }
  int best = -1, best_count = 0;
  for (const auto& [n, c] : count) {
    if (c > best_count) {
      best = n;
      best_count = c;
    }
  }
  p.host_node = best >= 0 ? best : single_node(topo);
  return p;
}

std::string node_text(int n) { return n >= 0 ? "node " + std::to_string(n) : "no binding"; }

}  // namespace

Status check_numa_node_option(const Topology& topo, int numa_node) {
  if (numa_node < kNumaNone) {
    return invalid_argument("StoreOptions.numa_node=" + std::to_string(numa_node) +
                            ": expected a node number, -1 (automatic) or -2 (none)");
  }
  if (numa_node >= 0 && topo.numa_node(numa_node) == nullptr) {
    return invalid_argument("StoreOptions.numa_node=" + std::to_string(numa_node) +
                            ": the machine has no NUMA node " + std::to_string(numa_node) +
                            " (" + std::to_string(topo.numa_nodes().size()) + " nodes)");
  }
  return Status::OK();
}

std::vector<int> StorePlacement::groups() const {
  std::vector<int> g;
  for (int n : dir_nodes) {
    if (std::find(g.begin(), g.end(), n) == g.end()) g.push_back(n);
  }
  return g;
}

std::string StorePlacement::describe(const std::vector<std::string>& dirs) const {
  std::string s;
  for (size_t i = 0; i < dir_nodes.size(); ++i) {
    const std::string dev = i < dir_devices.size() && !dir_devices[i].empty()
                                ? dir_devices[i]
                                : "no block device";
    s += "nvme dir " + (i < dirs.size() ? dirs[i] : std::to_string(i)) + " (" + dev +
         "): staging memory and I/O threads on " + node_text(dir_nodes[i]) + "\n";
  }
  s += "host tier: pinned memory on " + node_text(host_node);
  if (gpu_node >= 0) s += " (GPU on node " + std::to_string(gpu_node) + ")";
  return s;
}

Result<StorePlacement> plan_store_placement(const Topology& topo,
                                            const std::vector<std::string>& dir_devices,
                                            int cuda_index, int numa_node) {
  StorePlacement p;
  p.dir_devices = dir_devices;
  for (const auto& name : dir_devices) {
    int n = single_node(topo);
    if (!name.empty()) {
      auto r = topo.numa_node_of_block_device(name);
      if (r.ok() && *r >= 0) n = *r;
    }
    p.dir_nodes.push_back(n);
  }
  return finish(topo, std::move(p), cuda_index, numa_node);
}

Result<StorePlacement> plan_store_placement_for_paths(const Topology& topo,
                                                      const std::vector<std::string>& dirs,
                                                      int cuda_index, int numa_node) {
  StorePlacement p;
  for (const auto& d : dirs) {
    auto info = topo.path_info(d);
    if (!info.ok()) return info.status();
    p.dir_devices.push_back(info->device ? info->device->name : "");
    p.dir_nodes.push_back(info->numa_node);
  }
  return finish(topo, std::move(p), cuda_index, numa_node);
}

}  // namespace strata
