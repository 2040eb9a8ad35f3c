// C API: custom update rules (strata_rule_t) as optimizer::UpdateRule.
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "c_optimizer.hpp"
#include "strata/optimizer/update.hpp"

namespace strata::capi {

namespace {

namespace so = strata::optimizer;

/// What a C rule is made of: copies of strata_rule_t's strings and arrays.
struct CRuleSpec {
  std::string name;
  std::vector<std::string> state_names;
  std::vector<float> state_inits;
  std::vector<std::string> hp_names;
  std::vector<double> hp_defaults;
  strata_update_fn update = nullptr;
  void* user_data = nullptr;
  bool whole_spans = false;
  bool may_fail = true;
};

static_assert(STRATA_MAX_STATES == so::kMaxStateStreams);
static_assert(STRATA_RULE_TILE_NUMEL == so::kTileNumel);

class CRule final : public so::UpdateRule {
 public:
  CRule(std::shared_ptr<const CRuleSpec> spec, std::vector<double> hp)
      : spec_(std::move(spec)), hp_(std::move(hp)) {}

  std::string_view name() const override { return spec_->name; }
  int num_states() const override { return static_cast<int>(spec_->state_names.size()); }
  std::string_view state_name(int i) const override { return spec_->state_names[i]; }
  float state_init_value(int i) const override { return spec_->state_inits[i]; }
  bool whole_spans() const override { return spec_->whole_spans; }
  bool may_fail() const override { return spec_->may_fail; }

  void update(const so::UpdateSpans& s, const so::StepInfo& info) const override {
    (void)update_or_fail(s, info);  // apply_update() calls update_or_fail()
  }

  Status update_or_fail(const so::UpdateSpans& s, const so::StepInfo& info) const override {
    if (s.numel == 0) return Status::OK();
    // The gradient as fp32 times grad_scale: the attached buffer itself when it
    // already is.
    const float* grad = static_cast<const float*>(s.grad);
    thread_local std::vector<float> tile_buf;
    std::vector<float> whole_buf;
    if (s.grad_type != DType::kFloat32 || info.grad_scale != 1.0f) {
      float* buf;
      if (s.numel <= so::kTileNumel) {
        if (tile_buf.size() < so::kTileNumel) tile_buf.resize(so::kTileNumel);
        buf = tile_buf.data();
      } else {
        whole_buf.resize(s.numel);
        buf = whole_buf.data();
      }
      so::load_scaled_grad(s.grad, s.grad_type, info.grad_scale, buf, s.numel);
      grad = buf;
    }
    strata_update_spans_t spans{};
    spans.param = s.param;
    spans.grad = grad;
    for (int k = 0; k < num_states(); ++k) spans.states[k] = s.states[k];
    spans.numel = s.numel;
    const std::string param_name(info.param_name);
    char error[256] = {0};
    strata_update_info_t ci{};
    ci.step = info.step;
    ci.grad_scale = info.grad_scale;
    ci.param = info.param;
    ci.param_name = param_name.c_str();
    ci.offset = info.offset;
    ci.hyperparams = hp_.data();
    ci.error = error;
    ci.error_size = sizeof(error);
    const strata_status_t rc = spec_->update(&spans, &ci, spec_->user_data);
    if (rc != STRATA_OK) {
      error[sizeof(error) - 1] = '\0';
      const bool known = rc >= STRATA_ERR_INVALID_ARGUMENT && rc <= STRATA_ERR_PERMISSION_DENIED;
      return Status(known ? static_cast<StatusCode>(rc) : StatusCode::kInternal,
                    "custom rule '" + spec_->name + "' returned " +
                        (known ? std::string(strata_status_name(rc))
                               : "status value " + std::to_string(static_cast<int>(rc))) +
                        " on parameter '" + param_name + "' (elements [" +
                        std::to_string(info.offset) + ", " + std::to_string(info.offset + s.numel) +
                        "), step " + std::to_string(info.step) + ")" +
                        (error[0] != '\0' ? std::string(": ") + error : std::string()));
    }
    if (s.param_copy != nullptr && s.param_copy_type != DType::kFloat32) {
      so::store_converted(s.param, s.param_copy_type, s.param_copy, s.numel);
    }
    return Status::OK();
  }

 private:
  std::shared_ptr<const CRuleSpec> spec_;
  std::vector<double> hp_;  ///< in the order of spec_->hp_names
};

/// A printable-ASCII name without whitespace (names end up in store keys and
/// records).
bool plain_name(const char* s) {
  if (s == nullptr || *s == '\0') return false;
  for (const char* c = s; *c; ++c) {
    if (*c <= ' ' || *c > '~') return false;
  }
  return true;
}

}  // namespace

Result<so::RuleFactory> c_rule_factory(const strata_rule_t* r, so::Hyperparams* defaults) {
  if (r->struct_size < offsetof(strata_rule_t, may_fail) + sizeof(int))
    return invalid_argument("rule not initialized with STRATA_RULE_INIT (struct_size " +
                            std::to_string(r->struct_size) + ")");
  if (!plain_name(r->name))
    return invalid_argument("rule.name must be non-empty printable ASCII without whitespace");
  auto spec = std::make_shared<CRuleSpec>();
  spec->name = r->name;
  const std::string what = "rule '" + spec->name + "': ";
  if (so::builtin_rule_factory(spec->name).ok())
    return invalid_argument(what +
                            "the name of a built-in optimizer (set options.optimizer "
                            "for it, or give the custom rule another name)");
  if (r->num_states < 0 || r->num_states > STRATA_MAX_STATES)
    return invalid_argument(what + "num_states " + std::to_string(r->num_states) +
                            " is outside 0.." + std::to_string(STRATA_MAX_STATES));
  if (r->num_states > 0 && r->state_names == nullptr)
    return invalid_argument(what + "state_names is NULL with num_states " +
                            std::to_string(r->num_states));
  std::set<std::string> seen;
  for (int i = 0; i < r->num_states; ++i) {
    if (!plain_name(r->state_names[i]))
      return invalid_argument(what + "state_names[" + std::to_string(i) +
                              "] must be non-empty printable ASCII without whitespace");
    if (!seen.insert(r->state_names[i]).second)
      return invalid_argument(what + "state name '" + std::string(r->state_names[i]) +
                              "' appears twice");
    spec->state_names.emplace_back(r->state_names[i]);
    spec->state_inits.push_back(r->state_inits ? r->state_inits[i] : 0.0f);
  }
  if (r->num_hyperparams > 0 &&
      (r->hyperparam_names == nullptr || r->hyperparam_defaults == nullptr))
    return invalid_argument(what +
                            "hyperparam_names or hyperparam_defaults is NULL with "
                            "num_hyperparams " +
                            std::to_string(r->num_hyperparams));
  seen.clear();
  for (size_t i = 0; i < r->num_hyperparams; ++i) {
    if (!plain_name(r->hyperparam_names[i]))
      return invalid_argument(what + "hyperparam_names[" + std::to_string(i) +
                              "] must be non-empty printable ASCII without whitespace");
    if (!seen.insert(r->hyperparam_names[i]).second)
      return invalid_argument(what + "hyperparameter '" + std::string(r->hyperparam_names[i]) +
                              "' appears twice");
    spec->hp_names.emplace_back(r->hyperparam_names[i]);
    spec->hp_defaults.push_back(r->hyperparam_defaults[i]);
  }
  if (r->update == nullptr) return invalid_argument(what + "update is NULL");
  spec->update = r->update;
  spec->user_data = r->user_data;
  spec->whole_spans = r->whole_spans != 0;
  spec->may_fail = r->may_fail != 0;
  if (defaults != nullptr) {
    defaults->clear();
    for (size_t i = 0; i < spec->hp_names.size(); ++i)
      (*defaults)[spec->hp_names[i]] = spec->hp_defaults[i];
  }
  std::shared_ptr<const CRuleSpec> cspec = std::move(spec);
  return so::RuleFactory(
      [cspec](const so::Hyperparams& given) -> Result<std::unique_ptr<so::UpdateRule>> {
        std::vector<double> hp = cspec->hp_defaults;
        for (const auto& [k, v] : given) {
          size_t i = 0;
          while (i < cspec->hp_names.size() && cspec->hp_names[i] != k) ++i;
          if (i == cspec->hp_names.size()) {
            std::string known;
            for (const auto& n : cspec->hp_names) known += (known.empty() ? "" : ", ") + n;
            return invalid_argument("custom rule '" + cspec->name + "' has no hyperparameter '" +
                                    k + "' (it takes: " + (known.empty() ? "none" : known) + ")");
          }
          hp[i] = v;
        }
        return std::unique_ptr<so::UpdateRule>(new CRule(cspec, std::move(hp)));
      });
}

}  // namespace strata::capi
