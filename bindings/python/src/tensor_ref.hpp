// Zero-copy views of Python array objects: the buffer protocol (numpy, memoryview, bytes)
// and DLPack (torch tensors, CPU or CUDA, and any other producer of `__dlpack__`).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/base/dtype.hpp"

namespace strata::py_bindings {

namespace py = pybind11;

/// A borrowed view of an array's memory. `owner` keeps the exporter's memory alive (a
/// Py_buffer or a DLPack managed tensor); it must be destroyed with the GIL held.
struct TensorRef {
  void* data = nullptr;
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;
  uint64_t numel = 1;
  uint64_t nbytes = 0;
  bool device = false;     ///< CUDA device memory (DLPack kDLCUDA)
  int device_id = -1;
  std::shared_ptr<void> owner;
};

/// Views `obj` without copying. The memory must be C-contiguous.
/// \param writable request a writable view (get_into targets).
/// \param dtype_override reinterpret the elements as this dtype (e.g. "bf16" for a uint16
///     numpy array); its size must equal the exporter's item size.
/// Throws StatusError(InvalidArgument) for a non-contiguous array, an unsupported element
/// type, a read-only target or an override of another size; TypeError-like
/// InvalidArgument for objects that are neither buffers nor DLPack producers.
TensorRef view_tensor(const py::handle& obj, bool writable,
                      const std::optional<std::string>& dtype_override);

/// The numpy dtype name of a strata dtype ("float32", "int64", "bool", ...; bf16, which
/// numpy lacks, -> "uint16", its bits).
std::string numpy_dtype_name(DType t);

}  // namespace strata::py_bindings
