// Private parts of the C API's optimizer: the handle struct (shared by
// c_optimizer.cpp and c_optimizer_state.cpp) and the C custom rule
// (c_rule.cpp).
#pragma once

#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "c_common.hpp"
#include "strata/optimizer/offload.hpp"

struct strata_optimizer {
  std::unique_ptr<strata::optimizer::OffloadedOptimizer> opt;
  /// Strings the C API hands out as `const char*` valid until close: the rule's
  /// and the state streams' names (fixed at create / open) and, per parameter,
  /// its name and master key (filled on the first param_info of that parameter;
  /// parameters are never removed).
  std::string rule_name;
  std::vector<std::string> state_names;
  std::mutex names_mu;
  std::deque<std::pair<std::string, std::string>> param_names;  ///< index = handle
  /// A custom rule's hyperparameter defaults (strata_optimizer_hyperparam of a
  /// key never set); empty for a built-in optimizer (its defaults come from the
  /// library).
  strata::optimizer::Hyperparams rule_defaults;
};

namespace strata::capi {

/// InvalidArgument when `o` is NULL or has no optimizer.
Status check_opt(strata_optimizer_t* o);

/// The RuleFactory of a C rule: validates `rule` (name, state names,
/// hyperparameter names, update), copies its strings and arrays, and returns a
/// factory whose rules call rule->update (with rule->user_data). Hyperparameter
/// keys must be among the rule's names (an unknown key is InvalidArgument
/// naming it and listing the known ones). `defaults` (may be null) receives the
/// rule's hyperparameter defaults. \error InvalidArgument naming the field at
/// fault (struct_size, name, a built-in name,
///     num_states, a state or hyperparameter name, update).
Result<optimizer::RuleFactory> c_rule_factory(const strata_rule_t* rule,
                                              optimizer::Hyperparams* defaults);

}  // namespace strata::capi
