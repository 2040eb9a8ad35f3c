// strata::optimizer — gradient utilities for mixed-precision training: the global L2 norm
// over many tensors (for clipping by norm) and inf/nan detection (to skip a step when a
// loss-scaled fp16 gradient overflowed).
#pragma once

#include <cstddef>
#include <limits>
#include <span>

#include "strata/base/status.hpp"
#include "strata/base/dtype.hpp"

namespace strata {
class ThreadPool;  // strata/base/thread_pool.hpp; the optimizer's: make_kernel_pool()
}  // namespace strata

namespace strata::optimizer {

/// A read-only view of `numel` gradient elements of type `type` (kFloat32, kFloat16 or
/// kBFloat16) in host memory. No alignment required.
struct GradView {
  const void* data = nullptr;
  DType type = DType::kFloat32;
  size_t numel = 0;
};

/// Elements per reduction tile of the norm (see GradNormAccumulator).
inline constexpr size_t kNormTileNumel = 4096;

/// Sum of squares of every element, computed so that the result does not depend on thread
/// count, SIMD target or (see add()) chunking: each tensor is cut into tiles of
/// kNormTileNumel elements from its first element; a tile's sum is taken in fp64 over 16
/// interleaved lanes (element i into lane i % 16, in element order; squares of fp32
/// values are exact in fp64) which are then added pairwise; tile sums are added in order,
/// tensor after tensor, in fp64.
/// \threadsafety one accumulator per thread; add() itself fans out over `pool`.
class GradNormAccumulator {
 public:
  /// Adds the squares of `grad`. Adding a tensor in several consecutive chunks gives the
  /// bit-identical result to adding it whole when every chunk but the tensor's last has a
  /// numel that is a multiple of kNormTileNumel.
  /// \error InvalidArgument for a null data pointer with numel > 0 or a non-float type.
  Status add(const GradView& grad, ThreadPool* pool = nullptr);
  /// Sum of squares so far (+inf or NaN when any element was inf or NaN).
  double sum_squares() const { return sum_; }
  /// sqrt(sum_squares()).
  double l2_norm() const;
  /// True when an inf or NaN was seen (the norm is then not finite).
  bool nonfinite() const;

 private:
  double sum_ = 0.0;
};

/// The global L2 norm of all `grads` together (torch.nn.utils.clip_grad_norm_'s
/// total_norm with norm_type 2): GradNormAccumulator over the views in order.
/// \returns +inf or NaN when any element is inf or NaN.
/// \error as GradNormAccumulator::add.
Result<double> global_l2_norm(std::span<const GradView> grads, ThreadPool* pool = nullptr);

/// The factor torch.nn.utils.clip_grad_norm_ multiplies gradients by:
/// min(1, max_norm / (total_norm + 1e-6)). Pass it as StepInfo::grad_scale (times
/// 1/loss_scale if any). Returns 1 for a non-finite total_norm (the caller should skip).
double clip_coefficient(double total_norm, double max_norm);

/// torch.nn.utils.clip_grad_norm_'s coefficient in torch's own fp32 arithmetic (torch 1.13
/// and 2.x): `max_norm / (total_norm + 1e-6)` on a 0-d fp32 tensor is evaluated by
/// Tensor.__rtruediv__ as `reciprocal(total_norm + 1e-6f) * (float)max_norm`, then
/// `clamp(max=1.0)`. For a `total_norm` torch computed (fp32). An infinite total gives 0
/// (as torch: the gradients are zeroed), a NaN total NaN.
float torch_clip_coefficient(float total_norm, double max_norm);

/// Where the global norm a step's gate uses came from, which fixes the clip coefficient's
/// arithmetic.
enum class NormArithmetic {
  kStrata,  ///< GradNormAccumulator's fp64 norm; coefficient clip_coefficient()
  kTorch,   ///< torch.norm's fp32 norm; coefficient torch_clip_coefficient()
};

/// What a step's gate decided.
struct GateDecision {
  bool skip = false;  ///< skip the whole step (a non-finite gradient)
  /// The global L2 norm times |grad_scale| (NaN when clipping is off).
  double grad_norm = std::numeric_limits<double>::quiet_NaN();
  double clip_coef = 1.0;   ///< clipping's factor (1 = none)
  float grad_scale = 1.0f;  ///< what the kernels multiply every gradient by
};

/// The gate of an optimizer step, the one place its decision is made (the offloaded step,
/// finish_step of an overlapped step, and callers that step in batches and pass the result
/// on as StepOptions::grad_scale): skip on a non-finite gradient, clip by global norm.
/// \param max_grad_norm > 0 clips (torch.nn.utils.clip_grad_norm_'s max_norm); 0 = off.
/// \param grad_scale the gradients' scale (e.g. 1/loss_scale), also applied to the norm.
/// \param skip_if_nonfinite skip when `nonfinite` (or, with kStrata, when the scaled norm
///     is not finite: an overflow of finite values counts as non-finite).
/// \param grad_norm the global L2 norm of every gradient of the step (unscaled); ignored
///     when max_grad_norm is 0.
/// \param nonfinite any gradient element is inf or NaN.
/// \param arithmetic where grad_norm came from: the coefficient is clip_coefficient()
///     (kStrata) or torch_clip_coefficient() (kTorch, bit-identical to torch's).
/// \returns the decision; grad_scale = grad_scale x clip_coef (in float).
/// \threadsafety pure function.
GateDecision decide_gate(double max_grad_norm, float grad_scale, bool skip_if_nonfinite,
                         double grad_norm, bool nonfinite, NormArithmetic arithmetic);

/// True when any element of any view is inf or NaN (checks the exponent bits; one pass).
/// \error InvalidArgument as GradNormAccumulator::add.
Result<bool> has_inf_or_nan(std::span<const GradView> grads, ThreadPool* pool = nullptr);

}  // namespace strata::optimizer
