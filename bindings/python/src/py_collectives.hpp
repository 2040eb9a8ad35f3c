// strata._strata._Communicator: the binding of strata::Communicator and of the partitioned
// objects (store/partitioned.hpp) behind strata.distributed (strata/distributed.py documents
// the Python API).
#pragma once

#include <pybind11/pybind11.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "errors.hpp"
#include "py_futures.hpp"
#include "strata/base/thread_pool.hpp"
#include "strata/collectives/communicator.hpp"
#include "strata/collectives/rendezvous.hpp"
#include "tensor_ref.hpp"

namespace strata::py_bindings {

namespace py = pybind11;

/// One communicator plus its sequencer: a single worker thread that runs every operation
/// issued through this object (collectives and partitioned calls) one at a time, in issue
/// order, each to completion. The partitioned calls issue several collectives of their own
/// from a thread of theirs; the sequencer keeps another operation from interleaving with
/// them (store/partitioned.hpp forbids it), so Python callers may keep any number of
/// futures in flight.
/// Thread-safety: methods need the GIL; `closed_` is read and written with it.
class PyCommunicator {
 public:
  /// `server`: the rendezvous server this rank hosts itself (Communicator.from_torch on
  /// group rank 0), kept until close(); null otherwise.
  PyCommunicator(std::unique_ptr<Communicator> comm, std::unique_ptr<ThreadPool> sequencer,
                 std::shared_ptr<RendezvousServer> server);
  ~PyCommunicator();
  PyCommunicator(const PyCommunicator&) = delete;
  PyCommunicator& operator=(const PyCommunicator&) = delete;

  /// The communicator. \error FailedPrecondition once closed.
  Communicator& c();
  bool closed() const { return closed_; }

  /// Runs the remaining operations, destroys the communicator (GIL released), then, when
  /// this rank hosts the rendezvous server, waits (at most min(timeout, 10 s)) for the other
  /// ranks to disconnect before stopping it. Idempotent.
  void close();

  /// Queues `op` (run on the sequencer, GIL not held; it returns the operation's Status)
  /// and returns its Python future; `value` is the future's result, `keep` the buffers the
  /// operation uses (referenced until done).
  PyFuture submit(std::function<Status()> op, py::object value, std::vector<TensorRef> keep);

  /// A view of the array argument `what` ("send", "out", ...) for this communicator's
  /// memory kind: host memory (Gloo) or device memory of device() (NCCL). `dtype`: None or
  /// a dtype name reinterpreting the elements (e.g. "bf16" for numpy uint16 bits).
  /// \error InvalidArgument naming `what`.
  TensorRef view(py::handle obj, const char* what, bool writable, py::handle dtype);

 private:
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<ThreadPool> sequencer_;
  std::shared_ptr<RendezvousServer> server_;
  bool closed_ = false;
};

/// A view of the host array argument `what` (the partitioned calls take host memory).
/// \error InvalidArgument naming `what`.
TensorRef view_host(py::handle obj, const char* what, bool writable, py::handle dtype);

/// True when the byte ranges [a, a+an) and [b, b+bn) share a byte.
bool overlaps(const void* a, uint64_t an, const void* b, uint64_t bn);

/// The blocking form of an *_async binding `f`: its future's result, waited for with the
/// GIL released.
template <class... A>
auto blocking(PyFuture (*f)(PyCommunicator&, A...)) {
  return [f](PyCommunicator& c, A... a) { return f(c, a...).result(std::nullopt); };
}

/// "sum" / "max" -> ReduceOp.  \error InvalidArgument naming `op`.
ReduceOp to_reduce_op(py::handle op);

/// Registers _Communicator, _RendezvousHost and the module functions
/// _read_distributed_env, _nccl_available (call once from the module init).
void register_collectives(py::module_& m);

/// Adds the partitioned calls to the _Communicator class and the module functions
/// _partition_layout, _stat_partitioned, _remove_partitioned (py_partitioned.cpp).
void register_partitioned(py::module_& m, py::class_<PyCommunicator>& cls);

}  // namespace strata::py_bindings
