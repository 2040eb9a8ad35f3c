#include "py_futures.hpp"

#include <cmath>
#include <string>

#include "errors.hpp"

namespace strata::py_bindings {

using namespace pybind11::literals;

namespace {

struct VoidFutureImpl : FutureImplOf<void> {
  using FutureImplOf<void>::FutureImplOf;
  py::object value() const override { return py::none(); }
};

}  // namespace

PyFuture::~PyFuture() {
  if (impl_ && !impl_->ready()) {
    py::gil_scoped_release nogil;
    impl_->wait();
  }
}

py::object PyFuture::result(std::optional<double> timeout) {
  if (timeout && (std::isnan(*timeout) || *timeout < 0))
    throw StatusError(invalid_argument("timeout must be None or a number of seconds >= 0, "
                                       "got " + std::string(py::str(py::float_(*timeout)))));
  // Longer waits than ~31 years are treated as "forever": steady_clock's deadline
  // (now + timeout, in int64 nanoseconds) would overflow near 292 years.
  constexpr double kForeverSeconds = 1e9;
  if (timeout && *timeout >= kForeverSeconds) timeout.reset();
  {
    py::gil_scoped_release nogil;
    if (timeout) {
      const auto us = std::chrono::microseconds(static_cast<int64_t>(*timeout * 1e6));
      if (!impl_->wait_for(us))
        throw StatusError(deadline_exceeded("operation not complete within " +
                                            std::to_string(*timeout) + " s"));
    } else {
      impl_->wait();
    }
  }
  check(impl_->status());
  keep_.clear();  // buffers no longer in use
  if (!value_.is_none()) return value_;
  return impl_->value();
}

py::object PyFuture::exception() {
  {
    py::gil_scoped_release nogil;
    impl_->wait();
  }
  Status s = impl_->status();
  if (s.ok()) return py::none();
  return exception_of(s);
}

PyFuture make_future(Future<void> f, py::object value, std::vector<TensorRef> keep) {
  return PyFuture(std::make_unique<VoidFutureImpl>(std::move(f)), std::move(value),
                  std::move(keep));
}

void register_futures(py::module_& m) {
  py::class_<PyFuture>(m, "Future",
                       "Result of an asynchronous strata call. result(timeout=None) waits "
                       "(GIL released) and returns the value or raises the strata error; "
                       "TimeoutError when `timeout` seconds pass first (the operation keeps "
                       "running); timeout None, inf or >= 1e9 waits without limit, NaN or "
                       "negative is a ValueError. Buffers passed to the call stay referenced "
                       "until done; dropping the future waits for the operation.")
      .def("result", &PyFuture::result, "timeout"_a = py::none())
      .def("done", &PyFuture::done)
      .def("exception", &PyFuture::exception);
}

}  // namespace strata::py_bindings
