// Python argument conversions shared by the store and optimizer bindings: text, paths,
// sizes and counts, tiers; the aligned host buffers behind arrays strata allocates; and
// release_gil() for the calls that block.
//
// Every conversion raises StatusError(InvalidArgument) naming the argument (strata's
// InvalidArgumentError, a ValueError) where pybind11 would raise a TypeError outside
// strata.Error. All of them need the GIL.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "strata/store/store.hpp"

namespace strata::py_bindings {

namespace py = pybind11;

/// The name of `v`'s type, for messages ("int", "float", "NoneType").
std::string type_name(const py::handle& v);

/// `v` (a str) as UTF-8. Strings are exchanged with the store as UTF-8, so a str that has no
/// UTF-8 encoding (a lone surrogate such as "a\udc80", e.g. from os.fsdecode of a non-UTF-8
/// name) and anything that is not a str are InvalidArgument naming `what` (the argument:
/// "key", "prefix", "tier", ...).
std::string to_text(const py::handle& v, const char* what);

/// A file system path (str or os.PathLike), encoded like os.fsencode (surrogateescape), so
/// any name the OS gave Python round-trips. Other types: InvalidArgument naming `what`.
std::string to_path(const py::handle& v, const char* what);

/// A byte offset, byte count or element count: a Python int (or any object with
/// __index__, e.g. numpy.int64) in [0, 2**64 - 1]. Anything else (negative, too large,
/// float, bool, None) is InvalidArgument naming `what`.
uint64_t to_u64(const py::handle& v, const char* what);

/// A size in bytes: an int in [0, 2**64 - 1] or a size string such as "1GiB" (parse_size:
/// powers of 1024). Anything else, negative or too large: InvalidArgument naming `what`.
uint64_t to_size(const py::handle& v, const char* what);

/// An optional dtype-override argument (None or a str naming a dtype, checked later).
std::optional<std::string> to_dtype_arg(const py::handle& v);

/// "device", "host" or "nvme"; another str or type: InvalidArgument.
Tier to_tier(const py::handle& v);

/// A store key or message as a Python str: UTF-8, with bytes that are not valid UTF-8 kept as
/// lone surrogates ("surrogateescape", as os.fsdecode does for file names) instead of raising
/// UnicodeDecodeError. Keys a Python program put are always valid UTF-8; others come from
/// catalogs written elsewhere (or damaged).
py::str text_of(const std::string& s);

/// The numpy module. Imported on each call (a sys.modules lookup once numpy is loaded):
/// a function-local `static py::object` would be destroyed by the C++ exit handlers after
/// the interpreter has finalized, which crashes at exit (Py_DECREF on a dead interpreter).
py::object numpy();

/// A block of host memory aligned to 4096 bytes (so the store can read into it with
/// O_DIRECT without a bounce copy), exported through the buffer protocol as
/// strata._strata._AlignedBuffer. numpy arrays made from it keep it alive.
/// Its memory comes from and goes back to the ArrayPool (array_pool.hpp) where that holds a
/// block of its size: memory is reused only once the last reference is gone.
/// Not thread-safe; freed by whichever thread drops the last reference (no GIL needed).
class AlignedBuffer {
 public:
  /// \error StatusError(ResourceExhausted) when the memory cannot be allocated.
  explicit AlignedBuffer(uint64_t nbytes);
  ~AlignedBuffer();
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  void* data() const { return data_; }
  uint64_t nbytes() const { return nbytes_; }

 private:
  void* data_ = nullptr;
  uint64_t nbytes_ = 0;
  uint64_t alloc_ = 0;  // nbytes_ rounded up to 4096 (at least 4096)
};

/// Registers AlignedBuffer as strata._strata._AlignedBuffer and the array pool's functions
/// (_array_pool_reserve, _array_pool_stats; call once from the module init).
void register_aligned_buffer(py::module_& m);

/// A numpy array of `desc`'s dtype and shape over `buf` (which it then owns; bf16 is
/// exposed as uint16). Needs the GIL.
py::object array_of(std::unique_ptr<AlignedBuffer> buf, const TensorDesc& desc);

/// A new numpy array of `desc` backed by an AlignedBuffer; *data receives its address.
/// \error StatusError(ResourceExhausted) as AlignedBuffer.
py::object new_aligned_array(const TensorDesc& desc, void** data);

/// Calls `f()` with the GIL released and returns its result (a Status, Result or Future,
/// which the caller checks with the GIL held again). `f` must not touch Python objects.
template <class F>
auto release_gil(F&& f) {
  py::gil_scoped_release nogil;
  return std::forward<F>(f)();
}

}  // namespace strata::py_bindings
