// strata._strata: the pybind11 extension behind the `strata` Python package.
//
// The pure-Python layer (strata/__init__.py, strata/torch.py) wraps these classes; see
// docs/bindings.md. Every call that may block (I/O, waits, optimizer steps) releases the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "errors.hpp"
#include "strata/base/future.hpp"
#include "strata/base/units.hpp"
#include "strata/optimizer/offload.hpp"
#include "strata/store/store.hpp"
#include "tensor_ref.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace strata::py_bindings {

Result<optimizer::RuleFactory> torch_exact_rule_factory(const std::string& optimizer);

// ---- errors -----------------------------------------------------------------------------

void register_errors(py::module_& m) {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      const Status& s = e.status();
      try {
        py::object make = py::module_::import("strata._errors").attr("_from_status");
        py::object exc = make(static_cast<int>(s.code()), s.message(), s.sys_errno());
        PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
      } catch (py::error_already_set& inner) {
        inner.restore();
      }
    }
  });
}

namespace {

// ---- helpers ----------------------------------------------------------------------------

/// The name of `v`'s type, for messages ("int", "float", "NoneType").
std::string type_name(const py::handle& v) {
  return py::str(py::type::handle_of(v).attr("__name__"));
}

/// `v` (a str) as UTF-8. Strings are exchanged with the store as UTF-8, so a str that has no
/// UTF-8 encoding (a lone surrogate such as "a\udc80", e.g. from os.fsdecode of a non-UTF-8
/// name) and anything that is not a str are InvalidArgument naming `what` (the argument:
/// "key", "prefix", "tier", ...), where pybind11 would raise a TypeError outside strata.Error.
std::string to_text(const py::handle& v, const char* what) {
  if (!PyUnicode_Check(v.ptr()))
    throw StatusError(invalid_argument(std::string(what) + " must be a str, got " +
                                       type_name(v) + " " + std::string(py::repr(v))));
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
  throw StatusError(invalid_argument(std::string(what) + " " + std::string(py::repr(v)) +
                                     " is not valid UTF-8 text: lone surrogate " + u +
                                     " at index " + std::to_string(at)));
}

/// A file system path (str or os.PathLike): encoded like os.fsencode (surrogateescape), so
/// any name the OS gave Python round-trips. Other types: InvalidArgument naming `what`.
std::string to_path(const py::handle& v, const char* what) {
  PyObject* b = nullptr;
  if (!PyUnicode_FSConverter(v.ptr(), &b)) {
    PyErr_Clear();
    throw StatusError(invalid_argument(std::string(what) + " must be a str or os.PathLike, got " +
                                       type_name(v) + " " + std::string(py::repr(v))));
  }
  py::bytes bytes = py::reinterpret_steal<py::bytes>(b);
  return std::string(bytes);
}

/// A byte offset, byte count or element count: a Python int (or any object with
/// __index__, e.g. numpy.int64) in [0, 2**64 - 1]. Anything else (negative, too large,
/// float, bool, None) is InvalidArgument naming `what`, where pybind11's uint64_t argument
/// would raise a TypeError outside strata.Error.
uint64_t to_u64(const py::handle& v, const char* what) {
  if (PyBool_Check(v.ptr()) || !PyIndex_Check(v.ptr()))
    throw StatusError(invalid_argument(std::string(what) + " must be an int, got " +
                                       type_name(v) + " " + std::string(py::repr(v))));
  py::object i = py::reinterpret_steal<py::object>(PyNumber_Index(v.ptr()));
  if (!i) throw py::error_already_set();
  if (PyObject_RichCompareBool(i.ptr(), py::int_(0).ptr(), Py_LT) == 1)
    throw StatusError(invalid_argument(std::string(what) + " must be >= 0, got " +
                                       std::string(py::str(i))));
  const unsigned long long x = PyLong_AsUnsignedLongLong(i.ptr());
  if (PyErr_Occurred()) {
    PyErr_Clear();
    throw StatusError(invalid_argument(std::string(what) + " = " + std::string(py::str(i)) +
                                       " does not fit in 64 bits (max 2**64-1)"));
  }
  return static_cast<uint64_t>(x);
}

/// An optional dtype-override argument (None or a str).
std::optional<std::string> to_dtype_arg(const py::handle& v) {
  if (v.is_none()) return std::nullopt;
  return to_text(v, "dtype");
}

uint64_t to_size(const py::handle& v, const char* what) {
  if (py::isinstance<py::str>(v)) {
    auto r = parse_size(to_text(v, what));
    if (!r.ok()) throw StatusError(r.status().with_context(what));
    return *r;
  }
  if (py::isinstance<py::int_>(v) && !py::isinstance<py::bool_>(v)) {
    // Python ints are unbounded: check the range here (pybind's cast would raise a
    // RuntimeError "Unable to cast" outside strata's exception family).
    if (PyObject_RichCompareBool(v.ptr(), py::int_(0).ptr(), Py_LT) == 1)
      throw StatusError(invalid_argument(std::string(what) + " must be >= 0, got " +
                                         std::string(py::str(v))));
    const unsigned long long x = PyLong_AsUnsignedLongLong(v.ptr());
    if (PyErr_Occurred()) {
      PyErr_Clear();
      throw StatusError(invalid_argument(std::string(what) + " = " + std::string(py::str(v)) +
                                         " does not fit in 64 bits (max 2**64-1 bytes)"));
    }
    return static_cast<uint64_t>(x);
  }
  throw StatusError(invalid_argument(std::string(what) + " must be an int or a size string "
                                     "like \"1GiB\""));
}

Tier to_tier(const py::handle& v) {
  const std::string name = to_text(v, "tier");
  auto t = tier_from_name(name);
  if (!t) throw StatusError(invalid_argument("unknown tier '" + name +
                                             "' (expected 'device', 'host' or 'nvme')"));
  return *t;
}

/// The numpy module. Imported on each call (a sys.modules lookup once numpy is loaded):
/// a function-local `static py::object` would be destroyed by the C++ exit handlers after
/// the interpreter has finalized, which crashes at exit (Py_DECREF on a dead interpreter).
py::object numpy() { return py::module_::import("numpy"); }

/// A block of host memory aligned to 4096 bytes (so the store can read into it with
/// O_DIRECT without a bounce copy), exported through the buffer protocol. numpy arrays made
/// with numpy.frombuffer() keep it alive.
class AlignedBuffer {
 public:
  explicit AlignedBuffer(uint64_t nbytes) : nbytes_(nbytes) {
    const uint64_t alloc = align_up(nbytes == 0 ? 1 : nbytes, 4096);
    if (posix_memalign(&data_, 4096, alloc) != 0 || data_ == nullptr)
      throw StatusError(resource_exhausted("cannot allocate " + format_bytes(alloc) +
                                           " for an array"));
  }
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  void* data() const { return data_; }
  uint64_t nbytes() const { return nbytes_; }

 private:
  void* data_ = nullptr;
  uint64_t nbytes_ = 0;
};

/// A new numpy array of `desc` backed by an AlignedBuffer; *data receives its address.
py::object new_aligned_array(const TensorDesc& desc, void** data) {
  auto buf = std::make_unique<AlignedBuffer>(desc.nbytes());
  *data = buf->data();
  py::object owner = py::cast(std::move(buf));
  py::tuple shape(desc.shape.size());
  for (size_t i = 0; i < desc.shape.size(); ++i) shape[i] = py::int_(desc.shape[i]);
  py::object arr = numpy().attr("frombuffer")(owner, "dtype"_a = numpy_dtype_name(desc.dtype));
  return arr.attr("reshape")(shape);
}

// ---- futures ----------------------------------------------------------------------------

/// A Python future over a strata Future<T>. `keep` holds the buffers the operation uses;
/// the destructor waits for the operation (GIL released) before releasing them.
class PyFuture {
 public:
  struct Impl {
    virtual ~Impl() = default;
    virtual bool ready() const = 0;
    virtual void wait() const = 0;
    virtual bool wait_for(std::chrono::microseconds d) const = 0;
    virtual Status status() const = 0;
    virtual py::object value() const = 0;  // with the GIL, after an OK status
  };

  PyFuture(std::unique_ptr<Impl> impl, py::object value, std::vector<TensorRef> keep)
      : impl_(std::move(impl)), value_(std::move(value)), keep_(std::move(keep)) {}
  PyFuture(PyFuture&&) noexcept = default;
  PyFuture& operator=(PyFuture&&) = delete;
  PyFuture(const PyFuture&) = delete;

  ~PyFuture() {
    if (impl_ && !impl_->ready()) {
      py::gil_scoped_release nogil;
      impl_->wait();
    }
  }

  bool done() const { return impl_->ready(); }

  /// Waits for the operation (GIL released) and returns its value. `timeout`: None, inf or
  /// any value of at least kForeverSeconds waits without limit; otherwise seconds >= 0
  /// (0 polls). NaN or negative: InvalidArgument (ValueError). Not ready in time:
  /// DeadlineExceeded (TimeoutError); the operation keeps running.
  py::object result(std::optional<double> timeout) {
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

  py::object exception() {
    {
      py::gil_scoped_release nogil;
      impl_->wait();
    }
    Status s = impl_->status();
    if (s.ok()) return py::none();
    try {
      throw StatusError(s);
    } catch (...) {
      // Translate to the Python exception object without raising it.
      try {
        py::object make = py::module_::import("strata._errors").attr("_from_status");
        return make(static_cast<int>(s.code()), s.message(), s.sys_errno());
      } catch (py::error_already_set&) {
        throw;
      }
    }
  }

 private:
  std::unique_ptr<Impl> impl_;
  py::object value_;
  std::vector<TensorRef> keep_;
};

struct VoidFutureImpl : PyFuture::Impl {
  explicit VoidFutureImpl(Future<void> f) : f(std::move(f)) {}
  bool ready() const override { return f.ready(); }
  void wait() const override { f.wait(); }
  bool wait_for(std::chrono::microseconds d) const override { return f.wait_for(d); }
  Status status() const override { return f.result().status(); }
  py::object value() const override { return py::none(); }
  Future<void> f;
};

py::dict stats_dict(const optimizer::StepStats& s) {
  py::dict d;
  d["skipped"] = s.skipped;
  d["grad_norm"] = s.grad_norm;
  d["clip_coef"] = s.clip_coef;
  d["tensors_updated"] = s.tensors_updated;
  d["numel_updated"] = s.numel_updated;
  d["bytes_read"] = s.bytes_read;
  d["bytes_written"] = s.bytes_written;
  d["seconds"] = s.seconds;
  d["compute_seconds"] = s.compute_seconds;
  d["io_wait_seconds"] = s.io_wait_seconds;
  return d;
}

struct StepFutureImpl : PyFuture::Impl {
  explicit StepFutureImpl(Future<optimizer::StepStats> f) : f(std::move(f)) {}
  bool ready() const override { return f.ready(); }
  void wait() const override { f.wait(); }
  bool wait_for(std::chrono::microseconds d) const override { return f.wait_for(d); }
  Status status() const override { return f.result().status(); }
  py::object value() const override { return stats_dict(*f.result()); }
  Future<optimizer::StepStats> f;
};

PyFuture make_future(Future<void> f, py::object value = py::none(),
                     std::vector<TensorRef> keep = {}) {
  return PyFuture(std::make_unique<VoidFutureImpl>(std::move(f)), std::move(value),
                  std::move(keep));
}

// ---- store ------------------------------------------------------------------------------

/// A store key or message as a Python str: UTF-8, with bytes that are not valid UTF-8 kept as
/// lone surrogates ("surrogateescape", as os.fsdecode does for file names) instead of raising
/// UnicodeDecodeError. Keys a Python program put are always valid UTF-8; others come from
/// catalogs written elsewhere (or damaged).
py::str text_of(const std::string& s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "surrogateescape");
  if (!o) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(o);
}

py::dict info_dict(const ObjectInfo& i) {
  py::dict d;
  d["key"] = text_of(i.key);
  d["dtype"] = std::string(dtype_name(i.dtype));
  py::tuple shape(i.shape.size());
  for (size_t k = 0; k < i.shape.size(); ++k) shape[k] = py::int_(i.shape[k]);
  d["shape"] = shape;
  d["nbytes"] = i.nbytes;
  d["tier"] = std::string(tier_name(i.tier));
  d["on_nvme"] = i.on_nvme;
  d["dirty"] = i.dirty;
  d["pinned"] = i.pinned;
  d["num_chunks"] = i.num_chunks;
  d["damage"] = text_of(i.damage);
  return d;
}

/// One Store.get / get_async: Store::get_alloc fixes the version to read, then calls back
/// for a buffer of that version's dtype and shape, so the array holds one version whole
/// (old or new) even when another thread overwrites the key with another dtype or shape
/// meanwhile. `store` is borrowed: the caller keeps the Store alive until `done` is ready
/// (PyStore::get holds a shared_ptr while it waits; GetFutureImpl holds one and the
/// PyFuture's destructor waits).
struct GetOp {
  std::string key;
  TensorDesc desc;
  std::unique_ptr<AlignedBuffer> buf;
  Future<void> done;

  /// `raise_early`: a missing or damaged object raises here, before any read
  /// (get_async("nope") raises NotFound like get); the read itself does not depend on it.
  static std::shared_ptr<GetOp> start(const std::shared_ptr<Store>& store, std::string key,
                                      bool raise_early) {
    auto op = std::make_shared<GetOp>();
    op->key = std::move(key);
    py::gil_scoped_release nogil;
    if (raise_early) {
      auto info = store->stat(op->key);
      if (!info.ok()) check(info.status());
      if (!info->damage.empty())
        check(data_loss("store " + store->options().path + ": " + info->damage));
    }
    GetOp* raw = op.get();  // the op outlives `done` (held by the caller)
    op->done = store->get_alloc(op->key, [raw](const TensorDesc& d) -> Result<void*> {
      raw->desc = d;
      try {
        raw->buf = std::make_unique<AlignedBuffer>(d.nbytes());
      } catch (const StatusError& e) {
        return e.status();  // ResourceExhausted: the memory cannot be allocated
      }
      return static_cast<void*>(raw->buf->data());
    });
    return op;
  }

  /// Moves the buffer into a numpy array (call once, with the GIL, after `done` is OK).
  /// GetOp holds no Python object: its last reference may go on a store worker thread.
  py::object array() {
    py::object owner = py::cast(std::move(buf));
    py::tuple shape(desc.shape.size());
    for (size_t i = 0; i < desc.shape.size(); ++i) shape[i] = py::int_(desc.shape[i]);
    return numpy()
        .attr("frombuffer")(owner, "dtype"_a = numpy_dtype_name(desc.dtype))
        .attr("reshape")(shape);
  }
};

/// The Python future of a get_async: its value is the GetOp's array.
struct GetFutureImpl : PyFuture::Impl {
  GetFutureImpl(std::shared_ptr<GetOp> op, std::shared_ptr<Store> store)
      : op(std::move(op)), store(std::move(store)), f(this->op->done) {}
  bool ready() const override { return f.ready(); }
  void wait() const override { f.wait(); }
  bool wait_for(std::chrono::microseconds d) const override { return f.wait_for(d); }
  Status status() const override { return f.result().status(); }
  py::object value() const override {  // with the GIL (PyFuture::result)
    if (!arr) arr = op->array();
    return arr;
  }
  std::shared_ptr<GetOp> op;
  mutable py::object arr;
  std::shared_ptr<Store> store;  // keeps the store alive while the op may still use it
  Future<void> f;
};

/// Upper bound of Store.open(workers=...) (StoreOptions::worker_threads, the threads that
/// run store operations): far more than the I/O can use, and far below the ~100k threads
/// at which thread creation fails with EAGAIN.
constexpr int kMaxWorkers = 1024;

class PyStore {
 public:
  explicit PyStore(std::shared_ptr<Store> s) : store_(std::move(s)) {}
  ~PyStore() {
    if (store_) {
      py::gil_scoped_release nogil;
      (void)store_->close();
    }
  }

  static std::unique_ptr<PyStore> open(py::handle path_arg, py::handle nvme,
                                       py::object host_budget, py::object nvme_budget,
                                       py::object device_budget, py::object chunk_size,
                                       py::object staging, std::optional<bool> verify,
                                       const std::string& durability, bool read_only,
                                       bool create, std::optional<int> workers,
                                       std::optional<int> numa_node,
                                       std::optional<int> device_id) {
    const std::string path = to_path(path_arg, "path");
    StoreOptions o = check(StoreOptions::from_env());
    o.path = path;
    if (!py::isinstance<py::list>(nvme) && !py::isinstance<py::tuple>(nvme))
      throw StatusError(invalid_argument("nvme must be a list of directories, got " +
                                         type_name(nvme)));
    for (auto d : nvme) o.nvme_dirs.push_back(to_path(d, "nvme directory"));
    if (!host_budget.is_none()) o.host_budget_bytes = to_size(host_budget, "host_budget");
    if (!nvme_budget.is_none()) o.nvme_budget_bytes = to_size(nvme_budget, "nvme_budget");
    if (!device_budget.is_none()) o.device_budget_bytes = to_size(device_budget, "device_budget");
    if (!chunk_size.is_none()) o.chunk_bytes = to_size(chunk_size, "chunk_size");
    if (!staging.is_none()) o.staging_bytes = to_size(staging, "staging");
    if (verify) o.verify_checksums = *verify;
    if (durability == "put") {
      o.durability = Durability::kOnPut;
    } else if (durability == "flush") {
      o.durability = Durability::kOnFlush;
    } else {
      throw StatusError(invalid_argument("durability must be 'put' or 'flush', got '" +
                                         durability + "'"));
    }
    o.read_only = read_only;
    o.create = create;
    if (workers) {
      if (*workers < 1 || *workers > kMaxWorkers)
        throw StatusError(invalid_argument("workers must be in [1, " +
                                           std::to_string(kMaxWorkers) + "], got " +
                                           std::to_string(*workers)));
      o.worker_threads = static_cast<uint32_t>(*workers);
    }
    if (numa_node) o.numa_node = *numa_node;
    if (device_id) o.device_id = *device_id;
    Result<std::unique_ptr<Store>> r = invalid_argument("unreached");
    {
      py::gil_scoped_release nogil;
      try {
        r = Store::open(std::move(o));
      } catch (const std::system_error& e) {  // e.g. thread creation failed (EAGAIN)
        r = errno_status(e.code().value(), std::string("opening store '") + path +
                                               "': " + e.what() + " (lower workers?)");
      }
    }
    return std::make_unique<PyStore>(std::shared_ptr<Store>(std::move(check(std::move(r)))));
  }

  /// The store; a closed one stays allocated (its calls fail with FailedPrecondition), so
  /// that a call another thread is making while this one closes never sees it freed.
  Store& s() {
    if (closed_) throw StatusError(failed_precondition("the store is closed"));
    return *store_;
  }
  bool closed() const { return closed_; }
  const std::shared_ptr<Store>& shared() {
    s();
    return store_;
  }

  void close() {
    if (closed_) return;
    Status st;
    {
      py::gil_scoped_release nogil;
      st = store_->close();
    }
    // A failed write-back leaves the store open (Store::close): keep it usable, so that the
    // caller can make room and close again. A closed store is not freed here (see s()).
    if (st.ok()) closed_ = true;
    check(st);
  }

  PyFuture put_async(py::handle key_arg, py::handle array, py::handle tier, bool overwrite,
                     bool pin, py::handle dtype) {
    const std::string key = to_text(key_arg, "key");
    TensorRef r = view_tensor(array, false, to_dtype_arg(dtype));
    PutOptions po;
    po.tier = to_tier(tier);
    po.overwrite = overwrite;
    po.pin = pin;
    Future<void> f;
    {
      py::gil_scoped_release nogil;
      f = s().put(key, r.data, TensorDesc{r.dtype, r.shape}, po);
    }
    std::vector<TensorRef> keep;
    keep.push_back(std::move(r));
    return make_future(std::move(f), py::none(), std::move(keep));
  }

  void put(py::handle key_arg, py::handle array, py::handle tier, bool overwrite, bool pin,
           py::handle dtype) {
    const std::string key = to_text(key_arg, "key");
    TensorRef r = view_tensor(array, false, to_dtype_arg(dtype));
    PutOptions po;
    po.tier = to_tier(tier);
    po.overwrite = overwrite;
    po.pin = pin;
    Status st;
    {
      py::gil_scoped_release nogil;
      st = s().put_sync(key, r.data, TensorDesc{r.dtype, r.shape}, po);
    }
    check(st);
  }

  /// Reads object `key` into a new aligned numpy array of its dtype and shape (GIL
  /// released while waiting). Atomic with respect to concurrent overwrites: the array holds
  /// one version whole (see GetOp).
  py::object get(py::handle key_arg) {
    auto op = GetOp::start(shared(), to_text(key_arg, "key"), false);  // errors: from the read
    Status st;
    {
      py::gil_scoped_release nogil;
      st = op->done.result().status();
    }
    check(st);
    return op->array();
  }

  /// As get(); the future's result is the array.
  PyFuture get_async(py::handle key_arg) {
    auto store = shared();
    auto op = GetOp::start(store, to_text(key_arg, "key"), true);
    return PyFuture(std::make_unique<GetFutureImpl>(op, store), py::none(), {});
  }

  /// Reads `key` into `out` with no copy. `out` must have the object's dtype and shape
  /// (the Python layer converts other dtypes).
  PyFuture get_into_async(py::handle key_arg, py::handle out, py::handle dtype) {
    const std::string key = to_text(key_arg, "key");
    TensorRef r = view_tensor(out, true, to_dtype_arg(dtype));
    Future<void> f;
    {
      py::gil_scoped_release nogil;
      f = s().get(key, r.data, TensorDesc{r.dtype, r.shape});
    }
    std::vector<TensorRef> keep;
    keep.push_back(std::move(r));
    return make_future(std::move(f), py::reinterpret_borrow<py::object>(out), std::move(keep));
  }

  void get_into(py::handle key_arg, py::handle out, py::handle dtype) {
    const std::string key = to_text(key_arg, "key");
    TensorRef r = view_tensor(out, true, to_dtype_arg(dtype));
    Status st;
    {
      py::gil_scoped_release nogil;
      st = s().get_sync(key, r.data, TensorDesc{r.dtype, r.shape});
    }
    check(st);
  }

  py::object read_range(py::handle key_arg, py::handle offset_arg, py::handle nbytes_arg) {
    const std::string key = to_text(key_arg, "key");
    const uint64_t offset = to_u64(offset_arg, "offset");
    const uint64_t nbytes = to_u64(nbytes_arg, "nbytes");
    void* data = nullptr;
    py::object arr;
    try {
      arr = new_aligned_array(TensorDesc::bytes(nbytes), &data);
    } catch (const StatusError& e) {
      // No memory for `nbytes`: a range past the end is still OutOfRange (or the key
      // NotFound). The store checks those before it touches the destination (none here).
      Status st;
      {
        py::gil_scoped_release nogil;
        st = s().read_range_sync(key, offset, nbytes, nullptr);
      }
      if (st.code() == StatusCode::kOutOfRange || st.code() == StatusCode::kNotFound) check(st);
      throw;
    }
    Status st;
    {
      py::gil_scoped_release nogil;
      st = s().read_range_sync(key, offset, nbytes, data);
    }
    check(st);
    return arr;
  }

  void write_range(py::handle key_arg, py::handle offset_arg, py::handle src) {
    const std::string key = to_text(key_arg, "key");
    const uint64_t offset = to_u64(offset_arg, "offset");
    TensorRef r = view_tensor(src, false, std::nullopt);
    Status st;
    {
      py::gil_scoped_release nogil;
      st = s().write_range_sync(key, offset, r.nbytes, r.data);
    }
    check(st);
  }

  template <class F>
  void blocking(F&& f) {
    Status st;
    {
      py::gil_scoped_release nogil;
      st = f(s());
    }
    check(st);
  }

  py::dict stat(py::handle key) { return info_dict(check(s().stat(to_text(key, "key")))); }

  py::list list(py::handle prefix_arg) {
    const std::string prefix = to_text(prefix_arg, "prefix");
    std::vector<ObjectInfo> v;
    {
      py::gil_scoped_release nogil;
      v = s().list(prefix);
    }
    py::list out;
    for (auto& i : v) out.append(info_dict(i));
    return out;
  }

  py::list keys(py::handle prefix_arg) {
    const std::string prefix = to_text(prefix_arg, "prefix");
    std::vector<ObjectInfo> v;
    {
      py::gil_scoped_release nogil;
      v = s().list(prefix);
    }
    py::list out;
    for (auto& i : v) out.append(text_of(i.key));
    return out;
  }

  py::dict usage() {
    StoreUsage u = s().usage();
    py::dict d;
    d["device_bytes"] = u.device_bytes;
    d["device_budget_bytes"] = u.device_budget_bytes;
    d["host_bytes"] = u.host_bytes;
    d["host_budget_bytes"] = u.host_budget_bytes;
    d["nvme_bytes"] = u.nvme_bytes;
    d["nvme_budget_bytes"] = u.nvme_budget_bytes;
    d["objects"] = u.objects;
    return d;
  }

 private:
  std::shared_ptr<Store> store_;  // never null; freed with the PyStore
  bool closed_ = false;           // read and written with the GIL
};

// ---- optimizer --------------------------------------------------------------------------

optimizer::Hyperparams to_hyperparams(const py::dict& d) {
  optimizer::Hyperparams hp;
  for (auto kv : d) {
    const std::string k = py::str(kv.first);
    if (py::isinstance<py::bool_>(kv.second)) {
      hp[k] = kv.second.cast<bool>() ? 1.0 : 0.0;
    } else {
      // Anything float() accepts without parsing text: int, float, numpy scalars, 0-d
      // tensors. Strings and ints beyond double range are InvalidArgument (ValueError).
      const bool text = py::isinstance<py::str>(kv.second) || py::isinstance<py::bytes>(kv.second);
      const double x = text ? -1.0 : PyFloat_AsDouble(kv.second.ptr());
      if (text || (x == -1.0 && PyErr_Occurred())) {
        PyErr_Clear();
        throw StatusError(invalid_argument(
            "hyperparameter '" + k + "' must be a number (int, float or bool), got " +
            std::string(py::str(kv.second.get_type().attr("__name__"))) + " " +
            std::string(py::repr(kv.second))));
      }
      hp[k] = x;
    }
  }
  return hp;
}

py::dict from_hyperparams(const optimizer::Hyperparams& hp) {
  py::dict d;
  for (const auto& [k, v] : hp) d[py::str(k)] = v;
  return d;
}

optimizer::Placement to_placement(const std::string& s) {
  if (s == "auto") return optimizer::Placement::kAuto;
  if (s == "host") return optimizer::Placement::kHost;
  if (s == "nvme") return optimizer::Placement::kNvme;
  throw StatusError(invalid_argument("placement must be 'auto', 'host' or 'nvme', got '" + s +
                                     "'"));
}

class PyOptimizer {
 public:
  static std::unique_ptr<PyOptimizer> make(PyStore& store, const std::string& optimizer_name,
                                           const py::dict& hyperparams, bool resume,
                                           const std::string& key_prefix,
                                           uint64_t sub_group_numel, int num_buffers,
                                           py::object pinned_budget, py::object host_budget,
                                           const std::string& default_placement,
                                           int num_threads, bool verify_on_open,
                                           const std::string& arithmetic) {
    optimizer::OffloadOptions o;
    o.key_prefix = key_prefix;
    o.sub_group_numel = sub_group_numel;
    o.num_buffers = num_buffers;
    if (!pinned_budget.is_none()) o.pinned_budget_bytes = to_size(pinned_budget, "pinned_budget");
    if (!host_budget.is_none()) o.host_budget_bytes = to_size(host_budget, "host_budget");
    o.default_placement = to_placement(default_placement);
    o.num_threads = num_threads;
    o.verify_on_open = verify_on_open;
    if (arithmetic != "simd" && arithmetic != "torch")
      throw StatusError(invalid_argument("arithmetic must be 'simd' or 'torch', got '" +
                                         arithmetic + "'"));
    auto factory = check(arithmetic == "torch" ? torch_exact_rule_factory(optimizer_name)
                                               : optimizer::builtin_rule_factory(optimizer_name));
    auto hp = to_hyperparams(hyperparams);
    auto shared = store.shared();
    Result<std::unique_ptr<optimizer::OffloadedOptimizer>> r = invalid_argument("unreached");
    {
      py::gil_scoped_release nogil;
      r = resume ? optimizer::OffloadedOptimizer::open(shared, factory, o)
                 : optimizer::OffloadedOptimizer::create(shared, factory, hp, o);
    }
    auto p = std::make_unique<PyOptimizer>();
    p->opt_ = check(std::move(r));
    return p;
  }

  ~PyOptimizer() {
    if (opt_) {
      py::gil_scoped_release nogil;
      opt_.reset();  // waits for an in-flight step
    }
  }

  optimizer::OffloadedOptimizer& o() {
    if (!opt_) throw StatusError(failed_precondition("the optimizer is closed"));
    return *opt_;
  }

  void close() {
    py::gil_scoped_release nogil;
    opt_.reset();
  }

  uint32_t add_param(const std::string& name, uint64_t numel, py::object init, int group,
                     const std::string& placement) {
    // The fp32 master and each state stream take numel * 4 bytes; byte sizes and file
    // offsets are int64 (off_t) in the store, so numel * 4 must stay <= 2^63 - 1.
    constexpr uint64_t kMaxNumel = static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) /
                                   sizeof(float);
    if (numel > kMaxNumel)
      throw StatusError(invalid_argument(
          "parameter '" + name + "' has numel " + std::to_string(numel) +
          ": its fp32 master would take numel * 4 bytes, more than the 2^63 - 1 byte limit "
          "(numel <= " + std::to_string(kMaxNumel) + ")"));
    std::optional<TensorRef> r;
    if (!init.is_none()) {
      r = view_tensor(init, false, std::nullopt);
      if (r->device) throw StatusError(invalid_argument("init must be in host memory"));
      if (r->dtype != DType::kFloat32 || r->numel != numel)
        throw StatusError(invalid_argument("init of '" + name + "' must hold " +
                                           std::to_string(numel) + " float32 values, got " +
                                           std::to_string(r->numel) + " " +
                                           std::string(dtype_name(r->dtype))));
    }
    const float* p = r ? static_cast<const float*>(r->data) : nullptr;
    const auto pl = to_placement(placement);
    Result<uint32_t> h = invalid_argument("unreached");
    {
      py::gil_scoped_release nogil;
      h = o().add_param(name, numel, p, group, pl);
    }
    return check(std::move(h));
  }

  /// Attaches `grad` (fp32/fp16/bf16 host array of numel elements) or detaches (None).
  /// The array is kept referenced until replaced.
  void set_grad(uint32_t h, py::object grad) {
    if (grad.is_none()) {
      check(o().set_grad(h, nullptr, DType::kFloat32));
      grads_.erase(h);
      return;
    }
    TensorRef r = view_tensor(grad, false, std::nullopt);
    auto info = check(o().param_info(h));
    if (r.device) throw StatusError(invalid_argument("gradient of '" + info.name +
                                                     "' must be in host memory"));
    if (r.numel != info.numel)
      throw StatusError(invalid_argument("gradient of '" + info.name + "' has " +
                                         std::to_string(r.numel) + " elements, expected " +
                                         std::to_string(info.numel)));
    check(o().set_grad(h, r.data, r.dtype));
    grads_[h] = std::move(r);
  }

  void set_param_copy(uint32_t h, py::object dst) {
    if (dst.is_none()) {
      check(o().set_param_copy(h, nullptr, DType::kBFloat16));
      copies_.erase(h);
      return;
    }
    TensorRef r = view_tensor(dst, true, std::nullopt);
    auto info = check(o().param_info(h));
    if (r.device) throw StatusError(invalid_argument("parameter copy of '" + info.name +
                                                     "' must be in host memory"));
    if (r.numel != info.numel)
      throw StatusError(invalid_argument("parameter copy of '" + info.name + "' has " +
                                         std::to_string(r.numel) + " elements, expected " +
                                         std::to_string(info.numel)));
    check(o().set_param_copy(h, r.data, r.dtype));
    copies_[h] = std::move(r);
  }

  void clear_grads() {
    o().clear_grads();
    grads_.clear();
  }

  py::dict step(double max_grad_norm, float grad_scale, bool skip_if_nonfinite) {
    optimizer::StepOptions so;
    so.max_grad_norm = max_grad_norm;
    so.grad_scale = grad_scale;
    so.skip_if_nonfinite = skip_if_nonfinite;
    Result<optimizer::StepStats> r = invalid_argument("unreached");
    {
      py::gil_scoped_release nogil;
      r = o().step(so);
    }
    return stats_dict(check(std::move(r)));
  }

  PyFuture step_async(double max_grad_norm, float grad_scale, bool skip_if_nonfinite) {
    optimizer::StepOptions so;
    so.max_grad_norm = max_grad_norm;
    so.grad_scale = grad_scale;
    so.skip_if_nonfinite = skip_if_nonfinite;
    Future<optimizer::StepStats> f;
    {
      py::gil_scoped_release nogil;
      f = o().step_async(so);
    }
    // The attached gradient/copy buffers are referenced by grads_/copies_ (this object);
    // the future's destructor waits for the step.
    return PyFuture(std::make_unique<StepFutureImpl>(std::move(f)), py::none(), {});
  }

  uint64_t numel_of(uint32_t h) { return check(o().param_info(h)).numel; }

  /// Reads (stream < 0: the master) into `out` (fp32, count elements) or a new array.
  py::object read(uint32_t h, int stream, py::object out, uint64_t offset, uint64_t count) {
    const uint64_t numel = numel_of(h);
    if (count == optimizer::kToEnd) count = offset <= numel ? numel - offset : 0;
    if (out.is_none()) out = numpy().attr("empty")(py::int_(count), "dtype"_a = "float32");
    TensorRef r = view_tensor(out, true, std::nullopt);
    if (r.device || r.dtype != DType::kFloat32 || r.numel != count)
      throw StatusError(invalid_argument("out must be a host float32 array of " +
                                         std::to_string(count) + " elements"));
    Status st;
    {
      py::gil_scoped_release nogil;
      st = stream < 0 ? o().read_param(h, static_cast<float*>(r.data), offset, count)
                      : o().read_state(h, stream, static_cast<float*>(r.data), offset, count);
    }
    check(st);
    return out;
  }

  void write(uint32_t h, int stream, py::handle src, uint64_t offset) {
    TensorRef r = view_tensor(src, false, std::nullopt);
    if (r.device || r.dtype != DType::kFloat32)
      throw StatusError(invalid_argument("src must be a host float32 array"));
    Status st;
    {
      py::gil_scoped_release nogil;
      st = stream < 0 ? o().write_param(h, static_cast<const float*>(r.data), offset, r.numel)
                      : o().write_state(h, stream, static_cast<const float*>(r.data), offset,
                                        r.numel);
    }
    check(st);
  }

  void checkpoint() {
    Status st;
    {
      py::gil_scoped_release nogil;
      st = o().checkpoint();
    }
    check(st);
  }

  py::dict param_info(uint32_t h) {
    auto i = check(o().param_info(h));
    py::dict d;
    d["name"] = i.name;
    d["numel"] = i.numel;
    d["placement"] = std::string(optimizer::placement_name(i.placement));
    d["group"] = i.group;
    d["step"] = i.step;
    d["has_grad"] = i.has_grad;
    return d;
  }

  std::unique_ptr<optimizer::OffloadedOptimizer> opt_;
  std::map<uint32_t, TensorRef> grads_;
  std::map<uint32_t, TensorRef> copies_;
};

}  // namespace
}  // namespace strata::py_bindings

using namespace strata;
using namespace strata::py_bindings;

PYBIND11_MODULE(_strata, m) {
  m.doc() = "strata's C++ core (see the `strata` package for the documented API)";
  register_errors(m);

  m.def("parse_size", [](const std::string& s) { return check(parse_size(s)); }, "text"_a,
        "Bytes in a size string such as '1GiB' or '64M' (powers of 1024). ValueError if "
        "malformed.");
  m.def("format_bytes", &format_bytes, "nbytes"_a);
#ifdef STRATA_HAVE_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif

  py::class_<AlignedBuffer>(m, "_AlignedBuffer", py::buffer_protocol())
      .def_buffer([](AlignedBuffer& b) {
        return py::buffer_info(b.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.nbytes())}, {py::ssize_t{1}});
      });

  py::class_<PyFuture>(m, "Future",
                       "Result of an asynchronous strata call. result(timeout=None) waits "
                       "(GIL released) and returns the value or raises the strata error; "
                       "TimeoutError when `timeout` seconds pass first (the operation keeps "
                       "running); timeout None, inf or >= 1e9 waits without limit, NaN or "
                       "negative is a ValueError. Buffers passed to the call stay referenced until done; "
                       "dropping the future waits for the operation.")
      .def("result", &PyFuture::result, "timeout"_a = py::none())
      .def("done", &PyFuture::done)
      .def("exception", &PyFuture::exception);

  py::class_<PyStore>(m, "_Store")
      .def_static("open", &PyStore::open, "path"_a, "nvme"_a = py::list(),
                  "host_budget"_a = py::none(), "nvme_budget"_a = py::none(),
                  "device_budget"_a = py::none(), "chunk_size"_a = py::none(),
                  "staging"_a = py::none(), "verify"_a = py::none(), "durability"_a = "put",
                  "read_only"_a = false, "create"_a = true, "workers"_a = py::none(),
                  "numa_node"_a = py::none(), "device_id"_a = py::none())
      .def("close", &PyStore::close)
      .def_property_readonly("closed", &PyStore::closed)
      .def("put", &PyStore::put, "key"_a, "array"_a, "tier"_a = "nvme", "overwrite"_a = false,
           "pin"_a = false, "dtype"_a = py::none())
      .def("put_async", &PyStore::put_async, "key"_a, "array"_a, "tier"_a = "nvme",
           "overwrite"_a = false, "pin"_a = false, "dtype"_a = py::none())
      .def("get", &PyStore::get, "key"_a)
      .def("get_async", &PyStore::get_async, "key"_a)
      .def("get_into", &PyStore::get_into, "key"_a, "out"_a, "dtype"_a = py::none())
      .def("get_into_async", &PyStore::get_into_async, "key"_a, "out"_a, "dtype"_a = py::none())
      .def("read_range", &PyStore::read_range, "key"_a, "offset"_a, "nbytes"_a)
      .def("write_range", &PyStore::write_range, "key"_a, "offset"_a, "src"_a)
      .def("stat", &PyStore::stat, "key"_a)
      .def("list", &PyStore::list, "prefix"_a = "")
      .def("keys", &PyStore::keys, "prefix"_a = "")
      .def("contains", [](PyStore& s, py::handle k) { return s.s().contains(to_text(k, "key")); })
      .def("usage", &PyStore::usage)
      .def("chunk_bytes", [](PyStore& s) { return s.s().chunk_bytes(); })
      .def("has_device", [](PyStore& s) { return s.s().has_device(); })
      .def("delete", [](PyStore& s, py::handle k) {
        const std::string key = to_text(k, "key");
        s.blocking([&](Store& st) { return st.remove_sync(key); });
      }, "key"_a)
      .def("delete_async", [](PyStore& s, py::handle k) {
        const std::string key = to_text(k, "key");
        Future<void> f;
        {
          py::gil_scoped_release nogil;
          f = s.s().remove(key);
        }
        return make_future(std::move(f));
      }, "key"_a)
      .def("move", [](PyStore& s, py::handle k, py::handle t) {
        const std::string key = to_text(k, "key");
        Tier tier = to_tier(t);
        s.blocking([&](Store& st) { return st.move_sync(key, tier); });
      }, "key"_a, "tier"_a)
      .def("move_async", [](PyStore& s, py::handle k, py::handle t) {
        const std::string key = to_text(k, "key");
        Tier tier = to_tier(t);
        Future<void> f;
        {
          py::gil_scoped_release nogil;
          f = s.s().move(key, tier);
        }
        return make_future(std::move(f));
      }, "key"_a, "tier"_a)
      .def("prefetch", [](PyStore& s, py::handle k, py::handle t) {
        const std::string key = to_text(k, "key");
        Tier tier = to_tier(t);
        s.blocking([&](Store& st) { return st.prefetch_sync(key, tier); });
      }, "key"_a, "tier"_a = "host")
      .def("prefetch_async", [](PyStore& s, py::handle k, py::handle t) {
        const std::string key = to_text(k, "key");
        Tier tier = to_tier(t);
        Future<void> f;
        {
          py::gil_scoped_release nogil;
          f = s.s().prefetch(key, tier);
        }
        return make_future(std::move(f));
      }, "key"_a, "tier"_a = "host")
      .def("evict", [](PyStore& s, py::handle k) {
        const std::string key = to_text(k, "key");
        s.blocking([&](Store& st) { return st.evict_sync(key); });
      }, "key"_a)
      .def("pin", [](PyStore& s, py::handle k) {
        const std::string key = to_text(k, "key");
        s.blocking([&](Store& st) { return st.pin_sync(key); });
      }, "key"_a)
      .def("unpin", [](PyStore& s, py::handle k) {
        const std::string key = to_text(k, "key");
        s.blocking([&](Store& st) { return st.unpin_sync(key); });
      }, "key"_a)
      .def("flush", [](PyStore& s) { s.blocking([&](Store& st) { return st.flush_sync(); }); })
      .def("flush_async", [](PyStore& s) {
        Future<void> f;
        {
          py::gil_scoped_release nogil;
          f = s.s().flush();
        }
        return make_future(std::move(f));
      });

  py::class_<PyOptimizer>(m, "_OffloadedOptimizer")
      .def_static("create", [](PyStore& store, const std::string& name, const py::dict& hp,
                               bool resume, py::handle key_prefix,
                               py::handle sub_group_numel, int num_buffers,
                               py::object pinned_budget, py::object host_budget,
                               const std::string& default_placement, int num_threads,
                               bool verify_on_open, const std::string& arithmetic) {
        return PyOptimizer::make(store, name, hp, resume, to_text(key_prefix, "key_prefix"),
                                 to_u64(sub_group_numel, "sub_group_numel"),
                                 num_buffers, pinned_budget, host_budget, default_placement,
                                 num_threads, verify_on_open, arithmetic);
      }, "store"_a, "optimizer"_a = "adamw", "hyperparams"_a = py::dict(), "resume"_a = false,
         "key_prefix"_a = "optim/", "sub_group_numel"_a = 0, "num_buffers"_a = 4,
         "pinned_budget"_a = py::none(), "host_budget"_a = py::none(),
         "default_placement"_a = "auto", "num_threads"_a = 0, "verify_on_open"_a = false,
         "arithmetic"_a = "simd")
      .def("close", &PyOptimizer::close)
      .def("add_param_group", [](PyOptimizer& o, const py::dict& hp) {
        return check(o.o().add_param_group(to_hyperparams(hp)));
      })
      .def("num_param_groups", [](PyOptimizer& o) { return o.o().num_param_groups(); })
      .def("hyperparams", [](PyOptimizer& o, int g) {
        return from_hyperparams(check(o.o().hyperparams(g)));
      })
      .def("set_hyperparams", [](PyOptimizer& o, int g, const py::dict& hp) {
        check(o.o().set_hyperparams(g, to_hyperparams(hp)));
      })
      .def("add_param", [](PyOptimizer& o, py::handle name, py::handle numel, py::object init,
                           int group, const std::string& placement) {
        return o.add_param(to_text(name, "name"), to_u64(numel, "numel"), std::move(init), group,
                           placement);
      }, "name"_a, "numel"_a, "init"_a = py::none(),
           "group"_a = 0, "placement"_a = "auto")
      .def("num_params", [](PyOptimizer& o) { return o.o().num_params(); })
      .def("param_info", &PyOptimizer::param_info)
      .def("find_param", [](PyOptimizer& o, const std::string& n) {
        return check(o.o().find_param(n));
      })
      .def("set_grad", &PyOptimizer::set_grad, "param"_a, "grad"_a)
      .def("set_param_copy", &PyOptimizer::set_param_copy, "param"_a, "dst"_a)
      .def("clear_grads", &PyOptimizer::clear_grads)
      .def("step", &PyOptimizer::step, "max_grad_norm"_a = 0.0, "grad_scale"_a = 1.0f,
           "skip_if_nonfinite"_a = true)
      .def("step_async", &PyOptimizer::step_async, "max_grad_norm"_a = 0.0,
           "grad_scale"_a = 1.0f, "skip_if_nonfinite"_a = true)
      .def("read_param", [](PyOptimizer& o, uint32_t h, py::object out, py::handle off,
                            py::handle count) {
        return o.read(h, -1, out, to_u64(off, "offset"), to_u64(count, "count"));
      },
           "param"_a, "out"_a = py::none(), "offset"_a = 0, "count"_a = optimizer::kToEnd)
      .def("write_param", [](PyOptimizer& o, uint32_t h, py::handle src, py::handle off) {
        o.write(h, -1, src, to_u64(off, "offset"));
      }, "param"_a, "src"_a, "offset"_a = 0)
      .def("read_state", [](PyOptimizer& o, uint32_t h, int stream, py::object out,
                            py::handle off, py::handle count) {
        if (stream < 0) throw StatusError(out_of_range("state stream must be >= 0"));
        return o.read(h, stream, out, to_u64(off, "offset"), to_u64(count, "count"));
      }, "param"_a, "stream"_a, "out"_a = py::none(), "offset"_a = 0,
         "count"_a = optimizer::kToEnd)
      .def("write_state", [](PyOptimizer& o, uint32_t h, int stream, py::handle src,
                             py::handle off) {
        if (stream < 0) throw StatusError(out_of_range("state stream must be >= 0"));
        o.write(h, stream, src, to_u64(off, "offset"));
      }, "param"_a, "stream"_a, "src"_a, "offset"_a = 0)
      .def("step_count", [](PyOptimizer& o, uint32_t h) { return check(o.o().step_count(h)); })
      .def("set_step_count", [](PyOptimizer& o, uint32_t h, int64_t s) {
        check(o.o().set_step_count(h, s));
      })
      .def("checkpoint", &PyOptimizer::checkpoint)
      .def("num_states", [](PyOptimizer& o) { return o.o().num_states(); })
      .def("state_name", [](PyOptimizer& o, int i) { return o.o().state_name(i); })
      .def("rule_name", [](PyOptimizer& o) { return o.o().rule_name(); })
      .def("sub_group_numel", [](PyOptimizer& o) { return o.o().sub_group_numel(); })
      .def("pinned_bytes", [](PyOptimizer& o) { return o.o().pinned_bytes(); })
      .def("host_bytes", [](PyOptimizer& o) { return o.o().host_bytes(); });

  m.def("builtin_default_hyperparams", [](const std::string& name) {
    return from_hyperparams(check(optimizer::builtin_default_hyperparams(name)));
  }, "optimizer"_a);
}
