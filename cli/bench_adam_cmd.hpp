// `strata bench adam`'s measurement, shared with `strata tune` (adam_params_per_s).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/base/dtype.hpp"
#include "strata/base/status.hpp"

namespace strata::cli {

struct BenchAdamArgs {
  uint64_t numel = 100'000'000;
  int threads = 0;
  int numa_node = -1;
  std::string grad_dtype = "fp32";
  std::string optimizer = "adam";
  std::string simd;
  int steps = 10;
  int warmup = 2;
  bool json = false;
};

/// What measure_adam() measured: each timed step of the kernel and of the streaming probe
/// (the memory-bandwidth limit of an update of the same shape), alternating.
struct AdamMeasurement {
  uint64_t numel = 0;
  int threads = 0;
  int numa_node = -1;
  DType grad_dtype = DType::kFloat32;
  uint64_t bytes_per_param = 0;           ///< bytes moved per parameter by one step
  std::vector<double> seconds_all;        ///< the kernel's timed steps, seconds
  std::vector<double> probe_seconds_all;  ///< the probe's timed steps, seconds
};

/// Runs a.warmup + a.steps CPU optimizer steps (a.optimizer, a.numel parameters, a.threads
/// kernel threads on a.numa_node) over deterministic data, each followed by a probe step.
/// \error InvalidArgument for a bad option (naming it); ResourceExhausted when the state
///     does not fit MemAvailable or cannot be mapped.
Result<AdamMeasurement> measure_adam(const BenchAdamArgs& a);

}  // namespace strata::cli
