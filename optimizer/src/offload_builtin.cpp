// Built-in rule factories of the offloaded optimizer: torch.optim argument names mapped onto
// the fields of the option structs of optimizers.hpp, whose default values are torch.optim's
// defaults.
#include <string>
#include <utility>
#include <vector>

#include "strata/optimizer/offload.hpp"
#include "strata/optimizer/optimizers.hpp"

namespace strata::optimizer {
namespace {

// One hyperparameter of option struct O: its torch.optim name and its field, a number or a
// flag (given as 0 or 1).
template <class O>
struct Field {
  Field(const char* k, double O::*n) : key(k), number(n) {}
  Field(const char* k, bool O::*f) : key(k), flag(f) {}
  const char* key;
  double O::*number = nullptr;
  bool O::*flag = nullptr;
};

template <class O>
using MakeRule = Result<std::unique_ptr<UpdateRule>> (*)(const O&);

// Fills absent keys from `defaults`; unknown keys are errors.
Result<Hyperparams> merged(std::string_view optimizer, const Hyperparams& defaults,
                           const Hyperparams& given) {
  Hyperparams out = defaults;
  for (const auto& [k, v] : given) {
    auto it = out.find(k);
    if (it == out.end()) {
      std::string known;
      for (const auto& d : defaults) known += (known.empty() ? "" : ", ") + d.first;
      return invalid_argument(std::string(optimizer) + ": unknown hyperparameter '" + k +
                              "' (known: " + known + ")");
    }
    it->second = v;
  }
  return out;
}

// A factory and its defaults: what builtin_rule_factory / builtin_default_hyperparams give.
struct Builtin {
  RuleFactory factory;
  Hyperparams defaults;
};

// The factory of the rules `make` builds from `base` with `fields` set from the
// hyperparameters; the defaults are `base`'s values.
template <class O>
Builtin builtin_of(std::string name, std::vector<Field<O>> fields, O base, MakeRule<O> make) {
  Builtin b;
  for (const auto& f : fields) b.defaults[f.key] = f.number ? base.*f.number : (base.*f.flag ? 1.0 : 0.0);
  b.factory = [name = std::move(name), fields = std::move(fields), base, make,
               defaults = b.defaults](const Hyperparams& given)
      -> Result<std::unique_ptr<UpdateRule>> {
    STRATA_ASSIGN_OR_RETURN(Hyperparams hp, merged(name, defaults, given));
    O o = base;
    for (const auto& f : fields) {
      const double v = hp.at(f.key);
      if (f.number) {
        o.*f.number = v;
      } else if (v != 0.0 && v != 1.0) {
        return invalid_argument(name + ": hyperparameter '" + f.key + "' must be 0 or 1, got " +
                                std::to_string(v));
      } else {
        o.*f.flag = v == 1.0;
      }
    }
    return make(o);
  };
  return b;
}

Builtin adam_builtin(std::string_view name, MakeRule<AdamOptions> make) {
  AdamOptions base;
  if (name == "adamw") {
    base.decoupled_weight_decay = true;
    base.weight_decay = kAdamWDefaultWeightDecay;
  }
  using O = AdamOptions;
  return builtin_of<O>(std::string(name),
                       {{"lr", &O::lr}, {"beta1", &O::beta1}, {"beta2", &O::beta2},
                        {"eps", &O::eps}, {"weight_decay", &O::weight_decay},
                        {"amsgrad", &O::amsgrad}, {"maximize", &O::maximize},
                        {"any_betas", &O::any_betas}},
                       base, make);
}

Result<Builtin> builtin(std::string_view optimizer) {
  if (optimizer == "adam" || optimizer == "adamw") return adam_builtin(optimizer, &make_adam);
  if (optimizer == "adagrad") {
    using O = AdagradOptions;
    return builtin_of<O>("adagrad",
                         {{"lr", &O::lr}, {"lr_decay", &O::lr_decay},
                          {"weight_decay", &O::weight_decay},
                          {"initial_accumulator_value", &O::initial_accumulator_value},
                          {"eps", &O::eps}, {"maximize", &O::maximize}},
                         O{}, &make_adagrad);
  }
  if (optimizer == "sgd") {
    using O = SgdOptions;
    return builtin_of<O>("sgd",
                         {{"lr", &O::lr}, {"momentum", &O::momentum}, {"dampening", &O::dampening},
                          {"weight_decay", &O::weight_decay}, {"nesterov", &O::nesterov},
                          {"maximize", &O::maximize}},
                         O{}, &make_sgd);
  }
  if (optimizer == "lion") {
    using O = LionOptions;
    return builtin_of<O>("lion",
                         {{"lr", &O::lr}, {"beta1", &O::beta1}, {"beta2", &O::beta2},
                          {"weight_decay", &O::weight_decay}, {"maximize", &O::maximize}},
                         O{}, &make_lion);
  }
  return invalid_argument("unknown optimizer '" + std::string(optimizer) +
                          "' (known: adam, adamw, adagrad, sgd, lion)");
}

}  // namespace

std::string_view placement_name(Placement p) {
  switch (p) {
    case Placement::kAuto: return "auto";
    case Placement::kHost: return "host";
    case Placement::kNvme: return "nvme";
  }
  return "unknown";
}

Result<Hyperparams> builtin_default_hyperparams(std::string_view optimizer) {
  STRATA_ASSIGN_OR_RETURN(Builtin b, builtin(optimizer));
  return std::move(b.defaults);
}

Result<RuleFactory> builtin_rule_factory(std::string_view optimizer) {
  STRATA_ASSIGN_OR_RETURN(Builtin b, builtin(optimizer));
  return std::move(b.factory);
}

Result<RuleFactory> torch_exact_rule_factory(std::string_view optimizer) {
  if (optimizer != "adam" && optimizer != "adamw") {
    return invalid_argument("torch-exact arithmetic is available for adam and adamw, not '" +
                            std::string(optimizer) + "'");
  }
  return adam_builtin(optimizer, &make_torch_exact_adam).factory;
}

}  // namespace strata::optimizer
