// strata._strata._OffloadedOptimizer and hyperparams_refusal: the bindings of
// optimizer::OffloadedOptimizer (behind strata.OffloadedOptimizer and strata.torch) and of
// the built-in rules' hyperparameter checks.
#pragma once

#include <pybind11/pybind11.h>

namespace strata::py_bindings {

/// Registers _OffloadedOptimizer, builtin_default_hyperparams and hyperparams_refusal (call
/// once from the module init).
void register_optimizer(pybind11::module_& m);

}  // namespace strata::py_bindings
