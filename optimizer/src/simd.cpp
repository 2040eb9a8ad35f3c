// Run-time SIMD target selection (Highway's supported-target mask).
#include "strata/optimizer/simd.hpp"

#include <hwy/highway.h>
#include <hwy/targets.h>

#include <mutex>

#include "kernels.hpp"

namespace strata::optimizer {
namespace {

std::mutex g_mu;
int64_t g_forced = 0;  // 0 = automatic

// Targets compiled in (HWY_TARGETS) and supported by the CPU, ignoring any forcing.
int64_t real_supported() {
  if (g_forced != 0) hwy::SetSupportedTargetsForTest(0);
  const int64_t s = hwy::SupportedTargets() & HWY_TARGETS;
  if (g_forced != 0) hwy::SetSupportedTargetsForTest(g_forced);
  return s;
}

}  // namespace

std::vector<std::string> available_simd_targets() {
  std::lock_guard<std::mutex> lk(g_mu);
  std::vector<std::string> out;
  // Lower bit = better target on x86.
  for (int64_t t = real_supported(); t != 0; t &= t - 1) {
    out.emplace_back(hwy::TargetName(t & ~(t - 1)));
  }
  return out;
}

std::string active_simd_target() { return hwy::TargetName(kernels::dispatched_target()); }

Status force_simd_target(std::string_view name) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (name.empty() || name == "best") {
    g_forced = 0;
    hwy::SetSupportedTargetsForTest(0);
    return Status::OK();
  }
  const int64_t supported = real_supported();
  for (int64_t t = supported; t != 0; t &= t - 1) {
    const int64_t bit = t & ~(t - 1);
    if (name == hwy::TargetName(bit)) {
      g_forced = bit;
      hwy::SetSupportedTargetsForTest(bit);
      return Status::OK();
    }
  }
  std::string avail;
  for (int64_t t = supported; t != 0; t &= t - 1) {
    if (!avail.empty()) avail += ", ";
    avail += hwy::TargetName(t & ~(t - 1));
  }
  return invalid_argument("SIMD target '" + std::string(name) +
                          "' is not available (compiled and supported here: " + avail + ")");
}

}  // namespace strata::optimizer
