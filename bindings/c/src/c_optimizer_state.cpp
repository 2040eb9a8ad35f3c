// C API: the offloaded optimizer's param groups, state access and step options
// (strata.h, "since STRATA_C_API_VERSION 6").
#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>

#include "c_optimizer.hpp"

using namespace strata;
using namespace strata::capi;
namespace so = strata::optimizer;

namespace {

/// Hyperparams from parallel arrays; InvalidArgument for NULL entries.
Result<so::Hyperparams> make_hyperparams(const char* const* keys, const double* values, size_t n) {
  if (n > 0 && (keys == nullptr || values == nullptr))
    return invalid_argument("keys or values is NULL");
  so::Hyperparams hp;
  for (size_t i = 0; i < n; ++i) {
    if (keys[i] == nullptr) return invalid_argument("keys[" + std::to_string(i) + "] is NULL");
    if (!hp.emplace(keys[i], values[i]).second)
      return invalid_argument("key '" + std::string(keys[i]) + "' is given twice");
  }
  return hp;
}

/// StepOptions from a C struct (NULL: the defaults).
Result<so::StepOptions> make_step_options(const strata_step_options_t* o) {
  so::StepOptions so_opts;
  if (o == nullptr) return so_opts;
  if (o->struct_size < offsetof(strata_step_options_t, summary_nonfinite) + sizeof(int))
    return invalid_argument("step options not initialized with STRATA_STEP_OPTIONS_INIT");
  if (!(o->max_grad_norm >= 0.0))
    return invalid_argument("step options: max_grad_norm must be >= 0, got " +
                            std::to_string(o->max_grad_norm));
  so_opts.max_grad_norm = o->max_grad_norm;
  so_opts.grad_scale = o->grad_scale;
  so_opts.skip_if_nonfinite = o->skip_if_nonfinite != 0;
  if (o->has_grad_summary) {
    so::StepOptions::GradSummary g;
    g.grad_norm = o->summary_grad_norm;
    g.nonfinite = o->summary_nonfinite != 0;
    so_opts.grad_summary = g;
  }
  return so_opts;
}

void fill_stats(const so::StepStats& r, strata_step_stats_t* stats) {
  if (stats == nullptr) return;
  stats->skipped = r.skipped ? 1 : 0;
  stats->grad_norm = r.grad_norm;
  stats->clip_coef = r.clip_coef;
  stats->numel_updated = r.numel_updated;
  stats->bytes_read = r.bytes_read;
  stats->bytes_written = r.bytes_written;
  stats->seconds = r.seconds;
}

}  // namespace

extern "C" {

strata_status_t strata_optimizer_add_param_group(strata_optimizer_t* o, const char* const* keys,
                                                 const double* values, size_t n, int* group) {
  return guard([&]() -> strata_status_t {
    if (auto st = check_opt(o); !st.ok()) return set_error(st);
    if (group == nullptr) return invalid("group output is NULL");
    auto hp = make_hyperparams(keys, values, n);
    if (!hp.ok()) return set_error(hp.status());
    auto g = o->opt->add_param_group(*hp);
    if (!g.ok()) return set_error(g.status());
    *group = *g;
    return STRATA_OK;
  });
}

strata_status_t strata_optimizer_num_param_groups(strata_optimizer_t* o, int* n) {
  return guard([&]() -> strata_status_t {
    if (auto st = check_opt(o); !st.ok()) return set_error(st);
    if (n == nullptr) return invalid("n output is NULL");
    *n = o->opt->num_param_groups();
    return STRATA_OK;
  });
}

strata_status_t strata_optimizer_add_param_to_group(strata_optimizer_t* o, const char* name,
                                                    uint64_t numel, const float* init, int group,
                                                    strata_placement_t placement, uint32_t* param) {
  return guard([&]() -> strata_status_t {
    if (auto st = check_opt(o); !st.ok()) return set_error(st);
    if (name == nullptr || param == nullptr) return invalid("name or param output is NULL");
    if (placement < STRATA_PLACEMENT_AUTO || placement > STRATA_PLACEMENT_NVME)
      return invalid("add_param '" + std::string(name) + "': invalid placement value " +
                     std::to_string(static_cast<int>(placement)));
    constexpr uint64_t kMaxNumel = static_cast<uint64_t>(INT64_MAX) / sizeof(float);
    if (numel > kMaxNumel)
      return invalid("parameter '" + std::string(name) + "' has numel " + std::to_string(numel) +
                     ": numel * 4 bytes exceeds 2^63 - 1 (numel <= " + std::to_string(kMaxNumel) +
                     ")");
    auto h = o->opt->add_param(name, numel, init, group, static_cast<so::Placement>(placement));
    if (!h.ok()) return set_error(h.status());
    *param = *h;
    return STRATA_OK;
  });
}

strata_status_t strata_optimizer_num_params(strata_optimizer_t* o, uint32_t* n) {
  return guard([&]() -> strata_status_t {
    if (auto st = check_opt(o); !st.ok()) return set_error(st);
    if (n == nullptr) return invalid("n output is NULL");
    *n = static_cast<uint32_t>(o->opt->num_params());
    return STRATA_OK;
  });
}

strata_status_t strata_optimizer_param_info(strata_optimizer_t* o, uint32_t param,
                                            strata_param_info_t* out) {
  return guard([&]() -> strata_status_t {
    if (auto st = check_opt(o); !st.ok()) return set_error(st);
    if (out == nullptr || out->struct_size < sizeof(size_t))
      return invalid("info is NULL or not initialized with STRATA_PARAM_INFO_INIT");
    auto info = o->opt->param_info(param);
    if (!info.ok()) return set_error(info.status());
    const char* name;
    const char* master_key;
    {
      std::lock_guard<std::mutex> lk(o->names_mu);
      while (o->param_names.size() <= param) o->param_names.emplace_back();
      auto& slot = o->param_names[param];
      if (slot.first.empty()) slot = {info->name, info->master_key};
      name = slot.first.c_str();
      master_key = slot.second.c_str();
    }
    strata_param_info_t full{sizeof(full),
                             name,
                             info->numel,
                             static_cast<strata_placement_t>(info->placement),
                             info->group,
                             info->step,
                             info->has_grad ? 1 : 0,
                             master_key};
    const size_t n = std::min(out->struct_size, sizeof(full)) - sizeof(size_t);
    std::memcpy(reinterpret_cast<unsigned char*>(out) + sizeof(size_t),
                reinterpret_cast<unsigned char*>(&full) + sizeof(size_t), n);
    return STRATA_OK;
  });
}

const char* strata_optimizer_rule_name(strata_optimizer_t* o) {
  return check_opt(o).ok() ? o->rule_name.c_str() : "";
}

int strata_optimizer_num_states(strata_optimizer_t* o) {
  return check_opt(o).ok() ? static_cast<int>(o->state_names.size()) : -1;
}

const char* strata_optimizer_state_name(strata_optimizer_t* o, int stream) {
  if (!check_opt(o).ok() || stream < 0 || stream >= static_cast<int>(o->state_names.size()))
    return nullptr;
  return o->state_names[stream].c_str();
}

strata_status_t strata_optimizer_write_param(strata_optimizer_t* o, uint32_t param,
                                             const float* src, uint64_t offset, uint64_t count) {
  return guard([&]() -> strata_status_t {
    if (auto st = check_opt(o); !st.ok()) return set_error(st);
    if (src == nullptr && count > 0) return invalid("src is NULL");
    return set_error(o->opt->write_param(param, src, offset, count));
  });
}

strata_status_t strata_optimizer_read_state(strata_optimizer_t* o, uint32_t param, int stream,
                                            float* dst, uint64_t offset, uint64_t count) {
  return guard([&]() -> strata_status_t {
    if (auto st = check_opt(o); !st.ok()) return set_error(st);
    if (dst == nullptr && count > 0) return invalid("dst is NULL");
    return set_error(o->opt->read_state(param, stream, dst, offset, count));
  });
}

strata_status_t strata_optimizer_write_state(strata_optimizer_t* o, uint32_t param, int stream,
                                             const float* src, uint64_t offset, uint64_t count) {
  return guard([&]() -> strata_status_t {
    if (auto st = check_opt(o); !st.ok()) return set_error(st);
    if (src == nullptr && count > 0) return invalid("src is NULL");
    return set_error(o->opt->write_state(param, stream, src, offset, count));
  });
}

strata_status_t strata_optimizer_set_step_count(strata_optimizer_t* o, uint32_t param,
                                                int64_t step) {
  return guard([&]() -> strata_status_t {
    if (auto st = check_opt(o); !st.ok()) return set_error(st);
    return set_error(o->opt->set_step_count(param, step));
  });
}

strata_status_t strata_optimizer_clear_grads(strata_optimizer_t* o) {
  return guard([&]() -> strata_status_t {
    if (auto st = check_opt(o); !st.ok()) return set_error(st);
    o->opt->clear_grads();
    return STRATA_OK;
  });
}

strata_status_t strata_optimizer_step_with(strata_optimizer_t* o,
                                           const strata_step_options_t* options,
                                           strata_step_stats_t* stats) {
  return guard([&]() -> strata_status_t {
    if (auto st = check_opt(o); !st.ok()) return set_error(st);
    auto so_opts = make_step_options(options);
    if (!so_opts.ok()) return set_error(so_opts.status());
    auto r = o->opt->step(*so_opts);
    if (!r.ok()) return set_error(r.status());
    fill_stats(*r, stats);
    return STRATA_OK;
  });
}

strata_status_t strata_optimizer_step_async(strata_optimizer_t* o,
                                            const strata_step_options_t* options,
                                            strata_step_stats_t* stats, strata_future_t** future) {
  return guard([&]() -> strata_status_t {
    if (future == nullptr) return invalid("future output pointer is NULL");
    *future = nullptr;
    if (auto st = check_opt(o); !st.ok()) return set_error(st);
    auto so_opts = make_step_options(options);
    if (!so_opts.ok()) return set_error(so_opts.status());
    Future<void> done =
        o->opt->step_async(*so_opts).map([stats](const so::StepStats& r) { fill_stats(r, stats); });
    *future = wrap_future(std::move(done));
    if (*future == nullptr) return set_error(resource_exhausted("out of memory for a future"));
    return STRATA_OK;
  });
}

}  // extern "C"
