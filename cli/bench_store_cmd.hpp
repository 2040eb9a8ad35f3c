// `strata bench store`'s measurement, shared with `strata tune` (measured.store_*).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench_limits.hpp"
#include "strata/base/status.hpp"
#include "strata/base/units.hpp"
#include "strata/store/io_engine.hpp"
#include "strata/store/pinned_pool.hpp"
#include "strata/store/store.hpp"

namespace strata::cli {

/// Benchmark memory: a PinnedPool buffer (huge pages, registered with the engine) of at
/// least 4096 bytes. Not thread-safe.
struct BenchBuffer {
  std::shared_ptr<PinnedPool> pool;
  PinnedBuffer buf;
  /// \error the pool's errors (ResourceExhausted when `nbytes` cannot be pinned).
  Status init(uint64_t nbytes, const std::shared_ptr<IoEngine>& engine) {
    PinnedPoolOptions po;
    po.budget_bytes = align_up(std::max<uint64_t>(nbytes, 4096), 2 * kMiB);
    STRATA_ASSIGN_OR_RETURN(pool, PinnedPool::create(po, engine));
    STRATA_ASSIGN_OR_RETURN(buf, pool->try_allocate(std::max<uint64_t>(nbytes, 4096)));
    return Status::OK();
  }
  uint8_t* data() const { return static_cast<uint8_t*>(buf.data()); }
};

/// flocks DIR/bench.lock (holding this pid) in each benchmark directory until destroyed.
/// Not thread-safe.
struct BenchLocks {
  std::vector<int> fds;
  /// \error the errno of open / flock / write, naming DIR/bench.lock.
  Status take(const std::string& dir);
  ~BenchLocks();
};

/// OK unless `dir` is in use by another process: a store open for writing there (its LOCK
/// flock is held) or another benchmark (its bench.lock flock): a benchmark must not remove
/// their files under them.
/// \error FailedPrecondition "DIR is in use by pid N (...); nothing was removed".
Status check_unlocked(const std::string& dir);

/// Makes each of `dirs` a fresh, empty directory locked by `locks` (check_unlocked() first:
/// when one is in use, sets remove.keep and changes nothing). `remove` must name `dirs`.
/// \error FailedPrecondition (in use); the errno of creating or locking a directory.
Status prepare_bench_dirs(const std::vector<std::string>& dirs, BenchLocks& locks,
                          RemoveDirsOnExit& remove);

/// What measure_store() runs: `count` objects of `object_bytes` (uint8) put to the NVMe tier
/// of a fresh store in `dirs` (striped, chunk `chunk_bytes`, checksums on as the store always
/// computes them) and got back, beside the raw engine on the same bytes, `rounds` times.
struct StoreRunSpec {
  std::vector<std::string> paths;  ///< the user's directories (disk-space errors name them)
  std::vector<std::string> dirs;   ///< one fresh directory in each path (prepare_bench_dirs)
  uint64_t object_bytes = 0;       ///< > 0
  std::string object_size_text;    ///< object_bytes as the user wrote it (messages; "": bytes)
  uint64_t chunk_bytes = 0;        ///< > 0, a multiple of 4096
  uint32_t count = 0, rounds = 0;  ///< > 0
  std::shared_ptr<IoEngine> engine;
  /// Base store options (a configuration file's); path, nvme_dirs, chunk_bytes,
  /// host_budget_bytes (0), staging_bytes (16 MiB) and engine are set by measure_store().
  StoreOptions options;
  bool log_rounds = false;  ///< one line per round on stderr
};

/// Each round's figures, GB/s = 1e9 bytes / s over all `count` objects.
struct StoreMeasurement {
  std::vector<double> put_gbps, get_gbps;                    ///< the store
  std::vector<double> engine_write_gbps, engine_read_gbps;   ///< the raw engine (+ fdatasync)
  /// CPU seconds (user + system, every thread of the process: the caller, the store's
  /// workers and committer, the engine's threads and io_uring workers) per GB (1e9 bytes)
  /// moved, over the same timed transfers as the GB/s above.
  std::vector<double> put_cpu_s_per_gb, get_cpu_s_per_gb;
  std::vector<double> engine_write_cpu_s_per_gb, engine_read_cpu_s_per_gb;
  std::vector<double> put_ratio, get_ratio;                  ///< store / engine, per round
  std::vector<std::string> space;                            ///< "new" or "reused" file space
};

/// Runs the rounds of `strata bench store` (docs/store.md: alternating order, the raw file's
/// two regions). Checks disk space (2 versions of the objects + the raw file's 2 regions)
/// and memory (one object buffer) first. The store is closed and the raw file removed from
/// use before it returns; the directories are the caller's to remove.
/// \error InvalidArgument for a zero size / count / rounds or a chunk not a multiple of
///     4096; ResourceExhausted for too little disk (naming the path) or memory; the store's
///     and the engine's errors.
Result<StoreMeasurement> measure_store(const StoreRunSpec& spec);

}  // namespace strata::cli
