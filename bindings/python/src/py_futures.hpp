// strata._strata.Future: the Python future over a strata Future<T> returned by every
// `*_async` call of the store and the optimizer.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "strata/base/future.hpp"
#include "tensor_ref.hpp"

namespace strata::py_bindings {

namespace py = pybind11;

/// A Python future over a strata Future<T>. `keep` holds the buffers the operation uses
/// until it is done; the destructor waits for the operation (GIL released) before releasing
/// them. Methods need the GIL; one PyFuture is used by one Python thread at a time (the GIL
/// serializes them).
class PyFuture {
 public:
  /// The type-erased strata future. ready/wait/wait_for/status run without the GIL.
  struct Impl {
    virtual ~Impl() = default;
    virtual bool ready() const = 0;
    virtual void wait() const = 0;
    virtual bool wait_for(std::chrono::microseconds d) const = 0;
    virtual Status status() const = 0;
    virtual py::object value() const = 0;  // with the GIL, after an OK status
  };

  /// `value`, when not None, is the result (e.g. get_into's `out`); else impl->value().
  PyFuture(std::unique_ptr<Impl> impl, py::object value, std::vector<TensorRef> keep)
      : impl_(std::move(impl)), value_(std::move(value)), keep_(std::move(keep)) {}
  PyFuture(PyFuture&&) noexcept = default;
  PyFuture& operator=(PyFuture&&) = delete;
  PyFuture(const PyFuture&) = delete;
  ~PyFuture();

  /// True once the operation has finished (never blocks).
  bool done() const { return impl_->ready(); }

  /// Waits for the operation (GIL released) and returns its value. `timeout`: None, inf or
  /// any value of at least 1e9 seconds waits without limit; otherwise seconds >= 0 (0
  /// polls). NaN or negative: InvalidArgument (ValueError). Not ready in time:
  /// DeadlineExceeded (TimeoutError); the operation keeps running. The operation's error
  /// is raised as its strata.Error subclass.
  py::object result(std::optional<double> timeout);

  /// Waits (GIL released); None on success, else the strata.Error instance (not raised).
  py::object exception();

 private:
  std::unique_ptr<Impl> impl_;
  py::object value_;
  std::vector<TensorRef> keep_;
};

/// The Impl over one strata Future<T>; subclasses define value().
template <class T>
struct FutureImplOf : PyFuture::Impl {
  explicit FutureImplOf(Future<T> f) : f(std::move(f)) {}
  bool ready() const override { return f.ready(); }
  void wait() const override { f.wait(); }
  bool wait_for(std::chrono::microseconds d) const override { return f.wait_for(d); }
  Status status() const override { return f.result().status(); }
  Future<T> f;
};

/// The PyFuture of a Future<void>: its result is `value` (None by default); `keep` as
/// PyFuture.
PyFuture make_future(Future<void> f, py::object value = py::none(),
                     std::vector<TensorRef> keep = {});

/// Registers strata._strata.Future (call once from the module init).
void register_futures(py::module_& m);

}  // namespace strata::py_bindings
