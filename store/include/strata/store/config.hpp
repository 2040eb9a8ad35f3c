// strata::store — the configuration file: one JSON file holding the I/O engine's, the
// store's and the offloaded optimizer's settings, and the machine's measured bandwidths
// (written by `strata tune`, read by `strata plan`). docs/configuration.md lists every key.
//
//   { "strata_config": 1,
//     "io":        { "engine": "uring", "block_size": "1MiB", "queue_depth": 32, ... },
//     "store":     { "nvme_dirs": ["/mnt/nvme0/strata"], "chunk_bytes": 67108864, ... },
//     "optimizer": { "num_threads": 0, "num_buffers": 4, ... },
//     "measured":  { "nvme_read_bytes_per_s": 2.1e9, ... } }
//
// Every key is optional; "strata_config" (the format version) must be 1 when present.
// Sizes are integer bytes or strings with a suffix ("1MiB", parse_size()). Unknown keys, at
// any level, are errors (InvalidArgument naming the key path and the file), never ignored.
//
// Precedence, lowest first: built-in defaults < the configuration file < STRATA_*
// environment variables < explicit arguments. The file is named by STRATA_CONFIG (so
// StoreOptions::from_env() and IoEngineOptions::from_env() read it), `--config FILE` on
// the CLI, `config=` in Python and strata_store_open_config() in C.
//
// The "optimizer" section is checked here (names, types, ranges) and applied by the
// optimizer layer (offload_options_from_config(), optimizer/offload.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/base/status.hpp"
#include "strata/store/io_engine.hpp"
#include "strata/store/store.hpp"

namespace strata {

/// The "io" section: IoEngineOptions fields (same names; `engine` is IoEngineOptions::kind).
/// An unset field keeps what it overrides.
struct IoConfig {
  std::optional<EngineKind> engine;        ///< "uring" | "threads"
  std::optional<uint32_t> queue_depth;     ///< 1..4096
  std::optional<uint64_t> block_size;      ///< bytes, 1..1 GiB
  std::optional<uint32_t> workers;         ///< 1..64
  std::optional<bool> direct;
  std::optional<bool> allow_buffered_fallback;
  std::optional<bool> allow_threads_fallback;
  std::optional<bool> register_files;
  std::optional<bool> register_buffers;
  std::optional<uint32_t> submit_batch;    ///< 0..4096
  std::optional<int> numa_node;            ///< >= -1
  std::optional<bool> sqpoll;
  std::optional<bool> iopoll;

  bool operator==(const IoConfig&) const = default;
};

/// The "store" section: StoreOptions fields (same names; `durability` is "put" | "flush").
struct StoreConfig {
  std::optional<std::vector<std::string>> nvme_dirs;  ///< non-empty strings
  std::optional<uint64_t> host_budget_bytes;
  std::optional<uint64_t> nvme_budget_bytes;
  std::optional<uint64_t> device_budget_bytes;
  std::optional<int> device_id;                        ///< >= 0
  std::optional<uint64_t> chunk_bytes;                 ///< positive multiple of 4096
  std::optional<uint64_t> staging_bytes;               ///< > 0
  std::optional<uint64_t> pinned_initial_bytes;        ///< bytes, 0 = none until first use
  std::optional<uint64_t> pinned_grow_bytes;           ///< > 0
  std::optional<bool> verify_checksums;
  std::optional<Durability> durability;
  std::optional<uint32_t> worker_threads;              ///< 1..StoreOptions::kMaxWorkerThreads
  std::optional<int> numa_node;                        ///< >= -2 (kNumaNone .. a node)
  std::optional<double> stats_interval_seconds;        ///< >= 0, 0 = off (stats_interval)

  bool operator==(const StoreConfig&) const = default;
};

/// The "optimizer" section: OffloadOptions fields (optimizer/offload.hpp) and the bindings'
/// pipeline settings. Checked here, applied by the optimizer layer and the bindings.
struct OptimizerConfig {
  std::optional<uint64_t> sub_group_numel;       ///< elements, 0 = auto
  std::optional<int> num_buffers;                ///< 0..16 (0: as many as the pinned budget holds)
  std::optional<uint64_t> pinned_budget_bytes;   ///< bytes, 0 = what the slots need
  std::optional<uint64_t> host_budget_bytes;     ///< bytes
  std::optional<int> num_threads;                ///< 0..4096, 0 = one per core
  std::optional<int> numa_node;                  ///< >= -1
  std::optional<std::string> default_placement;  ///< "auto" | "host" | "nvme"
  std::optional<bool> verify_on_open;
  std::optional<std::string> arithmetic;         ///< "simd" | "torch" (bindings)
  std::optional<std::string> state_dtype;        ///< "fp32" | "bf16" (OffloadOptions::state_dtype)
  std::optional<bool> overlap_backward;          ///< strata.torch only
  std::optional<uint64_t> overlap_bucket_numel;  ///< >= 1, strata.torch only

  bool operator==(const OptimizerConfig&) const = default;
};

/// The "measured" section: what `strata tune` measured on this machine. Plain numbers,
/// finite and >= 0; each absent when not measured.
struct MeasuredConfig {
  std::optional<double> nvme_read_bytes_per_s;    ///< aggregate over `paths`, best config
  std::optional<double> nvme_write_bytes_per_s;   ///< aggregate over `paths`, best config
  /// Through the store's data path (put / get to the NVMe tier: checksums, copy-on-write
  /// extents) with the tuned engine settings and chunk size; `strata plan` prefers these.
  std::optional<double> store_read_bytes_per_s;
  std::optional<double> store_write_bytes_per_s;
  std::optional<double> memory_copy_bytes_per_s;  ///< STREAM copy (bytes read + written)/s
  std::optional<double> adam_params_per_s;        ///< CPU Adam step, fp32 parameters/s
  std::optional<double> allgather_bytes_per_s;    ///< host all-gather bus bandwidth
  std::optional<double> pcie_bytes_per_s;         ///< host <-> device (GPU machines)
  std::vector<std::string> paths;                 ///< the tuned directories

  bool operator==(const MeasuredConfig&) const = default;
};

/// A configuration file, parsed and checked. Copyable value; no I/O after load().
struct Config {
  static constexpr int kVersion = 1;  ///< the "strata_config" value this build reads

  /// The file it came from ("" for one built in memory); errors name it.
  std::string file;
  IoConfig io;
  StoreConfig store;
  OptimizerConfig optimizer;
  MeasuredConfig measured;

  /// Reads and checks `file`.
  /// \error NotFound / PermissionDenied / IoError (errno) naming the file when it cannot be
  ///     read; InvalidArgument "config file '<file>': ..." for malformed JSON (with line and
  ///     column), a top level that is not an object, an unknown key ("unknown key
  ///     'io.queue_dpeth' (did you mean 'io.queue_depth'?)"), or a value of the wrong type
  ///     or out of range ("io.queue_depth: expected an integer in 1..4096, got 0").
  /// \threadsafety safe (reads the file only).
  static Result<Config> load(const std::string& file);
  /// Parses JSON `text` as load() does; `file` only names it in messages.
  static Result<Config> parse(std::string_view text, const std::string& file);

  /// The file's JSON: "strata_config" first, then each non-empty section, only the keys
  /// that are set; sizes as integer bytes; 2-space indentation, a final newline.
  /// parse(to_json()) gives back an equal Config (round trip).
  std::string to_json() const;
  /// Writes to_json() to `path` (through a temporary file renamed over it).
  /// \error errno_status naming the path.
  Status save(const std::string& path) const;

  /// Sets the fields of `o` that the "io" section sets.
  void apply(IoEngineOptions& o) const;
  /// Sets the fields of `o` that the "store" section sets, and of o.engine_options what the
  /// "io" section sets; o.config_file = file.
  void apply(StoreOptions& o) const;

  bool operator==(const Config&) const = default;
};

/// The configuration file to use: `explicit_file` when non-empty, else $STRATA_CONFIG when
/// set and non-empty, else none ("").
std::string config_file_to_use(const std::string& explicit_file = {});

/// Config::load(config_file_to_use(explicit_file)); nullopt when there is none.
/// \error what Config::load() returns.
Result<std::optional<Config>> load_config_to_use(const std::string& explicit_file = {});

}  // namespace strata
