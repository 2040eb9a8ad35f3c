// `strata bench partitioned-read --nproc N --bytes S --path DIR [--piece-bytes P]
//  [--iters K] [--emulated-drive-bw B [--emulated-drive-size Z]] [--json]`
//
// Bandwidth-centric partitioned read (ZeRO-Infinity): an object of S bytes is stored over
// N ranks, rank r keeping its ceil(S/N)-byte slice in its own store DIR/rank<r>; every rank
// then reads its slice and the slices are all-gathered so every rank holds all S bytes.
//
// With --emulated-drive-bw B, every rank gets its own drive (cli/emulated_drives.hpp): N
// sparse files of Z bytes under DIR (default Z: max(1 GiB, 2 x ceil(S/N) + 256 MiB)) on loop
// devices with direct I/O, ext4, throttled to B bytes/s each (reads and writes) by one blkio
// cgroup the ranks run in; rank r's store is <drive r>/rank<r>. Root only: elsewhere the run
// fails with "emulated drives refused: <what>". The same happens inside `strata
// emulate-drives` (the ranks take STRATA_EMULATED_DRIVES / STRATA_EMULATED_DRIVE_BW).
// In the same run, alternating, it measures:
//   read_seconds       every rank reads its whole slice from its store (concurrently);
//                      the slowest rank's time, median over iterations
//   allgather_seconds  the all-gather of the padded slices from memory (slowest rank)
//   pipelined_seconds  fetch_partitioned with reads overlapping the all-gather
//   sequential_seconds fetch_partitioned reading the whole slice first, then gathering
//                      (same pieces), i.e. no overlap
// seconds = pipelined_seconds; gbps = S / seconds.
//
// JSON fields for the drives' scaling (stable names; strata plan's accuracy check reads them):
//   aggregate_gbps         S / read_seconds: all ranks' slices over the slowest rank's read
//                          time (median over iterations), 1e9 bytes/s; = read_gbps
//   per_drive_gbps         ceil(S/N) / read_seconds: what each drive delivered while all read
//   per_rank_read_gbps     [r]: rank r's slice / rank r's own median read time
//   read_seconds_all       the slowest rank's read time of each iteration
//   emulated               whether the stores were on emulated drives
//   emulated_drive_bw      B in bytes/s (0 when not emulated)
//   emulated_drives        the drives' mount points ([] when not emulated)
//   aggregate_target_gbps  N x B / 1e9 (0 when not emulated)
//   aggregate_efficiency   aggregate_gbps / aggregate_target_gbps (0 when not emulated) The model (docs/partitioned.md,
// DESIGN.md): pipelined ~= max(read, allgather), sequential ~= read + allgather.
// verified is true only when every rank's gathered bytes equal the known pattern after every
// fetch.
//
// Without --from-env the command re-executes itself through the local launcher with N
// ranks (as `strata bench allgather` does); with --from-env it is one rank.
//
// Memory per rank (partitioned_rank_memory): 2 x S (the gathered object and the expected
// bytes it is verified against) + N x ceil(S/N) (the all-gather buffer of the gather-only
// variant) + 2 x ceil(S/N) (its send buffer and the read-only variant's buffer) +
// (3 + 2N) x piece (fetch_partitioned's read and staging buffers), about (3 + 2/N) x S. Before
// launching, the run is refused (ResourceExhausted) when N times that exceeds MemAvailable;
// a rank that cannot allocate a buffer returns ResourceExhausted naming it.
// --piece-bytes must be a positive multiple of 4096 (it becomes the store's chunk size).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "bench_limits.hpp"
#include "command.hpp"
#include "config_option.hpp"
#include "emulated_drives.hpp"
#include "launch_ranks.hpp"
#include "strata/base/units.hpp"
#include "strata/collectives/communicator.hpp"
#include "strata/collectives/launcher.hpp"
#include "strata/store/config.hpp"
#include "strata/store/partitioned.hpp"
#include "strata/store/store.hpp"

namespace strata::cli {
namespace {

struct PartArgs {
  int nproc = 2;
  std::string bytes_text = "256MiB";
  std::string path;
  std::string piece_text = "8MiB";
  int iters = 5;
  bool keep = false;
  std::string config;  // --config FILE: exported to the ranks as STRATA_CONFIG
  std::string drive_bw_text;    // --emulated-drive-bw ("" = real disk)
  std::string drive_size_text;  // --emulated-drive-size ("" = default)
  RankOptions ranks;  // --master-port, --json, --from-env, --result-file
};

// Byte i of the benchmark object (independent of N, so every rank can verify all bytes).
inline uint8_t pattern(uint64_t i) {
  return static_cast<uint8_t>((i * 0x9E3779B1u) >> 13) ^ static_cast<uint8_t>(i >> 20);
}

// 4096-aligned host memory; allocate() reports a failed allocation.
struct Aligned {
  uint8_t* p = nullptr;
  Aligned() = default;
  ~Aligned() { std::free(p); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  Status allocate(uint64_t n, const char* what) {
    const uint64_t len = align_up(std::max<uint64_t>(n, 1), 4096);
    p = static_cast<uint8_t*>(std::aligned_alloc(4096, len));
    if (p == nullptr) {
      return resource_exhausted(std::string("allocating ") + what + " (" + std::to_string(len) +
                                    " bytes) failed",
                                ENOMEM);
    }
    return Status::OK();
  }
};

// Bytes one rank allocates for an object of `total` bytes over `n` ranks with pieces of
// `piece` bytes (see the file comment); nullopt when that overflows 64 bits.
std::optional<uint64_t> partitioned_rank_memory(uint64_t total, uint64_t n, uint64_t piece) {
  const unsigned __int128 c = (static_cast<unsigned __int128>(total) + n - 1) / n;
  const unsigned __int128 need = 2 * static_cast<unsigned __int128>(total) + n * c + 2 * c +
                                 (3 + 2 * static_cast<unsigned __int128>(n)) * piece;
  if (need > UINT64_MAX) return std::nullopt;
  return static_cast<uint64_t>(need);
}

// The slowest rank's value of `x`.
Result<double> max_over_ranks(Communicator& c, double x) {
  STRATA_RETURN_IF_ERROR(c.all_reduce(&x, &x, 1, DType::kFloat64, ReduceOp::kMax));
  return x;
}

Result<nlohmann::json> run_rank(const PartArgs& a, uint64_t total, uint64_t piece) {
  STRATA_ASSIGN_OR_RETURN(auto comm, create_communicator_from_env(Backend::kGloo));
  Communicator& c = *comm;
  const int n = c.size(), r = c.rank();
  StoreOptions so;
  STRATA_ASSIGN_OR_RETURN(so, StoreOptions::from_env());
  const std::vector<std::string> drives = emulated_drive_dirs_from_env();
  if (!drives.empty() && drives.size() < static_cast<size_t>(n)) {
    return invalid_argument(std::string(kEmulatedDrivesEnv) + " names " +
                            std::to_string(drives.size()) + " drive(s), fewer than the " +
                            std::to_string(n) + " ranks");
  }
  const std::string base = drives.empty() ? a.path : drives[static_cast<size_t>(r)];
  so.path = (std::filesystem::path(base) / ("rank" + std::to_string(r))).string();
  so.staging_bytes = std::min<uint64_t>(so.staging_bytes, 64ull << 20);
  // Pieces are whole store chunks (read_range verifies whole chunks): a new store gets
  // chunks of one piece; an existing one keeps its chunk size and the piece is rounded up.
  so.chunk_bytes = piece;  // a positive multiple of 4096 (checked by run_partitioned)
  STRATA_ASSIGN_OR_RETURN(auto store, Store::open(so));

  const TensorDesc desc = TensorDesc::bytes(total);
  STRATA_ASSIGN_OR_RETURN(PartitionLayout l, partition_layout(total, n));
  const uint64_t own = l.owned_numel(r), begin = l.begin(r), cbytes = l.chunk_numel;
  const uint64_t store_chunk = store->chunk_bytes();
  piece = effective_piece_bytes(piece, store_chunk);
  const std::string key = "bench_partitioned_read";

  // Put this rank's slice.
  {
    Aligned slice;
    STRATA_RETURN_IF_ERROR(slice.allocate(own, "the rank's slice"));
    for (uint64_t i = 0; i < own; ++i) slice.p[i] = pattern(begin + i);
    PartitionOptions po;
    po.put.overwrite = true;
    STRATA_RETURN_IF_ERROR(put_partitioned_slice(*store, c, key, slice.p, desc, po));
  }

  Aligned dst, want, rbuf, sendb, gbuf;
  STRATA_RETURN_IF_ERROR(dst.allocate(total, "the gathered object"));
  STRATA_RETURN_IF_ERROR(want.allocate(total, "the expected object"));
  STRATA_RETURN_IF_ERROR(rbuf.allocate(cbytes, "the read buffer"));
  STRATA_RETURN_IF_ERROR(sendb.allocate(cbytes, "the all-gather send buffer"));
  STRATA_RETURN_IF_ERROR(gbuf.allocate(cbytes * n, "the all-gather buffer"));
  std::memset(sendb.p, 0, cbytes);
  std::memset(dst.p, 0, total);
  for (uint64_t i = 0; i < total; ++i) want.p[i] = pattern(i);
  int64_t mismatched = 0;
  auto verify = [&] {  // every gathered byte against the pattern, then clear for the next
    if (std::memcmp(dst.p, want.p, total) != 0)
      for (uint64_t i = 0; i < total; ++i) mismatched += dst.p[i] != want.p[i];
    std::memset(dst.p, 0, total);
  };
  std::vector<double> t_pipe, t_seq, t_read, t_gather, t_read_own;
  PartitionOptions pipe, seq;
  pipe.piece_bytes = seq.piece_bytes = piece;
  seq.pipelined = false;
  auto fetch = [&](const PartitionOptions& o) -> Result<double> {
    STRATA_RETURN_IF_ERROR(c.barrier());
    auto t0 = Clock::now();
    STRATA_RETURN_IF_ERROR(fetch_partitioned(*store, c, key, dst.p, desc, o));
    double dt = seconds_since(t0);
    verify();
    return max_over_ranks(c, dt);
  };
  auto read_only = [&]() -> Result<double> {
    STRATA_RETURN_IF_ERROR(c.barrier());
    auto t0 = Clock::now();
    if (own) STRATA_RETURN_IF_ERROR(store->read_range(key + kPartitionDataSuffix, 0, own, rbuf.p));
    t_read_own.push_back(seconds_since(t0));
    return max_over_ranks(c, t_read_own.back());
  };
  auto gather_only = [&]() -> Result<double> {
    STRATA_RETURN_IF_ERROR(c.barrier());
    auto t0 = Clock::now();
    STRATA_RETURN_IF_ERROR(c.all_gather(sendb.p, gbuf.p, cbytes, DType::kUInt8));
    return max_over_ranks(c, seconds_since(t0));
  };

  // Warm-up (connections, first-touch of buffers), verified too.
  STRATA_RETURN_IF_ERROR(fetch(pipe).status());
  STRATA_RETURN_IF_ERROR(gather_only().status());


  for (int it = 0; it < a.iters; ++it) {
    // Alternate the order (ABBA...) so drift does not favour one variant.
    const bool pipe_first = it % 2 == 0;
    for (int k = 0; k < 2; ++k) {
      STRATA_ASSIGN_OR_RETURN(double t, fetch((k == 0) == pipe_first ? pipe : seq));
      ((k == 0) == pipe_first ? t_pipe : t_seq).push_back(t);
    }
    STRATA_ASSIGN_OR_RETURN(double tr, read_only());
    t_read.push_back(tr);
    STRATA_ASSIGN_OR_RETURN(double tg, gather_only());
    t_gather.push_back(tg);
  }
  // Each rank's own median read time, gathered (rank order).
  std::vector<double> own_read(static_cast<size_t>(n));
  double my_read = median(t_read_own);
  STRATA_RETURN_IF_ERROR(c.all_gather(&my_read, own_read.data(), 1, DType::kFloat64));
  double bad = static_cast<double>(mismatched);
  STRATA_RETURN_IF_ERROR(c.all_reduce(&bad, &bad, 1, DType::kFloat64, ReduceOp::kSum));
  if (!a.keep) (void)remove_partitioned(*store, key);
  STRATA_RETURN_IF_ERROR(store->close());

  const double tp = median(t_pipe), ts = median(t_seq), tr = median(t_read),
               tg = median(t_gather);
  nlohmann::json j;
  j["bench"] = "partitioned-read";
  j["nproc"] = n;
  j["bytes"] = total;
  j["bytes_per_rank"] = cbytes;
  j["piece_bytes"] = piece;
  j["store_chunk_bytes"] = store_chunk;
  j["iters"] = a.iters;
  j["path"] = a.path;
  j["seconds"] = tp;
  j["gbps"] = gbps(total, tp);
  j["pipelined_seconds"] = tp;
  j["sequential_seconds"] = ts;
  j["sequential_gbps"] = gbps(total, ts);
  j["pipelining_gain"] = tp > 0 ? ts / tp : 0.0;
  j["read_seconds"] = tr;
  j["read_gbps"] = gbps(total, tr);  // all ranks' slices together
  j["allgather_seconds"] = tg;
  j["allgather_algbw_gbps"] = gbps(total, tg);
  j["model_overlap_seconds"] = std::max(tr, tg);  // pipelined ideal
  j["model_sum_seconds"] = tr + tg;               // no overlap
  j["overlap_efficiency"] = tp > 0 ? std::max(tr, tg) / tp : 0.0;
  j["pipelined_seconds_all"] = t_pipe;
  j["sequential_seconds_all"] = t_seq;
  j["aggregate_gbps"] = gbps(total, tr);
  j["per_drive_gbps"] = gbps(cbytes, tr);
  std::vector<double> per_rank;
  for (int q = 0; q < n; ++q) per_rank.push_back(gbps(l.owned_numel(q), own_read[q]));
  j["per_rank_read_gbps"] = per_rank;
  j["read_seconds_all"] = t_read;
  const uint64_t bw = drives.empty() ? 0 : emulated_drive_bw_from_env();
  j["emulated"] = !drives.empty();
  j["emulated_drive_bw"] = bw;
  j["emulated_drives"] = drives.empty() ? drives : std::vector<std::string>(drives.begin(), drives.begin() + n);
  const double target = static_cast<double>(bw) * n / 1e9;
  j["aggregate_target_gbps"] = target;
  j["aggregate_efficiency"] = target > 0 ? gbps(total, tr) / target : 0.0;
  j["verified"] = bad == 0;
  j["mismatched_bytes"] = static_cast<int64_t>(bad);
  return j;
}

void print_human(const nlohmann::json& j) {
  std::printf("partitioned-read  nproc=%d  bytes=%s (%s per rank)  piece=%s  iters=%d  path=%s\n",
              j["nproc"].get<int>(), format_bytes(j["bytes"].get<uint64_t>()).c_str(),
              format_bytes(j["bytes_per_rank"].get<uint64_t>()).c_str(),
              format_bytes(j["piece_bytes"].get<uint64_t>()).c_str(), j["iters"].get<int>(),
              j["path"].get<std::string>().c_str());
  auto ms = [&](const char* k) { return j[k].get<double>() * 1e3; };
  std::printf("  fetch pipelined   %9.2f ms  %7.3f GB/s\n", ms("pipelined_seconds"),
              j["gbps"].get<double>());
  std::printf("  fetch sequential  %9.2f ms  %7.3f GB/s   pipelining gain x%.2f\n",
              ms("sequential_seconds"), j["sequential_gbps"].get<double>(),
              j["pipelining_gain"].get<double>());
  std::printf("  read only         %9.2f ms  %7.3f GB/s (all ranks' slices together)\n",
              ms("read_seconds"), j["read_gbps"].get<double>());
  std::printf("  all-gather only   %9.2f ms  %7.3f GB/s algbw\n", ms("allgather_seconds"),
              j["allgather_algbw_gbps"].get<double>());
  std::printf("  model: max(read, gather) %.2f ms, read + gather %.2f ms; "
              "max / pipelined = %.3f\n",
              ms("model_overlap_seconds"), ms("model_sum_seconds"),
              j["overlap_efficiency"].get<double>());
  if (j["emulated"].get<bool>()) {
    std::printf("  emulated drives: %d x %.3f GB/s; aggregate read %.3f GB/s = %.3f x N x B "
                "(%.3f GB/s per drive)\n",
                j["nproc"].get<int>(), j["emulated_drive_bw"].get<double>() / 1e9,
                j["aggregate_gbps"].get<double>(), j["aggregate_efficiency"].get<double>(),
                j["per_drive_gbps"].get<double>());
  }
  std::printf("  verified: %s\n", j["verified"].get<bool>() ? "yes" : "NO");
}

// The drives of --emulated-drive-bw for an object of `total` bytes over a.nproc ranks.
// \error InvalidArgument for a bad bandwidth or size, too many ranks, a drive too small for
//     its slice; ResourceExhausted when the real disk cannot hold the drives' data.
Result<EmulatedDriveOptions> emulated_drive_options(const PartArgs& a, uint64_t total) {
  EmulatedDriveOptions o;
  STRATA_ASSIGN_OR_RETURN(o.bytes_per_s,
                          parse_bandwidth_arg(a.drive_bw_text, "--emulated-drive-bw"));
  if (a.nproc > kMaxEmulatedDrives) {
    return invalid_argument("--nproc " + std::to_string(a.nproc) + " with --emulated-drive-bw: " +
                            "at most " + std::to_string(kMaxEmulatedDrives) +
                            " emulated drives (one per rank)");
  }
  const uint64_t n = static_cast<uint64_t>(a.nproc), slice = (total + n - 1) / n;
  const uint64_t need = 2 * slice + (256ull << 20);  // the slice, a rewrite, ext4's metadata
  if (a.drive_size_text.empty()) {
    o.size_bytes = align_up(std::max<uint64_t>(need, 1ull << 30), 1ull << 20);
  } else {
    STRATA_ASSIGN_OR_RETURN(o.size_bytes,
                            parse_size_arg(a.drive_size_text, "--emulated-drive-size"));
    if (o.size_bytes < kMinEmulatedDriveBytes || o.size_bytes % 4096 != 0 ||
        o.size_bytes < slice + (64ull << 20)) {
      return invalid_argument("--emulated-drive-size '" + a.drive_size_text + "' (" +
                              std::to_string(o.size_bytes) + " bytes) must be a multiple of " +
                              "4096 and hold a rank's slice of " + format_bytes(slice) +
                              " plus 64 MiB for ext4 (at least " +
                              format_bytes(std::max<uint64_t>(kMinEmulatedDriveBytes, slice + (64ull << 20))) +
                              ")");
    }
  }
  o.count = a.nproc;
  o.base_dir = a.path;
  // The sparse files take what is written: the slice and ext4's tables and journal (~1/16).
  STRATA_RETURN_IF_ERROR(check_free_space(
      {{"--path", a.path, n * (slice + o.size_bytes / 16)}},
      "bench partitioned-read --emulated-drive-bw (" + std::to_string(n) + " drives)"));
  return o;
}

int run_partitioned(const PartArgs& a) {
  if (!a.config.empty()) {  // checked here; every rank reads it through StoreOptions::from_env()
    if (auto c = Config::load(a.config); !c.ok()) return report_error(c.status());
    ::setenv("STRATA_CONFIG", a.config.c_str(), 1);
  }
  auto total = parse_size(a.bytes_text);
  if (!total.ok()) return report_error(total.status().with_context("--bytes"));
  auto piece = parse_size(a.piece_text);
  if (!piece.ok()) return report_error(piece.status().with_context("--piece-bytes"));
  if (*piece == 0 || *piece % 4096 != 0) {
    return report_error(invalid_argument("--piece-bytes '" + a.piece_text + "' (" +
                                         std::to_string(*piece) +
                                         " bytes) must be a positive multiple of 4096"));
  }
  if (a.path.empty()) return report_error(invalid_argument("--path is required"));
  if (a.iters < 1) return report_error(invalid_argument("--iters must be >= 1"));
  if (a.ranks.from_env) {
    auto env = read_distributed_env();
    if (!env.ok()) return report_error(env.status());
    // This rank's own need (the launching command checked all ranks together).
    auto need = partitioned_rank_memory(*total, static_cast<uint64_t>(env->world_size), *piece);
    Status mem = need ? check_memory(*need, "rank " + std::to_string(env->rank) +
                                                " of bench partitioned-read --bytes " + a.bytes_text)
                      : invalid_argument("--bytes " + a.bytes_text + ": the memory need overflows 64 bits");
    if (!mem.ok()) return report_error(mem);
    auto j = run_rank(a, *total, *piece);
    if (!j.ok()) return report_error(j.status());
    emit_rank_result(a.ranks, env->rank, *j, print_human);
    return (*j)["verified"].get<bool>() ? 0 : 1;
  }
  if (*total == 0) return report_error(invalid_argument("--bytes must be > 0"));
  std::optional<EmulatedDriveOptions> drives;
  if (!a.drive_bw_text.empty()) {
    auto o = emulated_drive_options(a, *total);
    if (!o.ok()) return report_error(o.status());
    drives = *o;
  } else if (!a.drive_size_text.empty()) {
    return report_error(invalid_argument("--emulated-drive-size needs --emulated-drive-bw"));
  }
  {
    const uint64_t n = static_cast<uint64_t>(a.nproc);
    auto per_rank = partitioned_rank_memory(*total, n, *piece);
    if (!per_rank || *per_rank > UINT64_MAX / n) {
      return report_error(
          invalid_argument("--bytes " + a.bytes_text + ": the memory need overflows 64 bits"));
    }
    Status mem = check_memory(*per_rank * n, "bench partitioned-read --nproc " +
                                                 std::to_string(a.nproc) + " --bytes " +
                                                 a.bytes_text + " (" + std::to_string(*per_rank) +
                                                 " bytes per rank)");
    if (!mem.ok()) return report_error(mem);
  }
  std::vector<std::string> args = {"bench", "partitioned-read", "--from-env", "--bytes",
                                   a.bytes_text, "--path", a.path, "--piece-bytes", a.piece_text,
                                   "--iters", std::to_string(a.iters)};
  if (a.keep) args.push_back("--keep");
  auto launch = [&, args] {
    auto run = run_self_as_ranks(a.nproc, a.ranks.master_port, args);
    if (!run.ok()) return report_error(run.status());
    // A rank that found a mismatch exits non-zero after rank 0 wrote its (unverified) result.
    if (!run->ranks_status.ok() && run->result.empty())
      return report_error(run->ranks_status.with_context("bench partitioned-read"));
    auto j = print_ranks_result(a.ranks, *run, print_human);
    if (!j.ok()) return report_error(j.status());
    return (*j)["verified"].get<bool>() && run->ranks_status.ok() ? 0 : 1;
  };
  if (!drives) return launch();
  std::error_code ec;
  const bool made_path = std::filesystem::create_directories(a.path, ec);
  if (ec) return report_error(errno_status(ec.value(), "create --path '" + a.path + "'"));
  const int rc = with_emulated_drives(*drives, [&](const EmulatedDrives&) { return launch(); });
  if (made_path) std::filesystem::remove(a.path, ec);
  return rc;
}

void register_bench_partitioned(Registry& r) {
  auto a = std::make_shared<PartArgs>();
  auto* cmd = add_command(
      bench_group(r), "partitioned-read",
      "Bandwidth-centric partitioned read: each rank reads its slice, all-gather assembles it", a,
      run_partitioned);
  cmd->add_option("--nproc", a->nproc, "Number of local ranks to launch")->check(CLI::Range(1, 1024));
  cmd->add_option("--bytes", a->bytes_text,
                  "Object size S (e.g. 256MiB); each rank stores S/N. Memory: each rank holds "
                  "2 x S + (N + 2) x ceil(S/N) + (3 + 2N) x piece bytes (about (3 + 2/N) x S); refused "
                  "when N ranks need more than MemAvailable");
  cmd->add_option("--path", a->path, "Directory; rank r uses DIR/rank<r> as its store")->required();
  cmd->add_option("--piece-bytes", a->piece_text,
                  "Pipeline piece per rank, a positive multiple of 4096 (default 8MiB)");
  cmd->add_option("--iters", a->iters, "Timed iterations of each variant (default 5)")
      ->check(CLI::Range(1, 1000000));
  add_rank_options(cmd, a->ranks);
  cmd->add_flag("--keep", a->keep, "Keep the object in the stores afterwards");
  add_config_option(cmd, a->config);
  cmd->add_option("--emulated-drive-bw", a->drive_bw_text,
                  "Give each rank its own emulated drive of this many bytes/s (e.g. 200MiB; "
                  "loop device over a file under --path, ext4, blkio throttle; root only)");
  cmd->add_option("--emulated-drive-size", a->drive_size_text,
                  "Size of each emulated drive (sparse; default max(1GiB, 2 x S/N + 256MiB))");
}

STRATA_CLI_COMMAND(register_bench_partitioned);

}  // namespace
}  // namespace strata::cli
