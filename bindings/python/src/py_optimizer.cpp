#include "py_optimizer.hpp"

#include <cstddef>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "errors.hpp"
#include "py_convert.hpp"
#include "py_futures.hpp"
#include "py_rule.hpp"
#include "py_store.hpp"
#include "strata/base/logging.hpp"
#include "strata/optimizer/offload.hpp"
#include "tensor_ref.hpp"

namespace strata::py_bindings {

namespace {

using namespace pybind11::literals;

/// A dict of hyperparameters: keys are str()-ed; values are anything float() accepts without
/// parsing text (int, float, bool, numpy scalars, 0-d tensors). Strings and ints beyond
/// double range are InvalidArgument (ValueError) naming the key.
optimizer::Hyperparams to_hyperparams(const py::dict& d) {
  optimizer::Hyperparams hp;
  for (auto kv : d) {
    const std::string k = py::str(kv.first);
    if (py::isinstance<py::bool_>(kv.second)) {
      hp[k] = kv.second.cast<bool>() ? 1.0 : 0.0;
      continue;
    }
    const bool text = py::isinstance<py::str>(kv.second) || py::isinstance<py::bytes>(kv.second);
    const double x = text ? -1.0 : PyFloat_AsDouble(kv.second.ptr());
    if (text || (x == -1.0 && PyErr_Occurred())) {
      PyErr_Clear();
      throw StatusError(invalid_argument(
          "hyperparameter '" + k + "' must be a number (int, float or bool), got " +
          type_name(kv.second) + " " + std::string(py::repr(kv.second))));
    }
    hp[k] = x;
  }
  return hp;
}

py::dict from_hyperparams(const optimizer::Hyperparams& hp) {
  py::dict d;
  for (const auto& [k, v] : hp) d[py::str(k)] = v;
  return d;
}

/// None when built-in rule `optimizer` accepts `hyperparams` (absent keys at their
/// defaults); else (key, message): `message` is the rule's InvalidArgument message and `key`
/// the hyperparameter it refuses -- the first, in key order, whose value alone (the others at
/// their defaults) the rule refuses with the same message -- or None when no single key is
/// to blame. Calls the rule's own checks (optimizer/src/optimizers.cpp), so Python repeats
/// none of them.
/// \error InvalidArgument for an unknown optimizer or a non-number value (to_hyperparams).
py::object hyperparams_refusal(const std::string& optimizer, const py::dict& hyperparams) {
  auto factory = check(optimizer::builtin_rule_factory(optimizer));
  const optimizer::Hyperparams hp = to_hyperparams(hyperparams);
  auto rule = factory(hp);
  if (rule.ok()) return py::none();
  const std::string message = rule.status().message();
  for (const auto& [k, v] : hp) {
    auto alone = factory(optimizer::Hyperparams{{k, v}});
    if (!alone.ok() && alone.status().message() == message) return py::make_tuple(k, message);
  }
  return py::make_tuple(py::none(), message);
}

optimizer::Placement to_placement(const std::string& s) {
  if (s == "auto") return optimizer::Placement::kAuto;
  if (s == "host") return optimizer::Placement::kHost;
  if (s == "nvme") return optimizer::Placement::kNvme;
  throw StatusError(invalid_argument("placement must be 'auto', 'host' or 'nvme', got '" + s +
                                     "'"));
}

py::dict stats_dict(const optimizer::StepStats &s) {
  return py::dict(
      "skipped"_a = s.skipped, "grad_norm"_a = s.grad_norm,
      "clip_coef"_a = s.clip_coef, "tensors_updated"_a = s.tensors_updated,
      "numel_updated"_a = s.numel_updated, "bytes_read"_a = s.bytes_read,
      "bytes_written"_a = s.bytes_written, "sub_groups"_a = s.sub_groups,
      "seconds"_a = s.seconds,
      "compute_seconds"_a = s.compute_seconds,
      "io_wait_seconds"_a = s.io_wait_seconds,
      "tensors_started_early"_a = s.tensors_started_early,
      "early_seconds"_a = s.early_seconds, "rolled_back"_a = s.rolled_back);
}

struct StepFutureImpl : FutureImplOf<optimizer::StepStats> {
  using FutureImplOf<optimizer::StepStats>::FutureImplOf;
  py::object value() const override { return stats_dict(*f.result()); }
};

optimizer::NormArithmetic norm_arithmetic(const std::string& name) {
  if (name == "strata") return optimizer::NormArithmetic::kStrata;
  if (name == "torch") return optimizer::NormArithmetic::kTorch;
  throw StatusError(invalid_argument("norm arithmetic must be 'strata' or 'torch', got '" +
                                     name + "'"));
}

/// StepOptions from the Python arguments; `grad_summary` is None or a tuple
/// (grad_norm: float, nonfinite: bool, arithmetic: "strata" | "torch").
optimizer::StepOptions step_options(double max_grad_norm, float grad_scale,
                                    bool skip_if_nonfinite,
                                    const py::object& grad_summary = py::none()) {
  optimizer::StepOptions so;
  so.max_grad_norm = max_grad_norm;
  so.grad_scale = grad_scale;
  so.skip_if_nonfinite = skip_if_nonfinite;
  if (!grad_summary.is_none()) {
    auto t = grad_summary.cast<py::tuple>();
    if (t.size() != 3)
      throw StatusError(invalid_argument(
          "grad_summary must be (grad_norm, nonfinite, arithmetic), got " +
          std::string(py::str(grad_summary))));
    optimizer::StepOptions::GradSummary g;
    g.grad_norm = t[0].cast<double>();
    g.nonfinite = t[1].cast<bool>();
    g.arithmetic = norm_arithmetic(t[2].cast<std::string>());
    so.grad_summary = g;
  }
  return so;
}

/// A gradient dtype: a str that parse_dtype() reads ("float32", "fp16", "bfloat16", ...), a
/// torch dtype (torch.bfloat16: its name without "torch."), or anything numpy.dtype()
/// takes (numpy.float32, numpy.dtype("float16")). Whether the optimizer accepts it (fp32,
/// fp16, bf16) is its own check.
/// \error InvalidArgument naming the value when it names no dtype.
DType to_grad_dtype(const py::handle& v) {
  std::string name;
  if (py::isinstance<py::str>(v)) {
    name = to_text(v, "dtype");
  } else {
    const std::string text = py::str(v);
    if (text.rfind("torch.", 0) == 0) {
      name = text.substr(6);
    } else {
      try {
        name = numpy().attr("dtype")(v).attr("name").cast<std::string>();
      } catch (const py::error_already_set&) {
        throw StatusError(invalid_argument("dtype must be a str, a torch dtype or a numpy "
                                           "dtype, got " + type_name(v) + " " + text));
      }
    }
  }
  auto d = parse_dtype(name);
  if (!d.ok()) throw StatusError(invalid_argument("dtype: " + d.status().message()));
  return *d;
}

/// A state stream index (>= 0; the upper bound is the optimizer's check).
int state_stream(int stream) {
  if (stream < 0) throw StatusError(out_of_range("state stream must be >= 0"));
  return stream;
}

/// One OffloadedOptimizer with the gradient and parameter-copy arrays attached to it.
/// Methods need the GIL and release it around steps, reads, writes and checkpoints.
class PyOptimizer {
 public:
  static std::unique_ptr<PyOptimizer> make(PyStore& store, const std::string& optimizer_name,
                                           const py::dict& hyperparams, bool resume,
                                           const std::string& key_prefix,
                                           uint64_t sub_group_numel, int num_buffers,
                                           py::object pinned_budget, py::object host_budget,
                                           const std::string& default_placement,
                                           int num_threads, bool verify_on_open,
                                           const std::string& arithmetic,
                                           const py::object& python_rule,
                                           const std::string& state_dtype) {
    optimizer::OffloadOptions o;
    o.state_dtype = check(parse_dtype(state_dtype));
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
    std::shared_ptr<PyRuleSpec> spec;
    optimizer::RuleFactory factory;
    if (!python_rule.is_none()) {
      spec = make_rule_spec(python_rule);
      factory = python_rule_factory(spec);
    } else {
      factory = check(arithmetic == "torch" ? optimizer::torch_exact_rule_factory(optimizer_name)
                                            : optimizer::builtin_rule_factory(optimizer_name));
    }
    auto hp = to_hyperparams(hyperparams);
    auto shared = store.shared();
    auto r = release_gil([&] {
      return resume ? optimizer::OffloadedOptimizer::open(shared, factory, o)
                    : optimizer::OffloadedOptimizer::create(shared, factory, hp, o);
    });
    if (!resume && r.status().code() == StatusCode::kAlreadyExists) {
      throw StatusError(already_exists(
          "offload create: store " + shared->options().path + " already holds an optimizer "
          "under '" + key_prefix + "' (OffloadedOptimizer.resume reopens it, "
          "OffloadedOptimizer.remove deletes it)"));
    }
    auto p = std::make_unique<PyOptimizer>();
    p->spec_ = spec;
    p->opt_ = p->checked(std::move(r));
    return p;
  }

  ~PyOptimizer() {
    try {
      close(true);
    } catch (const std::exception& e) {
      log_warn(std::string("strata optimizer: ") + e.what());
    }
  }

  /// fn(optimizer), with the GIL released when the rule is Python: a step in flight
  /// (step_async, an overlapped step's early batches) holds the optimizer's baton, which
  /// most members wait for, and takes the GIL for each call of its rule.
  /// \error FailedPrecondition once closed.
  template <class F>
  auto core(F&& fn) {
    auto& opt = o();
    if (!spec_) return fn(opt);
    py::gil_scoped_release nogil;
    return fn(opt);
  }

  Result<optimizer::ParamInfo> info_of(uint32_t h) {
    return core([h](optimizer::OffloadedOptimizer& c) { return c.param_info(h); });
  }

  /// \error FailedPrecondition once closed.
  optimizer::OffloadedOptimizer& o() {
    if (!opt_) throw StatusError(failed_precondition("the optimizer is closed"));
    return *opt_;
  }

  /// OffloadedOptimizer::close(checkpoint) (GIL released): waits for an in-flight step,
  /// checkpoints when anything changed (unless `checkpoint` is false), and releases the
  /// optimizer, also when the checkpoint fails. Idempotent.
  /// \error the checkpoint's, raised after the release.
  void close(bool checkpoint) {
    if (!opt_) return;
    Status st;
    {
      py::gil_scoped_release nogil;
      st = opt_->close(checkpoint);
      opt_.reset();
    }
    check(st);
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
    auto& opt = o();
    return check(release_gil([&] { return opt.add_param(name, numel, p, group, pl); }));
  }

  /// Attaches `grad` (fp32/fp16/bf16 host array of numel elements; for a zero-size
  /// parameter any empty one, whatever its address) or detaches (None). The array is kept
  /// referenced until replaced.
  void set_grad(uint32_t h, py::object grad) {
    attach(h, grad, false, "gradient", DType::kFloat32, grads_,
           [this](uint32_t p, void* data, DType t) {
             return core([&](optimizer::OffloadedOptimizer& c) { return c.set_grad(p, data, t); });
           });
  }

  /// OffloadedOptimizer::set_grad_object (GIL released: it stats the object): the gradient
  /// of `h` is store object `key`, numel elements of `dtype`. Replaces (and stops
  /// referencing) an array attached with set_grad.
  void set_grad_object(uint32_t h, py::handle key, py::handle dtype) {
    std::string k = to_text(key, "key");
    const DType t = to_grad_dtype(dtype);
    auto& opt = o();
    check(release_gil([&] { return opt.set_grad_object(h, std::move(k), t); }));
    grads_.erase(h);
  }

  /// Attaches `dst` (a writable fp16/bf16/fp32 host array of numel elements) to receive the
  /// updated parameter at each step (fp16/bf16 rounded to nearest even, fp32 the master), or
  /// detaches (None). Kept referenced until replaced.
  void set_param_copy(uint32_t h, py::object dst) {
    attach(h, dst, true, "parameter copy", DType::kBFloat16, copies_,
           [this](uint32_t p, void* data, DType t) {
             return core([&](optimizer::OffloadedOptimizer& c) { return c.set_param_copy(p, data, t); });
           });
  }

  void clear_grads() {
    core([](optimizer::OffloadedOptimizer& c) { c.clear_grads(); });
    grads_.clear();
  }

  py::dict step(double max_grad_norm, float grad_scale, bool skip_if_nonfinite,
                const py::object& grad_summary) {
    const auto so = step_options(max_grad_norm, grad_scale, skip_if_nonfinite, grad_summary);
    auto& opt = o();
    if (spec_) spec_->take_error();  // one of an earlier step_async: not this step's cause
    return stats_dict(checked(release_gil([&] { return opt.step(so); })));
  }

  PyFuture step_async(double max_grad_norm, float grad_scale, bool skip_if_nonfinite,
                      const py::object& grad_summary) {
    const auto so = step_options(max_grad_norm, grad_scale, skip_if_nonfinite, grad_summary);
    auto& opt = o();
    auto f = release_gil([&] { return opt.step_async(so); });
    // The attached gradient/copy buffers are referenced by grads_/copies_ (this object);
    // the future's destructor waits for the step.
    return PyFuture(std::make_unique<StepFutureImpl>(std::move(f)), py::none(), {});
  }

  /// Opens an overlapped step (OffloadedOptimizer::begin_step).
  void begin_step(double max_grad_norm, float grad_scale, bool skip_if_nonfinite) {
    const auto so = step_options(max_grad_norm, grad_scale, skip_if_nonfinite);
    auto& opt = o();
    check(release_gil([&] { return opt.begin_step(so); }));
  }

  /// start_update() of `entries`, a list of (handle, grad, param_copy or None[, master or
  /// None[, transient]]): host fp32/fp16/bf16 arrays of the parameter's numel elements
  /// (master: fp32, contiguous), kept referenced until finish_step()/abort_step() -- or,
  /// transient ones (EarlyGrad::transient), until wait_started() also.
  void start_update(const py::list& entries) {
    std::vector<optimizer::EarlyGrad> gs;
    std::vector<TensorRef> refs, transient_refs;
    for (py::handle item : entries) {
      auto t = item.cast<py::tuple>();
      if (t.size() < 3 || t.size() > 5)
        throw StatusError(invalid_argument(
            "start_update: entries are (handle, grad, param_copy[, master[, transient]])"));
      const uint32_t h = t[0].cast<uint32_t>();
      const auto& [name, numel] = entry_info(h);
      optimizer::EarlyGrad g;
      g.param = h;
      g.transient = t.size() > 4 && t[4].cast<bool>();
      auto& keep = g.transient ? transient_refs : refs;
      TensorRef gr = view_tensor(t[1], false, std::nullopt);
      if (gr.device || gr.numel != numel)
        throw StatusError(invalid_argument("start_update: the gradient of '" + name +
                                           "' must be a host array of " +
                                           std::to_string(numel) + " elements"));
      static std::byte empty_dummy;
      g.grad = gr.numel == 0 ? static_cast<const void*>(&empty_dummy) : gr.data;
      g.grad_type = gr.dtype;
      keep.push_back(std::move(gr));
      if (!py::reinterpret_borrow<py::object>(t[2]).is_none()) {
        TensorRef cr = view_tensor(t[2], true, std::nullopt);
        if (cr.device || cr.numel != numel)
          throw StatusError(invalid_argument("start_update: the param copy of '" + name +
                                             "' must be a writable host array of " +
                                             std::to_string(numel) + " elements"));
        g.param_copy = cr.numel == 0 ? nullptr : cr.data;
        g.param_copy_type = cr.dtype;
        refs.push_back(std::move(cr));
      }
      if (t.size() > 3 && !py::reinterpret_borrow<py::object>(t[3]).is_none()) {
        TensorRef mr = view_tensor(t[3], false, std::nullopt);
        if (mr.device || mr.numel != numel || mr.dtype != DType::kFloat32)
          throw StatusError(invalid_argument("start_update: the master of '" + name +
                                             "' must be a host float32 array of " +
                                             std::to_string(numel) + " elements"));
        g.master = numel == 0 ? nullptr : static_cast<const float*>(mr.data);
        keep.push_back(std::move(mr));
      }
      gs.push_back(g);
    }
    auto& opt = o();
    check(release_gil([&] { return opt.start_update(gs); }));
    for (auto& r : refs) early_refs_.push_back(std::move(r));
    for (auto& r : transient_refs) transient_refs_.push_back(std::move(r));
  }

  py::dict finish_step(double max_grad_norm, float grad_scale, bool skip_if_nonfinite,
                       const py::object& grad_summary) {
    const auto so = step_options(max_grad_norm, grad_scale, skip_if_nonfinite, grad_summary);
    auto& opt = o();
    auto r = release_gil([&] { return opt.finish_step(so); });
    early_refs_.clear();
    transient_refs_.clear();
    return stats_dict(checked(std::move(r)));
  }

  void abort_step() {
    auto& opt = o();
    Status st = release_gil([&] { return opt.abort_step(); });
    early_refs_.clear();
    transient_refs_.clear();
    check(st);
  }

  bool step_open() { return core([](optimizer::OffloadedOptimizer& c) { return c.step_open(); }); }

  void wait_started() {
    auto& opt = o();
    check(release_gil([&] { return opt.wait_started(); }));
    transient_refs_.clear();  // their early updates ran: the buffers are no longer read
  }

  /// Reads (stream < 0: the master) into `out` (fp32, count elements) or a new array.
  py::object read(uint32_t h, int stream, py::object out, uint64_t offset, uint64_t count) {
    const uint64_t numel = check(info_of(h)).numel;
    if (count == optimizer::kToEnd) count = offset <= numel ? numel - offset : 0;
    if (out.is_none()) out = numpy().attr("empty")(py::int_(count), "dtype"_a = "float32");
    TensorRef r = view_tensor(out, true, std::nullopt);
    if (r.device || r.dtype != DType::kFloat32 || r.numel != count)
      throw StatusError(invalid_argument("out must be a host float32 array of " +
                                         std::to_string(count) + " elements"));
    auto& opt = o();
    auto* dst = static_cast<float*>(r.data);
    check(release_gil([&] {
      return stream < 0 ? opt.read_param(h, dst, offset, count)
                        : opt.read_state(h, stream, dst, offset, count);
    }));
    return out;
  }

  /// Writes `src` (host fp32) at element `offset` of the master (stream < 0) or a state.
  void write(uint32_t h, int stream, py::handle src, uint64_t offset) {
    TensorRef r = view_tensor(src, false, std::nullopt);
    if (r.device || r.dtype != DType::kFloat32)
      throw StatusError(invalid_argument("src must be a host float32 array"));
    auto& opt = o();
    const auto* data = static_cast<const float*>(r.data);
    check(release_gil([&] {
      return stream < 0 ? opt.write_param(h, data, offset, r.numel)
                        : opt.write_state(h, stream, data, offset, r.numel);
    }));
  }

  void checkpoint() {
    auto& opt = o();
    check(release_gil([&] { return opt.checkpoint(); }));
  }

  py::dict param_info(uint32_t h) {
    auto i = check(info_of(h));
    return py::dict(
        "name"_a = i.name, "numel"_a = i.numel,
        "placement"_a = std::string(optimizer::placement_name(i.placement)),
        "group"_a = i.group, "step"_a = i.step, "has_grad"_a = i.has_grad,
        "master_key"_a = i.master_key);
  }

 private:
  /// set_grad / set_param_copy: views `arr` (None detaches: `set(h, nullptr, none_dtype)`),
  /// checks it is host memory of the parameter's numel (InvalidArgument naming `what` and the
  /// parameter), hands it to `set` and keeps it referenced in `held`. An empty array may
  /// have no address (torch's data_ptr() of a zero-size tensor is 0) while a null pointer
  /// means "detach": for a zero-size parameter `set` gets the address of a static dummy
  /// byte instead, which the optimizer never reads or writes (numel 0).
  template <class Set>
  void attach(uint32_t h, py::object arr, bool writable, const char* what, DType none_dtype,
              std::map<uint32_t, TensorRef>& held, Set set) {
    if (arr.is_none()) {
      check(set(h, nullptr, none_dtype));
      held.erase(h);
      return;
    }
    TensorRef r = view_tensor(arr, writable, std::nullopt);
    auto info = check(info_of(h));
    const std::string of = std::string(what) + " of '" + info.name + "'";
    if (r.device) throw StatusError(invalid_argument(of + " must be in host memory"));
    if (r.numel != info.numel)
      throw StatusError(invalid_argument(of + " has " + std::to_string(r.numel) +
                                         " elements, expected " + std::to_string(info.numel)));
    static std::byte empty_dummy;
    check(set(h, r.numel == 0 ? static_cast<void*>(&empty_dummy) : r.data, r.dtype));
    held[h] = std::move(r);
  }

  /// check(r), but an error caused by an exception of the Python rule's callable raises the
  /// strata error with that exception as its __cause__.
  template <class T>
  T checked(Result<T> r) {
    if (r.ok()) return std::move(r).value();
    py::object cause = spec_ ? spec_->take_error() : py::none();
    if (cause.is_none()) throw StatusError(r.status());
    py::object exc = exception_of(r.status());
    PyException_SetCause(exc.ptr(), cause.release().ptr());  // steals the reference
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    throw py::error_already_set();
  }

  std::shared_ptr<PyRuleSpec> spec_;  // the Python rule, or null (a built-in rule)
  std::unique_ptr<optimizer::OffloadedOptimizer> opt_;
  std::map<uint32_t, TensorRef> grads_;
  std::map<uint32_t, TensorRef> copies_;
  std::vector<TensorRef> early_refs_;  // start_update()'s arrays, until finish/abort
  std::vector<TensorRef> transient_refs_;  // ... transient ones, until wait_started() too
  /// (name, numel) of a handle, cached: start_update() runs during backward and must not
  /// wait for the baton an early batch holds (param_info() takes it); a handle's name and
  /// size never change.
  std::unordered_map<uint32_t, std::pair<std::string, uint64_t>> entry_info_;
  const std::pair<std::string, uint64_t>& entry_info(uint32_t h) {
    auto it = entry_info_.find(h);
    if (it == entry_info_.end()) {
      auto i = check(info_of(h));
      it = entry_info_.emplace(h, std::make_pair(i.name, i.numel)).first;
    }
    return it->second;
  }
};

}  // namespace

void register_optimizer(py::module_& m) {
  py::class_<PyOptimizer>(m, "_OffloadedOptimizer")
      .def_static("create", [](PyStore& store, const std::string& name, const py::dict& hp,
                               bool resume, py::handle key_prefix,
                               py::handle sub_group_numel, int num_buffers,
                               py::object pinned_budget, py::object host_budget,
                               const std::string& default_placement, int num_threads,
                               bool verify_on_open, const std::string& arithmetic,
                               const py::object& python_rule, const std::string& state_dtype) {
        return PyOptimizer::make(store, name, hp, resume, to_text(key_prefix, "key_prefix"),
                                 to_u64(sub_group_numel, "sub_group_numel"),
                                 num_buffers, pinned_budget, host_budget, default_placement,
                                 num_threads, verify_on_open, arithmetic, python_rule,
                                 state_dtype);
      }, "store"_a, "optimizer"_a = "adamw", "hyperparams"_a = py::dict(), "resume"_a = false,
         "key_prefix"_a = "optim/", "sub_group_numel"_a = 0, "num_buffers"_a = 4,
         "pinned_budget"_a = py::none(), "host_budget"_a = py::none(),
         "default_placement"_a = "auto", "num_threads"_a = 0, "verify_on_open"_a = false,
         "arithmetic"_a = "simd", "python_rule"_a = py::none(), "state_dtype"_a = "fp32")
      .def_static("remove", [](PyStore& store, py::handle key_prefix, py::object python_rule) {
        optimizer::OffloadOptions o;
        o.key_prefix = to_text(key_prefix, "key_prefix");
        // a checkpoint written with a Python rule names it: its factory opens the record
        optimizer::RuleFactory factory;
        if (!python_rule.is_none()) factory = python_rule_factory(make_rule_spec(python_rule));
        auto shared = store.shared();
        check(release_gil([&] { return optimizer::OffloadedOptimizer::remove(shared, factory, o); }));
      }, "store"_a, "key_prefix"_a = "optim/", "python_rule"_a = py::none())
      .def("close", &PyOptimizer::close, "checkpoint"_a = true)
      .def("add_param_group", [](PyOptimizer& o, const py::dict& hp) {
        const auto h = to_hyperparams(hp);
        return check(o.core([&](optimizer::OffloadedOptimizer& c) { return c.add_param_group(h); }));
      })
      .def("num_param_groups", [](PyOptimizer& o) {
        return o.core([](optimizer::OffloadedOptimizer& c) { return c.num_param_groups(); });
      })
      .def("hyperparams", [](PyOptimizer& o, int g) {
        return from_hyperparams(check(o.core([&](optimizer::OffloadedOptimizer& c) { return c.hyperparams(g); })));
      })
      .def("set_hyperparams", [](PyOptimizer& o, int g, const py::dict& hp) {
        const auto h = to_hyperparams(hp);
        check(o.core([&](optimizer::OffloadedOptimizer& c) { return c.set_hyperparams(g, h); }));
      })
      .def("add_param", [](PyOptimizer& o, py::handle name, py::handle numel, py::object init,
                           int group, const std::string& placement) {
        return o.add_param(to_text(name, "name"), to_u64(numel, "numel"), std::move(init), group,
                           placement);
      }, "name"_a, "numel"_a, "init"_a = py::none(), "group"_a = 0, "placement"_a = "auto")
      .def("num_params", [](PyOptimizer& o) {
        return o.core([](optimizer::OffloadedOptimizer& c) { return c.num_params(); });
      })
      .def("param_info", &PyOptimizer::param_info)
      .def("find_param", [](PyOptimizer& o, const std::string& n) {
        return check(o.core([&](optimizer::OffloadedOptimizer& c) { return c.find_param(n); }));
      })
      .def("set_grad", &PyOptimizer::set_grad, "param"_a, "grad"_a)
      .def("set_grad_object", &PyOptimizer::set_grad_object, "param"_a, "key"_a, "dtype"_a)
      .def("set_param_copy", &PyOptimizer::set_param_copy, "param"_a, "dst"_a)
      .def("clear_grads", &PyOptimizer::clear_grads)
      .def("begin_step", &PyOptimizer::begin_step, "max_grad_norm"_a = 0.0,
           "grad_scale"_a = 1.0f, "skip_if_nonfinite"_a = true)
      .def("start_update", &PyOptimizer::start_update, "entries"_a)
      .def("finish_step", &PyOptimizer::finish_step, "max_grad_norm"_a = 0.0,
           "grad_scale"_a = 1.0f, "skip_if_nonfinite"_a = true, "grad_summary"_a = py::none())
      .def("abort_step", &PyOptimizer::abort_step)
      .def("step_open", &PyOptimizer::step_open)
      .def("wait_started", &PyOptimizer::wait_started)
      .def("step", &PyOptimizer::step, "max_grad_norm"_a = 0.0, "grad_scale"_a = 1.0f,
           "skip_if_nonfinite"_a = true, "grad_summary"_a = py::none())
      .def("step_async", &PyOptimizer::step_async, "max_grad_norm"_a = 0.0,
           "grad_scale"_a = 1.0f, "skip_if_nonfinite"_a = true, "grad_summary"_a = py::none())
      .def("read_param", [](PyOptimizer& o, uint32_t h, py::object out, py::handle off,
                            py::handle count) {
        return o.read(h, -1, out, to_u64(off, "offset"), to_u64(count, "count"));
      }, "param"_a, "out"_a = py::none(), "offset"_a = 0, "count"_a = optimizer::kToEnd)
      .def("write_param", [](PyOptimizer& o, uint32_t h, py::handle src, py::handle off) {
        o.write(h, -1, src, to_u64(off, "offset"));
      }, "param"_a, "src"_a, "offset"_a = 0)
      .def("read_state", [](PyOptimizer& o, uint32_t h, int stream, py::object out,
                            py::handle off, py::handle count) {
        return o.read(h, state_stream(stream), out, to_u64(off, "offset"),
                      to_u64(count, "count"));
      }, "param"_a, "stream"_a, "out"_a = py::none(), "offset"_a = 0,
         "count"_a = optimizer::kToEnd)
      .def("write_state", [](PyOptimizer& o, uint32_t h, int stream, py::handle src,
                             py::handle off) {
        o.write(h, state_stream(stream), src, to_u64(off, "offset"));
      }, "param"_a, "stream"_a, "src"_a, "offset"_a = 0)
      .def("step_count", [](PyOptimizer& o, uint32_t h) {
        return check(o.core([&](optimizer::OffloadedOptimizer& c) { return c.step_count(h); }));
      })
      .def("set_step_count", [](PyOptimizer& o, uint32_t h, int64_t s) {
        check(o.core([&](optimizer::OffloadedOptimizer& c) { return c.set_step_count(h, s); }));
      })
      .def("checkpoint", &PyOptimizer::checkpoint)
      .def("stats", [](PyOptimizer& o) {
        const optimizer::OptimizerStats t = o.core([](optimizer::OffloadedOptimizer& c) { return c.stats(); });
        return py::dict("steps"_a = t.steps, "steps_skipped"_a = t.steps_skipped,
                        "steps_rolled_back"_a = t.steps_rolled_back, "sub_groups"_a = t.sub_groups,
                        "tensors_updated"_a = t.tensors_updated, "numel_updated"_a = t.numel_updated,
                        "bytes_read"_a = t.bytes_read, "bytes_written"_a = t.bytes_written,
                        "step_seconds"_a = t.step_seconds, "update_seconds"_a = t.update_seconds,
                        "io_wait_seconds"_a = t.io_wait_seconds, "early_seconds"_a = t.early_seconds,
                        "overlap"_a = t.overlap());
      })
      .def("reset_stats", [](PyOptimizer& o) { o.core([](optimizer::OffloadedOptimizer& c) { c.reset_stats(); }); })
      .def("num_states", [](PyOptimizer& o) { return o.o().num_states(); })
      .def("state_name", [](PyOptimizer& o, int i) { return o.o().state_name(i); })
      .def("rule_name", [](PyOptimizer& o) { return o.o().rule_name(); })
      .def("sub_group_numel", [](PyOptimizer& o) { return o.o().sub_group_numel(); })
      .def("pinned_bytes", [](PyOptimizer& o) { return o.o().pinned_bytes(); })
      .def("host_bytes", [](PyOptimizer& o) {
        return o.core([](optimizer::OffloadedOptimizer& c) { return c.host_bytes(); });
      })
      .def("disk_space", [](PyOptimizer& o, const std::vector<uint64_t>& more) {
        auto& opt = o.o();
        auto n = check(release_gil([&] { return opt.disk_space(more); }));
        return py::dict("state_bytes"_a = n.state_bytes, "in_flight_bytes"_a = n.in_flight_bytes,
                        "margin_bytes"_a = n.margin_bytes, "need_bytes"_a = n.need_bytes,
                        "held_bytes"_a = n.held_bytes, "free_bytes"_a = n.free_bytes,
                        "short_path"_a = n.short_path, "short_need"_a = n.short_need,
                        "short_free"_a = n.short_free);
      }, "more_numels"_a = std::vector<uint64_t>{})
      .def("check_disk_space", [](PyOptimizer& o, const std::vector<uint64_t>& more) {
        auto& opt = o.o();
        check(release_gil([&] { return opt.check_disk_space(more); }));
      }, "more_numels"_a = std::vector<uint64_t>{});

  m.def("builtin_default_hyperparams", [](const std::string& name) {
    return from_hyperparams(check(optimizer::builtin_default_hyperparams(name)));
  }, "optimizer"_a);
  m.def("decide_gate", [](double max_grad_norm, float grad_scale, bool skip_if_nonfinite,
                          double grad_norm, bool nonfinite, const std::string& arithmetic) {
    const auto d = optimizer::decide_gate(max_grad_norm, grad_scale, skip_if_nonfinite,
                                          grad_norm, nonfinite, norm_arithmetic(arithmetic));
    return py::dict("skipped"_a = d.skip, "grad_norm"_a = d.grad_norm,
                    "clip_coef"_a = d.clip_coef, "grad_scale"_a = d.grad_scale);
  }, "max_grad_norm"_a, "grad_scale"_a, "skip_if_nonfinite"_a, "grad_norm"_a, "nonfinite"_a,
     "arithmetic"_a,
        "The gate of a step (optimizer::decide_gate, grad_utils.hpp): a dict of skipped, "
        "grad_norm, clip_coef, grad_scale. arithmetic: 'strata' or 'torch' (where grad_norm "
        "came from: torch's fp32 norm gives torch.nn.utils.clip_grad_norm_'s coefficient).");
  m.def("hyperparams_refusal", &hyperparams_refusal, "optimizer"_a, "hyperparams"_a,
        "None when the built-in rule `optimizer` accepts `hyperparams` (a dict of numbers; "
        "absent keys take their defaults), else (key, message): the rule's InvalidArgument "
        "message and the hyperparameter it refuses (None when no single one is to blame). "
        "InvalidArgumentError for an unknown optimizer or a value that is not a number.");
}

}  // namespace strata::py_bindings
