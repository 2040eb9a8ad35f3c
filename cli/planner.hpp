// The bandwidth planner behind `strata plan`: a model of one training iteration of a
// ZeRO-3 / ZeRO-Infinity style run (parameters, gradients and optimizer states partitioned
// over the ranks and offloaded to NVMe or host memory), after Rajbhandari et al.,
// "ZeRO-Infinity: Breaking the GPU Memory Wall for Extreme Scale Deep Learning", SC21,
// section 4 ("Memory and bandwidth requirements", 4.2 "Bandwidth requirements"), and
// docs/planner.md. Pure functions over plain numbers: no I/O, no global state; every
// function is safe to call from any thread.
//
// Units: bytes, bytes per second, seconds, FLOP, FLOP per second (SI: 1 GB/s = 1e9 B/s).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/base/status.hpp"

namespace strata::cli::planner {

// ---- The paper's section 4.2 formulas -------------------------------------------------

/// FLOP of one iteration on one GPU: 2 x 4 x bsz x seq x params (SC21 sec. 4.2, "Total
/// computation per iteration": 2 x bsz x seq x params for the forward pass of the linear
/// layers, twice that for backward, once more for the activation recomputation).
/// \param params model parameters; seq sequence length (tokens); bsz batch per GPU.
double flops_per_iteration(double params, double seq, double bsz);

/// Arithmetic intensity (FLOP per byte moved) w.r.t. parameters and gradients: seq x bsz
/// (SC21 sec. 4.2: 2 x 4 x params bytes moved per iteration, fp16 parameters loaded for
/// forward, backward and recomputation and fp16 gradients stored once, against
/// flops_per_iteration()).
double ait_params_grads(double seq, double bsz);

/// Arithmetic intensity w.r.t. optimizer states: seq x bsz / 4 (SC21 sec. 4.2: the states,
/// ~16 B/param for mixed-precision Adam, read once and written once per iteration:
/// 2 x 16 x params bytes).
double ait_optimizer_states(double seq, double bsz);

/// Arithmetic intensity w.r.t. activation checkpoints: 24 x hd x ci (SC21 sec. 4.2: one
/// fp16 checkpoint of bsz x seq x hd every ci transformer blocks, written in forward and read
/// in backward, against 2 x 4 x bsz x seq x 12 hd^2 FLOP per block).
/// \param hidden hidden size hd; ci transformer blocks between two checkpoints.
double ait_activation_checkpoints(double hidden, double ci);

/// Efficiency = ait x bw / (ait x bw + peak_tp) (SC21 sec. 4.2, "Efficiency metric":
/// compute_time / (compute_time + communication_time), no overlap assumed).
/// \param ait FLOP/byte; bw bytes/s; peak_tp achievable peak FLOP/s of one GPU.
/// \returns a fraction in [0, 1); 0 when bw or ait is 0.
double efficiency(double ait, double bw, double peak_tp);

/// The bandwidth (bytes/s) at which efficiency(ait, bw, peak_tp) == eff: the inverse,
/// bw = eff x peak_tp / (ait x (1 - eff)).
/// \param eff in (0, 1); ait > 0.
double required_bandwidth(double ait, double eff, double peak_tp);

// ---- Measurements -----------------------------------------------------------------------

/// The measured-section keys (docs/configuration.md; `strata tune` writes the first
/// four and the optional two), plus three the planner takes from bench JSON or flags only.
inline constexpr const char* kNvmeRead = "nvme_read_bytes_per_s";    ///< node aggregate
inline constexpr const char* kNvmeWrite = "nvme_write_bytes_per_s";  ///< node aggregate
inline constexpr const char* kMemoryCopy = "memory_copy_bytes_per_s";
inline constexpr const char* kAdam = "adam_params_per_s";          ///< fp32 params/s, node
inline constexpr const char* kAllgather = "allgather_bytes_per_s";  ///< busbw, per rank
inline constexpr const char* kPcie = "pcie_bytes_per_s";            ///< per GPU, one direction
/// Concurrent reads + writes (bytes read + written over the time), node aggregate
/// (`bench step`'s I/O probe). Used for the optimizer step's mixed traffic when present.
inline constexpr const char* kNvmeMixed = "nvme_mixed_bytes_per_s";
/// One rank's own drive (`bench partitioned-read --emulated-drive-bw`, or --drive-bw).
inline constexpr const char* kDriveRead = "drive_read_bytes_per_s";
/// HBM bandwidth of one GPU (--gpu-memory-bw): the optimizer step when it stays on the GPU.
inline constexpr const char* kGpuMemory = "gpu_memory_bytes_per_s";

/// One measured figure and where it came from ("config FILE", "bench FILE", "--flag").
struct Measurement {
  double value = 0;
  std::string source;
};
/// Measurements by key (the k* names above).
using Measurements = std::map<std::string, Measurement>;

// ---- The model --------------------------------------------------------------------------

enum class Phase { kIteration, kOptimizer, kFetch };
enum class Offload { kOptimizer, kParams, kAll };  // which model states leave the GPU
enum class Device { kNvme, kCpu };                 // where offloaded states live

struct PlanOptions {
  double params = 0;         ///< model parameters (> 0)
  int gpus_per_node = 0;     ///< GPUs per node (>= 1 for Phase::kIteration)
  int nodes = 1;             ///< nodes (>= 1)
  int ranks_per_node = 0;    ///< data-parallel ranks per node; 0: gpus_per_node, or 1 without GPUs
  double seq = 1024;         ///< sequence length (tokens)
  double batch = 1;          ///< micro-batch per GPU (sequences)
  double peak_tflops = 70;   ///< achievable peak per GPU, TFLOP/s (the paper's V100 figure)
  Phase phase = Phase::kIteration;
  Offload offload = Offload::kAll;
  Device device = Device::kNvme;
  /// Forward/backward: data movement hidden under compute (max instead of sum). Fetch: the
  /// reads, the copies and the all-gather pipelined piece by piece (PhasePlan's formula)
  /// instead of one after the other. Default false: the paper's no-overlap assumption
  /// (SC21 sec. 4.2), and what this 2-core machine shows for the fetch (docs/planner.md).
  /// The optimizer step is always strata's pipeline (its measured overlap ~0.9-1.0).
  bool overlap = false;
  double state_bytes = 12;   ///< optimizer state per param on the offload tier (fp32 master, m, v)
  double sub_group_numel = 16777216;  ///< optimizer pipeline item (elements; 64 MiB of fp32)
  double chunk_bytes = 67108864;      ///< the store's chunk (bytes; StoreOptions::chunk_bytes)
  double piece_bytes = 8388608;       ///< parameter-fetch pipeline piece per rank (bytes)
  double hidden = 0;         ///< hidden size; > 0 with offload_activations
  double ci = 1;             ///< transformer blocks per activation checkpoint
  bool offload_activations = false;  ///< activation checkpoints to host memory over PCIe
};

/// The time one tier (a link or an engine) needs for its share of a phase.
struct TierTime {
  std::string tier;      ///< "nvme", "pcie", "cpu_adam", "memory", "network", "compute", ...
  double bytes = 0;      ///< bytes it moves (FLOP for "compute", params for "cpu_adam")
  double rate = 0;       ///< its bandwidth (bytes/s, FLOP/s, params/s)
  double seconds = 0;    ///< bytes / rate (plus the pipeline's fill; see PhasePlan)
  std::string source;    ///< where `rate` came from
};

/// One phase of the iteration: its tiers work as a pipeline of `items` equal items, so the
/// phase takes max_i t_i + (sum_i t_i - max_i t_i) / items (a pipeline of k items through
/// stages of per-item times t_i / k: the slowest stage's k items plus one item of each other
/// stage to fill and drain it). "forward_backward" without overlap: compute + that.
struct PhasePlan {
  std::string name;      ///< "forward_backward", "optimizer_step", "parameter_fetch"
  std::vector<TierTime> tiers;
  double items = 1;
  double seconds = 0;
  std::string bottleneck;  ///< the tier with the largest time
};

struct Plan {
  PlanOptions options;
  int ranks = 0;                    ///< ranks_per_node x nodes
  double predicted_step_seconds = 0;
  std::string bottleneck;           ///< the tier the step waits on longest (see plan())
  std::map<std::string, double> bottleneck_seconds;  ///< seconds credited to each tier
  std::vector<PhasePlan> phases;
  double flops_per_gpu = 0;         ///< flops_per_iteration(), 0 without GPUs
  // Efficiencies (SC21 sec. 4.2), with the effective bandwidths in the paper's byte counts
  // (8 B/param for parameters + gradients, 32 B/param for optimizer states).
  std::optional<double> params_grads_bandwidth, params_grads_efficiency;
  std::optional<double> optimizer_bandwidth, optimizer_efficiency;
  std::optional<double> overall_efficiency;  ///< compute / step
};

/// Predicts one step of `o` from `m`.
/// \returns the plan; predicted_step_seconds is the sum of the phases' seconds, bottleneck
///     the tier credited most: each phase credits its bottleneck tier with its time (a
///     phase without overlap credits "compute" with the compute time and its data movement's
///     bottleneck with the rest).
/// \error InvalidArgument naming the option at fault (params <= 0, nodes < 1, a phase that
///     needs GPUs without them, ...); NotFound "missing measurement(s): KEY (how to get it),
///     ..." naming every measurement the configuration needs that `m` lacks.
Result<Plan> plan(const PlanOptions& o, const Measurements& m);

/// The plan as JSON (keys: predicted_step_seconds, bottleneck, phases[], efficiencies{},
/// requirements{}, inputs{}, measurements{}; docs/planner.md lists them).
nlohmann::json plan_to_json(const Plan& p, const Measurements& m);

const char* phase_name(Phase p);
const char* offload_name(Offload o);
const char* device_name(Device d);

}  // namespace strata::cli::planner
