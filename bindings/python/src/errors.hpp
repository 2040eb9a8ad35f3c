// strata::Status -> Python exceptions (classes defined in strata/_errors.py).
#pragma once

#include <pybind11/pybind11.h>
// The STL casters (std::optional, std::vector, std::map, ...) in every binding file alike:
// a caster seen by one file and not another would be an ODR violation.
#include <pybind11/stl.h>

#include <exception>
#include <string>

#include "strata/base/status.hpp"

namespace strata::py_bindings {

/// A Status on its way to Python; the registered translator raises the matching
/// strata.Error subclass (docs/errors.md: KeyError, ValueError, MemoryError, OSError, ...).
class StatusError : public std::exception {
 public:
  explicit StatusError(Status s) : status_(std::move(s)), what_(status_.to_string()) {}
  const Status& status() const { return status_; }
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  Status status_;
  std::string what_;
};

/// Throws StatusError when `s` is an error.
inline void check(const Status& s) {
  if (!s.ok()) throw StatusError(s);
}
template <class T>
T check(Result<T> r) {
  if (!r.ok()) throw StatusError(r.status());
  return std::move(r).value();
}

/// The strata.Error subclass instance for an error Status (strata._errors._from_status),
/// not raised. Needs the GIL; Python errors of the import propagate as error_already_set.
pybind11::object exception_of(const Status& s);

/// Registers the translator that raises exception_of(status) for a StatusError escaping a
/// binding (call once from the module init).
void register_errors(pybind11::module_& m);

}  // namespace strata::py_bindings
