// strata::optimizer — which SIMD instruction set the kernels use.
//
// The kernels are compiled for several x86 targets (Highway's AVX3 = AVX-512
// F/BW/DQ/VL, AVX2 (+FMA, F16C), SSE4, SSSE3, and SCALAR) and the best one the CPU
// supports is chosen at run time, so one binary runs on any x86-64. Tests and benchmarks
// can force a lower target. Results are bit-identical across thread counts and chunkings
// for one target; across targets they may differ in the last bit (FMA vs mul+add), except
// the gradient norm (grad_utils.hpp), which is identical on every target.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "strata/base/status.hpp"

namespace strata::optimizer {

/// Names of the targets compiled in AND supported by this CPU, best first, e.g.
/// {"AVX3", "AVX2", "SSE4", "SSSE3", "SCALAR"}.
/// \threadsafety safe.
std::vector<std::string> available_simd_targets();

/// Name of the target the kernels dispatch to now (e.g. "AVX3").
std::string active_simd_target();

/// Forces the kernels onto target `name` (one of available_simd_targets()); "" or "best"
/// returns to the automatic choice. Process-wide.
/// \error InvalidArgument when `name` is not compiled in or not supported by this CPU.
/// \threadsafety must not run concurrently with any kernel call (tests, benchmark setup).
Status force_simd_target(std::string_view name);

}  // namespace strata::optimizer
