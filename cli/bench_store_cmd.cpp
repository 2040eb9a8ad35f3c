// `strata bench store`: put/get bandwidth through the store beside the raw I/O engine on the
// same bytes, in the same run, alternating.
// `strata bench device`: pinned host<->device copies and NVMe->device through the store,
// each beside the plain copy limit measured in the same run (needs a GPU).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#ifdef STRATA_HAVE_CUDA
#include "strata/base/detail/cuda_api.hpp"  // the CUDA runtime, loaded at run time
#endif
#include "strata/base/gpu_libraries.hpp"

#include "bench_store_cmd.hpp"
#include "command.hpp"
#include "config_option.hpp"
#include "strata/base/units.hpp"
#include "strata/store/gpu.hpp"
#include "strata/store/io_engine.hpp"
#include "strata/store/pinned_pool.hpp"
#include "strata/store/store.hpp"

namespace strata::cli {
namespace {

// ---------------------------------------------------------------- strata bench store

struct BenchStoreArgs {
  std::vector<std::string> paths;
  std::string object_size = "1GiB";
  uint32_t count = 4;
  uint32_t rounds = 4;
  std::string chunk_size = "64MiB";
  bool keep = false;
  bool json = false;
  std::string config;  // --config FILE
};

int run_bench_store(const BenchStoreArgs& a) {
  auto size_arg = parse_size_arg(a.object_size, "--object-size");
  if (!size_arg.ok()) return report_error(size_arg.status());
  auto chunk_arg = parse_size_arg(a.chunk_size, "--chunk-size");
  if (!chunk_arg.ok()) return report_error(chunk_arg.status());
  const uint64_t size = *size_arg, chunk = *chunk_arg;
  if (a.count == 0 || a.rounds == 0 || size == 0) {
    return report_error(invalid_argument("--count, --rounds and --object-size must be > 0"));
  }
  if (Status st = check_nonempty_paths(a.paths, "--path"); !st.ok()) return report_error(st);
  if (chunk == 0 || chunk % 4096 != 0) {
    return report_error(invalid_argument("--chunk-size " + std::to_string(chunk) +
                                         " is not a positive multiple of 4096"));
  }
  auto eo = IoEngineOptions::from_config(a.config);
  if (!eo.ok()) return report_error(eo.status());
  auto engine = IoEngine::create(*eo);
  if (!engine.ok()) return report_error(engine.status());
  auto so_r = StoreOptions::from_config(a.config);
  if (!so_r.ok()) return report_error(so_r.status());

  // Fresh store under <path0>/strata-bench-store, data striped over every --path.
  StoreRunSpec spec;
  spec.paths = a.paths;
  for (auto& p : a.paths) spec.dirs.push_back(p + "/strata-bench-store");
  BenchLocks locks;  // released after the directories are removed (declared first)
  // Declared before the store and the raw file, so it runs after they are closed.
  RemoveDirsOnExit remove_dirs{spec.dirs, a.keep};
  if (Status st = prepare_bench_dirs(spec.dirs, locks, remove_dirs); !st.ok()) {
    return report_error(st);
  }
  spec.object_bytes = size;
  spec.object_size_text = a.object_size;
  spec.chunk_bytes = chunk;
  spec.count = a.count;
  spec.rounds = a.rounds;
  spec.engine = *engine;
  spec.options = *so_r;
  spec.log_rounds = !a.json;
  auto mr = measure_store(spec);
  if (!mr.ok()) return report_error(mr.status());
  const StoreMeasurement& m = *mr;
  // A round's ratio is store / engine; rounds 2k-1 and 2k (one of each order, same kind of
  // file space) make a pair whose ratio is the geometric mean of the two, which cancels a
  // multiplicative order effect; the reported ratios are medians of the pair ratios (of the
  // round ratios when there is a single round).
  const double put = median(m.put_gbps), get = median(m.get_gbps);
  const double ew = median(m.engine_write_gbps), er = median(m.engine_read_gbps);
  auto pair_ratios = [](const std::vector<double>& r) {
    std::vector<double> p;
    for (size_t i = 0; i + 1 < r.size(); i += 2) p.push_back(std::sqrt(r[i] * r[i + 1]));
    return p.empty() ? r : p;
  };
  const std::vector<double> put_p = pair_ratios(m.put_ratio), get_p = pair_ratios(m.get_ratio);
  const double put_ratio = median(put_p), get_ratio = median(get_p);
  if (a.json) {
    nlohmann::json j;
    j["object_bytes"] = size;
    j["count"] = a.count;
    j["rounds"] = a.rounds;
    j["chunk_bytes"] = chunk;
    j["paths"] = a.paths;
    j["engine"] = std::string(engine_kind_name((*engine)->kind()));
    j["put_gbps"] = put;
    j["get_gbps"] = get;
    j["engine_write_gbps"] = ew;
    j["engine_read_gbps"] = er;
    j["put_vs_engine"] = put_ratio;  // median of the pair ratios (see above)
    j["get_vs_engine"] = get_ratio;
    j["put_vs_engine_pairs"] = put_p;
    j["get_vs_engine_pairs"] = get_p;
    j["put_vs_engine_rounds"] = m.put_ratio;
    j["get_vs_engine_rounds"] = m.get_ratio;
    std::vector<std::string> first;
    for (uint32_t r = 0; r < a.rounds; ++r) first.push_back(r % 2 == 0 ? "store" : "engine");
    j["first_rounds"] = first;
    // What the ratios are medians of: "pairs", or "single round" (one round: the order is
    // not counterbalanced). With an odd round count the last round is in no pair.
    j["ratio_basis"] = a.rounds >= 2 ? "pairs" : "single round";
    j["unpaired_rounds"] = a.rounds >= 2 ? a.rounds % 2 : 0;
    j["put_gbps_rounds"] = m.put_gbps;
    j["get_gbps_rounds"] = m.get_gbps;
    j["engine_write_gbps_rounds"] = m.engine_write_gbps;
    j["engine_read_gbps_rounds"] = m.engine_read_gbps;
    j["space_rounds"] = m.space;
    // CPU cost: process CPU seconds (all threads) per GB moved, medians over the rounds.
    j["put_cpu_seconds_per_gb"] = median(m.put_cpu_s_per_gb);
    j["get_cpu_seconds_per_gb"] = median(m.get_cpu_s_per_gb);
    j["engine_write_cpu_seconds_per_gb"] = median(m.engine_write_cpu_s_per_gb);
    j["engine_read_cpu_seconds_per_gb"] = median(m.engine_read_cpu_s_per_gb);
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("store put: %.2f GB/s  engine write: %.2f GB/s  ratio %.3f\n", put, ew,
                put_ratio);
    std::printf("store get: %.2f GB/s  engine read:  %.2f GB/s  ratio %.3f\n", get, er,
                get_ratio);
    std::printf("CPU seconds per GB (process, all threads): put %.3f, engine write %.3f, "
                "get %.3f, engine read %.3f\n",
                median(m.put_cpu_s_per_gb), median(m.engine_write_cpu_s_per_gb),
                median(m.get_cpu_s_per_gb), median(m.engine_read_cpu_s_per_gb));
    std::printf("(%u x %s objects, %u rounds; GB/s are medians; ratios are medians over round "
                "pairs (store first, engine first) of the geometric mean of the two rounds' "
                "ratios; GB/s = 1e9 B/s)\n",
                a.count, format_bytes(size).c_str(), a.rounds);
    if (a.rounds == 1) {
      std::printf("(one round: the ratios are that round's, the store wrote first; use an even "
                  "--rounds for counterbalanced ratios)\n");
    } else if (a.rounds % 2 == 1) {
      std::printf("(round %u is in no pair and not in the ratios: use an even --rounds)\n",
                  a.rounds);
    }
  }
  return 0;
}

// ---------------------------------------------------------------- strata bench device

struct BenchDeviceArgs {
  std::string path;
  std::string size = "1GiB";
  uint32_t rounds = 3;
  bool json = false;
};

int run_bench_device(const BenchDeviceArgs& a) {
  if (gpu_count() == 0) {
    std::fprintf(stderr,
                 "strata bench device: no GPU (built with CUDA: %s; the CUDA runtime reports no "
                 "usable device%s%s): nothing to measure\n",
                 built_with_cuda() ? "yes" : "no", cuda_runtime_library().loaded ? "" : ": ",
                 cuda_runtime_library().loaded ? "" : cuda_runtime_library().error.c_str());
    return 2;
  }
#ifndef STRATA_HAVE_CUDA
  return 2;
#else
  const detail::CudartApi& cu = *detail::cudart();  // loaded: gpu_count() > 0
  auto size_arg = parse_size_arg(a.size, "--size");
  if (!size_arg.ok()) return report_error(size_arg.status());
  const uint64_t size = *size_arg;
  auto eo = IoEngineOptions::from_env();
  if (!eo.ok()) return report_error(eo.status());
  auto engine = IoEngine::create(*eo);
  if (!engine.ok()) return report_error(engine.status());
  BenchBuffer mem;
  if (Status st = mem.init(size, *engine); !st.ok()) return report_error(st);
  std::memset(mem.data(), 0x5a, size);
  void* dev = nullptr;
  if (cu.cudaMalloc(&dev, size) != cudaSuccess) {
    return report_error(resource_exhausted("cudaMalloc of " + format_bytes(size)));
  }
  std::vector<double> h2d, d2h, nvme_dev, nvme_host;
  std::unique_ptr<Store> store;
  std::string dir;
  if (!a.path.empty()) {
    dir = a.path + "/strata-bench-device";
    if (Status st = check_unlocked(dir); !st.ok()) return report_error(st);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    StoreOptions so;
    so.path = dir;
    so.host_budget_bytes = 0;
    so.engine = *engine;
    auto s = Store::open(so);
    if (!s.ok()) return report_error(s.status());
    store = std::move(*s);
    if (Status st = store->put("bench", mem.data(), TensorDesc::bytes(size)); !st.ok())
      return report_error(st);
  }
  for (uint32_t r = 0; r < a.rounds; ++r) {
    auto t0 = Clock::now();
    cu.cudaMemcpy(dev, mem.data(), size, cudaMemcpyHostToDevice);
    h2d.push_back(gbps(size, seconds_since(t0)));
    t0 = Clock::now();
    cu.cudaMemcpy(mem.data(), dev, size, cudaMemcpyDeviceToHost);
    d2h.push_back(gbps(size, seconds_since(t0)));
    if (store) {
      t0 = Clock::now();
      if (Status st = store->get_bytes("bench", dev, size); !st.ok()) return report_error(st);
      nvme_dev.push_back(gbps(size, seconds_since(t0)));
      t0 = Clock::now();
      if (Status st = store->get_bytes("bench", mem.data(), size); !st.ok())
        return report_error(st);
      nvme_host.push_back(gbps(size, seconds_since(t0)));
    }
  }
  cu.cudaFree(dev);
  if (store) {
    (void)store->close();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  nlohmann::json j;
  j["bytes"] = size;
  j["h2d_pinned_gbps"] = median(h2d);
  j["d2h_pinned_gbps"] = median(d2h);
  if (!nvme_dev.empty()) {
    j["nvme_to_device_gbps"] = median(nvme_dev);
    j["nvme_to_pinned_gbps"] = median(nvme_host);
    double limit = std::min(median(h2d), median(nvme_host));
    j["nvme_to_device_vs_limit"] = limit > 0 ? median(nvme_dev) / limit : 0;
  }
  if (a.json) {
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("pinned host->device: %.2f GB/s, device->host: %.2f GB/s\n", median(h2d),
                median(d2h));
    if (!nvme_dev.empty()) {
      std::printf("nvme->device through the store: %.2f GB/s (nvme->pinned %.2f GB/s; ratio to "
                  "min(nvme->pinned, h2d) %.3f)\n",
                  median(nvme_dev), median(nvme_host), j["nvme_to_device_vs_limit"].get<double>());
    }
  }
  return 0;
#endif
}

void register_bench_store(Registry& r) {
  auto& bench = bench_group(r);
  auto ba = std::make_shared<BenchStoreArgs>();
  auto* bs = add_command(bench, "store",
                         "Put then get N objects through the store, beside the raw I/O engine on "
                         "the same bytes (alternating rounds, medians)",
                         ba, run_bench_store);
  bs->add_option("--path", ba->paths, "NVMe directory (repeat to stripe)")->required();
  add_defaulted(bs, "--object-size", ba->object_size, "bytes per object (suffixes KiB, MiB, GiB)");
  add_defaulted(bs, "--count", ba->count, "objects per round");
  add_defaulted(bs, "--rounds", ba->rounds,
                "rounds; even counts pair a store-first with an engine-first round (see "
                "docs/store.md)");
  add_defaulted(bs, "--chunk-size", ba->chunk_size, "store chunk size");
  bs->add_flag("--keep", ba->keep, "keep the store and the raw file afterwards");
  bs->add_flag("--json", ba->json, "print one JSON object");
  add_config_option(bs, ba->config);

  auto da = std::make_shared<BenchDeviceArgs>();
  auto* bd = add_command(
      bench, "device",
      "Pinned host<->device copy bandwidth and NVMe->device through the store (GPU only)", da,
      run_bench_device);
  bd->add_option("--path", da->path, "NVMe directory for the store part (optional)");
  add_defaulted(bd, "--size", da->size, "bytes per transfer");
  add_defaulted(bd, "--rounds", da->rounds, "rounds (medians)");
  bd->add_flag("--json", da->json, "print one JSON object");
}

}  // namespace

STRATA_CLI_COMMAND(register_bench_store);

}  // namespace strata::cli
