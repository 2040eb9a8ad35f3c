// `strata bench store`: put/get bandwidth through the store beside the raw I/O engine on the
// same bytes, in the same run, alternating.
// `strata bench device`: pinned host<->device copies and NVMe->device through the store,
// each beside the plain copy limit measured in the same run (needs a GPU).
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

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
#include "striped_file.hpp"
#include "strata/base/units.hpp"
#include "strata/store/gpu.hpp"
#include "strata/store/io_engine.hpp"
#include "strata/store/pinned_pool.hpp"
#include "strata/store/store.hpp"

namespace strata::cli {
namespace {

/// Benchmark memory: a PinnedPool buffer (huge pages, registered with the engine).
struct BenchBuffer {
  std::shared_ptr<PinnedPool> pool;
  PinnedBuffer buf;
  Status init(uint64_t nbytes, const std::shared_ptr<IoEngine>& engine) {
    PinnedPoolOptions po;
    po.budget_bytes = align_up(std::max<uint64_t>(nbytes, 4096), 2 * kMiB);
    STRATA_ASSIGN_OR_RETURN(pool, PinnedPool::create(po, engine));
    STRATA_ASSIGN_OR_RETURN(buf, pool->try_allocate(std::max<uint64_t>(nbytes, 4096)));
    return Status::OK();
  }
  uint8_t* data() const { return static_cast<uint8_t*>(buf.data()); }
};

/// The file a benchmark holds an flock on in each of its directories for as long as it
/// runs (a store's LOCK exists in its root only, not in its other NVMe directories).
constexpr const char* kBenchLock = "bench.lock";

}  // namespace

Status check_unlocked(const std::string& dir) {
  for (const char* name : {"LOCK", kBenchLock}) {
    const std::string lock_path = dir + "/" + name;
    int fd = ::open(lock_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    Status st;
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
      char pid[32] = {0};
      ssize_t n = ::pread(fd, pid, sizeof pid - 1, 0);
      std::string holder = n > 0 ? std::string(pid, static_cast<size_t>(n)) : "?";
      while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) {
        holder.pop_back();
      }
      st = failed_precondition(
          dir + " is in use by pid " + holder + " (" + lock_path +
          " is locked: a store open for writing, or another benchmark on this --path); "
          "nothing was removed");
    }
    ::close(fd);  // also releases the flock taken just now
    if (!st.ok()) return st;
  }
  return Status::OK();
}

Status BenchLocks::take(const std::string& dir) {
  const std::string path = dir + "/" + kBenchLock;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return errno_status(errno, "open " + path);
  fds.push_back(fd);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) return errno_status(errno, "flock " + path);
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    return errno_status(errno, "write " + path);
  }
  return Status::OK();
}

BenchLocks::~BenchLocks() {
  for (int fd : fds) ::close(fd);
}

Status prepare_bench_dirs(const std::vector<std::string>& dirs, BenchLocks& locks,
                          RemoveDirsOnExit& remove) {
  namespace fs = std::filesystem;
  for (auto& d : dirs) {
    if (Status st = check_unlocked(d); !st.ok()) {
      remove.keep = true;
      return st;
    }
  }
  std::error_code ec;
  for (auto& d : dirs) {
    fs::remove_all(d, ec);
    fs::create_directories(d, ec);
    if (ec) return errno_status(ec.value(), "create " + d);
    STRATA_RETURN_IF_ERROR(locks.take(d));
  }
  return Status::OK();
}

Result<StoreMeasurement> measure_store(const StoreRunSpec& spec) {
  const uint64_t size = spec.object_bytes, chunk = spec.chunk_bytes;
  if (spec.count == 0 || spec.rounds == 0 || size == 0) {
    return invalid_argument("--count, --rounds and --object-size must be > 0");
  }
  if (chunk == 0 || chunk % 4096 != 0) {
    return invalid_argument("--chunk-size " + std::to_string(chunk) +
                            " is not a positive multiple of 4096");
  }
  // Disk use per directory (k of them): the store holds up to two versions of the N objects
  // (copy-on-write; each chunk a 4 KiB-aligned extent, so a 1-byte object takes 4 KiB),
  // striped chunk by chunk, plus up to one chunk of imbalance; the raw engine file two
  // regions of N objects in stripe units of one chunk. Computed in 128 bits.
  STRATA_ASSIGN_OR_RETURN(uint64_t total, checked_mul(size, spec.count, "--object-size x --count"));
  uint64_t need_per_dir = 0;
  {
    using U128 = unsigned __int128;
    const U128 k = spec.dirs.size();
    const U128 extent_bytes = U128(size / chunk) * chunk + (size % chunk + 4095) / 4096 * 4096;
    const U128 store_bytes = 2 * U128(spec.count) * extent_bytes;
    const U128 raw_units = (2 * U128(total) + chunk - 1) / chunk;
    const U128 need = (store_bytes + k - 1) / k + chunk + (raw_units + k - 1) / k * chunk;
    if (need > U128(UINT64_MAX)) {
      return invalid_argument("bench store: --object-size " + std::to_string(size) +
                              " x --count " + std::to_string(spec.count) +
                              " needs more than 2^64 bytes of disk per --path");
    }
    need_per_dir = static_cast<uint64_t>(need);
  }
  STRATA_RETURN_IF_ERROR(check_memory(size, "bench store (one --object-size buffer)"));
  {
    std::vector<DiskNeed> needs;
    for (size_t j = 0; j < spec.dirs.size(); ++j) {
      needs.push_back({"--path #" + std::to_string(j + 1), spec.paths[j], need_per_dir});
    }
    STRATA_RETURN_IF_ERROR(check_free_space(
        needs, "bench store (" + std::to_string(spec.count) + " x " +
                   (spec.object_size_text.empty() ? format_bytes(size) : spec.object_size_text) +
                   ", 4 copies)"));
  }
  // Commit the removal of an earlier run's files now: on a file system mounted with
  // `discard`, the freed blocks are discarded at the next journal commit, which would
  // otherwise land inside the first timed put.
  ::sync();
  StoreOptions so = spec.options;
  so.path = spec.dirs[0];
  so.nvme_dirs = spec.dirs;
  so.chunk_bytes = chunk;
  so.host_budget_bytes = 0;
  so.staging_bytes = 16ull << 20;
  so.engine = spec.engine;
  STRATA_ASSIGN_OR_RETURN(auto s, Store::open(so));

  // The raw engine on the same bytes: one striped file over the same directories, stripe
  // unit = the store's chunk size, N objects back to back, then fdatasync (the store's put
  // is durable when its future is ready, so the raw write pays for its sync too).
  //
  // Same file-system work on both sides: a put never overwrites the committed version of
  // its key (copy-on-write), so round 1 writes into newly allocated space, round 2 into
  // more new space, and round r >= 3 into the extents freed by round r-2. The raw file
  // therefore holds two regions of N objects, preallocated like the store's data files
  // (fallocate: unwritten extents), and round r writes region r % 2. Writing unwritten
  // extents costs the file system an extent conversion per completed request (ext4:
  // ~10-15% at 1 MiB requests), so comparing a first-time put with an in-place overwrite
  // would measure the file system, not the store. `space` says which kind of space each
  // round wrote.
  STRATA_ASSIGN_OR_RETURN(auto raw, StripedFile::open(spec.engine, spec.dirs, "raw-engine.dat",
                                                      OpenMode::kTruncate, chunk));
  {
    const uint64_t k = spec.dirs.size();
    const uint64_t units = (2 * total + chunk - 1) / chunk;
    const uint64_t per_file = (units + k - 1) / k * chunk;
    for (const auto& f : raw->files()) {
      int fd = ::open(f->path().c_str(), O_WRONLY | O_CLOEXEC);
      if (fd < 0) return errno_status(errno, "open " + f->path());
      int rc = ::fallocate(fd, 0, 0, static_cast<off_t>(per_file));
      int e = errno;
      ::close(fd);
      if (rc != 0 && e != EOPNOTSUPP) {
        return errno_status(e, "fallocate " + f->path() + " length " + std::to_string(per_file));
      }
    }
  }

  BenchBuffer mem;
  STRATA_RETURN_IF_ERROR(mem.init(size, spec.engine));
  for (uint64_t i = 0; i < size; ++i) mem.data()[i] = static_cast<uint8_t>(i * 131 + 7);

  // Each round times four transfers of the same N objects: store put, engine write (+ sync),
  // store get (verified), engine read. The store goes first in odd rounds and the engine in
  // even rounds (counterbalanced: on the development VM's virtio disk the first of two
  // back-to-back writes after a read phase is slower whoever makes it -- fio alone, five
  // alternations of two 2 GiB files: first 1.88-2.07 GB/s, second 2.00-2.39).
  StoreMeasurement m;
  auto key = [](uint32_t i) { return "bench/" + std::to_string(i); };
  auto timed = [&](auto&& start_all) -> Result<double> {
    auto t0 = Clock::now();
    STRATA_RETURN_IF_ERROR(start_all());
    return gbps(total, seconds_since(t0));
  };
  for (uint32_t r = 0; r < spec.rounds; ++r) {
    const uint64_t base = (r % 2) * total;  // region of the raw file (see above)
    auto store_put = [&]() -> Status {
      std::vector<Future<void>> f;
      for (uint32_t i = 0; i < spec.count; ++i) {
        f.push_back(s->put_async(key(i), mem.data(), TensorDesc::bytes(size), {Tier::kNvme, true}));
      }
      return when_all(f).result().status();
    };
    auto engine_write = [&]() -> Status {
      std::vector<Future<uint64_t>> w;
      for (uint32_t i = 0; i < spec.count; ++i) {
        w.push_back(raw->write_async(mem.data(), size, base + i * size));
      }
      STRATA_RETURN_IF_ERROR(when_all(w).result().status());
      return raw->sync_async().result().status();
    };
    auto store_get = [&]() -> Status {
      std::vector<Future<void>> f;
      for (uint32_t i = 0; i < spec.count; ++i) {
        f.push_back(s->get_bytes_async(key(i), mem.data(), size));
      }
      return when_all(f).result().status();
    };
    auto engine_read = [&]() -> Status {
      std::vector<Future<uint64_t>> w;
      for (uint32_t i = 0; i < spec.count; ++i) {
        w.push_back(raw->read_async(mem.data(), size, base + i * size));
      }
      return when_all(w).result().status();
    };
    Result<double> pg = 0.0, ewg = 0.0, gg = 0.0, erg = 0.0;
    if (r % 2 == 0) {
      pg = timed(store_put);
      if (pg.ok()) ewg = timed(engine_write);
      if (ewg.ok()) gg = timed(store_get);
      if (gg.ok()) erg = timed(engine_read);
    } else {
      ewg = timed(engine_write);
      if (ewg.ok()) pg = timed(store_put);
      if (pg.ok()) erg = timed(engine_read);
      if (erg.ok()) gg = timed(store_get);
    }
    for (const auto* x : {&pg, &ewg, &gg, &erg}) {
      if (!x->ok()) return x->status();
    }
    m.put_gbps.push_back(*pg);
    m.engine_write_gbps.push_back(*ewg);
    m.get_gbps.push_back(*gg);
    m.engine_read_gbps.push_back(*erg);
    m.put_ratio.push_back(*ewg > 0 ? *pg / *ewg : 0);
    m.get_ratio.push_back(*erg > 0 ? *gg / *erg : 0);
    m.space.push_back(r < 2 ? "new" : "reused");
    if (spec.log_rounds) {
      std::fprintf(stderr,
                   "round %u (%s space, %s first): put %.2f GB/s / engine write %.2f = %.3f, "
                   "get %.2f GB/s / engine read %.2f = %.3f\n",
                   r + 1, m.space.back().c_str(), r % 2 == 0 ? "store" : "engine", *pg, *ewg,
                   m.put_ratio.back(), *gg, *erg, m.get_ratio.back());
    }
  }
  raw.reset();
  STRATA_RETURN_IF_ERROR(s->close());
  return m;
}

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
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("store put: %.2f GB/s  engine write: %.2f GB/s  ratio %.3f\n", put, ew,
                put_ratio);
    std::printf("store get: %.2f GB/s  engine read:  %.2f GB/s  ratio %.3f\n", get, er,
                get_ratio);
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
