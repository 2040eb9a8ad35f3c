// Internal: the SIMD kernels (kernels_hwy.cpp), dispatched at run time with Highway, and
// the scalar torch-exact Adam (torch_exact.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "strata/optimizer/optimizers.hpp"
#include "strata/optimizer/update.hpp"

namespace strata::optimizer::kernels {

// Per-call scalars, already in fp32 as torch passes them to its fp32 kernels. `gscale` is
// StepInfo::grad_scale, negated for maximize (negation is exact, so this equals torch's
// -grad followed by the scale).
struct AdamScalars {
  float gscale, weight_decay, decay, beta1, one_minus_beta1, beta2, one_minus_beta2;
  float neg_step_size, inv_bias_correction2_sqrt, bias_correction2_sqrt, eps;
  bool l2, decoupled, amsgrad;
};
struct AdagradScalars {
  float gscale, weight_decay, neg_clr, eps;
  bool l2;
};
struct SgdScalars {
  float gscale, weight_decay, neg_lr, momentum, one_minus_dampening;
  bool l2, has_momentum, first_step, nesterov;
};
struct LionScalars {
  float gscale, decay, lr, beta1, one_minus_beta1, beta2, one_minus_beta2;
  bool decoupled;
};

/// Adam's scalars for step `info` (torch's Python-float arithmetic in double, then fp32).
AdamScalars adam_scalars(const AdamOptions& o, const StepInfo& info);

void adam(const UpdateSpans& s, const AdamScalars& a);
/// Adam with torch's exact rounding (torch_exact.cpp), for validated options.
std::unique_ptr<UpdateRule> torch_exact_adam(const AdamOptions& o);
void adagrad(const UpdateSpans& s, const AdagradScalars& a);
void sgd(const UpdateSpans& s, const SgdScalars& a);
void lion(const UpdateSpans& s, const LionScalars& a);
/// x = x + 0 * g for param and the first num_states states; writes the copy if any.
void stream_probe(const UpdateSpans& s, int num_states, float gscale);

void load_scaled_grad(const void* src, DType type, float scale, float* dst, size_t n);
void store_converted(const float* src, DType type, void* dst, size_t n);

/// Sum of squares of each kNormTileNumel tile of data[0, n): tile_sums[t] for
/// t < ceil(n / kNormTileNumel). See GradNormAccumulator for the order.
void tile_sum_squares(const void* data, DType type, size_t n, double* tile_sums);
/// True when any of data[0, n) is inf or NaN.
bool has_inf_or_nan(const void* data, DType type, size_t n);

/// HWY_TARGET of the target the dispatcher picks now.
int64_t dispatched_target();

}  // namespace strata::optimizer::kernels
