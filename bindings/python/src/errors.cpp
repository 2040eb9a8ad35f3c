#include "errors.hpp"

namespace strata::py_bindings {

namespace py = pybind11;

py::object exception_of(const Status& s) {
  py::object make = py::module_::import("strata._errors").attr("_from_status");
  return make(static_cast<int>(s.code()), s.message(), s.sys_errno());
}

void register_errors(py::module_& /*m*/) {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      try {
        py::object exc = exception_of(e.status());
        PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
      } catch (py::error_already_set& inner) {
        inner.restore();
      }
    }
  });
}

}  // namespace strata::py_bindings
