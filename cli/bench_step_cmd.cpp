// `strata bench step`: the offloaded optimizer step (Adam, master weights and states in the
// NVMe tier) beside its two limits measured in the same run:
//  - io_seconds: the same bytes (12 B/param read, 12 B/param written; 8 and 8 with
//    --state-dtype bf16: fp32 master + two bf16 moments, OffloadOptions::state_dtype) moved
//    by the I/O engine alone, reads and writes concurrently, chunk-sized requests from pinned
//    memory, over a probe file striped over the same directories;
//  - compute_seconds: the Adam kernel alone over the same sub-groups, in memory, on fp32
//    spans (without the bf16 widening and narrowing a bf16-state step adds).
// overlap_efficiency = max(io, compute) / step: 1 means the pipeline hides the smaller of
// the two completely and adds nothing. I/O probe, step and compute probe alternate, K times;
// each figure is the median of its K runs. last_step_device_seconds and
// last_io_probe_device_seconds split the last step's and the last probe's time by what the
// engine had in flight (IoEngine::occupancy(): idle, reads only, writes only, both): a step
// slower than the probe with little idle time keeps the device busy at a lower rate.
//
// The model is cut into tensors of at most --tensor-numel parameters (a model has many
// tensors); they share one synthetic gradient buffer (read-only), so the DRAM the run needs
// is the pinned pipeline buffers plus one tensor's gradient, whatever --params is.
//
// Disk: the state takes 12 B/param (master weights, Adam's m and v, fp32; 8 B/param with bf16
// m and v), twice (copy-on-write: the checkpoint's copy and the steps'; the optimizer checks
// its batches in flight itself, OffloadedOptimizer::check_disk_space), spread over the
// --path directories, and the I/O probe file 2 x region (region = the state bytes
// rounded up to the chunk size); the run is refused (ResourceExhausted, naming the path, the
// bytes needed and available) when a file system has less room, before anything is written.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_limits.hpp"
#include "command.hpp"
#include "config_option.hpp"
#include "progress.hpp"
#include "striped_file.hpp"
#include "strata/base/units.hpp"
#include "strata/optimizer/offload.hpp"
#include "strata/optimizer/optimizers.hpp"
#include "strata/optimizer/kernel_pool.hpp"
#include "strata/optimizer/update.hpp"
#include "strata/store/io_engine.hpp"
#include "strata/store/pinned_pool.hpp"
#include "strata/store/store.hpp"

namespace strata::cli {
namespace {

namespace opt = strata::optimizer;

struct BenchStepArgs {
  uint64_t params = 100'000'000;
  std::vector<std::string> paths;
  std::string host_budget = "1GiB";
  uint64_t sub_group = 0;
  int buffers = 4;  // 0: as many as the pinned budget holds (OffloadOptions::num_buffers)
  int steps = 3;
  uint32_t warmup_steps = 2;  // untimed steps first (the first steps write new space)
  std::string chunk_size = "64MiB";
  uint64_t tensor_numel = 1ull << 26;
  int threads = 0;
  uint32_t store_workers = 0;  // 0: the StoreOptions default
  bool keep = false;
  bool json = false;
  std::string config;  // --config FILE
  std::string state_dtype = "fp32";  // --state-dtype: fp32 | bf16
};

uint64_t peak_rss_bytes() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;  // ru_maxrss is in KiB on Linux
}

// Waits for every valid future of `fs` (so that the buffers they use may be freed after)
// and returns `first` when it is an error, else the first error among them.
Status wait_all(const std::vector<Future<uint64_t>>& fs, Status first = Status::OK()) {
  for (const auto& f : fs) {
    if (!f.valid()) continue;
    const Status st = f.result().status();
    if (first.ok() && !st.ok()) first = st;
  }
  return first;
}

// Reads `read_bytes` and writes `write_bytes` concurrently through `engine` over `file`,
// in requests of `req` bytes from `pool`, keeping up to `depth` reads and `depth` writes in
// flight. Reads cycle over [read_base, read_base + region), writes over [write_base,
// write_base + region).
Result<double> io_probe(IoEngine& engine, StripedFile& file, PinnedPool& pool, uint64_t req,
                        int depth, uint64_t region, uint64_t read_base, uint64_t write_base,
                        uint64_t read_bytes, uint64_t write_bytes) {
  std::vector<PinnedBuffer> bufs;
  for (int i = 0; i < 2 * depth; ++i) {
    STRATA_ASSIGN_OR_RETURN(PinnedBuffer b, pool.allocate(req));
    bufs.push_back(std::move(b));
  }
  std::vector<Future<uint64_t>> rq(depth), wq(depth);
  uint64_t r_off = 0, w_off = 0, r_done = 0, w_done = 0;
  const auto t0 = Clock::now();
  for (uint64_t it = 0; r_done < read_bytes || w_done < write_bytes; ++it) {
    const size_t i = it % static_cast<size_t>(depth);
    Status st = rq[i].valid() ? rq[i].result().status() : Status::OK();
    if (st.ok() && wq[i].valid()) st = wq[i].result().status();
    if (!st.ok()) return wait_all(wq, wait_all(rq, st));  // none in flight on return
    rq[i] = {};
    wq[i] = {};
    if (r_done < read_bytes) {
      const uint64_t n = std::min(req, read_bytes - r_done);
      rq[i] = file.read_async(bufs[2 * i].data(), n, read_base + r_off);
      r_off = (r_off + req) % region;
      r_done += n;
    }
    if (w_done < write_bytes) {
      const uint64_t n = std::min(req, write_bytes - w_done);
      wq[i] = file.write_async(bufs[2 * i + 1].data(), n, write_base + w_off);
      w_off = (w_off + req) % region;
      w_done += n;
    }
  }
  STRATA_RETURN_IF_ERROR(wait_all(wq, wait_all(rq)));
  return seconds_since(t0);
}

// The engine's occupancy over an interval (IoOccupancy), as a JSON object of seconds.
nlohmann::json occupancy_json(const IoOccupancy& o) {
  return {{"idle", o.idle_seconds},
          {"reads_only", o.reads_only_seconds},
          {"writes_only", o.writes_only_seconds},
          {"reads_and_writes", o.reads_and_writes_seconds},
          {"read_piece_seconds", o.read_piece_seconds},
          {"write_piece_seconds", o.write_piece_seconds}};
}

int run_bench_step(const BenchStepArgs& a) {
  auto host_budget_arg = parse_size_arg(a.host_budget, "--host-budget");
  if (!host_budget_arg.ok()) return report_error(host_budget_arg.status());
  auto chunk_arg = parse_size_arg(a.chunk_size, "--chunk-size");
  if (!chunk_arg.ok()) return report_error(chunk_arg.status());
  const uint64_t host_budget = *host_budget_arg, chunk = *chunk_arg;
  if (a.paths.empty()) return report_error(invalid_argument("--path is required"));
  if (a.params == 0 || a.steps < 1 || a.tensor_numel == 0) {
    return report_error(invalid_argument("--params, --steps and --tensor-numel must be >= 1"));
  }
  if (chunk == 0 || chunk % 4096 != 0) {
    return report_error(invalid_argument("--chunk-size '" + a.chunk_size +
                                         "' must be a positive multiple of 4096"));
  }
  if (a.state_dtype != "fp32" && a.state_dtype != "bf16") {
    return report_error(invalid_argument("--state-dtype must be fp32 or bf16, got '" +
                                         a.state_dtype + "'"));
  }
  const DType state_dtype = a.state_dtype == "bf16" ? DType::kBFloat16 : DType::kFloat32;
  // Sizes: the state on disk per param: the fp32 master (4 B) and Adam's m and v (4 B each in
  // fp32, 2 B in bf16): 12 or 8 B, each read and written once per step; the gradient of the
  // largest tensor in DRAM.
  const uint64_t state_bytes_per_param = a.state_dtype == "bf16" ? 8 : 12;
  auto bytes_per_step_r =
      checked_mul(a.params, state_bytes_per_param,
                  "--params " + std::to_string(a.params) + " needs " +
                      std::to_string(state_bytes_per_param) + " bytes of state each");
  if (!bytes_per_step_r.ok()) return report_error(bytes_per_step_r.status());
  const uint64_t bytes_per_step = *bytes_per_step_r;
  const uint64_t grad_numel = std::min(a.params, a.tensor_numel);
  auto grad_bytes = checked_mul(grad_numel, sizeof(float), "--tensor-numel gradient bytes");
  if (!grad_bytes.ok()) return report_error(grad_bytes.status());
  if (Status st = check_memory(*grad_bytes, "bench step (the gradient of a tensor of " +
                                                std::to_string(grad_numel) + " fp32 parameters)");
      !st.ok()) {
    return report_error(st);
  }
  if (Status st = check_nonempty_paths(a.paths, "--path"); !st.ok()) return report_error(st);
  if (Status st = check_distinct_dirs(a.paths, "--path"); !st.ok()) return report_error(st);
  // The I/O probe's file: two regions of the step's own state bytes (rounded up to the
  // chunk); each probe run reads the region the run before wrote and writes the other, as
  // each step reads what the step before wrote. A region smaller than the state would be
  // re-read within a run, possibly from a cache the step's bytes do not fit.
  // In 128 bits: near 2^64 state bytes the probe's need saturates (and the disk need below
  // is refused as more than 2^64 bytes) instead of wrapping.
  using u128 = unsigned __int128;
  const u128 region_wide = (u128{bytes_per_step} + chunk - 1) / chunk * chunk;
  const uint64_t region = region_wide > UINT64_MAX ? UINT64_MAX : static_cast<uint64_t>(region_wide);
  // DRAM: the store keeps only the small checkpoint record in its host tier and streams
  // unaligned pieces through its staging buffers; the rest of the budget is the pipeline's.
  const uint64_t store_host = 8ull << 20, store_staging = 32ull << 20;
  if (host_budget <= store_host + store_staging + (16ull << 20)) {
    return report_error(invalid_argument("--host-budget " + format_bytes(host_budget) +
                                         " is too small (>= 56 MiB)"));
  }
  const uint64_t pinned_budget = host_budget - store_host - store_staging;
  const bool progress = progress_wanted();

  std::vector<std::string> dirs;
  for (const auto& p : a.paths) dirs.push_back(p + "/strata-bench-step");
  {
    // Free space, after removing what an earlier --keep run left: the state twice (the
    // optimizer's model, docs/offload.md "Disk space": the checkpoint's copy and the steps'
    // copy-on-write one; add_param() checks that and the batches in flight once the probe
    // file below has taken its room) and the probe file (two regions), striped over the
    // directories, at most one chunk more per directory.
    for (const auto& d : dirs) {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
    const uint64_t ndirs = a.paths.size();
    const u128 total = 2 * u128{bytes_per_step} + 2 * region_wide;
    const u128 per_dir_wide = total / ndirs + (total % ndirs ? 1 : 0) + chunk;
    if (per_dir_wide > UINT64_MAX) {
      return report_error(invalid_argument("bench step --params " + std::to_string(a.params) +
                                           " needs more than 2^64 bytes of disk per --path"));
    }
    const auto per_dir = static_cast<uint64_t>(per_dir_wide);
    std::vector<DiskNeed> needs;
    for (size_t i = 0; i < ndirs; ++i) {
      needs.push_back({"--path #" + std::to_string(i + 1), a.paths[i], per_dir});
    }
    if (Status st = check_free_space(needs, "bench step --params " + std::to_string(a.params));
        !st.ok()) {
      return report_error(st);
    }
  }
  for (const auto& d : dirs) {
    std::error_code ec;
    std::filesystem::create_directories(d, ec);
    if (ec) return report_error(errno_status(ec.value(), "creating " + d));
  }
  RemoveDirsOnExit cleanup{dirs, a.keep};

  auto so_r = StoreOptions::from_config(a.config);
  if (!so_r.ok()) return report_error(so_r.status());
  StoreOptions so = *so_r;
  so.path = dirs[0];
  so.nvme_dirs = dirs;
  so.chunk_bytes = chunk;
  so.host_budget_bytes = store_host;
  so.staging_bytes = store_staging;
  if (a.store_workers > 0) so.worker_threads = a.store_workers;
  auto store_r = Store::open(so);
  if (!store_r.ok()) return report_error(store_r.status());
  std::shared_ptr<Store> store = std::move(store_r).value();

  opt::OffloadOptions oo;
  oo.sub_group_numel = a.sub_group;
  oo.num_buffers = a.buffers;
  oo.pinned_budget_bytes = pinned_budget;
  oo.default_placement = opt::Placement::kNvme;
  oo.num_threads = a.threads;
  oo.state_dtype = state_dtype;
  auto factory = *opt::builtin_rule_factory("adam");
  const opt::Hyperparams hp = {{"lr", 1e-4}};

  // The I/O probe's file, over the same directories, both regions written (untimed) before
  // the store grows its data files: its room is taken first, so the store's growth ahead of
  // need (at most a quarter of the free space, StoreImpl::ensure_file_size) cannot take it.
  auto engine = store->engine();
  auto file_r = StripedFile::open(engine, dirs, "io_probe.dat", OpenMode::kTruncate, chunk);
  if (!file_r.ok()) return report_error(file_r.status());
  auto file = *file_r;
  const int depth = std::max(1, a.buffers != 0 ? a.buffers : 4);
  const uint64_t probe_pool_bytes = static_cast<uint64_t>(2 * depth) * chunk;
  {
    if (progress) std::fprintf(stderr, "\rwriting the io probe's file ...");
    PinnedPoolOptions po;
    po.budget_bytes = std::min(probe_pool_bytes, pinned_budget);
    auto fill_pool = PinnedPool::create(po, engine);
    if (!fill_pool.ok()) return report_error(fill_pool.status());
    const uint64_t req = std::min<uint64_t>(chunk, (*fill_pool)->budget_bytes() / 4096 * 4096);
    auto b = (*fill_pool)->allocate(req);
    if (!b.ok()) return report_error(b.status());
    std::memset(b->data(), 0, req);
    std::vector<Future<uint64_t>> fills;  // up to 2 x depth writes of one buffer in flight
    for (uint64_t off = 0; off < 2 * region; off += req) {
      if (fills.size() == static_cast<size_t>(2 * depth)) {
        if (Status st = fills.front().result().status(); !st.ok()) {
          return report_error(wait_all(fills, st));  // none in flight when `b` is freed
        }
        fills.erase(fills.begin());
      }
      fills.push_back(file->write_async(b->data(), std::min(req, 2 * region - off), off));
    }
    if (Status st = wait_all(fills); !st.ok()) return report_error(st);
    if (progress) std::fprintf(stderr, "\r%40s\r", "");
  }
  const auto t_setup = Clock::now();
  auto opt_r = opt::OffloadedOptimizer::create(store, factory, hp, oo);
  if (!opt_r.ok()) return report_error(opt_r.status());
  auto optimizer = std::move(opt_r).value();
  const uint64_t sg = optimizer->sub_group_numel();
  const int buffers = optimizer->num_buffers();

  // Tensors (zeros: created without DRAM proportional to their size) and one gradient.
  const uint64_t ntensors = (a.params - 1) / a.tensor_numel + 1;
  std::vector<float> grad(grad_numel);
  for (uint64_t i = 0; i < grad_numel; ++i) {
    grad[i] = 1e-3f * static_cast<float>(static_cast<int64_t>(i % 2001) - 1000) / 1000.0f;
  }
  Progress creating("creating tensors", ntensors);
  for (uint64_t t = 0; t < ntensors; ++t) {
    const uint64_t n = std::min(a.tensor_numel, a.params - t * a.tensor_numel);
    auto h = optimizer->add_param("w" + std::to_string(t), n, nullptr, 0, opt::Placement::kNvme);
    if (!h.ok()) return report_error(h.status());
    if (Status st = optimizer->set_grad(*h, grad.data(), DType::kFloat32); !st.ok()) {
      return report_error(st);
    }
    creating.update(t + 1);
  }
  creating.finish();
  const double setup_seconds = seconds_since(t_setup);

  // Limits: the I/O engine alone (the probe file, above) and the kernel alone (sub-group
  // buffers in memory).
  auto rule = factory(hp).value();
  auto pool_r = opt::make_kernel_pool({a.threads, -1});
  if (!pool_r.ok()) return report_error(pool_r.status());
  auto& pool = **pool_r;
  std::vector<double> io_runs, compute_runs;
  std::vector<double> io_cpu_runs, step_cpu_runs;  // process CPU seconds, all threads
  IoOccupancy probe_device, step_device;  // the last I/O probe's and the last step's
  auto io_once = [&]() -> Status {
    {  // I/O: the timed mix over the regions written before the store's tensors.
      PinnedPoolOptions po;
      po.budget_bytes = std::min(probe_pool_bytes, pinned_budget);
      STRATA_ASSIGN_OR_RETURN(auto ppool, PinnedPool::create(po, engine));
      const uint64_t req = std::min<uint64_t>(chunk, ppool->budget_bytes() / (2 * depth) / 4096 * 4096);
      if (progress) std::fprintf(stderr, "\rio probe ...");
      const IoOccupancy before = engine->occupancy();
      const double cpu0 = process_cpu_seconds();
      const uint64_t read_base = io_runs.size() % 2 == 0 ? 0 : region;
      STRATA_ASSIGN_OR_RETURN(double io,
                              io_probe(*engine, *file, *ppool, req, depth, region, read_base,
                                       region - read_base, bytes_per_step, bytes_per_step));
      probe_device = engine->occupancy() - before;
      io_cpu_runs.push_back(process_cpu_seconds() - cpu0);
      io_runs.push_back(io);
    }
    if (progress) std::fprintf(stderr, "\r%40s\r", "");
    return Status::OK();
  };
  auto compute_once = [&]() -> Status {
    {  // Compute: the same sub-groups through apply_update, in memory.
      if (progress) std::fprintf(stderr, "\rcompute probe ...");
      std::vector<float> p(sg), m(sg), v(sg);
      opt::UpdateSpans s;
      s.param = p.data();
      s.states[0] = m.data();
      s.states[1] = v.data();
      s.grad_type = DType::kFloat32;
      const auto t0 = Clock::now();
      for (uint64_t t = 0; t < ntensors; ++t) {
        const uint64_t n = std::min(a.tensor_numel, a.params - t * a.tensor_numel);
        for (uint64_t b = 0; b < n; b += sg) {
          s.numel = std::min(sg, n - b);
          s.grad = grad.data() + b;
          STRATA_RETURN_IF_ERROR(opt::apply_update(*rule, s, {1, 1.0f}, &pool));
        }
      }
      compute_runs.push_back(seconds_since(t0));
    }
    if (progress) std::fprintf(stderr, "\r%40s\r", "");
    return Status::OK();
  };
  // Warm-up: the first step of a run is its slowest (at 500M here 2.7-3.1 s against 1.9-2.7
  // s for the later ones): write_range is copy-on-write per chunk (store.hpp), so the first
  // steps write space never written before (ext4 converts unwritten extents as the writes
  // complete), where a training run's later steps write extents an earlier step wrote. The
  // warm-up steps are timed on their own and reported, not in the medians.
  std::vector<double> warmup_runs;
  for (uint32_t s = 0; s < a.warmup_steps; ++s) {
    auto r = optimizer->step();
    if (!r.ok()) return report_error(r.status());
    warmup_runs.push_back(r->seconds);
    if (progress) {
      std::fprintf(stderr, "warm-up step %u/%u: %.2f s\n", s + 1, a.warmup_steps, r->seconds);
    }
  }
  std::vector<double> step_runs;
  opt::StepStats last;
  // Alternate: I/O alone, the step, compute alone — machine noise hits all three alike.
  for (int s = 0; s < a.steps; ++s) {
    if (Status st = io_once(); !st.ok()) return report_error(st);
    const IoOccupancy before = engine->occupancy();
    const double cpu0 = process_cpu_seconds();
    auto r = optimizer->step();
    step_cpu_runs.push_back(process_cpu_seconds() - cpu0);
    step_device = engine->occupancy() - before;
    if (!r.ok()) return report_error(r.status());
    last = *r;
    step_runs.push_back(r->seconds);
    if (progress) {
      std::fprintf(stderr, "step %d/%d: %.2f s (update %.2f s, waiting for I/O %.2f s), %.2f GB/s\n",
                   s + 1, a.steps, r->seconds, r->compute_seconds, r->io_wait_seconds,
                   static_cast<double>(r->bytes_read + r->bytes_written) / r->seconds / 1e9);
    }
    if (Status st = compute_once(); !st.ok()) return report_error(st);
  }
  const auto t_ckpt = Clock::now();
  if (Status st = optimizer->checkpoint(); !st.ok()) return report_error(st);
  const double checkpoint_seconds = seconds_since(t_ckpt);

  // A sanity check that the steps did something: w0[0] (offset 0, one element) moved away
  // from 0. Its gradient is -1e-3 at every step, so each Adam step adds lr x |g| / (|g| + eps)
  // = 1e-4 x 0.99999 (Kingma & Ba, Algorithm 1, with m_hat = g and v_hat = g^2).
  float w0 = 0.0f;
  if (Status st = optimizer->read_param(0, &w0, 0, 1); !st.ok()) return report_error(st);
  if (!(w0 > 0.0f)) {
    return report_error(internal_error("w0[0] is " + std::to_string(w0) + " after " +
                                       std::to_string(a.steps + static_cast<uint64_t>(a.warmup_steps)) +
                                       " Adam steps with gradient -1e-3; expected > 0"));
  }

  const double step_s = median(step_runs);
  const double io_s = median(io_runs);
  const double compute_s = median(compute_runs);
  const double eff = step_s > 0 ? std::max(io_s, compute_s) / step_s : 0.0;
  // Bytes read + bytes written per step, over the step's and the I/O probe's time.
  const double step_gbps = static_cast<double>(2 * bytes_per_step) / step_s / 1e9;
  const double io_gbps = static_cast<double>(2 * bytes_per_step) / io_s / 1e9;
  const uint64_t rss = peak_rss_bytes();
  file.reset();
  optimizer.reset();
  (void)store->close();

  if (a.json) {
    const nlohmann::json j = {
        {"benchmark", "step"},
        {"optimizer", "adam"},
        {"state_dtype", a.state_dtype},
        {"params", a.params},
        {"tensors", ntensors},
        {"paths", a.paths},
        {"host_budget_bytes", host_budget},
        {"pinned_budget_bytes", pinned_budget},
        {"chunk_bytes", chunk},
        {"sub_group_numel", sg},
        {"buffers", buffers},
        {"store_workers", so.worker_threads},
        {"steps", a.steps},
        {"warmup_steps", a.warmup_steps},
        {"warmup_step_seconds_all", warmup_runs},
        {"step_seconds", step_s},
        {"step_seconds_all", step_runs},
        {"io_seconds", io_s},
        {"io_seconds_all", io_runs},
        {"compute_seconds", compute_s},
        {"compute_seconds_all", compute_runs},
        {"step_cpu_seconds", median(step_cpu_runs)},
        {"io_cpu_seconds", median(io_cpu_runs)},
        {"overlap_efficiency", eff},
        {"bytes_read", last.bytes_read},
        {"bytes_written", last.bytes_written},
        {"bytes_read_per_param", static_cast<double>(last.bytes_read) / static_cast<double>(a.params)},
        {"bytes_written_per_param",
         static_cast<double>(last.bytes_written) / static_cast<double>(a.params)},
        {"step_gbps", step_gbps},
        {"io_gbps", io_gbps},
        {"last_step_update_seconds", last.compute_seconds},
        {"last_step_io_wait_seconds", last.io_wait_seconds},
        {"last_step_device_seconds", occupancy_json(step_device)},
        {"last_io_probe_device_seconds", occupancy_json(probe_device)},
        {"setup_seconds", setup_seconds},
        {"checkpoint_seconds", checkpoint_seconds},
        {"peak_rss_bytes", rss},
        {"w0_0", w0}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("Adam step, %llu params in %llu tensors, %s states on NVMe (%zu dirs), sub-group "
                "%llu, %d buffers, %u store workers\n",
                static_cast<unsigned long long>(a.params), static_cast<unsigned long long>(ntensors),
                a.state_dtype.c_str(), a.paths.size(), static_cast<unsigned long long>(sg), buffers, so.worker_threads);
    std::printf("  step (median of %d):  %8.3f s   %6.2f GB/s (read+write), after %u warm-up "
                "step(s)\n", a.steps, step_s, step_gbps, a.warmup_steps);
    std::printf("  io alone (engine):    %8.3f s   %6.2f GB/s\n", io_s, io_gbps);
    std::printf("  compute alone:        %8.3f s\n", compute_s);
    std::printf("  overlap efficiency:   %8.3f  (max(io, compute) / step)\n", eff);
    std::printf("  bytes read/written:   %s / %s per step (%.2f / %.2f B/param)\n",
                format_bytes(last.bytes_read).c_str(), format_bytes(last.bytes_written).c_str(),
                static_cast<double>(last.bytes_read) / static_cast<double>(a.params),
                static_cast<double>(last.bytes_written) / static_cast<double>(a.params));
    for (const auto& [name, o] : {std::pair{"last step", step_device}, {"last io probe", probe_device}}) {
      std::printf("  %-14s device:  idle %.3f s, reads only %.3f s, writes only %.3f s, both %.3f s\n",
                  name, o.idle_seconds, o.reads_only_seconds, o.writes_only_seconds,
                  o.reads_and_writes_seconds);
    }
    std::printf("  checkpoint:           %8.3f s\n", checkpoint_seconds);
    std::printf("  peak RSS:             %s\n", format_bytes(rss).c_str());
  }
  return 0;
}

void register_bench_step(Registry& r) {
  auto args = std::make_shared<BenchStepArgs>();
  CLI::App* sub =
      add_command(bench_group(r), "step",
                  "offloaded Adam step with state on NVMe vs. I/O alone and compute alone", args,
                  run_bench_step);
  add_defaulted(sub, "--params", args->params,
                "fp32 parameters (disk: 12 B each, 8 with --state-dtype bf16, twice "
                "(copy-on-write), plus the I/O probe file of twice that: 4x the state, "
                "checked before the run)");
  sub->add_option("--path", args->paths, "NVMe directory (repeat to stripe over distinct directories)")
      ->required();
  add_defaulted(sub, "--host-budget", args->host_budget,
                "DRAM for buffers: pipeline + store (size, e.g. 1GiB)");
  add_defaulted(sub, "--sub-group", args->sub_group, "elements per sub-group (0 = one chunk)");
  add_defaulted(sub, "--buffers", args->buffers,
                "pipeline buffer slots (1..16; 0 = as many as the host budget holds, 4..64; "
                "the JSON's buffers says how many)");
  add_defaulted(sub, "--steps", args->steps, "timed steps (median reported)");
  add_defaulted(sub, "--warmup-steps", args->warmup_steps,
                "untimed steps before the timed ones (a run's first steps write new space: "
                "copy-on-write); their times are in the JSON's warmup_step_seconds_all");
  add_defaulted(sub, "--chunk-size", args->chunk_size, "store chunk size");
  add_defaulted(sub, "--tensor-numel", args->tensor_numel,
                "largest tensor (the model is cut into tensors)");
  add_defaulted(sub, "--state-dtype", args->state_dtype,
                "element type of Adam's m and v in the store: fp32 or bf16 (bf16 moments; the "
                "master stays fp32)");
  add_defaulted(sub, "--threads", args->threads, "kernel threads (0 = one per core)");
  add_defaulted(sub, "--store-workers", args->store_workers,
                "store worker threads (0 = the store default, 4)");
  sub->add_flag("--keep", args->keep, "keep the store directories");
  sub->add_flag("--json", args->json, "print one JSON object");
  add_config_option(sub, args->config);
}

STRATA_CLI_COMMAND(register_bench_step);

}  // namespace
}  // namespace strata::cli
