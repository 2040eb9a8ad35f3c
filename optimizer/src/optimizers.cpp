// The built-in optimizers: hyperparameter checks (as torch.optim does them), per-step
// scalars computed in double like torch's Python code, then one SIMD kernel call.
#include "strata/optimizer/optimizers.hpp"

#include <cmath>
#include <string>

#include "kernels.hpp"

namespace strata::optimizer {
namespace {

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

Status check(bool ok, const char* optimizer, const char* what, double value, const char* rule) {
  if (ok) return Status::OK();
  return invalid_argument(std::string(optimizer) + ": invalid " + what + " " + num(value) +
                          " (must be " + rule + ")");
}

// A built-in rule: fixed state names, per-call scalars computed from the options, then one
// kernel call.
template <class Options, class Scalars>
class KernelRule final : public UpdateRule {
 public:
  using ScalarsFn = Scalars (*)(const Options&, const StepInfo&);
  using KernelFn = void (*)(const UpdateSpans&, const Scalars&);

  KernelRule(std::string_view name, int num_states, const Options& o, ScalarsFn scalars,
             KernelFn kernel, float init = 0.0f)
      : name_(name), n_(num_states), o_(o), scalars_(scalars), kernel_(kernel), init_(init) {}
  std::string_view name() const override { return name_; }
  int num_states() const override { return n_; }
  std::string_view state_name(int i) const override;
  float state_init_value(int) const override { return init_; }
  void update(const UpdateSpans& s, const StepInfo& info) const override {
    kernel_(s, scalars_(o_, info));
  }

 private:
  std::string_view name_;
  int n_;
  Options o_;
  ScalarsFn scalars_;
  KernelFn kernel_;
  float init_;
};

template <>
std::string_view KernelRule<AdamOptions, kernels::AdamScalars>::state_name(int i) const {
  static constexpr std::string_view kNames[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  return kNames[i];
}
template <>
std::string_view KernelRule<AdagradOptions, kernels::AdagradScalars>::state_name(int) const {
  return "sum";
}
template <>
std::string_view KernelRule<SgdOptions, kernels::SgdScalars>::state_name(int) const {
  return "momentum_buffer";
}
template <>
std::string_view KernelRule<LionOptions, kernels::LionScalars>::state_name(int) const {
  return "exp_avg";
}

float signed_scale(bool maximize, const StepInfo& info) {
  return maximize ? -info.grad_scale : info.grad_scale;
}

kernels::AdagradScalars adagrad_scalars(const AdagradOptions& o, const StepInfo& info) {
  kernels::AdagradScalars a{};
  a.gscale = signed_scale(o.maximize, info);
  a.weight_decay = static_cast<float>(o.weight_decay);
  const double clr = o.lr / (1.0 + static_cast<double>(info.step - 1) * o.lr_decay);
  a.neg_clr = static_cast<float>(-clr);
  a.eps = static_cast<float>(o.eps);
  a.l2 = o.weight_decay != 0.0;
  return a;
}

kernels::SgdScalars sgd_scalars(const SgdOptions& o, const StepInfo& info) {
  kernels::SgdScalars a{};
  a.gscale = signed_scale(o.maximize, info);
  a.weight_decay = static_cast<float>(o.weight_decay);
  a.neg_lr = static_cast<float>(-o.lr);
  a.momentum = static_cast<float>(o.momentum);
  a.one_minus_dampening = static_cast<float>(1.0 - o.dampening);
  a.l2 = o.weight_decay != 0.0;
  a.has_momentum = o.momentum != 0.0;
  a.first_step = info.step == 1;
  a.nesterov = o.nesterov;
  return a;
}

kernels::LionScalars lion_scalars(const LionOptions& o, const StepInfo& info) {
  kernels::LionScalars a{};
  a.gscale = signed_scale(o.maximize, info);
  a.decay = static_cast<float>(1.0 - o.lr * o.weight_decay);
  a.lr = static_cast<float>(o.lr);
  a.beta1 = static_cast<float>(o.beta1);
  a.one_minus_beta1 = static_cast<float>(1.0 - o.beta1);
  a.beta2 = static_cast<float>(o.beta2);
  a.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
  a.decoupled = o.weight_decay != 0.0;
  return a;
}

class ProbeRule final : public UpdateRule {
 public:
  explicit ProbeRule(int num_states) : n_(num_states) {}
  std::string_view name() const override { return "streaming_probe"; }
  int num_states() const override { return n_; }
  std::string_view state_name(int) const override { return "stream"; }
  void update(const UpdateSpans& s, const StepInfo& info) const override {
    kernels::stream_probe(s, n_, info.grad_scale);
  }

 private:
  int n_;
};

// torch.optim.Adam / AdamW's range checks.
Status check_adam(const AdamOptions& o) {
  const char* name = o.decoupled_weight_decay ? "AdamW" : "Adam";
  STRATA_RETURN_IF_ERROR(check(o.lr >= 0.0, name, "learning rate", o.lr, ">= 0"));
  STRATA_RETURN_IF_ERROR(check(o.eps >= 0.0, name, "epsilon value", o.eps, ">= 0"));
  if (o.any_betas) {
    STRATA_RETURN_IF_ERROR(
        check(std::isfinite(o.beta1), name, "beta parameter at index 0", o.beta1, "finite"));
    STRATA_RETURN_IF_ERROR(
        check(std::isfinite(o.beta2), name, "beta parameter at index 1", o.beta2, "finite"));
  } else {
    STRATA_RETURN_IF_ERROR(check(o.beta1 >= 0.0 && o.beta1 < 1.0, name,
                                 "beta parameter at index 0", o.beta1, "in [0, 1)"));
    STRATA_RETURN_IF_ERROR(check(o.beta2 >= 0.0 && o.beta2 < 1.0, name,
                                 "beta parameter at index 1", o.beta2, "in [0, 1)"));
  }
  return check(o.weight_decay >= 0.0, name, "weight_decay value", o.weight_decay, ">= 0");
}

}  // namespace

kernels::AdamScalars kernels::adam_scalars(const AdamOptions& o, const StepInfo& info) {
  // torch: bias_correction1 = 1 - beta1 ** step (Python floats), step_size = lr / bc1,
  // bias_correction2_sqrt = math.sqrt(1 - beta2 ** step); passed to fp32 kernels.
  const double t = static_cast<double>(info.step);
  const double bc1 = 1.0 - std::pow(o.beta1, t);
  const double bc2 = 1.0 - std::pow(o.beta2, t);
  AdamScalars a{};
  a.gscale = signed_scale(o.maximize, info);
  a.weight_decay = static_cast<float>(o.weight_decay);
  a.decay = static_cast<float>(1.0 - o.lr * o.weight_decay);
  a.beta1 = static_cast<float>(o.beta1);
  a.one_minus_beta1 = static_cast<float>(1.0 - o.beta1);
  a.beta2 = static_cast<float>(o.beta2);
  a.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
  a.neg_step_size = static_cast<float>(-(o.lr / bc1));
  a.inv_bias_correction2_sqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  a.bias_correction2_sqrt = static_cast<float>(std::sqrt(bc2));
  a.eps = static_cast<float>(o.eps);
  a.l2 = !o.decoupled_weight_decay && o.weight_decay != 0.0;
  a.decoupled = o.decoupled_weight_decay;
  a.amsgrad = o.amsgrad;
  return a;
}

Result<std::unique_ptr<UpdateRule>> make_adam(const AdamOptions& o) {
  STRATA_RETURN_IF_ERROR(check_adam(o));
  return std::unique_ptr<UpdateRule>(
      std::make_unique<KernelRule<AdamOptions, kernels::AdamScalars>>(
          o.decoupled_weight_decay ? "adamw" : "adam", o.amsgrad ? 3 : 2, o,
          &kernels::adam_scalars, &kernels::adam));
}

Result<std::unique_ptr<UpdateRule>> make_adamw(AdamOptions options) {
  options.decoupled_weight_decay = true;
  return make_adam(options);
}

Result<std::unique_ptr<UpdateRule>> make_torch_exact_adam(const AdamOptions& o) {
  STRATA_RETURN_IF_ERROR(check_adam(o));
  return kernels::torch_exact_adam(o);
}

Result<std::unique_ptr<UpdateRule>> make_adagrad(const AdagradOptions& o) {
  STRATA_RETURN_IF_ERROR(check(o.lr >= 0.0, "Adagrad", "learning rate", o.lr, ">= 0"));
  STRATA_RETURN_IF_ERROR(check(o.lr_decay >= 0.0, "Adagrad", "lr_decay value", o.lr_decay, ">= 0"));
  STRATA_RETURN_IF_ERROR(
      check(o.weight_decay >= 0.0, "Adagrad", "weight_decay value", o.weight_decay, ">= 0"));
  STRATA_RETURN_IF_ERROR(check(o.initial_accumulator_value >= 0.0, "Adagrad",
                               "initial_accumulator_value", o.initial_accumulator_value, ">= 0"));
  STRATA_RETURN_IF_ERROR(check(o.eps >= 0.0, "Adagrad", "epsilon value", o.eps, ">= 0"));
  return std::unique_ptr<UpdateRule>(
      std::make_unique<KernelRule<AdagradOptions, kernels::AdagradScalars>>(
          "adagrad", 1, o, &adagrad_scalars, &kernels::adagrad,
          static_cast<float>(o.initial_accumulator_value)));
}

Result<std::unique_ptr<UpdateRule>> make_sgd(const SgdOptions& o) {
  STRATA_RETURN_IF_ERROR(check(o.lr >= 0.0, "SGD", "learning rate", o.lr, ">= 0"));
  STRATA_RETURN_IF_ERROR(check(o.momentum >= 0.0, "SGD", "momentum value", o.momentum, ">= 0"));
  STRATA_RETURN_IF_ERROR(
      check(o.weight_decay >= 0.0, "SGD", "weight_decay value", o.weight_decay, ">= 0"));
  if (o.nesterov && (o.momentum <= 0.0 || o.dampening != 0.0)) {
    return invalid_argument("SGD: Nesterov momentum requires a momentum and zero dampening");
  }
  return std::unique_ptr<UpdateRule>(std::make_unique<KernelRule<SgdOptions, kernels::SgdScalars>>(
      "sgd", o.momentum != 0.0 ? 1 : 0, o, &sgd_scalars, &kernels::sgd));
}

Result<std::unique_ptr<UpdateRule>> make_lion(const LionOptions& o) {
  STRATA_RETURN_IF_ERROR(check(o.lr >= 0.0, "Lion", "learning rate", o.lr, ">= 0"));
  STRATA_RETURN_IF_ERROR(
      check(o.beta1 >= 0.0 && o.beta1 <= 1.0, "Lion", "beta parameter at index 0", o.beta1, "in [0, 1]"));
  STRATA_RETURN_IF_ERROR(
      check(o.beta2 >= 0.0 && o.beta2 <= 1.0, "Lion", "beta parameter at index 1", o.beta2, "in [0, 1]"));
  STRATA_RETURN_IF_ERROR(
      check(o.weight_decay >= 0.0, "Lion", "weight_decay value", o.weight_decay, ">= 0"));
  return std::unique_ptr<UpdateRule>(std::make_unique<KernelRule<LionOptions, kernels::LionScalars>>(
      "lion", 1, o, &lion_scalars, &kernels::lion));
}

std::unique_ptr<UpdateRule> make_streaming_probe(int num_states) {
  return std::make_unique<ProbeRule>(std::clamp(num_states, 0, kMaxStateStreams));
}

size_t bytes_per_element(const UpdateRule& rule, DType grad_type, bool with_copy,
                         DType copy_type) {
  return 8 + dtype_size(grad_type) + 8 * static_cast<size_t>(rule.num_states()) +
         (with_copy ? dtype_size(copy_type) : 0);
}

}  // namespace strata::optimizer
