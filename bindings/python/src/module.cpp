// strata._strata: the pybind11 extension behind the `strata` Python package.
//
// The pure-Python layer (strata/__init__.py, strata/torch/) wraps these classes; see
// docs/bindings.md. Every call that may block (I/O, waits, optimizer steps) releases the GIL.
// One file per concern: errors.cpp (Status -> exceptions), py_convert.cpp (arguments,
// aligned arrays), tensor_ref.cpp (zero-copy views), py_futures.cpp, py_store.cpp,
// py_optimizer.cpp, py_collectives.cpp + py_partitioned.cpp, py_safetensors.cpp.
#include <pybind11/pybind11.h>

#include <string>

#include "errors.hpp"
#include "py_collectives.hpp"
#include "py_convert.hpp"
#include "py_futures.hpp"
#include "py_optimizer.hpp"
#include "py_store.hpp"
#include "strata/base/units.hpp"
#include "strata/store/config.hpp"

namespace strata::py_bindings {
void register_safetensors(py::module_& m);  // py_safetensors.cpp
}  // namespace strata::py_bindings

using namespace strata;
using namespace strata::py_bindings;
using namespace pybind11::literals;

PYBIND11_MODULE(_strata, m) {
  m.doc() = "strata's C++ core (see the `strata` package for the documented API)";
  register_errors(m);

  m.def("parse_size", [](const std::string& s) { return check(parse_size(s)); }, "text"_a,
        "Bytes in a size string such as '1GiB' or '64M' (powers of 1024). ValueError if "
        "malformed.");
  m.def("format_bytes", &format_bytes, "nbytes"_a);
  // The configuration file `path`, checked (errors raise, naming the key and the file),
  // as canonical JSON text: only the keys it sets, sizes as integer bytes.
  m.def("load_config", [](const std::string& path) { return check(Config::load(path)).to_json(); },
        "path"_a);
#ifdef STRATA_HAVE_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif

  register_aligned_buffer(m);
  register_futures(m);
  register_store(m);
  register_safetensors(m);
  register_optimizer(m);
  register_collectives(m);
}
