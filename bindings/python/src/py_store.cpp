#include "py_store.hpp"

#include <functional>
#include <system_error>
#include <utility>
#include <vector>

namespace strata::py_bindings {

using namespace pybind11::literals;

namespace {

/// Upper bound of Store.open(workers=...) (StoreOptions::worker_threads, the threads that
/// run store operations): far more than the I/O can use, and far below the ~100k threads
/// at which thread creation fails with EAGAIN.
constexpr int kMaxWorkers = 1024;

py::dict info_dict(const ObjectInfo& i) {
  py::tuple shape(i.shape.size());
  for (size_t k = 0; k < i.shape.size(); ++k) shape[k] = py::int_(i.shape[k]);
  return py::dict(
      "key"_a = text_of(i.key), "dtype"_a = std::string(dtype_name(i.dtype)),
      "shape"_a = shape, "nbytes"_a = i.nbytes,
      "tier"_a = std::string(tier_name(i.tier)), "on_nvme"_a = i.on_nvme,
      "dirty"_a = i.dirty, "pinned"_a = i.pinned, "num_chunks"_a = i.num_chunks,
      "damage"_a = text_of(i.damage));
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
    op->done = store->get_alloc_async(op->key, [raw](const TensorDesc& d) -> Result<void*> {
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
  py::object array() { return array_of(std::move(buf), desc); }
};

/// The Python future of a get_async: its value is the GetOp's array.
struct GetFutureImpl : FutureImplOf<void> {
  GetFutureImpl(std::shared_ptr<GetOp> op, std::shared_ptr<Store> store)
      : FutureImplOf<void>(op->done), op(std::move(op)), store(std::move(store)) {}
  py::object value() const override {  // with the GIL (PyFuture::result)
    if (!arr) arr = op->array();
    return arr;
  }
  std::shared_ptr<GetOp> op;
  mutable py::object arr;
  std::shared_ptr<Store> store;  // keeps the store alive while the op may still use it
};

/// A view of an array and the store call that uses its memory (`call` refers to `ref`).
struct BufferCall {
  TensorRef ref;
  std::function<Future<void>(Store&)> call;
};

BufferCall put_call(py::handle key_arg, py::handle array, py::handle tier, bool overwrite,
                 bool pin, py::handle dtype) {
  std::string key = to_text(key_arg, "key");
  BufferCall p{view_tensor(array, false, to_dtype_arg(dtype)), {}};
  PutOptions po;
  po.tier = to_tier(tier);
  po.overwrite = overwrite;
  po.pin = pin;
  p.call = [key = std::move(key), data = p.ref.data, desc = TensorDesc{p.ref.dtype, p.ref.shape},
            po](Store& s) { return s.put_async(key, data, desc, po); };
  return p;
}

/// put_repeated: object `key` of `numel` elements of `block`'s dtype (1-d) whose bytes
/// repeat `block`'s (PutOptions::repeat_bytes), NVMe tier.
void put_repeated(PyStore& st, py::handle key_arg, py::handle block, py::handle numel_arg,
                  bool overwrite, py::handle dtype) {
  std::string key = to_text(key_arg, "key");
  const uint64_t numel = to_u64(numel_arg, "numel");
  TensorRef r = view_tensor(block, false, to_dtype_arg(dtype));
  PutOptions po;
  po.overwrite = overwrite;
  po.repeat_bytes = r.nbytes;
  if (r.nbytes == 0) throw StatusError(invalid_argument("put_repeated '" + key + "': empty block"));
  const TensorDesc desc{r.dtype, {static_cast<int64_t>(numel)}};
  st.wait([&](Store& s) { return s.put_async(key, r.data, desc, po); });
}

/// A writable view of `out` and the store call that reads object `key` into it.
BufferCall get_into_call(py::handle key_arg, py::handle out, py::handle dtype) {
  std::string key = to_text(key_arg, "key");
  BufferCall p{view_tensor(out, true, to_dtype_arg(dtype)), {}};
  p.call = [key = std::move(key), data = p.ref.data,
            desc = TensorDesc{p.ref.dtype, p.ref.shape}](Store& s) {
    return s.get_async(key, data, desc);
  };
  return p;
}

using KeyOp = Future<void> (Store::*)(const std::string&);
using KeyTierOp = Future<void> (Store::*)(const std::string&, Tier);

/// The call of `op` on the store for the Python argument `key` (converted now).
auto key_call(KeyOp op, py::handle key) {
  return [op, k = to_text(key, "key")](Store& s) { return (s.*op)(k); };
}
auto key_tier_call(KeyTierOp op, py::handle key, py::handle tier) {
  return [op, k = to_text(key, "key"), t = to_tier(tier)](Store& s) { return (s.*op)(k, t); };
}

}  // namespace

PyStore::~PyStore() {
  if (store_) {
    py::gil_scoped_release nogil;
    (void)store_->close();
  }
}

std::unique_ptr<PyStore> PyStore::open(py::handle path_arg, py::handle nvme,
                                       py::object host_budget, py::object nvme_budget,
                                       py::object device_budget, py::object chunk_size,
                                       py::object staging, std::optional<bool> verify,
                                       std::optional<std::string> durability, bool read_only,
                                       bool create, std::optional<int> workers,
                                       std::optional<int> numa_node,
                                       std::optional<int> device_id, py::handle config) {
  const std::string path = to_path(path_arg, "path");
  // defaults < configuration file (config=, else $STRATA_CONFIG) < STRATA_* < arguments
  StoreOptions o = check(StoreOptions::from_config(
      config.is_none() ? std::string() : to_path(config, "config")));
  o.path = path;
  if (!py::isinstance<py::list>(nvme) && !py::isinstance<py::tuple>(nvme))
    throw StatusError(invalid_argument("nvme must be a list of directories, got " +
                                       type_name(nvme)));
  if (py::len(nvme) > 0) o.nvme_dirs.clear();
  for (auto d : nvme) o.nvme_dirs.push_back(to_path(d, "nvme directory"));
  if (!host_budget.is_none()) o.host_budget_bytes = to_size(host_budget, "host_budget");
  if (!nvme_budget.is_none()) o.nvme_budget_bytes = to_size(nvme_budget, "nvme_budget");
  if (!device_budget.is_none()) o.device_budget_bytes = to_size(device_budget, "device_budget");
  if (!chunk_size.is_none()) o.chunk_bytes = to_size(chunk_size, "chunk_size");
  if (!staging.is_none()) o.staging_bytes = to_size(staging, "staging");
  if (verify) o.verify_checksums = *verify;
  if (!durability) {
  } else if (*durability == "put") {
    o.durability = Durability::kOnPut;
  } else if (*durability == "flush") {
    o.durability = Durability::kOnFlush;
  } else {
    throw StatusError(invalid_argument("durability must be 'put' or 'flush', got '" +
                                       *durability + "'"));
  }
  o.read_only = read_only;
  o.create = create;
  if (workers) {
    if (*workers < 1 || *workers > kMaxWorkers)
      throw StatusError(invalid_argument("workers must be in [1, " + std::to_string(kMaxWorkers) +
                                         "], got " + std::to_string(*workers)));
    o.worker_threads = static_cast<uint32_t>(*workers);
  }
  if (numa_node) o.numa_node = *numa_node;
  if (device_id) o.device_id = *device_id;
  auto r = release_gil([&]() -> Result<std::unique_ptr<Store>> {
    try {
      return Store::open(std::move(o));
    } catch (const std::system_error& e) {  // e.g. thread creation failed (EAGAIN)
      return errno_status(e.code().value(), std::string("opening store '") + path +
                                                "': " + e.what() + " (lower workers?)");
    }
  });
  return std::make_unique<PyStore>(std::shared_ptr<Store>(check(std::move(r))));
}

void PyStore::close() {
  if (closed_) return;
  Status st = release_gil([&] { return store_->close(); });
  // A failed write-back leaves the store open (Store::close): keep it usable, so that the
  // caller can make room and close again. A closed store is not freed here (see s()).
  if (st.ok()) closed_ = true;
  check(st);
}

void PyStore::put(py::handle key, py::handle array, py::handle tier, bool overwrite, bool pin,
                  py::handle dtype) {
  BufferCall p = put_call(key, array, tier, overwrite, pin, dtype);
  wait(p.call);
}

PyFuture PyStore::put_async(py::handle key, py::handle array, py::handle tier, bool overwrite,
                            bool pin, py::handle dtype) {
  BufferCall p = put_call(key, array, tier, overwrite, pin, dtype);
  std::vector<TensorRef> keep;
  keep.push_back(std::move(p.ref));
  return start(p.call, py::none(), std::move(keep));
}

/// Reads object `key` into a new aligned numpy array of its dtype and shape (GIL released
/// while waiting). Atomic with respect to concurrent overwrites: the array holds one version
/// whole (see GetOp). Errors come from the read.
py::object PyStore::get(py::handle key) {
  auto op = GetOp::start(shared(), to_text(key, "key"), false);
  check(release_gil([&] { return op->done.result().status(); }));
  return op->array();
}

/// As get(); the future's result is the array. A missing or damaged object raises at once.
PyFuture PyStore::get_async(py::handle key) {
  auto store = shared();
  auto op = GetOp::start(store, to_text(key, "key"), true);
  return PyFuture(std::make_unique<GetFutureImpl>(op, store), py::none(), {});
}

/// Reads `key` into `out` with no copy. `out` must have the object's dtype and shape (the
/// Python layer converts other dtypes).
void PyStore::get_into(py::handle key, py::handle out, py::handle dtype) {
  BufferCall p = get_into_call(key, out, dtype);
  wait(p.call);
}

PyFuture PyStore::get_into_async(py::handle key, py::handle out, py::handle dtype) {
  BufferCall p = get_into_call(key, out, dtype);
  std::vector<TensorRef> keep;
  keep.push_back(std::move(p.ref));
  return start(p.call, py::reinterpret_borrow<py::object>(out), std::move(keep));
}

py::object PyStore::read_range(py::handle key_arg, py::handle offset_arg,
                               py::handle nbytes_arg) {
  const std::string key = to_text(key_arg, "key");
  const uint64_t offset = to_u64(offset_arg, "offset");
  const uint64_t nbytes = to_u64(nbytes_arg, "nbytes");
  auto read_into = [&](void* dst) {
    return [&, dst](Store& st) { return st.read_range_async(key, offset, nbytes, dst); };
  };
  void* data = nullptr;
  py::object arr;
  try {
    arr = new_aligned_array(TensorDesc::bytes(nbytes), &data);
  } catch (const StatusError& e) {
    // No memory for `nbytes`: a range past the end is still OutOfRange (or the key
    // NotFound). The store checks those before it touches the destination (none here).
    Store& st = s();
    Status verdict = release_gil([&] { return read_into(nullptr)(st).result().status(); });
    if (verdict.code() == StatusCode::kOutOfRange || verdict.code() == StatusCode::kNotFound)
      check(verdict);
    throw;
  }
  wait(read_into(data));
  return arr;
}

void PyStore::write_range(py::handle key_arg, py::handle offset_arg, py::handle src) {
  const std::string key = to_text(key_arg, "key");
  const uint64_t offset = to_u64(offset_arg, "offset");
  TensorRef r = view_tensor(src, false, std::nullopt);
  wait([&](Store& st) { return st.write_range_async(key, offset, r.nbytes, r.data); });
}

py::dict PyStore::stat(py::handle key) { return info_dict(check(s().stat(to_text(key, "key")))); }

std::vector<ObjectInfo> PyStore::infos(py::handle prefix_arg) {
  const std::string prefix = to_text(prefix_arg, "prefix");
  Store& st = s();
  return release_gil([&] { return st.list(prefix); });
}

py::list PyStore::list(py::handle prefix) {
  py::list out;
  for (auto& i : infos(prefix)) out.append(info_dict(i));
  return out;
}

py::list PyStore::keys(py::handle prefix) {
  py::list out;
  for (auto& i : infos(prefix)) out.append(text_of(i.key));
  return out;
}

py::dict PyStore::usage() {
  StoreUsage u = s().usage();
  return py::dict("device_bytes"_a = u.device_bytes,
                  "device_budget_bytes"_a = u.device_budget_bytes, "host_bytes"_a = u.host_bytes,
                  "host_budget_bytes"_a = u.host_budget_bytes, "nvme_bytes"_a = u.nvme_bytes,
                  "nvme_budget_bytes"_a = u.nvme_budget_bytes, "objects"_a = u.objects);
}

void register_store(py::module_& m) {
  py::class_<PyStore>(m, "_Store")
      .def_static("open", &PyStore::open, "path"_a, "nvme"_a = py::list(),
                  "host_budget"_a = py::none(), "nvme_budget"_a = py::none(),
                  "device_budget"_a = py::none(), "chunk_size"_a = py::none(),
                  "staging"_a = py::none(), "verify"_a = py::none(), "durability"_a = py::none(),
                  "read_only"_a = false, "create"_a = true, "workers"_a = py::none(),
                  "numa_node"_a = py::none(), "device_id"_a = py::none(), "config"_a = py::none())
      .def("close", &PyStore::close)
      .def_property_readonly("config_file",
                             [](PyStore& s) { return s.s().options().config_file; })
      .def_property_readonly("closed", &PyStore::closed)
      .def("put", &PyStore::put, "key"_a, "array"_a, "tier"_a = "nvme", "overwrite"_a = false,
           "pin"_a = false, "dtype"_a = py::none())
      .def("put_async", &PyStore::put_async, "key"_a, "array"_a, "tier"_a = "nvme",
           "overwrite"_a = false, "pin"_a = false, "dtype"_a = py::none())
      .def("put_repeated", &put_repeated, "key"_a, "block"_a, "numel"_a,
           "overwrite"_a = false, "dtype"_a = py::none())
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
      .def("stats", [](PyStore& s) {
        py::dict d;
        for (const StatField& f : stat_fields(s.s().stats())) {
          if (f.is_seconds) {
            d[f.name] = f.seconds;
          } else {
            d[f.name] = f.value;
          }
        }
        return d;
      })
      .def("reset_stats", [](PyStore& s) { s.s().reset_stats(); })
      .def("chunk_bytes", [](PyStore& s) { return s.s().chunk_bytes(); })
      .def("has_device", [](PyStore& s) { return s.s().has_device(); })
      .def("delete", [](PyStore& s, py::handle k) { s.wait(key_call(&Store::remove_async, k)); },
           "key"_a)
      .def("delete_async",
           [](PyStore& s, py::handle k) { return s.start(key_call(&Store::remove_async, k)); }, "key"_a)
      .def("move", [](PyStore& s, py::handle k, py::handle t) {
        s.wait(key_tier_call(&Store::move_async, k, t));
      }, "key"_a, "tier"_a)
      .def("move_async", [](PyStore& s, py::handle k, py::handle t) {
        return s.start(key_tier_call(&Store::move_async, k, t));
      }, "key"_a, "tier"_a)
      .def("prefetch", [](PyStore& s, py::handle k, py::handle t) {
        s.wait(key_tier_call(&Store::prefetch_async, k, t));
      }, "key"_a, "tier"_a = "host")
      .def("prefetch_async", [](PyStore& s, py::handle k, py::handle t) {
        return s.start(key_tier_call(&Store::prefetch_async, k, t));
      }, "key"_a, "tier"_a = "host")
      .def("evict", [](PyStore& s, py::handle k) { s.wait(key_call(&Store::evict_async, k)); }, "key"_a)
      .def("pin", [](PyStore& s, py::handle k) { s.wait(key_call(&Store::pin_async, k)); }, "key"_a)
      .def("unpin", [](PyStore& s, py::handle k) { s.wait(key_call(&Store::unpin_async, k)); }, "key"_a)
      .def("flush", [](PyStore& s) { s.wait([](Store& st) { return st.flush_async(); }); })
      .def("flush_async", [](PyStore& s) { return s.start([](Store& st) { return st.flush_async(); }); });
}

}  // namespace strata::py_bindings
