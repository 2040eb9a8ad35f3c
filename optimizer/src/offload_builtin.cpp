// Built-in rule factories of the offloaded optimizer: torch.optim argument names and
// defaults mapped onto the option structs of optimizers.hpp.
#include <cmath>
#include <string>

#include "strata/optimizer/offload.hpp"
#include "strata/optimizer/optimizers.hpp"

namespace strata::optimizer {
namespace {

// torch.optim defaults (PyTorch 1.13 / 2.x signatures).
Hyperparams adam_defaults(bool adamw) {
  return {{"lr", 1e-3},  {"beta1", 0.9},   {"beta2", 0.999},
          {"eps", 1e-8}, {"weight_decay", adamw ? kAdamWDefaultWeightDecay : 0.0},
          {"amsgrad", 0}, {"maximize", 0}};
}

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

Result<bool> flag(std::string_view optimizer, const Hyperparams& hp, const char* key) {
  double v = hp.at(key);
  if (v != 0.0 && v != 1.0) {
    return invalid_argument(std::string(optimizer) + ": hyperparameter '" + key +
                            "' must be 0 or 1, got " + std::to_string(v));
  }
  return v == 1.0;
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
  if (optimizer == "adam") return adam_defaults(false);
  if (optimizer == "adamw") return adam_defaults(true);
  if (optimizer == "adagrad") {
    return Hyperparams{{"lr", 1e-2}, {"lr_decay", 0.0}, {"weight_decay", 0.0},
                       {"initial_accumulator_value", 0.0}, {"eps", 1e-10}, {"maximize", 0}};
  }
  if (optimizer == "sgd") {
    return Hyperparams{{"lr", 1e-3},       {"momentum", 0.0}, {"dampening", 0.0},
                       {"weight_decay", 0.0}, {"nesterov", 0},  {"maximize", 0}};
  }
  if (optimizer == "lion") {
    return Hyperparams{{"lr", 1e-4}, {"beta1", 0.9}, {"beta2", 0.99}, {"weight_decay", 0.0},
                       {"maximize", 0}};
  }
  return invalid_argument("unknown optimizer '" + std::string(optimizer) +
                          "' (known: adam, adamw, adagrad, sgd, lion)");
}

Result<RuleFactory> builtin_rule_factory(std::string_view optimizer) {
  STRATA_ASSIGN_OR_RETURN(Hyperparams defaults, builtin_default_hyperparams(optimizer));
  std::string name(optimizer);
  RuleFactory f = [name, defaults](const Hyperparams& given)
      -> Result<std::unique_ptr<UpdateRule>> {
    STRATA_ASSIGN_OR_RETURN(Hyperparams hp, merged(name, defaults, given));
    if (name == "adam" || name == "adamw") {
      AdamOptions o;
      o.lr = hp.at("lr");
      o.beta1 = hp.at("beta1");
      o.beta2 = hp.at("beta2");
      o.eps = hp.at("eps");
      o.weight_decay = hp.at("weight_decay");
      STRATA_ASSIGN_OR_RETURN(o.amsgrad, flag(name, hp, "amsgrad"));
      STRATA_ASSIGN_OR_RETURN(o.maximize, flag(name, hp, "maximize"));
      return name == "adam" ? make_adam(o) : make_adamw(o);
    }
    if (name == "adagrad") {
      AdagradOptions o;
      o.lr = hp.at("lr");
      o.lr_decay = hp.at("lr_decay");
      o.weight_decay = hp.at("weight_decay");
      o.initial_accumulator_value = hp.at("initial_accumulator_value");
      o.eps = hp.at("eps");
      STRATA_ASSIGN_OR_RETURN(o.maximize, flag(name, hp, "maximize"));
      return make_adagrad(o);
    }
    if (name == "sgd") {
      SgdOptions o;
      o.lr = hp.at("lr");
      o.momentum = hp.at("momentum");
      o.dampening = hp.at("dampening");
      o.weight_decay = hp.at("weight_decay");
      STRATA_ASSIGN_OR_RETURN(o.nesterov, flag(name, hp, "nesterov"));
      STRATA_ASSIGN_OR_RETURN(o.maximize, flag(name, hp, "maximize"));
      return make_sgd(o);
    }
    LionOptions o;
    o.lr = hp.at("lr");
    o.beta1 = hp.at("beta1");
    o.beta2 = hp.at("beta2");
    o.weight_decay = hp.at("weight_decay");
    STRATA_ASSIGN_OR_RETURN(o.maximize, flag(name, hp, "maximize"));
    return make_lion(o);
  };
  return f;
}

}  // namespace strata::optimizer
