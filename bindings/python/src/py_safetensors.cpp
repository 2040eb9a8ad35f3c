// strata._strata: the safetensors format (strata/store/safetensors.hpp) behind
// strata.torch.checkpoints: _SafetensorsReader (the parsed header, copy into memory or store
// objects) and safetensors_write (a file from memory or store objects). Memory crosses as
// raw addresses the Python layer takes from tensors it keeps alive for the call; every copy
// and write releases the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "errors.hpp"
#include "py_convert.hpp"
#include "py_store.hpp"
#include "strata/store/safetensors.hpp"

namespace strata::py_bindings {
namespace {

namespace st = strata::safetensors;
using namespace pybind11::literals;

DType dtype_arg(const std::string& name) { return check(parse_dtype(name)); }

/// A strata.Store (its _Store) or a _Store; None: no store.
Store* store_arg(const py::object& store) {
  if (store.is_none()) return nullptr;
  if (py::isinstance<PyStore>(store)) return &store.cast<PyStore&>().s();
  return &store.attr("_s").cast<PyStore&>().s();
}

st::StreamOptions stream_options(const py::object& piece_bytes, const py::object& pieces,
                                 bool durable) {
  st::StreamOptions o = check(st::StreamOptions::from_env());
  if (!piece_bytes.is_none()) o.piece_bytes = to_size(piece_bytes, "piece_bytes");
  if (!pieces.is_none()) o.pieces = static_cast<uint32_t>(to_u64(pieces, "pieces"));
  if (o.piece_bytes == 0 || o.pieces == 0) {
    throw StatusError(invalid_argument("piece_bytes and pieces must be > 0"));
  }
  o.durable = durable;
  return o;
}

py::dict stats_dict(const st::StreamStats& s) {
  return py::dict("bytes_read"_a = s.bytes_read, "bytes_written"_a = s.bytes_written,
                  "seconds"_a = s.seconds);
}

}  // namespace

void register_safetensors(py::module_& m) {
  py::class_<st::Reader, std::shared_ptr<st::Reader>>(m, "_SafetensorsReader")
      .def(py::init([](const std::string& path) {
             return check(release_gil([&] { return st::Reader::open(path); }));
           }),
           "path"_a)
      // A header given by the caller: [(name, dtype, shape, begin, end)], file offsets.
      .def_static("ranges",
                  [](const std::string& path, const py::list& entries) {
                    std::vector<st::TensorEntry> es;
                    for (const auto& t : entries) {
                      auto tup = t.cast<py::tuple>();
                      st::TensorEntry e;
                      e.name = tup[0].cast<std::string>();
                      auto d = st::parse_dtype(tup[1].cast<std::string>());
                      if (!d) throw StatusError(invalid_argument("unknown safetensors dtype '" +
                                                                 tup[1].cast<std::string>() + "'"));
                      e.dtype = *d;
                      e.shape = tup[2].cast<std::vector<uint64_t>>();
                      e.begin = tup[3].cast<uint64_t>();
                      e.end = tup[4].cast<uint64_t>();
                      es.push_back(std::move(e));
                    }
                    return check(release_gil([&] { return st::Reader::open_ranges(path, std::move(es)); }));
                  },
                  "path"_a, "entries"_a)
      .def_property_readonly("path", &st::Reader::path)
      .def_property_readonly("header_nbytes", [](const st::Reader& r) { return r.header().header_nbytes; })
      .def_property_readonly("data_start", [](const st::Reader& r) { return r.header().data_start(); })
      .def_property_readonly("file_nbytes", [](const st::Reader& r) { return r.header().file_nbytes; })
      .def_property_readonly("metadata",
                             [](const st::Reader& r) {
                               py::dict d;
                               for (const auto& [k, v] : r.header().metadata) d[text_of(k)] = text_of(v);
                               return d;
                             })
      // [(name, dtype, shape, begin, end)] in file order (begin relative to data_start).
      .def_property_readonly("tensors",
                             [](const st::Reader& r) {
                               py::list out;
                               for (const auto& e : r.header().tensors) {
                                 py::tuple shape(e.shape.size());
                                 for (size_t i = 0; i < e.shape.size(); ++i) shape[i] = e.shape[i];
                                 out.append(py::make_tuple(text_of(e.name), std::string(st::dtype_name(e.dtype)),
                                                           shape, e.begin, e.end));
                               }
                               return out;
                             })
      // targets: [(tensor index, elem_begin, elem_end, dtype, address or None, key, key_offset)]
      .def("copy",
           [](const st::Reader& r, const py::list& targets, const py::object& store,
              const py::object& piece_bytes, const py::object& pieces) {
             std::vector<st::CopyTarget> ts;
             for (const auto& t : targets) {
               auto tup = t.cast<py::tuple>();
               st::CopyTarget c;
               c.tensor = tup[0].cast<size_t>();
               c.elem_begin = tup[1].cast<uint64_t>();
               c.elem_end = tup[2].is_none() ? UINT64_MAX : tup[2].cast<uint64_t>();
               c.dtype = dtype_arg(tup[3].cast<std::string>());
               c.memory = tup[4].is_none() ? nullptr : reinterpret_cast<void*>(tup[4].cast<uintptr_t>());
               c.key = tup[5].is_none() ? "" : tup[5].cast<std::string>();
               c.key_offset_bytes = tup[6].cast<uint64_t>();
               ts.push_back(std::move(c));
             }
             Store* s = store_arg(store);
             const st::StreamOptions o = stream_options(piece_bytes, pieces, true);
             return stats_dict(check(release_gil([&] { return st::copy_tensors(r, ts, s, o); })));
           },
           "targets"_a, "store"_a = py::none(), "piece_bytes"_a = py::none(), "pieces"_a = py::none());

  // sources: [(name, dtype, shape, src_dtype, address or None, key, key_offset)]
  m.def("safetensors_write",
        [](const std::string& path, const py::list& sources, const py::dict& metadata,
           const py::object& store, const py::object& piece_bytes, const py::object& pieces,
           bool durable) {
          std::vector<st::WriteSource> src;
          for (const auto& t : sources) {
            auto tup = t.cast<py::tuple>();
            st::WriteSource w;
            w.name = tup[0].cast<std::string>();
            w.dtype = dtype_arg(tup[1].cast<std::string>());
            w.shape = tup[2].cast<std::vector<uint64_t>>();
            w.src_dtype = dtype_arg(tup[3].cast<std::string>());
            w.memory = tup[4].is_none() ? nullptr : reinterpret_cast<const void*>(tup[4].cast<uintptr_t>());
            w.key = tup[5].is_none() ? "" : tup[5].cast<std::string>();
            w.key_offset_bytes = tup[6].cast<uint64_t>();
            src.push_back(std::move(w));
          }
          std::vector<std::pair<std::string, std::string>> meta;
          for (const auto& [k, v] : metadata) meta.emplace_back(k.cast<std::string>(), v.cast<std::string>());
          Store* s = store_arg(store);
          const st::StreamOptions o = stream_options(piece_bytes, pieces, durable);
          return stats_dict(
              check(release_gil([&] { return st::write_file(path, src, meta, s, o); })));
        },
        "path"_a, "sources"_a, "metadata"_a, "store"_a = py::none(), "piece_bytes"_a = py::none(),
        "pieces"_a = py::none(), "durable"_a = true);
}

}  // namespace strata::py_bindings
