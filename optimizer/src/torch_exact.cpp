// Adam / AdamW update rules that round exactly like torch.optim's CPU kernels (torch 1.13,
// `_single_tensor_adam(w)` on contiguous fp32 tensors), for bit-identical parity runs.
//
// The SIMD rules (kernels_hwy.cpp) fuse the last two operations (p + (-step_size) *
// (m / denom) as one FMA, denom with a reciprocal multiply): each element is within 1-2 ulp
// of torch, but training amplifies such differences step after step. This rule reproduces
// torch's sequence instead, established by comparing against torch 1.13 element by element
// (tests/optimizer/test_torch_parity.py, tests/bindings/test_torch_optim.py):
//   p   = p * float(1 - lr * wd)                         (AdamW: param.mul_)
//   g   = fma(p, wd, g)                                  (Adam L2: grad.add(param, alpha=wd))
//   m   = fma(g, float(1 - b1), m * b1)                  (exp_avg.mul_(b1).add_(g, alpha=1-b1))
//   v   = fma(float(1 - b2) * g, g, v * b2)              (exp_avg_sq.mul_(b2).addcmul_(g, g, 1-b2))
//   den = sqrt(vmax) / float(sqrt(bc2)) + eps            (true division, then add_)
//   p   = p + (float(-lr / bc1) * m) / den               (param.addcdiv_(m, den, -step_size))
// Compiled with -ffp-contract=off (see optimizer/CMakeLists.txt) so that only the explicit
// fmaf are fused. It runs element by element through make_elementwise_rule (same pipeline,
// tiling and threads as the SIMD rules, no run-time SIMD).
#include <cmath>
#include <memory>

#include "kernels.hpp"

namespace strata::optimizer::kernels {
namespace {

template <int NS>
std::unique_ptr<UpdateRule> make_rule(const AdamOptions& o) {
  // The gradient reaches `element` already multiplied by StepInfo::grad_scale; maximize
  // negates it there (exact), so the scalars are taken for a scale of 1.
  auto prepare = [o](int64_t step) { return adam_scalars(o, StepInfo{step, 1.0f}); };
  auto element = [maximize = o.maximize](const AdamScalars& s, float& p, float g, float* st) {
    if (maximize) g = -g;
    if (s.l2) g = std::fmaf(p, s.weight_decay, g);
    if (s.decoupled) p = p * s.decay;
    const float m = std::fmaf(g, s.one_minus_beta1, st[0] * s.beta1);
    const float v = std::fmaf(s.one_minus_beta2 * g, g, st[1] * s.beta2);
    st[0] = m;
    st[1] = v;
    float vmax = v;
    if constexpr (NS == 3) {
      vmax = st[2] > v ? st[2] : v;
      if (std::isnan(v)) vmax = v;  // torch.maximum propagates NaN
      if (std::isnan(st[2])) vmax = st[2];
      st[2] = vmax;
    }
    const float den = std::sqrt(vmax) / s.bias_correction2_sqrt + s.eps;
    p = p + (s.neg_step_size * m) / den;
  };
  const char* name = o.decoupled_weight_decay ? "adamw" : "adam";
  if constexpr (NS == 3) {
    return make_elementwise_rule<3>(name, {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"},
                                    prepare, element);
  } else {
    return make_elementwise_rule<2>(name, {"exp_avg", "exp_avg_sq"}, prepare, element);
  }
}

}  // namespace

std::unique_ptr<UpdateRule> torch_exact_adam(const AdamOptions& o) {
  return o.amsgrad ? make_rule<3>(o) : make_rule<2>(o);
}

}  // namespace strata::optimizer::kernels
