#include "py_collectives.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <utility>

#include "py_convert.hpp"

namespace strata::py_bindings {

using namespace pybind11::literals;

namespace {

[[noreturn]] void bad(const std::string& msg) { throw StatusError(invalid_argument(msg)); }

/// "fp32[2, 3]"-style description of a view, for messages.
std::string describe(const TensorRef& r) { return to_string(TensorDesc{r.dtype, r.shape}); }

void check_same_dtype(const char* what, const TensorRef& a, const char* an, const TensorRef& b,
                      const char* bn) {
  if (a.dtype != b.dtype)
    bad(std::string(what) + ": " + bn + " has dtype " + std::string(dtype_name(b.dtype)) +
        " but " + an + " has " + std::string(dtype_name(a.dtype)));
}

std::chrono::milliseconds to_timeout(std::optional<double> seconds,
                                     std::chrono::milliseconds fallback) {
  if (!seconds) return fallback;
  if (!std::isfinite(*seconds) || *seconds <= 0 || *seconds > 1e9)
    bad("timeout must be a number of seconds in (0, 1e9], got " +
        std::string(py::str(py::float_(*seconds))));
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(*seconds * 1000.0)));
}

/// Communicator creation (collective); see strata.distributed.Communicator.
std::unique_ptr<PyCommunicator> create(const std::string& addr, int port, int rank, int size,
                                       int local_rank, const std::string& backend,
                                       std::optional<double> timeout,
                                       std::shared_ptr<RendezvousServer> host) {
  if (port < 1 || port > 65535)
    bad("port must be a TCP port in [1, 65535], got " + std::to_string(port));
  if (size < 1) bad("world_size must be >= 1, got " + std::to_string(size));
  if (rank < 0 || rank >= size)
    bad("rank " + std::to_string(rank) + " is not in [0, world_size=" + std::to_string(size) +
        ")");
  CommunicatorOptions o = check(communicator_options_from_env());
  o.backend = check(parse_backend(backend));
  o.timeout = to_timeout(timeout, o.timeout);
  o.rank0_hosts_store = host == nullptr;
  DistributedEnv env;
  env.master_addr = addr;
  env.master_port = static_cast<uint16_t>(port);
  env.rank = rank;
  env.world_size = size;
  env.local_rank = local_rank;
  auto r = release_gil([&] { return create_communicator(env, o); });
  std::unique_ptr<Communicator> comm = check(std::move(r));
  auto seq = check(ThreadPool::create(1));
  return std::make_unique<PyCommunicator>(std::move(comm), std::move(seq), std::move(host));
}

/// Views `obj`; `dtype` (None or a dtype name) reinterprets the elements only when the
/// array's own element type is not one strata knows (numpy uint16 holding bf16 bits);
/// otherwise it must agree with the array's dtype.
TensorRef view_checked(py::handle obj, const char* what, bool writable, py::handle dtype) {
  auto over = to_dtype_arg(dtype);
  try {
    if (!over) return view_tensor(obj, writable, std::nullopt);
    const DType want = check(parse_dtype(*over));
    std::optional<TensorRef> plain;
    try {
      plain = view_tensor(obj, writable, std::nullopt);
    } catch (const StatusError&) {
      return view_tensor(obj, writable, over);  // e.g. uint16 bits as bf16
    }
    if (plain->dtype != want)
      bad("it has dtype " + std::string(dtype_name(plain->dtype)) + " but dtype='" + *over +
          "' was given (dtype only names the element type of raw 16-bit arrays)");
    return std::move(*plain);
  } catch (const StatusError& e) {
    throw StatusError(e.status().with_context(what));
  }
}

std::string device_text(const TensorRef& r) {
  return r.device ? "cuda:" + std::to_string(r.device_id) : "host memory";
}

// ---- collectives ------------------------------------------------------------------------

PyFuture all_gather_async(PyCommunicator& pc, py::handle send, py::handle out, py::handle dtype) {
  TensorRef s = pc.view(send, "send", false, dtype), r = pc.view(out, "out", true, dtype);
  Communicator& c = pc.c();
  check_same_dtype("all_gather", s, "send", r, "out");
  const uint64_t n = s.numel;
  if (r.numel != n * static_cast<uint64_t>(c.size()))
    bad("all_gather: out holds " + std::to_string(r.numel) + " elements (" + describe(r) +
        "), expected world size " + std::to_string(c.size()) + " x send's " +
        std::to_string(n) + " = " + std::to_string(n * c.size()));
  const auto* in_place = static_cast<const char*>(r.data) + c.rank() * s.nbytes;
  if (s.data != in_place && overlaps(s.data, s.nbytes, r.data, r.nbytes))
    bad("all_gather: send overlaps out (only send = out[rank*n:(rank+1)*n] may share memory)");
  auto op = [cm = &c, sd = s.data, rd = r.data, n, dt = s.dtype] {
    return cm->all_gather(sd, rd, n, dt);
  };
  std::vector<TensorRef> keep{std::move(s), std::move(r)};
  return pc.submit(op, py::reinterpret_borrow<py::object>(out), std::move(keep));
}

PyFuture reduce_scatter_async(PyCommunicator& pc, py::handle send, py::handle out, py::handle op,
                              py::handle dtype) {
  TensorRef s = pc.view(send, "send", false, dtype), r = pc.view(out, "out", true, dtype);
  Communicator& c = pc.c();
  const ReduceOp rop = to_reduce_op(op);
  check_same_dtype("reduce_scatter", s, "send", r, "out");
  const uint64_t n = r.numel;
  if (s.numel != n * static_cast<uint64_t>(c.size()))
    bad("reduce_scatter: send holds " + std::to_string(s.numel) + " elements (" + describe(s) +
        "), expected world size " + std::to_string(c.size()) + " x out's " + std::to_string(n) +
        " = " + std::to_string(n * c.size()));
  const auto* in_place = static_cast<const char*>(s.data) + c.rank() * r.nbytes;
  if (r.data != in_place && overlaps(s.data, s.nbytes, r.data, r.nbytes))
    bad("reduce_scatter: out overlaps send (only out = send[rank*n:(rank+1)*n] may share "
        "memory)");
  auto f = [cm = &c, sd = s.data, rd = r.data, n, dt = s.dtype, rop] {
    return cm->reduce_scatter(sd, rd, n, dt, rop);
  };
  std::vector<TensorRef> keep{std::move(s), std::move(r)};
  return pc.submit(f, py::reinterpret_borrow<py::object>(out), std::move(keep));
}

PyFuture all_reduce_async(PyCommunicator& pc, py::handle tensor, py::handle op, py::handle out,
                          py::handle dtype) {
  const bool in_place = out.is_none();
  TensorRef s = pc.view(tensor, "tensor", in_place, dtype);
  TensorRef r = in_place ? s : pc.view(out, "out", true, dtype);
  Communicator& c = pc.c();
  const ReduceOp rop = to_reduce_op(op);
  if (!in_place) {
    check_same_dtype("all_reduce", s, "tensor", r, "out");
    if (r.numel != s.numel)
      bad("all_reduce: out holds " + std::to_string(r.numel) + " elements (" + describe(r) +
          "), tensor " + std::to_string(s.numel) + " (" + describe(s) + ")");
    if (r.data != s.data && overlaps(s.data, s.nbytes, r.data, r.nbytes))
      bad("all_reduce: out overlaps tensor without being the same memory");
  }
  auto f = [cm = &c, sd = s.data, rd = r.data, n = s.numel, dt = s.dtype, rop] {
    return cm->all_reduce(sd, rd, n, dt, rop);
  };
  py::object value = py::reinterpret_borrow<py::object>(in_place ? tensor : out);
  std::vector<TensorRef> keep{std::move(s), std::move(r)};
  return pc.submit(f, std::move(value), std::move(keep));
}

PyFuture broadcast_async(PyCommunicator& pc, py::handle tensor, int root, py::handle dtype) {
  TensorRef t = pc.view(tensor, "tensor", true, dtype);
  Communicator& c = pc.c();
  if (root < 0 || root >= c.size())
    bad("broadcast: root " + std::to_string(root) + " is not a rank of a communicator of size " +
        std::to_string(c.size()));
  auto f = [cm = &c, d = t.data, n = t.numel, dt = t.dtype, root] {
    return cm->broadcast(d, n, dt, root);
  };
  std::vector<TensorRef> keep{std::move(t)};
  return pc.submit(f, py::reinterpret_borrow<py::object>(tensor), std::move(keep));
}

PyFuture barrier_async(PyCommunicator& pc) {
  Communicator& c = pc.c();
  return pc.submit([cm = &c] { return cm->barrier(); }, py::none(), {});
}

}  // namespace

PyCommunicator::PyCommunicator(std::unique_ptr<Communicator> comm,
                               std::unique_ptr<ThreadPool> sequencer,
                               std::shared_ptr<RendezvousServer> server)
    : comm_(std::move(comm)), sequencer_(std::move(sequencer)), server_(std::move(server)) {}

PyCommunicator::~PyCommunicator() { close(); }

Communicator& PyCommunicator::c() {
  if (closed_) throw StatusError(failed_precondition("the communicator is closed"));
  return *comm_;
}

void PyCommunicator::close() {
  if (closed_) return;
  closed_ = true;
  py::gil_scoped_release nogil;
  sequencer_->shutdown();  // the queued operations run first
  const auto bound = std::min(comm_->options().timeout, std::chrono::milliseconds(10000));
  comm_.reset();
  if (server_) {
    // Our own client is gone with comm_; wait for the other ranks' before stopping.
    (void)server_->wait_until_disconnected({}, bound);
    server_.reset();
  }
}

PyFuture PyCommunicator::submit(std::function<Status()> op, py::object value,
                                std::vector<TensorRef> keep) {
  c();
  Future<void> f = sequencer_->async(std::move(op));
  return make_future(std::move(f), std::move(value), std::move(keep));
}

TensorRef PyCommunicator::view(py::handle obj, const char* what, bool writable,
                               py::handle dtype) {
  TensorRef r = view_checked(obj, what, writable, dtype);
  Communicator& cm = c();
  if (cm.backend() == Backend::kGloo && r.device)
    bad(std::string(what) + ": the tensor is on " + device_text(r) +
        " but a gloo communicator moves host memory: pass a CPU tensor");
  if (cm.backend() == Backend::kNccl && (!r.device || r.device_id != cm.device()))
    bad(std::string(what) + ": the tensor is in " + device_text(r) +
        " but this nccl communicator moves memory of cuda:" + std::to_string(cm.device()));
  return r;
}

TensorRef view_host(py::handle obj, const char* what, bool writable, py::handle dtype) {
  TensorRef r = view_checked(obj, what, writable, dtype);
  if (r.device)
    bad(std::string(what) + ": the tensor is on " + device_text(r) +
        " but partitioned objects move host memory: pass a CPU tensor");
  return r;
}

bool overlaps(const void* a, uint64_t an, const void* b, uint64_t bn) {
  if (an == 0 || bn == 0) return false;
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + bn && pb < pa + an;
}

ReduceOp to_reduce_op(py::handle op) {
  const std::string name = to_text(op, "op");
  if (name == "sum") return ReduceOp::kSum;
  if (name == "max") return ReduceOp::kMax;
  bad("op must be 'sum' or 'max', got '" + name + "'");
}

void register_collectives(py::module_& m) {
  py::class_<RendezvousServer, std::shared_ptr<RendezvousServer>>(m, "_RendezvousHost")
      .def_static("start", [](int port) {
        if (port < 0 || port > 65535) bad("port must be in [0, 65535], got " + std::to_string(port));
        auto r = release_gil([&] { return RendezvousServer::start("0.0.0.0", static_cast<uint16_t>(port)); });
        return std::shared_ptr<RendezvousServer>(check(std::move(r)));
      }, "port"_a = 0)
      .def_property_readonly("port", &RendezvousServer::port);

  m.def("_read_distributed_env", [] {
    DistributedEnv e = check(read_distributed_env());
    return py::dict("master_addr"_a = e.master_addr, "master_port"_a = e.master_port,
                    "rank"_a = e.rank, "world_size"_a = e.world_size,
                    "local_rank"_a = e.local_rank);
  });
  m.def("_nccl_available", &nccl_available);

  py::class_<PyCommunicator> cls(m, "_Communicator");
  cls.def_static("create", &create, "master_addr"_a, "port"_a, "rank"_a, "world_size"_a,
                 "local_rank"_a, "backend"_a = "gloo", "timeout"_a = py::none(),
                 "host"_a = py::none())
      .def("close", &PyCommunicator::close)
      .def_property_readonly("closed", &PyCommunicator::closed)
      .def_property_readonly("rank", [](PyCommunicator& c) { return c.c().rank(); })
      .def_property_readonly("size", [](PyCommunicator& c) { return c.c().size(); })
      .def_property_readonly("backend", [](PyCommunicator& c) {
        return std::string(backend_name(c.c().backend()));
      })
      .def_property_readonly("device", [](PyCommunicator& c) { return c.c().device(); })
      .def_property_readonly("timeout", [](PyCommunicator& c) {
        return static_cast<double>(c.c().options().timeout.count()) / 1000.0;
      })
      .def("all_gather_async", &all_gather_async, "send"_a, "out"_a, "dtype"_a = py::none())
      .def("all_gather", blocking(&all_gather_async), "send"_a, "out"_a, "dtype"_a = py::none())
      .def("reduce_scatter_async", &reduce_scatter_async, "send"_a, "out"_a, "op"_a = "sum",
           "dtype"_a = py::none())
      .def("reduce_scatter", blocking(&reduce_scatter_async), "send"_a, "out"_a, "op"_a = "sum",
           "dtype"_a = py::none())
      .def("all_reduce_async", &all_reduce_async, "tensor"_a, "op"_a = "sum",
           "out"_a = py::none(), "dtype"_a = py::none())
      .def("all_reduce", blocking(&all_reduce_async), "tensor"_a, "op"_a = "sum",
           "out"_a = py::none(), "dtype"_a = py::none())
      .def("broadcast_async", &broadcast_async, "tensor"_a, "root"_a = 0, "dtype"_a = py::none())
      .def("broadcast", blocking(&broadcast_async), "tensor"_a, "root"_a = 0,
           "dtype"_a = py::none())
      .def("barrier_async", &barrier_async)
      .def("barrier", blocking(&barrier_async));
  register_partitioned(m, cls);
}

}  // namespace strata::py_bindings
