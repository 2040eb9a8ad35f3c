// The Python update rule (py_rule.hpp). Its update runs on whatever thread calls
// apply_update() -- the thread of step(), which released the GIL, or the overlapped step's
// thread -- and takes the GIL for the call (PyGILState_Ensure through gil_scoped_acquire).
// No strata lock is held that a Python thread could wait for while holding the GIL: the
// step bindings release the GIL before they take the optimizer's baton.
#include "py_rule.hpp"

#include <cstddef>
#include <string>

#include <pybind11/numpy.h>

#include "errors.hpp"
#include "py_convert.hpp"

namespace strata::py_bindings {

namespace {

using namespace pybind11::literals;

/// The owner of the arrays handed to the callable: none (they are views of strata's
/// buffers, valid during the call only).
py::capsule borrowed() {
  static char dummy;
  return py::capsule(static_cast<void*>(&dummy), [](void*) {});
}

/// A writable 1-D numpy view of `numel` elements at `data` (no copy). The gradient's is
/// writable too (torch.from_numpy warns on read-only arrays); the rule must not write it.
py::array view(const char* dtype, const void* data, size_t numel, size_t itemsize) {
  return py::array(py::dtype(dtype), {static_cast<py::ssize_t>(numel)},
                   {static_cast<py::ssize_t>(itemsize)}, data, borrowed());
}

class PyRule final : public optimizer::UpdateRule {
 public:
  PyRule(std::shared_ptr<PyRuleSpec> spec, optimizer::Hyperparams hp)
      : spec_(std::move(spec)), hp_(std::move(hp)) {}

  std::string_view name() const override { return spec_->name; }
  int num_states() const override { return static_cast<int>(spec_->state_names.size()); }
  std::string_view state_name(int i) const override { return spec_->state_names[i]; }
  float state_init_value(int i) const override { return spec_->state_inits[i]; }
  bool whole_spans() const override { return true; }
  bool may_fail() const override { return true; }

  void update(const optimizer::UpdateSpans& s, const optimizer::StepInfo& info) const override {
    (void)update_or_fail(s, info);  // apply_update() calls update_or_fail(): never reached
  }

  Status update_or_fail(const optimizer::UpdateSpans& s,
                        const optimizer::StepInfo& info) const override {
    if (s.numel == 0) return Status::OK();
    {
      py::gil_scoped_acquire gil;
      try {
        const char* gdt = s.grad_type == DType::kFloat32   ? "float32"
                          : s.grad_type == DType::kFloat16 ? "float16"
                                                           : "uint16";  // bf16 bits
        py::tuple states(num_states());
        for (int k = 0; k < num_states(); ++k) {
          states[k] = view("float32", s.states[k], s.numel, 4);
        }
        py::dict hp;
        for (const auto& [k, v] : hp_) hp[py::str(k)] = v;
        py::dict ctx("param"_a = info.param, "name"_a = std::string(info.param_name),
                     "offset"_a = info.offset, "grad_scale"_a = info.grad_scale,
                     "grad_dtype"_a = s.grad_type == DType::kFloat32   ? "float32"
                                     : s.grad_type == DType::kFloat16 ? "float16"
                                                                      : "bfloat16");
        spec_->update(view("float32", s.param, s.numel, 4),
                      view(gdt, s.grad, s.numel, dtype_size(s.grad_type)), states,
                      info.step, hp, ctx);
      } catch (py::error_already_set& e) {
        const std::string what = py::str(e.type().attr("__name__")).cast<std::string>() +
                                 ": " + py::str(e.value()).cast<std::string>();
        {
          std::lock_guard<std::mutex> lk(spec_->error_mu);
          Py_XDECREF(spec_->error);
          spec_->error = e.value().inc_ref().ptr();
        }
        return invalid_argument("python update rule '" + spec_->name + "' raised on parameter '" +
                                std::string(info.param_name) + "' (elements [" +
                                std::to_string(info.offset) + ", " +
                                std::to_string(info.offset + s.numel) + "), step " +
                                std::to_string(info.step) + "): " + what);
      } catch (const std::exception& e) {  // a conversion of pybind11: never escapes the step
        return internal_error("python update rule '" + spec_->name + "' on parameter '" +
                              std::string(info.param_name) + "': " + e.what());
      }
    }
    if (s.param_copy != nullptr) {  // fp16/bf16 (apply_update copies an fp32 one itself)
      optimizer::store_converted(s.param, s.param_copy_type, s.param_copy, s.numel);
    }
    return Status::OK();
  }

 private:
  std::shared_ptr<PyRuleSpec> spec_;
  optimizer::Hyperparams hp_;
};

}  // namespace

PyRuleSpec::~PyRuleSpec() {
  if (!Py_IsInitialized()) {  // interpreter gone: leak the references
    update.release();
    return;
  }
  py::gil_scoped_acquire gil;
  update = py::object();
  Py_XDECREF(error);
}

py::object PyRuleSpec::take_error() {
  std::lock_guard<std::mutex> lk(error_mu);
  if (error == nullptr) return py::none();
  PyObject* e = error;
  error = nullptr;
  return py::reinterpret_steal<py::object>(e);
}

std::shared_ptr<PyRuleSpec> make_rule_spec(const py::handle& spec) {
  auto s = std::make_shared<PyRuleSpec>();
  s->name = to_text(spec.attr("name"), "rule name");
  if (s->name.empty()) throw StatusError(invalid_argument("a python rule needs a name"));
  for (py::handle n : spec.attr("state_names")) s->state_names.push_back(to_text(n, "state name"));
  if (s->state_names.size() > static_cast<size_t>(optimizer::kMaxStateStreams)) {
    throw StatusError(invalid_argument(
        "python rule '" + s->name + "' has " + std::to_string(s->state_names.size()) +
        " state streams, at most " + std::to_string(optimizer::kMaxStateStreams)));
  }
  for (py::handle v : spec.attr("state_inits")) s->state_inits.push_back(v.cast<float>());
  if (s->state_inits.empty()) s->state_inits.assign(s->state_names.size(), 0.0f);
  if (s->state_inits.size() != s->state_names.size()) {
    throw StatusError(invalid_argument("python rule '" + s->name + "': " +
                                       std::to_string(s->state_inits.size()) +
                                       " state_inits for " +
                                       std::to_string(s->state_names.size()) + " states"));
  }
  for (auto kv : spec.attr("defaults").cast<py::dict>()) {
    const std::string k = py::str(kv.first);
    const double x = PyFloat_AsDouble(kv.second.ptr());
    if (x == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      throw StatusError(invalid_argument("python rule '" + s->name + "': default of '" + k +
                                         "' must be a number, got " + type_name(kv.second)));
    }
    s->defaults[k] = x;
  }
  s->update = py::reinterpret_borrow<py::object>(spec.attr("update"));
  if (!PyCallable_Check(s->update.ptr())) {
    throw StatusError(invalid_argument("python rule '" + s->name + "': update must be callable, "
                                       "got " + type_name(s->update)));
  }
  return s;
}

optimizer::RuleFactory python_rule_factory(std::shared_ptr<PyRuleSpec> spec) {
  return [spec](const optimizer::Hyperparams& given)
             -> Result<std::unique_ptr<optimizer::UpdateRule>> {
    optimizer::Hyperparams hp = spec->defaults;
    for (const auto& [k, v] : given) {
      auto it = hp.find(k);
      if (it == hp.end()) {
        std::string known;
        for (const auto& [d, _] : spec->defaults) known += (known.empty() ? "" : ", ") + d;
        return invalid_argument("python rule '" + spec->name + "' has no hyperparameter '" + k +
                                "' (it takes: " + (known.empty() ? "none" : known) + ")");
      }
      it->second = v;
    }
    return std::unique_ptr<optimizer::UpdateRule>(new PyRule(spec, std::move(hp)));
  };
}

}  // namespace strata::py_bindings
