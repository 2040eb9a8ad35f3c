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

class AdamRule final : public UpdateRule {
 public:
  explicit AdamRule(const AdamOptions& o) : o_(o) {}
  std::string_view name() const override { return o_.decoupled_weight_decay ? "adamw" : "adam"; }
  int num_states() const override { return o_.amsgrad ? 3 : 2; }
  std::string_view state_name(int i) const override {
    static constexpr std::string_view kNames[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
    return kNames[i];
  }
  void update(const UpdateSpans& s, const StepInfo& info) const override {
    // torch: bias_correction1 = 1 - beta1 ** step (Python floats), step_size = lr / bc1,
    // bias_correction2_sqrt = math.sqrt(1 - beta2 ** step); passed to fp32 kernels.
    const double t = static_cast<double>(info.step);
    const double bc1 = 1.0 - std::pow(o_.beta1, t);
    const double bc2 = 1.0 - std::pow(o_.beta2, t);
    kernels::AdamScalars a{};
    a.gscale = o_.maximize ? -info.grad_scale : info.grad_scale;
    a.weight_decay = static_cast<float>(o_.weight_decay);
    a.decay = static_cast<float>(1.0 - o_.lr * o_.weight_decay);
    a.beta1 = static_cast<float>(o_.beta1);
    a.one_minus_beta1 = static_cast<float>(1.0 - o_.beta1);
    a.beta2 = static_cast<float>(o_.beta2);
    a.one_minus_beta2 = static_cast<float>(1.0 - o_.beta2);
    a.neg_step_size = static_cast<float>(-(o_.lr / bc1));
    a.inv_bias_correction2_sqrt = static_cast<float>(1.0 / std::sqrt(bc2));
    a.eps = static_cast<float>(o_.eps);
    a.l2 = !o_.decoupled_weight_decay && o_.weight_decay != 0.0;
    a.decoupled = o_.decoupled_weight_decay;
    a.amsgrad = o_.amsgrad;
    kernels::adam(s, a);
  }

 private:
  AdamOptions o_;
};

class AdagradRule final : public UpdateRule {
 public:
  explicit AdagradRule(const AdagradOptions& o) : o_(o) {}
  std::string_view name() const override { return "adagrad"; }
  int num_states() const override { return 1; }
  std::string_view state_name(int) const override { return "sum"; }
  float state_init_value(int) const override {
    return static_cast<float>(o_.initial_accumulator_value);
  }
  void update(const UpdateSpans& s, const StepInfo& info) const override {
    kernels::AdagradScalars a{};
    a.gscale = o_.maximize ? -info.grad_scale : info.grad_scale;
    a.weight_decay = static_cast<float>(o_.weight_decay);
    const double clr = o_.lr / (1.0 + static_cast<double>(info.step - 1) * o_.lr_decay);
    a.neg_clr = static_cast<float>(-clr);
    a.eps = static_cast<float>(o_.eps);
    a.l2 = o_.weight_decay != 0.0;
    kernels::adagrad(s, a);
  }

 private:
  AdagradOptions o_;
};

class SgdRule final : public UpdateRule {
 public:
  explicit SgdRule(const SgdOptions& o) : o_(o) {}
  std::string_view name() const override { return "sgd"; }
  int num_states() const override { return o_.momentum != 0.0 ? 1 : 0; }
  std::string_view state_name(int) const override { return "momentum_buffer"; }
  void update(const UpdateSpans& s, const StepInfo& info) const override {
    kernels::SgdScalars a{};
    a.gscale = o_.maximize ? -info.grad_scale : info.grad_scale;
    a.weight_decay = static_cast<float>(o_.weight_decay);
    a.neg_lr = static_cast<float>(-o_.lr);
    a.momentum = static_cast<float>(o_.momentum);
    a.one_minus_dampening = static_cast<float>(1.0 - o_.dampening);
    a.l2 = o_.weight_decay != 0.0;
    a.has_momentum = o_.momentum != 0.0;
    a.first_step = info.step == 1;
    a.nesterov = o_.nesterov;
    kernels::sgd(s, a);
  }

 private:
  SgdOptions o_;
};

class LionRule final : public UpdateRule {
 public:
  explicit LionRule(const LionOptions& o) : o_(o) {}
  std::string_view name() const override { return "lion"; }
  int num_states() const override { return 1; }
  std::string_view state_name(int) const override { return "exp_avg"; }
  void update(const UpdateSpans& s, const StepInfo& info) const override {
    kernels::LionScalars a{};
    a.gscale = o_.maximize ? -info.grad_scale : info.grad_scale;
    a.decay = static_cast<float>(1.0 - o_.lr * o_.weight_decay);
    a.lr = static_cast<float>(o_.lr);
    a.beta1 = static_cast<float>(o_.beta1);
    a.one_minus_beta1 = static_cast<float>(1.0 - o_.beta1);
    a.beta2 = static_cast<float>(o_.beta2);
    a.one_minus_beta2 = static_cast<float>(1.0 - o_.beta2);
    a.decoupled = o_.weight_decay != 0.0;
    kernels::lion(s, a);
  }

 private:
  LionOptions o_;
};

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

}  // namespace

Result<std::unique_ptr<UpdateRule>> make_adam(const AdamOptions& o) {
  const char* name = o.decoupled_weight_decay ? "AdamW" : "Adam";
  STRATA_RETURN_IF_ERROR(check(o.lr >= 0.0, name, "learning rate", o.lr, ">= 0"));
  STRATA_RETURN_IF_ERROR(check(o.eps >= 0.0, name, "epsilon value", o.eps, ">= 0"));
  STRATA_RETURN_IF_ERROR(
      check(o.beta1 >= 0.0 && o.beta1 < 1.0, name, "beta parameter at index 0", o.beta1, "in [0, 1)"));
  STRATA_RETURN_IF_ERROR(
      check(o.beta2 >= 0.0 && o.beta2 < 1.0, name, "beta parameter at index 1", o.beta2, "in [0, 1)"));
  STRATA_RETURN_IF_ERROR(
      check(o.weight_decay >= 0.0, name, "weight_decay value", o.weight_decay, ">= 0"));
  return std::unique_ptr<UpdateRule>(std::make_unique<AdamRule>(o));
}

Result<std::unique_ptr<UpdateRule>> make_adamw(AdamOptions options) {
  options.decoupled_weight_decay = true;
  return make_adam(options);
}

Result<std::unique_ptr<UpdateRule>> make_adagrad(const AdagradOptions& o) {
  STRATA_RETURN_IF_ERROR(check(o.lr >= 0.0, "Adagrad", "learning rate", o.lr, ">= 0"));
  STRATA_RETURN_IF_ERROR(check(o.lr_decay >= 0.0, "Adagrad", "lr_decay value", o.lr_decay, ">= 0"));
  STRATA_RETURN_IF_ERROR(
      check(o.weight_decay >= 0.0, "Adagrad", "weight_decay value", o.weight_decay, ">= 0"));
  STRATA_RETURN_IF_ERROR(check(o.initial_accumulator_value >= 0.0, "Adagrad",
                               "initial_accumulator_value", o.initial_accumulator_value, ">= 0"));
  STRATA_RETURN_IF_ERROR(check(o.eps >= 0.0, "Adagrad", "epsilon value", o.eps, ">= 0"));
  return std::unique_ptr<UpdateRule>(std::make_unique<AdagradRule>(o));
}

Result<std::unique_ptr<UpdateRule>> make_sgd(const SgdOptions& o) {
  STRATA_RETURN_IF_ERROR(check(o.lr >= 0.0, "SGD", "learning rate", o.lr, ">= 0"));
  STRATA_RETURN_IF_ERROR(check(o.momentum >= 0.0, "SGD", "momentum value", o.momentum, ">= 0"));
  STRATA_RETURN_IF_ERROR(
      check(o.weight_decay >= 0.0, "SGD", "weight_decay value", o.weight_decay, ">= 0"));
  if (o.nesterov && (o.momentum <= 0.0 || o.dampening != 0.0)) {
    return invalid_argument("SGD: Nesterov momentum requires a momentum and zero dampening");
  }
  return std::unique_ptr<UpdateRule>(std::make_unique<SgdRule>(o));
}

Result<std::unique_ptr<UpdateRule>> make_lion(const LionOptions& o) {
  STRATA_RETURN_IF_ERROR(check(o.lr >= 0.0, "Lion", "learning rate", o.lr, ">= 0"));
  STRATA_RETURN_IF_ERROR(
      check(o.beta1 >= 0.0 && o.beta1 <= 1.0, "Lion", "beta parameter at index 0", o.beta1, "in [0, 1]"));
  STRATA_RETURN_IF_ERROR(
      check(o.beta2 >= 0.0 && o.beta2 <= 1.0, "Lion", "beta parameter at index 1", o.beta2, "in [0, 1]"));
  STRATA_RETURN_IF_ERROR(
      check(o.weight_decay >= 0.0, "Lion", "weight_decay value", o.weight_decay, ">= 0"));
  return std::unique_ptr<UpdateRule>(std::make_unique<LionRule>(o));
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
