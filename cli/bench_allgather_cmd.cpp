// `strata bench allgather --nproc N --bytes S [--backend gloo|nccl] [--iters K] [--json]`
//
// Times all-gather the way nccl-tests does: S ("bytes") is the total gathered size, each of
// the N ranks contributes floor(S/N) bytes (an all-gather moves equal shares), so the bytes
// measured are N x floor(S/N): the output's "bytes" (and the text) give that figure, and
// "bytes_requested" the S asked for, and the text says when they differ;
// algbw = bytes / time and busbw = algbw * (N-1)/N
// (https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md#allgather).
// The time of an iteration is the slowest rank's; the reported time is the median over
// iterations. Beside it, the same run measures a single-thread memcpy of one rank's share
// as a reference limit for loopback.
//
// Without --from-env the command re-executes itself through the local launcher with N
// ranks; with --from-env (as under torchrun or `strata launch`) it is one rank.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#ifdef STRATA_HAVE_CUDA
#include "strata/base/detail/cuda_api.hpp"  // the CUDA runtime, loaded at run time
#include "strata/base/gpu_libraries.hpp"
#endif

#include "command.hpp"
#include "launch_ranks.hpp"
#include "strata/base/units.hpp"
#include "strata/collectives/communicator.hpp"
#include "strata/collectives/launcher.hpp"

namespace strata::cli {
namespace {

struct AllgatherArgs {
  int nproc = 2;
  std::string bytes_text = "64MiB";
  std::string backend = "gloo";
  int iters = 20;
  int warmup = 3;
  RankOptions ranks;  // --master-port, --json, --from-env, --result-file
};

// Device or host buffer of the communicator's memory kind.
struct Buffer {
  void* ptr = nullptr;
  size_t nbytes = 0;
  bool device = false;
  ~Buffer() {
#ifdef STRATA_HAVE_CUDA
    if (device && ptr) detail::cudart()->cudaFree(ptr);  // device buffers exist only if loaded
#endif
    if (!device) std::free(ptr);
  }
};

Status alloc(Buffer& b, size_t nbytes, bool device) {
  b.nbytes = nbytes;
  b.device = device;
  if (device) {
#ifdef STRATA_HAVE_CUDA
    STRATA_RETURN_IF_ERROR(require_cuda_runtime("device buffer"));
    if (detail::cudart()->cudaMalloc(&b.ptr, std::max<size_t>(nbytes, 1)) != cudaSuccess)
      return resource_exhausted("cudaMalloc of " + std::to_string(nbytes) + " bytes failed");
    return Status::OK();
#else
    return unimplemented("device buffers need CUDA");
#endif
  }
  b.ptr = std::aligned_alloc(4096, align_up(std::max<size_t>(nbytes, 1), 4096));
  if (!b.ptr) return resource_exhausted("malloc of " + std::to_string(nbytes) + " bytes failed");
  std::memset(b.ptr, 0, nbytes);
  return Status::OK();
}

Status copy(void* dst, const void* src, size_t n, bool to_device, bool from_device) {
#ifdef STRATA_HAVE_CUDA
  if (to_device || from_device) {
    auto kind = to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    STRATA_RETURN_IF_ERROR(require_cuda_runtime("cudaMemcpy"));
    if (detail::cudart()->cudaMemcpy(dst, src, n, kind) != cudaSuccess)
      return internal_error("cudaMemcpy failed");
    return Status::OK();
  }
#endif
  std::memcpy(dst, src, n);
  return Status::OK();
}

uint8_t pattern(int rank, size_t i) { return static_cast<uint8_t>(rank * 37 + 1 + i * 7); }

// One rank: returns the result JSON (meaningful on rank 0).
Result<nlohmann::json> run_rank(const AllgatherArgs& a, uint64_t total_bytes) {
  STRATA_ASSIGN_OR_RETURN(Backend backend, parse_backend(a.backend));
  STRATA_ASSIGN_OR_RETURN(auto comm, create_communicator_from_env(backend));
  const int n = comm->size(), r = comm->rank();
  const size_t share = total_bytes / static_cast<size_t>(n);
  const size_t gathered = share * static_cast<size_t>(n);
  const bool dev = backend == Backend::kNccl;
  Buffer send, recv, timing;
  STRATA_RETURN_IF_ERROR(alloc(send, share, dev));
  STRATA_RETURN_IF_ERROR(alloc(recv, gathered, dev));
  STRATA_RETURN_IF_ERROR(alloc(timing, sizeof(double), dev));
  std::vector<uint8_t> host(std::max(share, gathered));
  for (size_t i = 0; i < share; ++i) host[i] = pattern(r, i);
  STRATA_RETURN_IF_ERROR(copy(send.ptr, host.data(), share, dev, false));

  // Warm-up, then verify what was gathered.
  for (int i = 0; i < std::max(a.warmup, 1); ++i)
    STRATA_RETURN_IF_ERROR(comm->all_gather(send.ptr, recv.ptr, share, DType::kUInt8));
  STRATA_RETURN_IF_ERROR(copy(host.data(), recv.ptr, gathered, false, dev));
  int64_t bad = 0;
  for (int s = 0; s < n; ++s)
    for (size_t i = 0; i < share; ++i) bad += host[s * share + i] != pattern(s, i);
  double bad_d = static_cast<double>(bad);
  // Sum of mismatches over ranks, via the communicator itself.
  STRATA_RETURN_IF_ERROR(copy(timing.ptr, &bad_d, sizeof(double), dev, false));
  STRATA_RETURN_IF_ERROR(comm->all_reduce(timing.ptr, timing.ptr, 1, DType::kFloat64, ReduceOp::kSum));
  STRATA_RETURN_IF_ERROR(copy(&bad_d, timing.ptr, sizeof(double), false, dev));

  std::vector<double> times;
  for (int it = 0; it < a.iters; ++it) {
    STRATA_RETURN_IF_ERROR(comm->barrier());
    auto t0 = std::chrono::steady_clock::now();
    STRATA_RETURN_IF_ERROR(comm->all_gather(send.ptr, recv.ptr, share, DType::kUInt8));
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    STRATA_RETURN_IF_ERROR(copy(timing.ptr, &dt, sizeof(double), dev, false));
    STRATA_RETURN_IF_ERROR(comm->all_reduce(timing.ptr, timing.ptr, 1, DType::kFloat64, ReduceOp::kMax));
    STRATA_RETURN_IF_ERROR(copy(&dt, timing.ptr, sizeof(double), false, dev));
    times.push_back(dt);
  }

  // Reference: single-thread memcpy of one share (host), median of 5, same process.
  std::vector<double> mc;
  {
    std::vector<uint8_t> a1(share + 1, 1), a2(share + 1, 2);
    for (int i = 0; i < 5; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      std::memcpy(a2.data(), a1.data(), share);
      mc.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      a1[i] = a2[share / 2];  // keep the copies observable
    }
  }
  const double sec = median(times);
  const double algbw = gbps(gathered, sec);
  nlohmann::json j;
  j["collective"] = "allgather";
  j["backend"] = std::string(backend_name(backend));
  j["nproc"] = n;
  j["bytes"] = gathered;
  j["bytes_requested"] = total_bytes;
  j["bytes_per_rank"] = share;
  j["iters"] = a.iters;
  j["seconds"] = sec;
  j["seconds_min"] = *std::min_element(times.begin(), times.end());
  j["seconds_max"] = *std::max_element(times.begin(), times.end());
  j["algbw_gbps"] = algbw;
  j["busbw_gbps"] = n > 1 ? algbw * (n - 1) / n : 0.0;
  j["memcpy_gbps"] = gbps(share, median(mc));
  j["verified"] = bad_d == 0;
  j["mismatched_bytes"] = static_cast<int64_t>(bad_d);
  return j;
}

void print_human(const nlohmann::json& j) {
  std::printf("allgather  backend=%s  nproc=%d  bytes=%llu (%s total, %s per rank)  iters=%d\n",
              j["backend"].get<std::string>().c_str(), j["nproc"].get<int>(),
              static_cast<unsigned long long>(j["bytes"].get<uint64_t>()),
              format_bytes(j["bytes"].get<uint64_t>()).c_str(),
              format_bytes(j["bytes_per_rank"].get<uint64_t>()).c_str(), j["iters"].get<int>());
  const uint64_t requested = j.value("bytes_requested", j["bytes"].get<uint64_t>());
  if (requested != j["bytes"].get<uint64_t>()) {
    std::printf("  note: --bytes %llu is not a multiple of nproc %d: measured %llu bytes "
                "(%d x %llu per rank)\n",
                static_cast<unsigned long long>(requested), j["nproc"].get<int>(),
                static_cast<unsigned long long>(j["bytes"].get<uint64_t>()), j["nproc"].get<int>(),
                static_cast<unsigned long long>(j["bytes_per_rank"].get<uint64_t>()));
  }
  std::printf("  time (median of slowest rank) %.3f ms   [min %.3f, max %.3f]\n",
              j["seconds"].get<double>() * 1e3, j["seconds_min"].get<double>() * 1e3,
              j["seconds_max"].get<double>() * 1e3);
  std::printf("  algbw %.3f GB/s   busbw %.3f GB/s   (busbw = algbw * (n-1)/n, as nccl-tests)\n",
              j["algbw_gbps"].get<double>(), j["busbw_gbps"].get<double>());
  double mc = j["memcpy_gbps"].get<double>();
  std::printf("  reference: memcpy of one rank's share %.2f GB/s; busbw / memcpy = %.3f\n", mc,
              mc > 0 ? j["busbw_gbps"].get<double>() / mc : 0.0);
  std::printf("  verified: %s\n", j["verified"].get<bool>() ? "yes" : "NO");
}

int run_allgather(const AllgatherArgs& a) {
  auto total = parse_size(a.bytes_text);
  if (!total.ok()) return report_error(total.status().with_context("--bytes"));
  if (auto b = parse_backend(a.backend); !b.ok()) return report_error(b.status());
  if (a.iters < 1) return report_error(invalid_argument("--iters must be >= 1"));
  if (a.ranks.from_env) {
    auto env = read_distributed_env();
    if (!env.ok()) return report_error(env.status());
    auto j = run_rank(a, *total);
    if (!j.ok()) return report_error(j.status());
    emit_rank_result(a.ranks, env->rank, *j, print_human);
    return 0;
  }
  if (*total < static_cast<uint64_t>(a.nproc))
    return report_error(invalid_argument("--bytes " + a.bytes_text + " is smaller than --nproc"));
  auto run = run_self_as_ranks(
      a.nproc, a.ranks.master_port,
      {"bench", "allgather", "--from-env", "--bytes", a.bytes_text, "--backend", a.backend,
       "--iters", std::to_string(a.iters), "--warmup", std::to_string(a.warmup)});
  if (!run.ok()) return report_error(run.status());
  if (!run->ranks_status.ok()) return report_error(run->ranks_status.with_context("bench allgather"));
  auto j = print_ranks_result(a.ranks, *run, print_human);
  if (!j.ok()) return report_error(j.status());
  return (*j)["verified"].get<bool>() ? 0 : 1;
}

void register_bench_allgather(Registry& r) {
  auto a = std::make_shared<AllgatherArgs>();
  auto* cmd = add_command(bench_group(r), "allgather",
                          "All-gather bandwidth (nccl-tests' algbw/busbw)", a, run_allgather);
  cmd->add_option("--nproc", a->nproc, "Number of local ranks to launch")->check(CLI::Range(1, 1024));
  cmd->add_option("--bytes", a->bytes_text,
                  "Total gathered size S (e.g. 64MiB); each rank sends floor(S/N) bytes, so "
                  "N x floor(S/N) bytes are measured and reported as bytes (bytes_requested: S)");
  cmd->add_option("--backend", a->backend, "gloo (host memory) or nccl (GPU memory)");
  cmd->add_option("--iters", a->iters, "Timed iterations")->check(CLI::Range(1, 1000000));
  cmd->add_option("--warmup", a->warmup, "Untimed iterations first")->check(CLI::Range(0, 1000000));
  add_rank_options(cmd, a->ranks);
}

STRATA_CLI_COMMAND(register_bench_allgather);

}  // namespace
}  // namespace strata::cli
