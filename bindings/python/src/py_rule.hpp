// A Python update rule: an optimizer::UpdateRule whose update calls a Python callable on
// each streamed slice (behind strata.PythonRule and strata.torch.optim's rules).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>

#include "strata/optimizer/offload.hpp"

namespace strata::py_bindings {

/// What a Python rule is made of, shared by its factory and every rule it builds. The
/// Python objects are released with the GIL held (or leaked at interpreter exit).
struct PyRuleSpec {
  std::string name;                      ///< the rule's name (UpdateRule::name, checkpoints)
  std::vector<std::string> state_names;  ///< fp32 state streams (0..kMaxStateStreams)
  std::vector<float> state_inits;        ///< their initial values
  optimizer::Hyperparams defaults;       ///< every hyperparameter it takes, with defaults
  pybind11::object update;               ///< update(param, grad, states, step, hp, ctx)
  /// The exception object the last failing call raised (strong reference, or null), taken by
  /// take_error(): the cause of the strata error step() raises.
  PyObject* error = nullptr;
  std::mutex error_mu;

  ~PyRuleSpec();
  /// The last error's exception (a new reference; None when none) and clears it. GIL held.
  pybind11::object take_error();
};

/// The spec from Python values: name (str), state_names (sequence of str, at most
/// kMaxStateStreams), state_inits (sequence of float, same length, or empty: zeros),
/// defaults (dict str -> number) and update (callable).
/// \error StatusError(InvalidArgument) naming the bad value.
std::shared_ptr<PyRuleSpec> make_rule_spec(const pybind11::handle& spec);

/// The RuleFactory of `spec`: hyperparameter keys must be among spec->defaults (absent
/// ones take them; an unknown key is InvalidArgument naming it); every rule it builds is
/// whole-span (one Python call per apply_update) and may fail (the offloaded step is then
/// transactional, offload.hpp "A RULE THAT FAILS").
optimizer::RuleFactory python_rule_factory(std::shared_ptr<PyRuleSpec> spec);

}  // namespace strata::py_bindings
