// strata._strata._Store: the binding of strata::Store behind strata.Store
// (strata/__init__.py documents the Python API).
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <optional>
#include <string>

#include "errors.hpp"
#include "py_convert.hpp"
#include "py_futures.hpp"
#include "strata/store/store.hpp"

namespace strata::py_bindings {

namespace py = pybind11;

/// One open store. Methods need the GIL and release it around every call that may block.
/// Thread-safety: the Store is safe to use from many threads; `closed_` is read and written
/// with the GIL held.
class PyStore {
 public:
  explicit PyStore(std::shared_ptr<Store> s) : store_(std::move(s)) {}
  ~PyStore();
  PyStore(const PyStore&) = delete;
  PyStore& operator=(const PyStore&) = delete;

  /// Store.open: see strata.Store.open for the arguments, their units and errors.
  static std::unique_ptr<PyStore> open(py::handle path, py::handle nvme, py::object host_budget,
                                       py::object nvme_budget, py::object device_budget,
                                       py::object chunk_size, py::object staging,
                                       std::optional<bool> verify,
                                       std::optional<std::string> durability, bool read_only,
                                       bool create, std::optional<int> workers,
                                       std::optional<int> numa_node, std::optional<int> device_id,
                                       py::handle config);

  /// The store; a closed one stays allocated (its calls fail with FailedPrecondition), so
  /// that a call another thread is making while this one closes never sees it freed.
  /// \error FailedPrecondition once closed.
  Store& s() {
    if (closed_) throw StatusError(failed_precondition("the store is closed"));
    return *store_;
  }
  bool closed() const { return closed_; }
  /// As s(), shared: for users that must keep the store alive (futures, the optimizer).
  const std::shared_ptr<Store>& shared() {
    s();
    return store_;
  }

  /// Closes the store (GIL released). A failed write-back leaves it open and raises.
  void close();

  /// Starts `call(store)` (returns a Future<void>) with the GIL released and waits for it;
  /// raises its error.
  template <class Call>
  void wait(Call&& call) {
    Store& st = s();
    check(release_gil([&] { return call(st).result().status(); }));
  }

  /// Starts `call(store)` with the GIL released; returns its Python future, whose result is
  /// `value` and which keeps `keep` referenced until done.
  template <class Call>
  PyFuture start(Call&& call, py::object value = py::none(), std::vector<TensorRef> keep = {}) {
    Store& st = s();
    Future<void> f = release_gil([&] { return call(st); });
    return make_future(std::move(f), std::move(value), std::move(keep));
  }

  void put(py::handle key, py::handle array, py::handle tier, bool overwrite, bool pin,
           py::handle dtype);
  PyFuture put_async(py::handle key, py::handle array, py::handle tier, bool overwrite,
                     bool pin, py::handle dtype);
  py::object get(py::handle key);
  PyFuture get_async(py::handle key);
  void get_into(py::handle key, py::handle out, py::handle dtype);
  PyFuture get_into_async(py::handle key, py::handle out, py::handle dtype);
  py::object read_range(py::handle key, py::handle offset, py::handle nbytes);
  void write_range(py::handle key, py::handle offset, py::handle src);
  py::dict stat(py::handle key);
  py::list list(py::handle prefix);
  py::list keys(py::handle prefix);
  py::dict usage();

 private:
  std::vector<ObjectInfo> infos(py::handle prefix);

  std::shared_ptr<Store> store_;  // never null; freed with the PyStore
  bool closed_ = false;           // read and written with the GIL
};

/// Registers strata._strata._Store (call once from the module init).
void register_store(py::module_& m);

}  // namespace strata::py_bindings
