#include "py_convert.hpp"

#include "array_pool.hpp"

#include <cstdio>
#include <cstdlib>

#include "errors.hpp"
#include "strata/base/units.hpp"
#include "tensor_ref.hpp"

namespace strata::py_bindings {

using namespace pybind11::literals;

namespace {

[[noreturn]] void bad(const std::string& msg) { throw StatusError(invalid_argument(msg)); }

/// The Python int `i` in [0, 2**64 - 1]; `unit` ends the too-large message ("" or " bytes").
uint64_t int_to_u64(const py::handle& i, const char* what, const char* unit) {
  if (PyObject_RichCompareBool(i.ptr(), py::int_(0).ptr(), Py_LT) == 1)
    bad(std::string(what) + " must be >= 0, got " + std::string(py::str(i)));
  const unsigned long long x = PyLong_AsUnsignedLongLong(i.ptr());
  if (PyErr_Occurred()) {
    PyErr_Clear();
    bad(std::string(what) + " = " + std::string(py::str(i)) +
        " does not fit in 64 bits (max 2**64-1" + unit + ")");
  }
  return static_cast<uint64_t>(x);
}

}  // namespace

std::string type_name(const py::handle& v) {
  return py::str(py::type::handle_of(v).attr("__name__"));
}

std::string to_text(const py::handle& v, const char* what) {
  if (!PyUnicode_Check(v.ptr()))
    bad(std::string(what) + " must be a str, got " + type_name(v) + " " +
        std::string(py::repr(v)));
  Py_ssize_t n = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(v.ptr(), &n);
  if (utf8 != nullptr) return std::string(utf8, static_cast<size_t>(n));
  PyErr_Clear();
  // The only str without a UTF-8 encoding is one holding a surrogate code point.
  const Py_ssize_t len = PyUnicode_GetLength(v.ptr());
  Py_ssize_t at = 0;
  Py_UCS4 cp = 0;
  for (; at < len; ++at) {
    cp = PyUnicode_ReadChar(v.ptr(), at);
    if (cp >= 0xD800 && cp <= 0xDFFF) break;
  }
  char u[16];
  std::snprintf(u, sizeof u, "U+%04X", static_cast<unsigned>(cp));
  bad(std::string(what) + " " + std::string(py::repr(v)) +
      " is not valid UTF-8 text: lone surrogate " + u + " at index " + std::to_string(at));
}

std::string to_path(const py::handle& v, const char* what) {
  PyObject* b = nullptr;
  if (!PyUnicode_FSConverter(v.ptr(), &b)) {
    PyErr_Clear();
    bad(std::string(what) + " must be a str or os.PathLike, got " + type_name(v) + " " +
        std::string(py::repr(v)));
  }
  py::bytes bytes = py::reinterpret_steal<py::bytes>(b);
  return std::string(bytes);
}

uint64_t to_u64(const py::handle& v, const char* what) {
  if (PyBool_Check(v.ptr()) || !PyIndex_Check(v.ptr()))
    bad(std::string(what) + " must be an int, got " + type_name(v) + " " +
        std::string(py::repr(v)));
  py::object i = py::reinterpret_steal<py::object>(PyNumber_Index(v.ptr()));
  if (!i) throw py::error_already_set();
  return int_to_u64(i, what, "");
}

uint64_t to_size(const py::handle& v, const char* what) {
  if (py::isinstance<py::str>(v)) {
    auto r = parse_size(to_text(v, what));
    if (!r.ok()) throw StatusError(r.status().with_context(what));
    return *r;
  }
  // Python ints are unbounded: int_to_u64 checks the range (pybind's cast would raise a
  // RuntimeError "Unable to cast" outside strata's exception family).
  if (py::isinstance<py::int_>(v) && !py::isinstance<py::bool_>(v))
    return int_to_u64(v, what, " bytes");
  bad(std::string(what) + " must be an int or a size string like \"1GiB\"");
}

std::optional<std::string> to_dtype_arg(const py::handle& v) {
  if (v.is_none()) return std::nullopt;
  return to_text(v, "dtype");
}

Tier to_tier(const py::handle& v) {
  const std::string name = to_text(v, "tier");
  auto t = tier_from_name(name);
  if (!t) bad("unknown tier '" + name + "' (expected 'device', 'host' or 'nvme')");
  return *t;
}

py::str text_of(const std::string& s) {
  PyObject* o =
      PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "surrogateescape");
  if (!o) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(o);
}

py::object numpy() { return py::module_::import("numpy"); }

AlignedBuffer::AlignedBuffer(uint64_t nbytes)
    : nbytes_(nbytes), alloc_(align_up(nbytes == 0 ? 1 : nbytes, 4096)) {
  data_ = ArrayPool::instance().take(alloc_);
  if (data_ != nullptr) return;
  if (posix_memalign(&data_, 4096, alloc_) != 0 || data_ == nullptr)
    throw StatusError(resource_exhausted("cannot allocate " + format_bytes(alloc_) +
                                         " for an array"));
}

AlignedBuffer::~AlignedBuffer() { ArrayPool::instance().give(data_, alloc_); }

void register_aligned_buffer(py::module_& m) {
  m.def(
      "_array_pool_reserve",
      [](int64_t delta) { ArrayPool::instance().reserve(delta); }, "delta_bytes"_a,
      "Raises (delta_bytes > 0) or lowers the array pool's capacity (bytes): freed arrays of\n"
      "at least 64 KiB made by Store.get/get_async/get_tensor/read_range are kept, up to\n"
      "it, for the next array of the same size (no page faults). Lowering frees the oldest\n"
      "kept blocks.\n"
      "Thread-safe. ParameterOffload reserves its working-set budget while open.");
  m.def(
      "_array_pool_stats",
      []() {
        const auto s = ArrayPool::instance().stats();
        return py::dict("capacity_bytes"_a = s.capacity_bytes, "held_bytes"_a = s.held_bytes,
                        "held_blocks"_a = s.held_blocks, "hits"_a = s.hits,
                        "misses"_a = s.misses);
      },
      "The array pool's capacity and held bytes, blocks held, and its hits and misses\n"
      "(allocations of at least 64 KiB served from it or not) since the process started.");
  py::class_<AlignedBuffer>(m, "_AlignedBuffer", py::buffer_protocol())
      .def_buffer([](AlignedBuffer& b) {
        return py::buffer_info(b.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.nbytes())}, {py::ssize_t{1}});
      });
}

py::object array_of(std::unique_ptr<AlignedBuffer> buf, const TensorDesc& desc) {
  py::object owner = py::cast(std::move(buf));
  py::tuple shape(desc.shape.size());
  for (size_t i = 0; i < desc.shape.size(); ++i) shape[i] = py::int_(desc.shape[i]);
  return numpy()
      .attr("frombuffer")(owner, "dtype"_a = numpy_dtype_name(desc.dtype))
      .attr("reshape")(shape);
}

py::object new_aligned_array(const TensorDesc& desc, void** data) {
  auto buf = std::make_unique<AlignedBuffer>(desc.nbytes());
  *data = buf->data();
  return array_of(std::move(buf), desc);
}

}  // namespace strata::py_bindings
