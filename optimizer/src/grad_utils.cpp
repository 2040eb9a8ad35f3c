// Global gradient norm (fixed tiling, fixed reduction order) and inf/nan detection.
#include "strata/optimizer/grad_utils.hpp"

#include <atomic>
#include <cmath>
#include <string>
#include <vector>

#include "kernels.hpp"
#include "strata/base/thread_pool.hpp"

namespace strata::optimizer {
namespace {

Status check_view(const GradView& g) {
  if (g.type != DType::kFloat32 && g.type != DType::kFloat16 && g.type != DType::kBFloat16) {
    return invalid_argument("gradient dtype " + std::string(dtype_name(g.type)) +
                            " is not supported (fp32, fp16 or bf16)");
  }
  if (g.data == nullptr && g.numel > 0) {
    return invalid_argument("gradient data is null with numel " + std::to_string(g.numel));
  }
  return Status::OK();
}

// Tiles handed to one worker at a time when splitting a norm over threads.
constexpr size_t kNormTilesPerTask = 16;

}  // namespace

Status GradNormAccumulator::add(const GradView& g, ThreadPool* pool) {
  STRATA_RETURN_IF_ERROR(check_view(g));
  if (g.numel == 0) return Status::OK();
  const size_t tiles = (g.numel + kNormTileNumel - 1) / kNormTileNumel;
  std::vector<double> sums(tiles);
  const size_t esize = dtype_size(g.type);
  if (pool == nullptr || pool->num_threads() <= 1 || g.numel < kMinParallelNumel) {
    kernels::tile_sum_squares(g.data, g.type, g.numel, sums.data());
  } else {
    const size_t tasks = (tiles + kNormTilesPerTask - 1) / kNormTilesPerTask;
    pool->parallel_for(tasks, [&](size_t t0, size_t t1) {
      const size_t first_tile = t0 * kNormTilesPerTask;
      const size_t begin = first_tile * kNormTileNumel;
      const size_t end = std::min(g.numel, t1 * kNormTilesPerTask * kNormTileNumel);
      kernels::tile_sum_squares(static_cast<const char*>(g.data) + begin * esize, g.type,
                                end - begin, sums.data() + first_tile);
    });
  }
  for (double s : sums) sum_ += s;  // fixed order: tile after tile
  return Status::OK();
}

double GradNormAccumulator::l2_norm() const { return std::sqrt(sum_); }
bool GradNormAccumulator::nonfinite() const { return !std::isfinite(sum_); }

Result<double> global_l2_norm(std::span<const GradView> grads, ThreadPool* pool) {
  GradNormAccumulator acc;
  for (const auto& g : grads) STRATA_RETURN_IF_ERROR(acc.add(g, pool));
  return acc.l2_norm();
}

double clip_coefficient(double total_norm, double max_norm) {
  if (!std::isfinite(total_norm)) return 1.0;
  const double c = max_norm / (total_norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

float torch_clip_coefficient(float total_norm, double max_norm) {
  const float denom = total_norm + 1e-6f;  // the scalar 1e-6 cast to the tensor's fp32
  const float c = (1.0f / denom) * static_cast<float>(max_norm);
  return c > 1.0f ? 1.0f : c;  // clamp(max=1): NaN stays NaN
}

GateDecision decide_gate(double max_grad_norm, float grad_scale, bool skip_if_nonfinite,
                         double grad_norm, bool nonfinite, NormArithmetic arithmetic) {
  GateDecision d;
  d.grad_scale = grad_scale;
  if (max_grad_norm > 0.0) {
    d.grad_norm = grad_norm * std::fabs(static_cast<double>(grad_scale));
    if (arithmetic == NormArithmetic::kTorch) {
      if (nonfinite && skip_if_nonfinite) {
        d.skip = true;
        return d;
      }
      d.clip_coef = torch_clip_coefficient(static_cast<float>(d.grad_norm), max_grad_norm);
    } else if (nonfinite || !std::isfinite(d.grad_norm)) {
      d.skip = skip_if_nonfinite;
      return d;
    } else {
      d.clip_coef = clip_coefficient(d.grad_norm, max_grad_norm);
    }
    d.grad_scale = static_cast<float>(static_cast<double>(grad_scale) * d.clip_coef);
  } else if (nonfinite && skip_if_nonfinite) {
    d.skip = true;
  }
  return d;
}

Result<bool> has_inf_or_nan(std::span<const GradView> grads, ThreadPool* pool) {
  for (const auto& g : grads) STRATA_RETURN_IF_ERROR(check_view(g));
  for (const auto& g : grads) {
    if (g.numel == 0) continue;
    if (pool == nullptr || pool->num_threads() <= 1 || g.numel < kMinParallelNumel) {
      if (kernels::has_inf_or_nan(g.data, g.type, g.numel)) return true;
      continue;
    }
    std::atomic<bool> found{false};
    const size_t esize = dtype_size(g.type);
    const size_t tiles = (g.numel + kTileNumel - 1) / kTileNumel;
    pool->parallel_for(tiles, [&](size_t t0, size_t t1) {
      const size_t begin = t0 * kTileNumel;
      const size_t end = std::min(g.numel, t1 * kTileNumel);
      if (kernels::has_inf_or_nan(static_cast<const char*>(g.data) + begin * esize, g.type,
                                  end - begin)) {
        found.store(true, std::memory_order_relaxed);
      }
    });
    if (found.load()) return true;
  }
  return false;
}

}  // namespace strata::optimizer
