#include "tensor_ref.hpp"

#include <bit>
#include <cstring>

#include "errors.hpp"

namespace strata::py_bindings {
namespace {

// The DLPack ABI (dlpack.h v0.6-0.8, https://github.com/dmlc/dlpack/blob/v0.8/include/dlpack/dlpack.h),
// as exported by torch's Tensor.__dlpack__(): a "dltensor" PyCapsule holding a
// DLManagedTensor. The consumer renames the capsule "used_dltensor" and calls the deleter
// when done with the memory.
struct DLDevice {
  int32_t device_type;  // kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLBool = 6
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; NULL = compact row-major
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};
constexpr int32_t kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3;

[[noreturn]] void bad(const std::string& msg) { throw StatusError(invalid_argument(msg)); }

/// Rejects a buffer whose elements are not in this machine's byte order: strata stores
/// raw bytes and reads them back as native values, so a '>f4' array would come back as
/// garbage. Formats per the struct module: '<' little, '>' and '!' big, '@' and '=' native.
void check_byte_order(const std::string& format, ssize_t itemsize) {
  if (itemsize <= 1 || format.empty()) return;
  const bool native_little = std::endian::native == std::endian::little;
  char order = format[0];
  const bool big = order == '>' || order == '!';
  const bool little = order == '<';
  if ((big && native_little) || (little && !native_little))
    bad(std::string("the array is ") + (big ? "big" : "little") + "-endian (buffer format '" +
        format + "') but this machine is " + (native_little ? "little" : "big") +
        "-endian; strata stores native byte order only: convert first, e.g. "
        "arr.astype(arr.dtype.newbyteorder('='))");
}

DType dtype_from_format(const std::string& format, ssize_t itemsize) {
  // Strip byte-order / alignment prefixes ('<', '>', '=', '@', '!'); check_byte_order has
  // already rejected a foreign byte order.
  std::string f = format;
  while (!f.empty() && std::strchr("<>=@!", f[0]) != nullptr) f.erase(0, 1);
  if (f.size() == 1) {
    switch (f[0]) {
      case 'f': if (itemsize == 4) return DType::kFloat32; break;
      case 'd': if (itemsize == 8) return DType::kFloat64; break;
      case 'e': if (itemsize == 2) return DType::kFloat16; break;
      case '?': return DType::kBool;
      case 'B': return DType::kUInt8;
      case 'b': return DType::kInt8;
      case 'h': if (itemsize == 2) return DType::kInt16; break;
      case 'i': case 'l': case 'q':
        if (itemsize == 4) return DType::kInt32;
        if (itemsize == 8) return DType::kInt64;
        break;
      case 'c': return DType::kUInt8;
      default: break;
    }
  }
  bad("unsupported element type (buffer format '" + format + "', item size " +
      std::to_string(itemsize) + "); strata stores fp32, fp16, bf16, fp64, int8, int16, int32, "
      "int64, uint8 and bool (pass dtype='bf16' for a 16-bit array holding bfloat16)");
}

/// The DLPack type code of `t`: kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLBool 6.
uint8_t dlpack_code(DType t) {
  if (t == DType::kBool) return 6;
  if (t == DType::kBFloat16) return 4;
  if (dtype_is_floating(t)) return 2;
  return t == DType::kUInt8 ? 1 : 0;
}

DType dtype_from_dlpack(const DLDataType& t) {
  if (t.lanes != 1) bad("DLPack tensors with lanes != 1 are not supported");
  for (int i = 0; i < kNumDTypes; ++i) {
    const auto d = static_cast<DType>(i);
    if (dlpack_code(d) == t.code && dtype_size(d) * 8 == t.bits) return d;
  }
  bad("unsupported DLPack dtype (code " + std::to_string(t.code) + ", " +
      std::to_string(t.bits) + " bits)");
}

void apply_override(TensorRef& r, const std::optional<std::string>& dtype_override,
                    size_t itemsize) {
  if (!dtype_override) return;
  auto dt = parse_dtype(*dtype_override);
  if (!dt.ok()) throw StatusError(dt.status());
  if (dtype_size(*dt) != itemsize)
    bad("dtype '" + *dtype_override + "' has " + std::to_string(dtype_size(*dt)) +
        "-byte elements but the array's have " + std::to_string(itemsize));
  r.dtype = *dt;
}

void finish(TensorRef& r) {
  r.numel = 1;
  for (int64_t d : r.shape) r.numel *= static_cast<uint64_t>(d);
  r.nbytes = r.numel * dtype_size(r.dtype);
}

}  // namespace

std::string numpy_dtype_name(DType t) {
  if (t == DType::kBFloat16) return "uint16";  // numpy has no bfloat16: its bits
  if (t == DType::kBool || t == DType::kUInt8) return std::string(dtype_name(t));
  return (dtype_is_floating(t) ? "float" : "int") + std::to_string(dtype_size(t) * 8);
}

TensorRef view_tensor(const py::handle& obj_in, bool writable,
                      const std::optional<std::string>& dtype_override) {
  py::object obj = py::reinterpret_borrow<py::object>(obj_in);
  TensorRef r;
  if (PyObject_CheckBuffer(obj.ptr())) {
    auto view = std::make_shared<Py_buffer>();
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj.ptr(), view.get(), flags) != 0) {
      PyErr_Clear();
      // Say why: read-only or not contiguous.
      Py_buffer probe;
      if (PyObject_GetBuffer(obj.ptr(), &probe, PyBUF_STRIDES | PyBUF_FORMAT) == 0) {
        const bool ro = probe.readonly != 0;
        PyBuffer_Release(&probe);
        if (writable && ro) bad("the output array is read-only");
      } else {
        PyErr_Clear();
      }
      bad("the array is not C-contiguous (use numpy.ascontiguousarray or tensor.contiguous())");
    }
    std::shared_ptr<Py_buffer> owner(view.get(), [view](Py_buffer* b) { PyBuffer_Release(b); });
    r.data = view->buf;
    check_byte_order(view->format ? view->format : "B", view->itemsize);
    // With an override only the item size matters (e.g. uint16 bits holding bf16).
    r.dtype = dtype_override ? DType::kUInt8
                             : dtype_from_format(view->format ? view->format : "B",
                                                 view->itemsize);
    for (int i = 0; i < view->ndim; ++i) r.shape.push_back(view->shape[i]);
    if (view->ndim == 0 && view->shape == nullptr && view->len != view->itemsize) {
      r.shape.push_back(view->len / view->itemsize);  // bytes-like without shape
    }
    r.owner = std::shared_ptr<void>(owner, owner.get());
    apply_override(r, dtype_override, static_cast<size_t>(view->itemsize));
    finish(r);
    return r;
  }
  if (!py::hasattr(obj, "__dlpack__"))
    bad(std::string("expected a numpy array, a buffer or a DLPack tensor (torch.Tensor), got ") +
        std::string(py::str(obj.get_type().attr("__name__"))));
  // torch refuses to export tensors that require grad: take a detached view (no copy).
  if (py::hasattr(obj, "requires_grad") && obj.attr("requires_grad").cast<bool>())
    obj = obj.attr("detach")();
  // torch tensors that DLPack cannot carry: say why instead of torch's RuntimeError.
  bool as_bool = false;
  const std::string type_module = py::str(obj.get_type().attr("__module__"));
  if (type_module.rfind("torch", 0) == 0) {
    const std::string layout = py::str(obj.attr("layout"));
    if (layout != "torch.strided")
      bad("the tensor has layout " + layout + " (sparse or other non-strided tensors are not "
          "supported; use tensor.to_dense())");
    const std::string dev = py::str(obj.attr("device").attr("type"));
    if (dev == "meta") bad("the tensor is on the 'meta' device and has no data");
    if (py::hasattr(obj, "is_conj") && obj.attr("is_conj")().cast<bool>())
      bad("the tensor has its conjugate bit set (a lazy conj() view; complex tensors are not "
          "supported, and resolve_conj() would copy)");
    if (py::hasattr(obj, "is_neg") && obj.attr("is_neg")().cast<bool>())
      bad("the tensor has its negative bit set (a lazy neg view); use resolve_neg() first");
    // torch's DLPack export refuses bool ("Bool type is not supported by dlpack"): export
    // the same memory as uint8 (a view, no copy) and keep the bool dtype.
    if (std::string(py::str(obj.attr("dtype"))) == "torch.bool") {
      obj = obj.attr("view")(py::module_::import("torch").attr("uint8"));
      as_bool = true;
    }
  }
  py::object cap;
  try {
    cap = obj.attr("__dlpack__")();
  } catch (py::error_already_set& e) {
    bad("cannot export the " + std::string(py::str(obj.get_type().attr("__name__"))) +
        " through DLPack: " + std::string(e.what()));
  }
  auto* mt = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap.ptr(), "dltensor"));
  if (mt == nullptr) {
    PyErr_Clear();
    bad("__dlpack__() did not return a 'dltensor' capsule");
  }
  PyCapsule_SetName(cap.ptr(), "used_dltensor");
  std::shared_ptr<DLManagedTensor> owner(mt, [](DLManagedTensor* t) {
    if (t->deleter) t->deleter(t);
  });
  const DLTensor& t = mt->dl_tensor;
  if (t.device.device_type != kDLCPU && t.device.device_type != kDLCUDAHost &&
      t.device.device_type != kDLCUDA)
    bad("DLPack device type " + std::to_string(t.device.device_type) +
        " is not supported (CPU, CUDA host or CUDA)");
  r.device = t.device.device_type == kDLCUDA;
  r.device_id = t.device.device_id;
  r.dtype = dtype_from_dlpack(t.dtype);
  if (as_bool) r.dtype = DType::kBool;
  r.data = static_cast<char*>(t.data) + t.byte_offset;
  for (int i = 0; i < t.ndim; ++i) r.shape.push_back(t.shape[i]);
  bool empty = false;  // no element: any strides are contiguous (torch exports (1, 1) for 0x4)
  for (int i = 0; i < t.ndim; ++i) empty = empty || t.shape[i] == 0;
  if (t.strides != nullptr && !empty) {
    int64_t expect = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      if (t.shape[i] != 1 && t.strides[i] != expect)
        bad("the tensor is not contiguous (use tensor.contiguous())");
      expect *= t.shape[i];
    }
  }
  r.owner = std::shared_ptr<void>(owner, owner.get());
  apply_override(r, dtype_override, dtype_size(r.dtype));
  finish(r);
  return r;
}

}  // namespace strata::py_bindings
