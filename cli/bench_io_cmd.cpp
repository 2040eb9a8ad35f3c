// `strata bench io`: sequential read or write bandwidth through the strata I/O engine, in
// the shape of fio's sequential jobs (block size, queue depth, O_DIRECT or buffered), over
// one file per --path, striped RAID-0 when several paths are given.
//
// Method: the engine runs with queue_depth and block_size as given, so it keeps exactly
// queue_depth block-sized transfers in flight on the device, as fio's iodepth does. The
// benchmark hands it requests of --request-size bytes (default queue_depth x block_size / 4)
// and keeps 2 x queue_depth x block_size bytes of them outstanding, replacing each completed
// request at once; the engine's worker refills the device queue from the requests it holds
// without a round trip through the submitting thread. Memory: one buffer of that many bytes
// from a PinnedPool (huge pages, registered with the engine: READ_FIXED/WRITE_FIXED). A read first lays out its files when
// they are missing or short (untimed) and drops them from the page cache. The figure is
// bytes / wall time of the timed loop; GB/s means 1e9 bytes per second, like fio's "GB/s".
// The bench/io_vs_fio.sh script compares it with fio on the same files.
//
// Before it starts, the run is refused (InvalidArgument) when two --path entries are the
// same directory, and (ResourceExhausted) when a file system lacks the space the files
// need beyond what they already hold. Unless --keep, a file the run created is removed when
// it ends, whether it succeeds, fails or is stopped by SIGINT/SIGTERM/SIGHUP, and a file that
// existed stays (truncated back to its former size after a failure); with --keep every file
// stays as it is (a later run reuses it: a read then needs no layout).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <csignal>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_limits.hpp"
#include "command.hpp"
#include "config_option.hpp"
#include "io_pass.hpp"
#include "progress.hpp"
#include "striped_file.hpp"
#include "strata/base/units.hpp"
#include "strata/store/config.hpp"
#include "strata/store/io_engine.hpp"
#include "strata/store/pinned_pool.hpp"

namespace strata::cli {
namespace {

struct BenchIoArgs {
  std::vector<std::string> paths;
  std::string size = "1GiB";
  std::string block_size = "1MiB";
  uint32_t queue_depth = 32;
  std::string op = "read";
  std::string engine = "uring";
  uint32_t workers = 1;
  std::string request_size;  // default: queue_depth x block_size / 4 (at least block_size)
  std::string stripe_unit;  // default: block size (when a multiple of 4096), else 1 MiB
  std::string file_name = "strata-bench-io.dat";
  bool buffered = false;
  bool keep = false;
  bool json = false;
  std::string config;  // --config FILE
  // the options whose value, when not given, comes from the configuration
  const CLI::Option *block_size_opt = nullptr, *queue_depth_opt = nullptr,
                    *engine_opt = nullptr, *workers_opt = nullptr;
};

int run_bench_io(const BenchIoArgs& a) {
  // Engine settings: defaults < configuration file < STRATA_* variables < these options.
  auto cfg = load_config_to_use(a.config);
  if (!cfg.ok()) return report_error(cfg.status());
  auto eo_r = IoEngineOptions::from_config(a.config);
  if (!eo_r.ok()) return report_error(eo_r.status());
  IoEngineOptions eo = *eo_r;
  if (given(a.engine_opt)) {
    if (a.engine != "uring" && a.engine != "threads") {
      return report_error(invalid_argument("--engine '" + a.engine + "': expected uring or threads"));
    }
    eo.kind = a.engine == "uring" ? EngineKind::kUring : EngineKind::kThreads;
  }
  if (given(a.queue_depth_opt)) eo.queue_depth = a.queue_depth;
  if (given(a.workers_opt)) eo.workers = a.workers;
  if (a.buffered) eo.direct = false;
  uint64_t size, bs = eo.block_size, unit, req;
  try {
    size = parse_size_or_throw(a.size, "--size");
    if (given(a.block_size_opt)) bs = parse_size_or_throw(a.block_size, "--block-size");
    if (bs == 0) return report_error(invalid_argument("--block-size '" + a.block_size + "' must be > 0"));
    req = a.request_size.empty() ? pass_shape(eo.queue_depth, bs).request
                                 : parse_size_or_throw(a.request_size, "--request-size");
    if (!a.stripe_unit.empty()) {
      unit = parse_size_or_throw(a.stripe_unit, "--stripe-unit");
    } else if (*cfg && (*cfg)->store.chunk_bytes) {
      unit = *(*cfg)->store.chunk_bytes;  // the store's stripe unit over several paths
    } else {
      unit = bs % 4096 == 0 ? bs : kMiB;
    }
  } catch (const CLI::ValidationError& e) {
    return report_error(invalid_argument(e.what()));
  }
  eo.block_size = bs;
  if (size == 0 || bs == 0) return report_error(invalid_argument("--size and --block-size must be > 0"));
  if (a.op != "read" && a.op != "write") {
    return report_error(invalid_argument("--op '" + a.op + "': expected read or write"));
  }
  if (eo.queue_depth == 0) return report_error(invalid_argument("--queue-depth must be >= 1"));
  if (a.file_name.empty() || a.file_name.find('/') != std::string::npos || a.file_name == "." ||
      a.file_name == "..") {
    return report_error(invalid_argument("--file-name '" + a.file_name +
                                         "' must be a plain file name inside each --path"));
  }
  if (req == 0) return report_error(invalid_argument("--request-size must be > 0"));
  for (size_t i = 0; i < a.paths.size(); ++i) {
    if (a.paths[i].empty()) {
      return report_error(invalid_argument("--path must name a directory, got an empty string "
                                           "(--path #" + std::to_string(i + 1) + ")"));
    }
  }
  if (Status st = check_distinct_dirs(a.paths, "--path"); !st.ok()) return report_error(st);
  if (unit == 0 || unit % 4096 != 0) {
    return report_error(invalid_argument("--stripe-unit " + std::to_string(unit) +
                                         " must be a positive multiple of 4096"));
  }
  // Free space: each file grows to its share of --size; what it already holds is reused.
  const uint64_t k = a.paths.size();
  FileGuard guard(a.paths, a.file_name, a.keep);
  {
    std::vector<DiskNeed> needs;
    for (uint64_t j = 0; j < k; ++j) {
      const uint64_t want = striped_file_bytes(size, unit, k, j);
      const uint64_t have = guard.allocated(j);
      needs.push_back({"--path #" + std::to_string(j + 1), a.paths[j], want > have ? want - have : 0});
    }
    if (Status st = check_free_space(needs, "bench io --size " + a.size); !st.ok()) {
      return report_error(st);
    }
  }
  const uint32_t slots = pass_shape(eo.queue_depth, bs, req).slots;
  auto mem_bytes_r = checked_mul(slots, req, "bench io buffer: " + std::to_string(slots) +
                                                 " requests outstanding of --request-size");
  if (!mem_bytes_r.ok()) return report_error(mem_bytes_r.status());
  const uint64_t mem_bytes = *mem_bytes_r;
  if (Status st = check_memory(mem_bytes, "bench io (" + std::to_string(slots) +
                                              " requests of " + std::to_string(req) +
                                              " bytes outstanding)");
      !st.ok()) {
    return report_error(st);
  }
  const bool write = a.op == "write";

  auto engine = IoEngine::create(eo);
  if (!engine.ok()) return report_error(engine.status());

  IoMemory mem;
  if (Status st = mem.init(mem_bytes, *engine); !st.ok()) return report_error(st);
  for (uint64_t i = 0; i < mem_bytes; ++i) {
    mem.data()[i] = static_cast<char>(i * 131 + (i >> 12));
  }

  auto file = StripedFile::open(*engine, a.paths, a.file_name, OpenMode::kReadWrite, unit);
  if (!file.ok()) return report_error(file.status());
  const bool progress = progress_wanted();

  if (!write) {
    bool short_file = false;
    for (uint64_t j = 0; j < k; ++j) {
      auto sz = (*file)->files()[j]->size();
      if (!sz.ok()) return report_error(sz.status());
      if (*sz < striped_file_bytes(size, unit, k, j)) short_file = true;
    }
    if (short_file) {
      if (!a.json) std::fprintf(stderr, "laying out %s for the read (untimed)\n", format_bytes(size).c_str());
      auto lay = run_loop(**file, true, mem.data(), size, req, slots, progress, "layout");
      if (!lay.status.ok()) return report_error(lay.status.with_context("laying out the read file"));
      auto s = (*file)->sync_async().result();
      if (!s.ok()) return report_error(s.status());
    }
  }
  for (const auto& f : (*file)->files()) drop_page_cache(f->path());

  auto res = run_loop(**file, write, mem.data(), size, req, slots, progress, a.op.c_str());
  if (!res.status.ok()) return report_error(res.status);
  const bool direct = (*file)->files()[0]->direct();
  const double bw = gbps(size, res.seconds);
  const double iops = res.seconds > 0 ? static_cast<double>((size + bs - 1) / bs) / res.seconds : 0;
  const std::string engine_name(engine_kind_name((*engine)->kind()));

  if (a.json) {
    nlohmann::json j;
    j["op"] = a.op;
    j["bytes"] = size;
    j["seconds"] = res.seconds;
    j["gbps"] = bw;
    j["mib_per_s"] = static_cast<double>(size) / res.seconds / kMiB;
    j["iops"] = iops;
    j["block_size"] = bs;
    j["queue_depth"] = eo.queue_depth;
    j["request_size"] = req;
    j["engine"] = engine_name;
    j["workers"] = eo.workers;
    j["direct"] = direct;
    j["paths"] = a.paths;
    j["stripe_unit"] = unit;
    j["memory"] = mem.kind();
    j["registered_buffers"] = mem.registered();
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("strata bench io: op=%s engine=%s direct=%d bs=%s iodepth=%u files=%zu memory=%s%s\n",
                a.op.c_str(), engine_name.c_str(), direct ? 1 : 0, format_bytes(bs).c_str(),
                eo.queue_depth, a.paths.size(), mem.kind(),
                mem.registered() ? " (registered)" : "");
    std::printf("  %s: IOPS=%.0f, BW=%.2f GB/s (%.0f MiB/s)(%s/%.3fs)\n", a.op.c_str(), iops, bw,
                static_cast<double>(size) / res.seconds / kMiB, format_bytes(size).c_str(),
                res.seconds);
    for (const auto& f : (*file)->files()) std::printf("  file: %s\n", f->path().c_str());
  }
  guard.succeeded();
  return 0;
}

void register_bench_io(Registry& r) {
  auto args = std::make_shared<BenchIoArgs>();
  auto* sub = add_command(bench_group(r), "io",
                          "Sequential read/write bandwidth through the I/O engine (fio-like; one "
                          "file per --path, striped when several)",
                          args, run_bench_io);
  sub->add_option("--path", args->paths,
                  "directory for the benchmark file (repeat to stripe over distinct directories; "
                  "each file system must have room for its files' share of --size)")
      ->required();
  add_defaulted(sub, "--size", args->size, "total bytes (suffixes KiB, MiB, GiB, K, M, G)");
  args->block_size_opt = sub->add_option(
      "--block-size", args->block_size,
      "bytes per request (default: io.block_size of the configuration, else 1MiB)");
  args->queue_depth_opt = non_negative(sub->add_option(
      "--queue-depth", args->queue_depth,
      "requests in flight (default: io.queue_depth of the configuration, else 32)"));
  add_defaulted(sub, "--op", args->op, "read or write");
  args->engine_opt = sub->add_option(
      "--engine", args->engine, "uring or threads (default: io.engine, else uring)");
  args->workers_opt = non_negative(sub->add_option(
      "--workers", args->workers,
      "io_uring worker threads, one ring each (default: io.workers, else 1)"));
  add_config_option(sub, args->config);
  sub->add_option("--request-size", args->request_size,
                  "bytes per engine request, split into block-size transfers (default: "
                  "queue depth x block size / 4)");
  sub->add_option("--stripe-unit", args->stripe_unit,
                  "stripe unit over several paths (default: store.chunk_bytes of the "
                  "configuration, else the block size)");
  add_defaulted(sub, "--file-name", args->file_name,
                "file name inside each path (a file the run creates is removed when it ends, "
                "also after an error or SIGINT; one that existed stays, truncated back to "
                "its size after a failure)");
  sub->add_flag("--keep", args->keep,
                "keep the files as they are when the run ends (a later run reuses them)");
  sub->add_flag("--buffered", args->buffered, "buffered I/O instead of O_DIRECT");
  sub->add_flag("--json", args->json, "print one JSON object");
}

}  // namespace

STRATA_CLI_COMMAND(register_bench_io);

}  // namespace strata::cli
