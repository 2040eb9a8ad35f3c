// The partitioned-object calls of strata._strata._Communicator (store/partitioned.hpp):
// put_partitioned[_slice], fetch_partitioned, reduce_scatter_grads, plus the per-rank
// helpers partition_layout, stat_partitioned and remove_partitioned.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "py_collectives.hpp"
#include "py_convert.hpp"
#include "py_store.hpp"
#include "strata/store/partitioned.hpp"

namespace strata::py_bindings {

using namespace pybind11::literals;

namespace {

[[noreturn]] void bad(const std::string& msg) { throw StatusError(invalid_argument(msg)); }

/// PartitionOptions from the keyword arguments (None keeps a default).
PartitionOptions part_options(py::handle piece_bytes, bool pipelined) {
  PartitionOptions o;
  if (!piece_bytes.is_none()) {
    o.piece_bytes = to_size(piece_bytes, "piece_bytes");
    if (o.piece_bytes == 0) bad("piece_bytes must be > 0");
  }
  o.pipelined = pipelined;
  return o;
}

PartitionLayout layout_of(uint64_t numel, int world_size) {
  return check(partition_layout(numel, world_size));
}

std::vector<int64_t> to_shape(py::handle v) {
  if (!py::isinstance<py::sequence>(v) || py::isinstance<py::str>(v))
    bad("full_shape must be a sequence of ints, got " + type_name(v));
  std::vector<int64_t> shape;
  for (auto e : v) {
    const uint64_t x = to_u64(e, "full_shape element");
    if (x > static_cast<uint64_t>(INT64_MAX)) bad("full_shape element too large");
    shape.push_back(static_cast<int64_t>(x));
  }
  return shape;
}

PyFuture put_partitioned_async(PyCommunicator& pc, PyStore& store, py::handle key_arg,
                               py::handle full, py::handle tier, bool overwrite,
                               py::handle piece_bytes, py::handle dtype) {
  std::string key = to_text(key_arg, "key");
  TensorRef t = view_host(full, "full", false, dtype);
  PartitionOptions o = part_options(piece_bytes, true);
  o.put.tier = to_tier(tier);
  o.put.overwrite = overwrite;
  auto op = [cm = &pc.c(), st = store.shared(), key = std::move(key), d = t.data,
             desc = TensorDesc{t.dtype, t.shape}, o] {
    return put_partitioned(*st, *cm, key, d, desc, o);
  };
  std::vector<TensorRef> keep{std::move(t)};
  return pc.submit(op, py::none(), std::move(keep));
}

PyFuture put_partitioned_slice_async(PyCommunicator& pc, PyStore& store, py::handle key_arg,
                                     py::handle owned, py::handle full_shape, py::handle dtype,
                                     py::handle tier, bool overwrite, py::handle piece_bytes) {
  std::string key = to_text(key_arg, "key");
  TensorRef t = view_host(owned, "owned_slice", false, dtype);
  TensorDesc desc{t.dtype, to_shape(full_shape)};
  Communicator& c = pc.c();
  const PartitionLayout l = layout_of(desc.numel(), c.size());
  const int r = c.rank();
  if (t.numel != l.owned_numel(r))
    bad("put_partitioned_slice '" + key + "': owned_slice holds " + std::to_string(t.numel) +
        " elements, but rank " + std::to_string(r) + " owns " +
        std::to_string(l.owned_numel(r)) + " of the " + std::to_string(desc.numel()) +
        " elements of " + to_string(desc) + " (elements [" + std::to_string(l.begin(r)) +
        ", " + std::to_string(l.end(r)) + ") over " + std::to_string(c.size()) + " ranks)");
  PartitionOptions o = part_options(piece_bytes, true);
  o.put.tier = to_tier(tier);
  o.put.overwrite = overwrite;
  auto op = [cm = &c, st = store.shared(), key = std::move(key), d = t.data, desc, o] {
    return put_partitioned_slice(*st, *cm, key, d, desc, o);
  };
  std::vector<TensorRef> keep{std::move(t)};
  return pc.submit(op, py::none(), std::move(keep));
}

PyFuture fetch_partitioned_async(PyCommunicator& pc, PyStore& store, py::handle key_arg,
                                 py::handle out, py::handle piece_bytes, bool pipelined,
                                 py::handle dtype) {
  std::string key = to_text(key_arg, "key");
  TensorRef t = view_host(out, "out", true, dtype);
  PartitionOptions o = part_options(piece_bytes, pipelined);
  auto op = [cm = &pc.c(), st = store.shared(), key = std::move(key), d = t.data,
             desc = TensorDesc{t.dtype, t.shape}, o] {
    return fetch_partitioned(*st, *cm, key, d, desc, o);
  };
  std::vector<TensorRef> keep{std::move(t)};
  return pc.submit(op, py::reinterpret_borrow<py::object>(out), std::move(keep));
}

PyFuture reduce_scatter_grads_async(PyCommunicator& pc, py::handle full_grad, py::handle out,
                                    py::handle op_arg, py::handle piece_bytes,
                                    py::handle dtype) {
  TensorRef g = view_host(full_grad, "full_grad", false, dtype);
  TensorRef s = view_host(out, "out", true, dtype);
  const ReduceOp rop = to_reduce_op(op_arg);
  PartitionOptions o = part_options(piece_bytes, true);
  Communicator& c = pc.c();
  if (g.dtype != s.dtype)
    bad("reduce_scatter_grads: out has dtype " + std::string(dtype_name(s.dtype)) +
        " but full_grad has " + std::string(dtype_name(g.dtype)));
  const PartitionLayout l = layout_of(g.numel, c.size());
  const int r = c.rank();
  if (s.numel != l.owned_numel(r))
    bad("reduce_scatter_grads: out holds " + std::to_string(s.numel) + " elements, but rank " +
        std::to_string(r) + " owns " + std::to_string(l.owned_numel(r)) + " of full_grad's " +
        std::to_string(g.numel) + " (elements [" + std::to_string(l.begin(r)) + ", " +
        std::to_string(l.end(r)) + ") over " + std::to_string(c.size()) + " ranks)");
  if (overlaps(g.data, g.nbytes, s.data, s.nbytes))
    bad("reduce_scatter_grads: out overlaps full_grad");
  auto f = [cm = &c, gd = g.data, sd = s.data, n = g.numel, dt = g.dtype, rop,
            pb = o.piece_bytes] { return reduce_scatter_grads(*cm, gd, sd, n, dt, rop, pb); };
  std::vector<TensorRef> keep{std::move(g), std::move(s)};
  return pc.submit(f, py::reinterpret_borrow<py::object>(out), std::move(keep));
}

}  // namespace

void register_partitioned(py::module_& m, py::class_<PyCommunicator>& cls) {
  cls.def("put_partitioned_async", &put_partitioned_async, "store"_a, "key"_a, "full"_a,
          "tier"_a = "nvme", "overwrite"_a = false, "piece_bytes"_a = py::none(),
          "dtype"_a = py::none())
      .def("put_partitioned", blocking(&put_partitioned_async), "store"_a, "key"_a, "full"_a,
           "tier"_a = "nvme", "overwrite"_a = false, "piece_bytes"_a = py::none(),
           "dtype"_a = py::none())
      .def("put_partitioned_slice_async", &put_partitioned_slice_async, "store"_a, "key"_a,
           "owned_slice"_a, "full_shape"_a, "dtype"_a = py::none(), "tier"_a = "nvme",
           "overwrite"_a = false, "piece_bytes"_a = py::none())
      .def("put_partitioned_slice", blocking(&put_partitioned_slice_async), "store"_a, "key"_a,
           "owned_slice"_a, "full_shape"_a, "dtype"_a = py::none(), "tier"_a = "nvme",
           "overwrite"_a = false, "piece_bytes"_a = py::none())
      .def("fetch_partitioned_async", &fetch_partitioned_async, "store"_a, "key"_a, "out"_a,
           "piece_bytes"_a = py::none(), "pipelined"_a = true, "dtype"_a = py::none())
      .def("fetch_partitioned", blocking(&fetch_partitioned_async), "store"_a, "key"_a, "out"_a,
           "piece_bytes"_a = py::none(), "pipelined"_a = true, "dtype"_a = py::none())
      .def("reduce_scatter_grads_async", &reduce_scatter_grads_async, "full_grad"_a, "out"_a,
           "op"_a = "sum", "piece_bytes"_a = py::none(), "dtype"_a = py::none())
      .def("reduce_scatter_grads", blocking(&reduce_scatter_grads_async), "full_grad"_a,
           "out"_a, "op"_a = "sum", "piece_bytes"_a = py::none(), "dtype"_a = py::none());

  m.def("_partition_layout", [](py::handle numel, int world_size) {
    const PartitionLayout l = layout_of(to_u64(numel, "numel"), world_size);
    py::list out;
    for (int r = 0; r < world_size; ++r) out.append(py::make_tuple(l.begin(r), l.end(r)));
    return out;
  }, "numel"_a, "world_size"_a);
  m.def("_stat_partitioned", [](PyStore& store, py::handle key) {
    const std::string k = to_text(key, "key");
    Store& st = store.s();
    PartitionInfo i = check(release_gil([&] { return stat_partitioned(st, k); }));
    py::tuple shape(i.desc.shape.size());
    for (size_t d = 0; d < i.desc.shape.size(); ++d) shape[d] = py::int_(i.desc.shape[d]);
    return py::dict("key"_a = text_of(i.key), "dtype"_a = std::string(dtype_name(i.desc.dtype)),
                    "shape"_a = shape, "numel"_a = i.numel, "world_size"_a = i.world_size,
                    "rank"_a = i.rank, "owned_begin"_a = i.owned_begin,
                    "owned_numel"_a = i.owned_numel);
  }, "store"_a, "key"_a);
  m.def("_remove_partitioned", [](PyStore& store, py::handle key) {
    const std::string k = to_text(key, "key");
    Store& st = store.s();
    check(release_gil([&] { return remove_partitioned(st, k); }));
  }, "store"_a, "key"_a);
}

}  // namespace strata::py_bindings
