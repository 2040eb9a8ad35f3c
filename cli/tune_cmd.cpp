// `strata tune --path DIR [--path DIR ...] [--long | --quick] [--output FILE] [--json]`:
// measures the user's drives and host, and writes a configuration file (store/config.hpp)
// with the chosen I/O settings and the "measured" section.
//
// Method (docs/tuning.md):
//  1. I/O sweep: for every block size x queue depth x I/O worker count of the sweep, a fresh
//     engine (io_uring, O_DIRECT) writes then reads one test file per --path (striped RAID-0
//     when several, stripe unit = block size), sequentially, exactly as `strata bench io`
//     does (io_pass.hpp: same request sizes, same outstanding bytes, page cache dropped
//     before each read), each pass stopping after --bytes or a time limit. Each
//     configuration runs `repeats` times, the sweep order reversed each time; the figures
//     are the medians. GB/s = 1e9 bytes / s of the timed loop.
//  2. Choice: the best read bandwidth B; among the configurations reading at >= 97% of B,
//     the one with the fewest bytes in flight (queue depth x block size x workers), then
//     fewer workers, then the better write bandwidth. Within 3% the measurements do not tell
//     configurations apart on a noisy machine, and fewer bytes in flight leave memory and
//     device queue to the rest of the program.
//  3. Stripe unit (several paths only): with the chosen engine settings, the read of the
//     same files striped with each chunk size of the sweep; the smallest chunk within 3% of
//     the best read becomes store.chunk_bytes (a finer stripe spreads smaller objects over
//     every drive), and the paths become store.nvme_dirs.
//  4. The store's data path: with the chosen engine settings and store.chunk_bytes, N
//     objects put to the NVMe tier of a fresh store in DIR/strata-tune-store (striped over
//     the paths) and got back, checksums on, beside the raw engine on the same bytes --
//     `strata bench store`'s measurement (bench_store_cmd.hpp), medians of the rounds. These
//     become measured.store_{read,write}_bytes_per_s, which `strata plan` prefers: the
//     offloaded step goes through this path, not the raw engine's.
//  5. Host: a STREAM-style copy (the kernel threads copy disjoint slices of one buffer to
//     another; bytes read + written per second, as STREAM counts them; median of 5) and the
//     CPU Adam step (`strata bench adam`'s measurement: fp32 parameters per second, median).
//  6. The file: --output (default ./strata.json). When it exists it is read first (an error
//     in it, e.g. an unknown key, stops the run before anything is measured), and only the
//     tuned keys are replaced: what else the user set stays.
//
// The test files (strata-tune.dat in each path) are removed when the run ends, also after
// an error or SIGINT (FileGuard). The default sweep (18 configurations x 2 passes of at most
// 0.4 s each way, a 1 GiB file laid out first) takes about a minute.
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_adam_cmd.hpp"
#include "bench_limits.hpp"
#include "bench_store_cmd.hpp"
#include "command.hpp"
#include "io_pass.hpp"
#include "progress.hpp"
#include "striped_file.hpp"
#include "strata/base/units.hpp"
#include "strata/optimizer/kernel_pool.hpp"
#include "strata/store/config.hpp"
#include "strata/store/io_engine.hpp"

namespace strata::cli {
namespace {

namespace opt = strata::optimizer;

struct TuneArgs {
  std::vector<std::string> paths;
  std::string output = "strata.json";
  std::string bytes;  // per pass; default by sweep
  bool long_sweep = false;
  bool quick = false;
  bool json = false;
};

struct Sweep {
  std::vector<uint64_t> block_sizes;
  std::vector<uint32_t> queue_depths;
  std::vector<uint32_t> workers;
  std::vector<uint64_t> chunk_sizes;  // several paths only
  uint64_t bytes = 0;                 // test file size (all paths together), most per pass
  double pass_seconds = 0;            // a pass ends after this long
  int repeats = 0;                    // passes per configuration (alternating sweep order)
  uint64_t copy_bytes = 0;            // per buffer of the memory copy
  uint64_t adam_numel = 0;
  int adam_steps = 0;
  uint64_t store_object = 0;  // store data path: at least this many bytes per object,
  uint32_t store_count = 0;   // objects per round,
  uint32_t store_rounds = 0;  // rounds (even: both orders of store and raw engine)
};

Sweep make_sweep(const TuneArgs& a) {
  Sweep s;
  if (a.quick) {  // a smoke test: seconds
    s.block_sizes = {128 * kKiB, kMiB};
    s.queue_depths = {4, 16};
    s.workers = {1};
    s.chunk_sizes = {kMiB, 4 * kMiB};
    s.bytes = 16 * kMiB;
    s.pass_seconds = 0.2;
    s.repeats = 1;
    s.copy_bytes = 16 * kMiB;
    s.adam_numel = 1'000'000;
    s.adam_steps = 2;
    s.store_object = 4 * kMiB;
    s.store_count = 2;
    s.store_rounds = 2;
  } else if (a.long_sweep) {
    s.block_sizes = {64 * kKiB, 128 * kKiB, 256 * kKiB, 512 * kKiB, kMiB, 2 * kMiB, 4 * kMiB,
                     8 * kMiB};
    s.queue_depths = {2, 4, 8, 16, 32, 64, 128};
    s.workers = {1, 2, 4};
    s.chunk_sizes = {kMiB, 4 * kMiB, 16 * kMiB, 64 * kMiB, 256 * kMiB};
    s.bytes = 2 * kGiB;
    s.pass_seconds = 1.0;
    s.repeats = 3;
    s.copy_bytes = 512 * kMiB;
    s.adam_numel = 100'000'000;
    s.adam_steps = 10;
    s.store_object = 256 * kMiB;
    s.store_count = 4;
    s.store_rounds = 4;
  } else {
    s.block_sizes = {256 * kKiB, kMiB, 4 * kMiB};
    s.queue_depths = {8, 32, 64};
    s.workers = {1, 2};
    s.chunk_sizes = {kMiB, 4 * kMiB, 16 * kMiB, 64 * kMiB};
    s.bytes = kGiB;
    s.pass_seconds = 0.4;
    s.repeats = 2;
    s.copy_bytes = 256 * kMiB;
    s.adam_numel = 20'000'000;
    s.adam_steps = 5;
    s.store_object = 64 * kMiB;
    s.store_count = 4;
    s.store_rounds = 2;
  }
  return s;
}

struct IoPoint {
  uint64_t block_size = 0;
  uint32_t queue_depth = 0;
  uint32_t workers = 0;
  uint64_t stripe_unit = 0;
  double read_bps = 0, write_bps = 0;  // bytes per second
  uint64_t in_flight() const { return block_size * queue_depth * workers; }
};

const char* kFileName = "strata-tune.dat";

/// The engine of `p`'s settings: io_uring, O_DIRECT, the built-in defaults otherwise (what
/// tune decides is its own to sweep).
IoEngineOptions engine_options(const IoPoint& p) {
  IoEngineOptions eo;
  eo.kind = EngineKind::kUring;
  eo.direct = true;
  eo.block_size = p.block_size;
  eo.queue_depth = p.queue_depth;
  eo.workers = p.workers;
  return eo;
}

/// One write pass then one read pass (each at most `bytes` from offset 0, and at most
/// `seconds` long) over the striped test file, which holds `bytes` already, with a fresh
/// engine of `p`'s settings; sets p.write_bps / p.read_bps. With `layout`, one untimed
/// write of the whole file instead.
Status measure_point(const std::vector<std::string>& paths, uint64_t bytes, double seconds,
                     bool layout, bool progress, IoPoint& p) {
  STRATA_ASSIGN_OR_RETURN(auto engine, IoEngine::create(engine_options(p)));
  const PassShape shape = pass_shape(p.queue_depth, p.block_size);
  STRATA_ASSIGN_OR_RETURN(uint64_t mem_bytes, checked_mul(shape.slots, shape.request, "tune buffer"));
  IoMemory mem;
  STRATA_RETURN_IF_ERROR(mem.init(mem_bytes, engine));
  for (uint64_t i = 0; i < mem_bytes; i += 4096) std::memset(mem.data() + i, static_cast<int>(i >> 12), 4096);
  STRATA_ASSIGN_OR_RETURN(auto file, StripedFile::open(engine, paths, kFileName,
                                                       OpenMode::kReadWrite, p.stripe_unit));
  LoopResult w = run_loop(*file, true, mem.data(), bytes, shape.request, shape.slots, progress,
                          layout ? "layout" : "write", layout ? 0.0 : seconds);
  STRATA_RETURN_IF_ERROR(w.status);
  STRATA_RETURN_IF_ERROR(file->sync_async().result().status());
  if (layout) return Status::OK();
  p.write_bps = static_cast<double>(w.bytes) / w.seconds;
  for (const auto& f : file->files()) drop_page_cache(f->path());
  LoopResult r = run_loop(*file, false, mem.data(), bytes, shape.request, shape.slots, progress,
                          "read", seconds);
  STRATA_RETURN_IF_ERROR(r.status);
  p.read_bps = static_cast<double>(r.bytes) / r.seconds;
  if (!file->files()[0]->direct()) {
    return failed_precondition("tune: " + paths[0] +
                               " refuses O_DIRECT (e.g. tmpfs): the figures would be the page "
                               "cache's; tune a directory on the drive itself");
  }
  return Status::OK();
}

/// Bytes per object of the store run: sw.store_object, and over several paths at least one
/// chunk per path (so that every object spans every drive).
uint64_t store_object_bytes(const Sweep& sw, uint64_t chunk, uint64_t paths) {
  return paths > 1 ? std::max<uint64_t>(sw.store_object, chunk * paths) : sw.store_object;
}

/// The store's data path with `best`'s engine settings and `chunk` (objects of
/// store_object_bytes()) in DIR/strata-tune-store of each path, removed afterwards: each
/// round's figures (measure_store()).
Result<StoreMeasurement> measure_store_path(const std::vector<std::string>& paths,
                                            const Sweep& sw, const IoPoint& best,
                                            uint64_t chunk) {
  StoreRunSpec spec;
  spec.paths = paths;
  for (const auto& p : paths) spec.dirs.push_back(p + "/strata-tune-store");
  BenchLocks locks;  // released after the directories are removed (declared first)
  RemoveDirsOnExit remove_dirs{spec.dirs, false};
  STRATA_RETURN_IF_ERROR(prepare_bench_dirs(spec.dirs, locks, remove_dirs));
  spec.object_bytes = store_object_bytes(sw, chunk, paths.size());
  spec.chunk_bytes = chunk;
  spec.count = sw.store_count;
  spec.rounds = sw.store_rounds;
  STRATA_ASSIGN_OR_RETURN(spec.engine, IoEngine::create(engine_options(best)));
  return measure_store(spec);
}

/// Index of the chosen point: reads within 3% of the best, then the fewest bytes in
/// flight, fewer workers, better writes.
size_t choose(const std::vector<IoPoint>& pts) {
  double best = 0;
  for (const auto& p : pts) best = std::max(best, p.read_bps);
  size_t pick = pts.size();
  for (size_t i = 0; i < pts.size(); ++i) {
    const IoPoint& p = pts[i];
    if (p.read_bps < 0.97 * best) continue;
    if (pick == pts.size()) {
      pick = i;
      continue;
    }
    const IoPoint& q = pts[pick];
    if (p.in_flight() != q.in_flight() ? p.in_flight() < q.in_flight()
        : p.workers != q.workers      ? p.workers < q.workers
                                      : p.write_bps > q.write_bps) {
      pick = i;
    }
  }
  return pick;
}

/// STREAM "Copy" over two buffers of `nbytes` with the kernel pool's threads: (bytes read +
/// bytes written) / s, median of 5 after one warm-up.
Result<double> measure_memory_copy(uint64_t nbytes) {
  STRATA_RETURN_IF_ERROR(check_memory(2 * nbytes, "tune memory copy (2 buffers)"));
  STRATA_ASSIGN_OR_RETURN(auto pool, opt::make_kernel_pool({}));
  std::unique_ptr<char[]> a(new (std::nothrow) char[nbytes]), b(new (std::nothrow) char[nbytes]);
  if (!a || !b) return resource_exhausted("tune memory copy: cannot allocate 2 x " + format_bytes(nbytes));
  constexpr size_t kSlice = 4 * kMiB;
  const size_t slices = (nbytes + kSlice - 1) / kSlice;
  auto copy = [&](char* dst, const char* src) {
    pool->parallel_for(slices, [&](size_t s0, size_t s1) {
      const size_t lo = s0 * kSlice, hi = std::min<size_t>(nbytes, s1 * kSlice);
      std::memcpy(dst + lo, src + lo, hi - lo);
    });
  };
  pool->parallel_for(slices, [&](size_t s0, size_t s1) {  // first touch by the threads
    const size_t lo = s0 * kSlice, hi = std::min<size_t>(nbytes, s1 * kSlice);
    std::memset(a.get() + lo, 1, hi - lo);
    std::memset(b.get() + lo, 2, hi - lo);
  });
  copy(b.get(), a.get());
  std::vector<double> t;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    copy(i % 2 ? a.get() : b.get(), i % 2 ? b.get() : a.get());
    t.push_back(seconds_since(t0));
  }
  return 2.0 * static_cast<double>(nbytes) / median(t);
}

std::string size_text(uint64_t b) {
  if (b % kMiB == 0) return std::to_string(b / kMiB) + "MiB";
  if (b % kKiB == 0) return std::to_string(b / kKiB) + "KiB";
  return std::to_string(b);
}

nlohmann::json point_json(const IoPoint& p) {
  return {{"block_size", p.block_size},       {"queue_depth", p.queue_depth},
          {"workers", p.workers},             {"stripe_unit", p.stripe_unit},
          {"read_gbps", p.read_bps / 1e9},    {"write_gbps", p.write_bps / 1e9}};
}

int run_tune(const TuneArgs& a) {
  const auto t_start = Clock::now();
  if (Status st = check_nonempty_paths(a.paths, "--path"); !st.ok()) return report_error(st);
  if (Status st = check_distinct_dirs(a.paths, "--path"); !st.ok()) return report_error(st);
  if (a.quick && a.long_sweep) return report_error(invalid_argument("--quick and --long exclude each other"));
  if (a.output.empty()) return report_error(invalid_argument("--output must name a file"));
  Sweep sw = make_sweep(a);
  if (!a.bytes.empty()) {
    auto b = parse_size_arg(a.bytes, "--bytes");
    if (!b.ok()) return report_error(b.status());
    sw.bytes = *b;
  }
  const uint64_t k = a.paths.size();
  uint64_t max_unit = *std::max_element(sw.block_sizes.begin(), sw.block_sizes.end());
  if (k > 1) max_unit = std::max(max_unit, *std::max_element(sw.chunk_sizes.begin(), sw.chunk_sizes.end()));
  sw.bytes = align_up(std::max<uint64_t>(sw.bytes, 1), max_unit * k);  // whole stripes
  if (sw.bytes == 0) return report_error(invalid_argument("--bytes must be > 0"));

  // The existing file first: an error in it stops the run before anything is measured.
  Config cfg;
  {
    struct stat st;
    if (::stat(a.output.c_str(), &st) == 0) {
      auto old = Config::load(a.output);
      if (!old.ok()) {
        return report_error(old.status().with_context("tune --output (an existing file is "
                                                      "updated, so it must be valid)"));
      }
      cfg = std::move(*old);
    }
  }
  FileGuard guard(a.paths, kFileName, false);
  {
    std::vector<DiskNeed> needs;
    for (uint64_t j = 0; j < k; ++j) {
      const uint64_t have = guard.allocated(j);
      const uint64_t want = sw.bytes / k;
      needs.push_back({"--path #" + std::to_string(j + 1), a.paths[j], want > have ? want - have : 0});
    }
    if (Status st = check_free_space(needs, "tune (" + format_bytes(sw.bytes) + " test file)"); !st.ok()) {
      return report_error(st);
    }
  }
  // One progress line for the sweep (a terminal only); the passes draw none of their own.
  const bool progress = false;
  const size_t total = sw.block_sizes.size() * sw.queue_depths.size() * sw.workers.size();
  if (!a.json) {
    std::printf("strata tune: %zu path(s), a %s test file, %zu configurations x %d passes of "
                "at most %.1f s (io_uring, O_DIRECT, sequential write then read; medians)\n",
                a.paths.size(), format_bytes(sw.bytes).c_str(), total, sw.repeats,
                sw.pass_seconds);
    std::fflush(stdout);
  }
  {  // the test file, untimed, with the sweep's largest transfers
    IoPoint lay;
    lay.block_size = *std::max_element(sw.block_sizes.begin(), sw.block_sizes.end());
    lay.queue_depth = 16;
    lay.workers = 1;
    lay.stripe_unit = lay.block_size;
    if (Status st = measure_point(a.paths, sw.bytes, 0, true, progress, lay); !st.ok()) {
      return report_error(st.with_context("tune: laying out the test file"));
    }
  }
  // Every configuration `repeats` times, the sweep order reversed each time (drifts in the
  // machine's load hit all alike); each figure is the median of its passes.
  std::vector<IoPoint> pts;
  for (uint32_t w : sw.workers) {
    for (uint32_t qd : sw.queue_depths) {
      for (uint64_t bs : sw.block_sizes) {
        IoPoint p;
        p.block_size = bs;
        p.queue_depth = qd;
        p.workers = w;
        p.stripe_unit = bs;
        pts.push_back(p);
      }
    }
  }
  std::vector<std::vector<double>> reads(pts.size()), writes(pts.size());
  size_t done = 0;
  Progress bar("  tune", pts.size() * sw.repeats, Progress::Unit::kItems);
  for (int rep = 0; rep < sw.repeats; ++rep) {
    for (size_t n = 0; n < pts.size(); ++n) {
      const size_t i = rep % 2 == 0 ? n : pts.size() - 1 - n;
      IoPoint p = pts[i];
      bar.set_label("  tune: bs " + size_text(p.block_size) + " qd " +
                    std::to_string(p.queue_depth) + " workers " + std::to_string(p.workers));
      bar.update(done++);
      if (Status st = measure_point(a.paths, sw.bytes, sw.pass_seconds, false, progress, p);
          !st.ok()) {
        return report_error(st.with_context("tune: block size " + std::to_string(p.block_size) +
                                            ", queue depth " + std::to_string(p.queue_depth) +
                                            ", workers " + std::to_string(p.workers)));
      }
      reads[i].push_back(p.read_bps);
      writes[i].push_back(p.write_bps);
    }
  }
  bar.finish();
  if (!a.json) {
    std::printf("  %10s %5s %7s %10s %10s\n", "block", "qd", "workers", "read GB/s", "write GB/s");
  }
  for (size_t i = 0; i < pts.size(); ++i) {
    pts[i].read_bps = median(reads[i]);
    pts[i].write_bps = median(writes[i]);
    if (!a.json) {
      std::printf("  %10s %5u %7u %10.2f %10.2f\n", size_text(pts[i].block_size).c_str(),
                  pts[i].queue_depth, pts[i].workers, pts[i].read_bps / 1e9,
                  pts[i].write_bps / 1e9);
    }
  }
  IoPoint best = pts[choose(pts)];
  std::vector<IoPoint> chunk_pts;
  if (k > 1) {
    for (uint64_t c : sw.chunk_sizes) {
      IoPoint p = best;
      p.stripe_unit = c;
      if (Status st = measure_point(a.paths, sw.bytes, sw.pass_seconds, false, progress, p);
          !st.ok()) {
        return report_error(st.with_context("tune: stripe unit " + std::to_string(c)));
      }
      chunk_pts.push_back(p);
    }
    double top = 0;
    for (const auto& p : chunk_pts) top = std::max(top, p.read_bps);
    for (const auto& p : chunk_pts) {  // ascending chunk sizes: the first within 3%
      if (p.read_bps >= 0.97 * top) {
        best = p;
        break;
      }
    }
    if (!a.json) {
      std::printf("  stripe unit over %zu paths (block %s, qd %u, workers %u):\n", a.paths.size(),
                  size_text(best.block_size).c_str(), best.queue_depth, best.workers);
      for (const auto& p : chunk_pts) {
        std::printf("  %10s %24.2f %10.2f\n", size_text(p.stripe_unit).c_str(), p.read_bps / 1e9,
                    p.write_bps / 1e9);
      }
    }
  }
  const uint64_t store_chunk = k > 1 ? best.stripe_unit
                               : cfg.store.chunk_bytes.value_or(StoreOptions{}.chunk_bytes);
  auto sm = measure_store_path(a.paths, sw, best, store_chunk);
  if (!sm.ok()) return report_error(sm.status().with_context("tune: the store's data path"));
  const double store_read_bps = median(sm->get_gbps) * 1e9;
  const double store_write_bps = median(sm->put_gbps) * 1e9;
  const uint64_t store_object = store_object_bytes(sw, store_chunk, k);
  auto copy = measure_memory_copy(sw.copy_bytes);
  if (!copy.ok()) return report_error(copy.status());
  BenchAdamArgs aa;
  aa.numel = sw.adam_numel;
  aa.steps = sw.adam_steps;
  aa.warmup = 1;
  auto adam = measure_adam(aa);
  if (!adam.ok()) return report_error(adam.status());
  const double adam_pps = static_cast<double>(adam->numel) / median(adam->seconds_all);

  cfg.io.engine = EngineKind::kUring;
  cfg.io.block_size = best.block_size;
  cfg.io.queue_depth = best.queue_depth;
  cfg.io.workers = best.workers;
  if (k > 1) {
    cfg.store.chunk_bytes = best.stripe_unit;
    cfg.store.nvme_dirs = a.paths;
  }
  cfg.measured.nvme_read_bytes_per_s = best.read_bps;
  cfg.measured.nvme_write_bytes_per_s = best.write_bps;
  cfg.measured.store_read_bytes_per_s = store_read_bps;
  cfg.measured.store_write_bytes_per_s = store_write_bps;
  cfg.measured.memory_copy_bytes_per_s = *copy;
  cfg.measured.adam_params_per_s = adam_pps;
  cfg.measured.paths = a.paths;
  if (Status st = cfg.save(a.output); !st.ok()) return report_error(st);
  const double secs = seconds_since(t_start);

  if (a.json) {
    nlohmann::json j;
    j["paths"] = a.paths;
    j["bytes_per_pass"] = sw.bytes;
    j["configs"] = nlohmann::json::array();
    for (const auto& p : pts) j["configs"].push_back(point_json(p));
    j["stripe_units"] = nlohmann::json::array();
    for (const auto& p : chunk_pts) j["stripe_units"].push_back(point_json(p));
    j["chosen"] = point_json(best);
    j["store"] = {{"object_bytes", store_object},
                  {"count", sw.store_count},
                  {"rounds", sw.store_rounds},
                  {"chunk_bytes", store_chunk},
                  {"read_gbps", store_read_bps / 1e9},
                  {"write_gbps", store_write_bps / 1e9},
                  {"engine_read_gbps", median(sm->engine_read_gbps)},
                  {"engine_write_gbps", median(sm->engine_write_gbps)}};
    j["memory_copy_gbps"] = *copy / 1e9;
    j["adam_params_per_s"] = adam_pps;
    j["adam_threads"] = adam->threads;
    j["output"] = a.output;
    j["seconds"] = secs;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("chosen: block %s, queue depth %u, workers %u%s: read %.2f GB/s, write %.2f GB/s\n"
                "  (the fewest bytes in flight among the configurations within 3%% of the best "
                "read)\n",
                size_text(best.block_size).c_str(), best.queue_depth, best.workers,
                k > 1 ? (", chunk " + size_text(best.stripe_unit)).c_str() : "",
                best.read_bps / 1e9, best.write_bps / 1e9);
    std::printf("store data path (%u x %s objects, chunk %s, checksums): get %.2f GB/s, put "
                "%.2f GB/s (raw engine on the same bytes: read %.2f, write %.2f)\n",
                sw.store_count, size_text(store_object).c_str(), size_text(store_chunk).c_str(),
                store_read_bps / 1e9, store_write_bps / 1e9, median(sm->engine_read_gbps),
                median(sm->engine_write_gbps));
    std::printf("memory copy (STREAM, %d threads): %.2f GB/s; Adam step: %.3g params/s (%d threads)\n",
                adam->threads, *copy / 1e9, adam_pps, adam->threads);
    std::printf("wrote %s (%.0f s)\n", a.output.c_str(), secs);
  }
  guard.succeeded();
  return 0;
}

void register_tune(Registry& r) {
  auto args = std::make_shared<TuneArgs>();
  CLI::App* sub = add_command(
      r.root(), "tune",
      "Sweep block size x queue depth x I/O workers (and the stripe unit over several paths) on "
      "the given drives, then with the chosen settings put/get through the store (checksums on), "
      "measure host memory copy and the CPU Adam step, and write a configuration file",
      args, run_tune);
  sub->add_option("--path", args->paths,
                  "directory on a drive to tune (repeat for several drives: striped, and the "
                  "stripe unit is swept too)")
      ->required();
  add_defaulted(sub, "--output", args->output,
                "configuration file to write (an existing one is updated: only the tuned keys "
                "change)");
  auto* lng = sub->add_flag("--long", args->long_sweep,
                            "a wider sweep (8 block sizes x 7 queue depths x 3 worker counts, "
                            "3 passes of 1 s each): about 20 minutes");
  sub->add_flag("--quick", args->quick, "a tiny sweep (16 MiB per pass; for tests)")->excludes(lng);
  sub->add_option("--bytes", args->bytes,
                  "test file size over all paths, the most a pass moves (default 1GiB; --long "
                  "2GiB, --quick 16MiB)");
  sub->add_flag("--json", args->json, "print one JSON object");
}

STRATA_CLI_COMMAND(register_tune);

}  // namespace
}  // namespace strata::cli
