// `strata bench store`'s measurement (measure_store(), shared with `strata tune`) and the
// benchmark directories' locks: put/get through the store beside the raw I/O engine on the
// same bytes, in the same run, alternating, with the process's CPU time per GB moved.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "bench_store_cmd.hpp"
#include "command.hpp"
#include "striped_file.hpp"
#include "strata/base/units.hpp"
#include "strata/store/io_engine.hpp"
#include "strata/store/store.hpp"

namespace strata::cli {
namespace {

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
  // One transfer of the N objects: its GB/s, and the process's CPU seconds per GB in `cpu`.
  auto timed = [&](auto&& start_all, std::vector<double>& cpu) -> Result<double> {
    const double c0 = process_cpu_seconds();
    auto t0 = Clock::now();
    STRATA_RETURN_IF_ERROR(start_all());
    const double s = seconds_since(t0);
    cpu.push_back((process_cpu_seconds() - c0) / (static_cast<double>(total) / 1e9));
    return gbps(total, s);
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
    auto put = [&] { return timed(store_put, m.put_cpu_s_per_gb); };
    auto ewrite = [&] { return timed(engine_write, m.engine_write_cpu_s_per_gb); };
    auto get = [&] { return timed(store_get, m.get_cpu_s_per_gb); };
    auto eread = [&] { return timed(engine_read, m.engine_read_cpu_s_per_gb); };
    if (r % 2 == 0) {
      pg = put();
      if (pg.ok()) ewg = ewrite();
      if (ewg.ok()) gg = get();
      if (gg.ok()) erg = eread();
    } else {
      ewg = ewrite();
      if (ewg.ok()) pg = put();
      if (pg.ok()) erg = eread();
      if (erg.ok()) gg = get();
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

}  // namespace strata::cli
