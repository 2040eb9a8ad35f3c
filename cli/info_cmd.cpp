// `strata info [--path DIR ...] [--json] [--xml FILE | --synthetic DESC]`: the machine as
// strata sees it — NUMA nodes with their CPUs and memory, GPUs and block devices with their
// nearest NUMA node, the block device behind each path with its DIO alignment, and the
// kernel features the I/O engine and the pinned pool use (io_uring, huge pages, mlock), and
// whether the CUDA runtime and NCCL were loaded at run time, from which file, or why not.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "command.hpp"
#include "config_option.hpp"
#include "strata/base/gpu_libraries.hpp"
#include "strata/base/units.hpp"
#include "strata/store/gpu.hpp"
#include "strata/store/placement.hpp"
#include "strata/store/store.hpp"
#include "strata/store/topology.hpp"

namespace strata::cli {
namespace {

/// A run-time-loaded GPU library as JSON: loaded, path, version, error, attempts.
nlohmann::json library_json(const GpuLibraryInfo& lib) {
  return {{"loaded", lib.loaded},
          {"path", lib.loaded ? nlohmann::json(lib.path) : nlohmann::json(nullptr)},
          {"version", lib.loaded ? nlohmann::json(lib.version) : nlohmann::json(nullptr)},
          {"error", lib.loaded ? nlohmann::json(nullptr) : nlohmann::json(lib.error)},
          {"env_var", lib.env_var},
          {"attempts", lib.attempts}};
}

/// "  CUDA runtime: loaded /path (version 13.0)" or "  CUDA runtime not loaded: <why>".
void print_library(const GpuLibraryInfo& lib) {
  if (lib.loaded) {
    std::printf("  %s: loaded %s (version %s)\n", lib.name.c_str(), lib.path.c_str(),
                lib.version.empty() ? "unknown" : lib.version.c_str());
  } else {
    std::printf("  %s\n", lib.error.c_str());
  }
}

struct InfoArgs {
  std::vector<std::string> paths;
  bool json = false;
  std::string xml;
  std::string synthetic;
  std::string config;  // --config FILE
};

/// The settings a store opened now would start from (defaults < configuration file <
/// STRATA_* variables), as JSON.
nlohmann::json settings_json(const StoreOptions& o) {
  const IoEngineOptions& e = o.engine_options;
  return {{"config_file", o.config_file.empty() ? nlohmann::json(nullptr) : nlohmann::json(o.config_file)},
          {"io", {{"engine", std::string(engine_kind_name(e.kind))},
                  {"block_size", e.block_size},
                  {"queue_depth", e.queue_depth},
                  {"workers", e.workers},
                  {"direct", e.direct},
                  {"submit_batch", e.submit_batch},
                  {"numa_node", e.numa_node}}},
          {"store", {{"nvme_dirs", o.nvme_dirs},
                     {"chunk_bytes", o.chunk_bytes},
                     {"host_budget_bytes", o.host_budget_bytes},
                     {"nvme_budget_bytes", o.nvme_budget_bytes},
                     {"device_budget_bytes", o.device_budget_bytes},
                     {"staging_bytes", o.staging_bytes},
                     {"pinned_initial_bytes", o.pinned_initial_bytes},
                     {"pinned_grow_bytes", o.pinned_grow_bytes},
                     {"worker_threads", o.worker_threads},
                     {"verify_checksums", o.verify_checksums},
                     {"durability", o.durability == Durability::kOnPut ? "put" : "flush"},
                     {"numa_node", o.numa_node}}}};
}

const char* source_name(TopologySource s) {
  if (s == TopologySource::kSynthetic) return "synthetic";
  return s == TopologySource::kXml ? "xml" : "system";
}

std::string node_str(int n) { return n < 0 ? std::string("all/unknown") : std::to_string(n); }

nlohmann::json node_json(int n) { return n < 0 ? nlohmann::json(nullptr) : nlohmann::json(n); }

std::string limit_str(uint64_t b) {
  return b == UINT64_MAX ? std::string("unlimited") : format_bytes(b);
}

/// `text` with two spaces before each line.
std::string indent(const std::string& text) {
  std::string out = "  ";
  for (char c : text) {
    out += c;
    if (c == '\n') out += "  ";
  }
  return out;
}

int run_info(const InfoArgs& args) {
  Result<std::shared_ptr<const Topology>> loaded = !args.xml.empty() ? Topology::load_xml(args.xml)
                                                   : !args.synthetic.empty()
                                                       ? Topology::load_synthetic(args.synthetic)
                                                       : Topology::load();
  if (!loaded.ok()) return report_error(loaded.status());
  const Topology& topo = **loaded;
  auto settings = StoreOptions::from_config(args.config);
  if (!settings.ok()) return report_error(settings.status());

  std::vector<PathInfo> paths;
  for (const auto& p : args.paths) {
    auto info = topo.path_info(p);
    if (!info.ok()) return report_error(info.status());
    paths.push_back(std::move(*info));
  }
  const HostFeatures host = probe_host_features();
  const auto gpus = topo.gpus();
  // Where a store over these paths (as NVMe directories) would place its pinned staging
  // memory, I/O threads and host tier, for the first GPU when there is one.
  std::optional<StorePlacement> placement;
  if (!paths.empty()) {
    const int gpu = !gpus.empty() && gpus[0].cuda_index >= 0 ? gpus[0].cuda_index : -1;
    auto pl = plan_store_placement_for_paths(topo, args.paths, gpu, kNumaAuto);
    if (!pl.ok()) return report_error(pl.status());
    placement = std::move(*pl);
  }

  if (args.json) {
    nlohmann::json j;
    j["topology"] = {{"source", source_name(topo.source())},
                     {"this_system", topo.is_this_system()},
                     {"packages", topo.num_packages()},
                     {"cores", topo.num_cores()},
                     {"pus", topo.num_pus()}};
    j["numa_nodes"] = nlohmann::json::array();
    for (const auto& n : topo.numa_nodes()) {
      j["numa_nodes"].push_back({{"node", n.os_index},
                                 {"cpus", n.cpulist},
                                 {"cores", n.cores},
                                 {"pus", n.cpus.size()},
                                 {"memory_bytes", n.memory_bytes}});
    }
    j["cuda"] = {{"built", built_with_cuda()},
                 {"devices", gpu_count()},
                 {"runtime", library_json(cuda_runtime_library())},
                 {"nccl", library_json(nccl_library())}};
    j["gpus"] = nlohmann::json::array();
    for (const auto& g : gpus) {
      j["gpus"].push_back({{"cuda_index", g.cuda_index < 0 ? nlohmann::json(nullptr)
                                                           : nlohmann::json(g.cuda_index)},
                           {"name", g.name},
                           {"pci_bus_id", g.pci_bus_id},
                           {"numa_node", node_json(g.numa_node)}});
    }
    j["block_devices"] = nlohmann::json::array();
    for (const auto& b : topo.block_devices()) {
      j["block_devices"].push_back({{"name", b.name},
                                    {"pci_bus_id", b.pci_bus_id},
                                    {"numa_node", node_json(b.numa_node)},
                                    {"local_numa_nodes", b.local_numa_nodes}});
    }
    j["paths"] = nlohmann::json::array();
    for (const auto& p : paths) {
      j["paths"].push_back(
          {{"path", p.path},
           {"dev", std::to_string(p.dev_major) + ":" + std::to_string(p.dev_minor)},
           {"device", p.device ? nlohmann::json(p.device->name) : nlohmann::json(nullptr)},
           {"partition", p.partition},
           {"pci_bus_id", p.device ? p.device->pci_bus_id : std::string()},
           {"numa_node", node_json(p.numa_node)},
           {"logical_block_size", p.logical_block_size},
           {"physical_block_size", p.physical_block_size},
           {"dio_from_statx", p.dio_from_statx},
           {"dio_mem_align", p.dio_mem_align},
           {"dio_offset_align", p.dio_offset_align},
           {"dio_alignment", p.dio_alignment()}});
    }
    if (placement) {
      nlohmann::json dirs = nlohmann::json::array();
      for (size_t i = 0; i < args.paths.size(); ++i) {
        dirs.push_back({{"path", args.paths[i]},
                        {"device", placement->dir_devices[i]},
                        {"numa_node", node_json(placement->dir_nodes[i])}});
      }
      j["store_placement"] = {{"nvme_dirs", dirs},
                              {"host_tier_numa_node", node_json(placement->host_node)},
                              {"gpu_numa_node", node_json(placement->gpu_node)}};
    }
    j["settings"] = settings_json(*settings);
    j["io_uring"] = {{"available", host.io_uring}, {"errno", host.io_uring_errno}};
    j["huge_pages"] = {{"thp", host.thp_mode},
                       {"hugetlb_page_bytes", host.hugetlb_page_bytes},
                       {"hugetlb_pages_total", host.hugetlb_pages_total},
                       {"hugetlb_pages_free", host.hugetlb_pages_free}};
    j["memlock"] = {{"limit_bytes", host.memlock_limit_bytes == UINT64_MAX
                                        ? nlohmann::json(nullptr)
                                        : nlohmann::json(host.memlock_limit_bytes)},
                    {"cap_ipc_lock", host.cap_ipc_lock}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }

  std::printf("topology: %s%s, %d package(s), %d core(s), %d PU(s)\n", source_name(topo.source()),
              topo.is_this_system() ? " (this machine)" : "", topo.num_packages(), topo.num_cores(),
              topo.num_pus());
  std::printf("\nNUMA nodes\n  %-5s %-16s %6s %6s %12s\n", "node", "cpus", "cores", "pus",
              "memory");
  for (const auto& n : topo.numa_nodes()) {
    std::printf("  %-5d %-16s %6d %6zu %12s\n", n.os_index, n.cpulist.c_str(), n.cores,
                n.cpus.size(), format_bytes(n.memory_bytes).c_str());
  }
  std::printf("\nGPUs (CUDA %s, %d device(s))\n", built_with_cuda() ? "built in" : "not built in",
              gpu_count());
  print_library(cuda_runtime_library());
  print_library(nccl_library());
  if (gpus.empty()) std::printf("  none\n");
  for (const auto& g : gpus) {
    std::printf("  cuda%-3s %-24s %s  numa node %s\n",
                g.cuda_index < 0 ? "?" : std::to_string(g.cuda_index).c_str(),
                g.name.empty() ? "(unknown)" : g.name.c_str(), g.pci_bus_id.c_str(),
                node_str(g.numa_node).c_str());
  }
  std::printf("\nBlock devices\n");
  if (topo.block_devices().empty()) std::printf("  none\n");
  for (const auto& b : topo.block_devices()) {
    std::printf("  %-12s PCI %-14s numa node %s\n", b.name.c_str(),
                b.pci_bus_id.empty() ? "-" : b.pci_bus_id.c_str(), node_str(b.numa_node).c_str());
  }
  if (!paths.empty()) {
    int w = 24;
    for (const auto& p : paths) w = std::max(w, static_cast<int>(p.path.size()));
    std::printf("\nPaths\n  %-*s %-12s %-11s %8s %8s %8s %8s\n", w, "path", "device", "numa", "lbs",
                "dio_mem", "dio_off", "align");
    for (const auto& p : paths) {
      std::string dev = p.device ? p.device->name : std::string("(none)");
      if (!p.partition.empty()) dev = p.partition;
      auto dio = [&](uint32_t v) {
        return p.dio_from_statx ? std::to_string(v) : std::string("-");
      };
      std::printf("  %-*s %-12s %-11s %8u %8s %8s %8u\n", w, p.path.c_str(), dev.c_str(),
                  node_str(p.numa_node).c_str(), p.logical_block_size, dio(p.dio_mem_align).c_str(),
                  dio(p.dio_offset_align).c_str(), p.dio_alignment());
    }
  }
  if (placement) {
    std::printf("\nStore placement (these paths as NVMe directories%s)\n%s\n",
                placement->gpu_node >= 0 ? ", the first GPU" : "",
                indent(placement->describe(args.paths)).c_str());
  }
  std::printf(
      "\nio_uring: %s\n",
      host.io_uring ? "yes" : ("no (errno " + std::to_string(host.io_uring_errno) + ")").c_str());
  std::printf("huge pages: THP %s; hugetlb %s pages: %llu reserved, %llu free\n",
              host.thp_mode.empty() ? "unsupported" : host.thp_mode.c_str(),
              format_bytes(host.hugetlb_page_bytes).c_str(),
              static_cast<unsigned long long>(host.hugetlb_pages_total),
              static_cast<unsigned long long>(host.hugetlb_pages_free));
  std::printf("mlock: limit %s, CAP_IPC_LOCK %s\n", limit_str(host.memlock_limit_bytes).c_str(),
              host.cap_ipc_lock ? "yes" : "no");
  const StoreOptions& so = *settings;
  const IoEngineOptions& eo = so.engine_options;
  std::printf("\nSettings (defaults < %s < STRATA_* variables)\n",
              so.config_file.empty() ? "no configuration file"
                                     : ("configuration file " + so.config_file).c_str());
  std::printf("  io:    engine %s, block_size %s, queue_depth %u, workers %u, direct %s\n",
              std::string(engine_kind_name(eo.kind)).c_str(), format_bytes(eo.block_size).c_str(),
              eo.queue_depth, eo.workers, eo.direct ? "yes" : "no");
  std::printf("  store: chunk_bytes %s, host_budget %s, staging %s, worker_threads %u, "
              "verify %s, durability %s\n",
              format_bytes(so.chunk_bytes).c_str(), format_bytes(so.host_budget_bytes).c_str(),
              format_bytes(so.staging_bytes).c_str(), so.worker_threads,
              so.verify_checksums ? "yes" : "no",
              so.durability == Durability::kOnPut ? "put" : "flush");
  // What a store opened with these settings pins: each pool (staging per NUMA node of its
  // directories, the host tier) commits min(initial, its budget) at open, then grows.
  const uint64_t init = align_up(so.pinned_initial_bytes, 2ull << 20);
  const uint64_t at_open = std::min(init, align_up(so.staging_bytes, 4096)) +
                           (so.host_budget_bytes ? std::min(init, align_up(so.host_budget_bytes, 4096)) : 0);
  std::printf("  pinned: a store commits %s at open (%s per pool: staging per NUMA node, host "
              "tier), grows by %s up to %s (staging %s per node + host %s)\n",
              format_bytes(at_open).c_str(), format_bytes(init).c_str(),
              format_bytes(so.pinned_grow_bytes).c_str(),
              format_bytes(so.staging_bytes + so.host_budget_bytes).c_str(),
              format_bytes(so.staging_bytes).c_str(), format_bytes(so.host_budget_bytes).c_str());
  return 0;
}

void register_info(Registry& r) {
  auto args = std::make_shared<InfoArgs>();
  CLI::App* sub = r.root().add_subcommand(
      "info",
      "Topology as strata sees it: NUMA nodes, GPUs, block devices behind paths, "
      "io_uring and huge pages");
  sub->add_option("--path", args->paths, "directory or file whose block device to show")
      ->take_all();
  sub->add_flag("--json", args->json, "print one JSON object");
  auto* xml = sub->add_option("--xml", args->xml, "load an hwloc XML topology instead");
  sub->add_option("--synthetic", args->synthetic,
                  "load an hwloc synthetic topology instead, e.g. \"pack:2 numa:1 core:4 pu:1\"")
      ->excludes(xml);
  add_config_option(sub, args->config);
  sub->callback([args] { Registry::set_exit_code(run_info(*args)); });
}

}  // namespace

STRATA_CLI_COMMAND(register_info);

}  // namespace strata::cli
