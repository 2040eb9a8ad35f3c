// strata::optimizer — the built-in optimizers, as UpdateRules (see update.hpp).
//
// Semantics follow torch.optim (PyTorch 1.13 `_single_tensor_*` implementations) so that a
// strata step matches a torch step to fp32 rounding; each field names its torch argument.
// The kernels are SIMD (Highway, target chosen at run time, see simd.hpp) and make one
// pass over the streams. All hyperparameters are validated like torch does.
#pragma once

#include <memory>
#include <string_view>

#include "strata/base/status.hpp"
#include "strata/optimizer/update.hpp"

namespace strata::optimizer {

/// Adam (Kingma & Ba 2015, arXiv:1412.6980) and AdamW (Loshchilov & Hutter 2019,
/// arXiv:1711.05101) as in torch.optim.Adam / AdamW. Per element, with g = grad*grad_scale:
///   if maximize: g = -g
///   Adam:  if weight_decay != 0: g = g + weight_decay * p        (L2 penalty)
///   AdamW: p = p * (1 - lr * weight_decay)                        (decoupled decay)
///   m = beta1 * m + (1 - beta1) * g;   v = beta2 * v + (1 - beta2) * g * g
///   if amsgrad: vmax = max(vmax, v), else vmax = v
///   p = p - lr / (1 - beta1^t) * m / (sqrt(vmax) / sqrt(1 - beta2^t) + eps)
/// States: 0 exp_avg (m), 1 exp_avg_sq (v), 2 max_exp_avg_sq (amsgrad only).
struct AdamOptions {
  double lr = 1e-3;            ///< learning rate, >= 0
  double beta1 = 0.9;          ///< betas[0], in [0, 1) (any finite value with any_betas)
  double beta2 = 0.999;        ///< betas[1], in [0, 1) (any finite value with any_betas)
  double eps = 1e-8;           ///< added to the denominator, >= 0
  double weight_decay = 0.0;   ///< >= 0; L2 (Adam) or decoupled (AdamW)
  bool amsgrad = false;        ///< keep the running max of v (Reddi et al. 2018)
  bool maximize = false;       ///< ascend instead of descend
  bool decoupled_weight_decay = false;  ///< true = AdamW
  /// Accept any finite betas (hyperparameter "any_betas", 0/1, default 0): torch.optim
  /// checks betas in [0, 1) at construction only and steps with whatever a scheduler later
  /// puts in param_groups (e.g. OneCycleLR cycling beta1). The formula above is computed
  /// as is; 1 - beta1^t == 0 gives an infinite step and 1 - beta2^t < 0 NaN, where torch
  /// raises (ZeroDivisionError / math domain error): the caller checks those per step.
  bool any_betas = false;
};

/// Adagrad (Duchi et al. 2011) as torch.optim.Adagrad:
///   g = ±grad*grad_scale (maximize); if weight_decay != 0: g += weight_decay * p
///   clr = lr / (1 + (t - 1) * lr_decay);  s = s + g * g;  p = p - clr * g / (sqrt(s) + eps)
/// State: 0 sum (starts at initial_accumulator_value).
struct AdagradOptions {
  double lr = 1e-2;                        ///< >= 0
  double lr_decay = 0.0;                   ///< >= 0
  double weight_decay = 0.0;               ///< >= 0
  double initial_accumulator_value = 0.0;  ///< >= 0
  double eps = 1e-10;                      ///< >= 0
  bool maximize = false;
};

/// SGD with momentum as torch.optim.SGD (Sutskever et al. 2013 form):
///   g = ±grad*grad_scale; if weight_decay != 0: g += weight_decay * p
///   if momentum != 0: b = (t == 1) ? g : momentum * b + (1 - dampening) * g
///                     g = nesterov ? g + momentum * b : b
///   p = p - lr * g
/// State: 0 momentum_buffer (only when momentum != 0; none otherwise).
struct SgdOptions {
  double lr = 1e-3;            ///< >= 0 (torch has no default; strata uses 1e-3)
  double momentum = 0.0;       ///< >= 0
  double dampening = 0.0;      ///< any value; nesterov requires 0
  double weight_decay = 0.0;   ///< >= 0
  bool nesterov = false;       ///< requires momentum > 0 and dampening == 0
  bool maximize = false;
};

/// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms",
/// arXiv:2302.06675, Algorithm 2 with decoupled weight decay):
///   c = beta1 * m + (1 - beta1) * g;  p = p * (1 - lr * weight_decay) - lr * sign(c)
///   m = beta2 * m + (1 - beta2) * g
/// sign(0) = 0. State: 0 exp_avg.
struct LionOptions {
  double lr = 1e-4;            ///< >= 0
  double beta1 = 0.9;          ///< in [0, 1]
  double beta2 = 0.99;         ///< in [0, 1]
  double weight_decay = 0.0;   ///< >= 0
  bool maximize = false;
};

/// Builds the rule.
/// \error InvalidArgument naming the hyperparameter that is out of range (torch's checks).
Result<std::unique_ptr<UpdateRule>> make_adam(const AdamOptions& options);
/// make_adam with decoupled_weight_decay forced to true (AdamW). Note torch.optim.AdamW's
/// default weight_decay is kAdamWDefaultWeightDecay (1e-2), AdamOptions' is 0: set it.
Result<std::unique_ptr<UpdateRule>> make_adamw(AdamOptions options);
/// Adam / AdamW (options.decoupled_weight_decay) with torch.optim's exact rounding: the
/// same formulas as make_adam, computed in torch 1.13's order of fp32 operations
/// (`_single_tensor_adam(w)`), so a step is bit-identical to torch.optim.Adam / AdamW on
/// contiguous fp32 CPU tensors (make_adam's SIMD kernel is within 1-2 ulp per step). Scalar
/// code: several times slower than make_adam. Its name() and state names are make_adam's,
/// so a checkpoint resumes with either arithmetic.
/// \error InvalidArgument as make_adam.
/// \threadsafety as every UpdateRule (immutable; update() concurrent on disjoint spans).
Result<std::unique_ptr<UpdateRule>> make_torch_exact_adam(const AdamOptions& options);
Result<std::unique_ptr<UpdateRule>> make_adagrad(const AdagradOptions& options);
Result<std::unique_ptr<UpdateRule>> make_sgd(const SgdOptions& options);
Result<std::unique_ptr<UpdateRule>> make_lion(const LionOptions& options);

/// AdamW's default weight decay in torch.optim.AdamW.
inline constexpr double kAdamWDefaultWeightDecay = 1e-2;

/// A rule with the same streams as `shape` (it reads param, grad and every state stream
/// and writes param, every state and the copy) that computes x = x + 0 * g: the memory
/// traffic of an update with no arithmetic to speak of. Benchmarks use it as the
/// bandwidth limit of an update of that shape, measured in the same run.
std::unique_ptr<UpdateRule> make_streaming_probe(int num_states);

/// Bytes an update of `rule` moves per element: param read+write (8), grad read
/// (dtype_size(grad_type)), each state read+write (8), plus the copy written (0 or 2).
/// fp32 Adam: 8 + 4 + 16 = 28.
size_t bytes_per_element(const UpdateRule& rule, DType grad_type, bool with_copy,
                         DType copy_type = DType::kBFloat16);

}  // namespace strata::optimizer
