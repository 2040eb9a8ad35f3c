// strata::Status -> Python exceptions (classes defined in strata/_errors.py).
#pragma once

#include <pybind11/pybind11.h>

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

/// Registers the exception translator (call once from the module init).
void register_errors(pybind11::module_& m);

}  // namespace strata::py_bindings
