// Adam / AdamW update rules that round exactly like torch.optim's CPU kernels (torch 1.13,
// `_single_tensor_adam(w)` on contiguous fp32 tensors), for bit-identical parity runs.
//
// The built-in SIMD rules (optimizer/optimizers.hpp) fuse the last two operations
// (p + (-step_size) * (m / denom) as one FMA, denom with a reciprocal multiply): each element
// is within 1-2 ulp of torch, but training amplifies such differences step after step. These
// rules reproduce torch's sequence instead, established by comparing against torch 1.13
// element by element (tests/bindings/test_torch_optim.py::test_torch_arithmetic_is_bit_exact):
//   p   = p * float(1 - lr * wd)                         (AdamW: param.mul_)
//   g   = fma(p, wd, g)                                  (Adam L2: grad.add(param, alpha=wd))
//   m   = fma(g, float(1 - b1), m * b1)                  (exp_avg.mul_(b1).add_(g, alpha=1-b1))
//   v   = fma(float(1 - b2) * g, g, v * b2)              (exp_avg_sq.mul_(b2).addcmul_(g, g, 1-b2))
//   den = sqrt(vmax) / float(sqrt(bc2)) + eps            (true division, then add_)
//   p   = p + (float(-lr / bc1) * m) / den               (param.addcdiv_(m, den, -step_size))
// Compiled with -ffp-contract=off (see CMakeLists.txt) so that only the explicit fmaf are
// fused. They run element by element through the engine's custom-rule path (same pipeline,
// tiling and threads as the built-in rules, no run-time SIMD).
#include <cmath>
#include <memory>
#include <string>

#include "errors.hpp"
#include "strata/optimizer/offload.hpp"
#include "strata/optimizer/optimizers.hpp"
#include "strata/optimizer/update.hpp"

namespace strata::py_bindings {

namespace so = strata::optimizer;

namespace {

struct Scalars {
  float decay, wd, b1, omb1, b2, omb2, bc2s, eps, neg_ss;
  bool decoupled, l2, maximize;
};

Result<so::AdamOptions> parse(bool decoupled, const so::Hyperparams& hp) {
  auto defaults = so::builtin_default_hyperparams(decoupled ? "adamw" : "adam");
  if (!defaults.ok()) return defaults.status();
  so::Hyperparams all = *defaults;
  for (const auto& [k, v] : hp) {
    if (all.find(k) == all.end())
      return invalid_argument(std::string("unknown hyperparameter '") + k + "' for " +
                              (decoupled ? "adamw" : "adam"));
    all[k] = v;
  }
  so::AdamOptions o;
  o.lr = all["lr"];
  o.beta1 = all["beta1"];
  o.beta2 = all["beta2"];
  o.eps = all["eps"];
  o.weight_decay = all["weight_decay"];
  o.amsgrad = all["amsgrad"] != 0.0;
  o.maximize = all["maximize"] != 0.0;
  o.decoupled_weight_decay = decoupled;
  // torch's range checks, through the built-in rule's validation.
  auto check_rule = so::make_adam(o);
  if (!check_rule.ok()) return check_rule.status();
  return o;
}

template <int NS>
std::unique_ptr<so::UpdateRule> make_rule(const so::AdamOptions o) {
  auto prepare = [o](int64_t step) {
    const double t = static_cast<double>(step);
    const double bc1 = 1.0 - std::pow(o.beta1, t);
    const double bc2 = 1.0 - std::pow(o.beta2, t);
    Scalars s;
    s.decay = static_cast<float>(1.0 - o.lr * o.weight_decay);
    s.wd = static_cast<float>(o.weight_decay);
    s.b1 = static_cast<float>(o.beta1);
    s.omb1 = static_cast<float>(1.0 - o.beta1);
    s.b2 = static_cast<float>(o.beta2);
    s.omb2 = static_cast<float>(1.0 - o.beta2);
    s.bc2s = static_cast<float>(std::sqrt(bc2));
    s.eps = static_cast<float>(o.eps);
    s.neg_ss = static_cast<float>(-(o.lr / bc1));
    s.decoupled = o.decoupled_weight_decay;
    s.l2 = !o.decoupled_weight_decay && o.weight_decay != 0.0;
    s.maximize = o.maximize;
    return s;
  };
  auto element = [](const Scalars& s, float& p, float g, float* st) {
    if (s.maximize) g = -g;
    if (s.l2) g = std::fmaf(p, s.wd, g);
    if (s.decoupled) p = p * s.decay;
    const float m = std::fmaf(g, s.omb1, st[0] * s.b1);
    const float v = std::fmaf(s.omb2 * g, g, st[1] * s.b2);
    st[0] = m;
    st[1] = v;
    float vmax = v;
    if constexpr (NS == 3) {
      vmax = st[2] > v ? st[2] : v;
      if (std::isnan(v)) vmax = v;  // torch.maximum propagates NaN
      if (std::isnan(st[2])) vmax = st[2];
      st[2] = vmax;
    }
    const float den = std::sqrt(vmax) / s.bc2s + s.eps;
    p = p + (s.neg_ss * m) / den;
  };
  const char* name = o.decoupled_weight_decay ? "adamw" : "adam";
  if constexpr (NS == 3) {
    return so::make_elementwise_rule<3>(name, {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"},
                                        prepare, element);
  } else {
    return so::make_elementwise_rule<2>(name, {"exp_avg", "exp_avg_sq"}, prepare, element);
  }
}

}  // namespace

/// The factory of "adam" / "adamw" with torch's exact rounding (see above). The rule names
/// equal the built-in ones, so a checkpoint resumes with either arithmetic.
/// \error InvalidArgument for another optimizer name.
Result<so::RuleFactory> torch_exact_rule_factory(const std::string& optimizer) {
  if (optimizer != "adam" && optimizer != "adamw")
    return invalid_argument("arithmetic='torch' is available for adam and adamw, not '" +
                            optimizer + "'");
  const bool decoupled = optimizer == "adamw";
  return so::RuleFactory([decoupled](const so::Hyperparams& hp)
                             -> Result<std::unique_ptr<so::UpdateRule>> {
    auto o = parse(decoupled, hp);
    if (!o.ok()) return o.status();
    if (o->amsgrad) return make_rule<3>(*o);
    return make_rule<2>(*o);
  });
}

}  // namespace strata::py_bindings
