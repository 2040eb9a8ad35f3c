// C API: the offloaded optimizer and the communicator (strata.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "c_optimizer.hpp"
#include "strata/collectives/communicator.hpp"
#include "strata/optimizer/offload.hpp"

struct strata_comm {
  std::unique_ptr<strata::Communicator> comm;
};

using namespace strata;
using namespace strata::capi;
namespace so = strata::optimizer;

Status strata::capi::check_opt(strata_optimizer_t* o) {
  if (o == nullptr || !o->opt) return invalid_argument("optimizer handle is NULL");
  return Status::OK();
}

namespace {

Status check_comm(const strata_comm_t* c) {
  if (c == nullptr || !c->comm) return invalid_argument("communicator handle is NULL");
  return Status::OK();
}

}  // namespace

extern "C" {

strata_status_t strata_optimizer_stats(strata_optimizer_t* o, strata_optimizer_stats_t* out,
                                       int reset) {
  return guard([&]() -> strata_status_t {
    if (auto st = check_opt(o); !st.ok()) return set_error(st);
    if (out == nullptr || out->struct_size < sizeof(size_t))
      return invalid("stats is NULL or not initialized with STRATA_OPTIMIZER_STATS_INIT");
    const so::OptimizerStats t = o->opt->stats();
    if (reset) o->opt->reset_stats();
    strata_optimizer_stats_t full{sizeof(full), t.steps, t.steps_skipped, t.steps_rolled_back,
                                  t.sub_groups, t.tensors_updated, t.numel_updated,
                                  t.bytes_read, t.bytes_written, t.step_seconds,
                                  t.update_seconds, t.io_wait_seconds, t.early_seconds,
                                  t.overlap()};
    const size_t n = std::min(out->struct_size, sizeof(full)) - sizeof(size_t);
    std::memcpy(reinterpret_cast<unsigned char*>(out) + sizeof(size_t),
                reinterpret_cast<unsigned char*>(&full) + sizeof(size_t), n);
    return STRATA_OK;
  });
}

strata_status_t strata_optimizer_create(strata_store_t* store, const strata_optimizer_options_t* o,
                                        int resume, strata_optimizer_t** out) {
  return guard([&]() -> strata_status_t {
    if (out == nullptr) return invalid("optimizer output pointer is NULL");
    *out = nullptr;
    if (store == nullptr || !store->store) return invalid("store handle is NULL");
    if (o == nullptr) return invalid("options is NULL");
    if (o->struct_size < offsetof(strata_optimizer_options_t, num_threads) + sizeof(int) ||
        o->version < 1)
      return invalid("options not initialized with STRATA_OPTIMIZER_OPTIONS_INIT");
    const strata_rule_t* rule =
        o->struct_size >= offsetof(strata_optimizer_options_t, rule) + sizeof(const strata_rule_t*)
            ? o->rule
            : nullptr;
    const std::string name = rule ? (rule->name ? rule->name : "") : o->optimizer ? o->optimizer : "adamw";
    // defaults < the "optimizer" section of the store's configuration file < the options
    std::optional<Config> cfg;
    if (const std::string& f = store->store->options().config_file; !f.empty()) {
      auto c = Config::load(f);
      if (!c.ok()) return set_error(c.status());
      cfg = std::move(*c);
    }
    const bool has_arithmetic =
        o->struct_size >= offsetof(strata_optimizer_options_t, arithmetic) + sizeof(const char*);
    const std::string arithmetic =
        has_arithmetic && o->arithmetic != nullptr ? o->arithmetic
        : cfg && cfg->optimizer.arithmetic          ? *cfg->optimizer.arithmetic
                                                    : "simd";
    if (arithmetic != "simd" && arithmetic != "torch")
      return invalid("arithmetic must be \"simd\" or \"torch\", got \"" + arithmetic + "\"");
    if (rule != nullptr && has_arithmetic && o->arithmetic != nullptr && arithmetic != "simd")
      return invalid("arithmetic \"" + arithmetic + "\" is for the built-in adam and adamw; "
                     "a custom rule's arithmetic is its own (leave arithmetic NULL)");
    so::Hyperparams rule_defaults;
    auto factory = rule != nullptr         ? c_rule_factory(rule, &rule_defaults)
                   : arithmetic == "torch" ? so::torch_exact_rule_factory(name)
                                           : so::builtin_rule_factory(name);
    if (!factory.ok()) return set_error(factory.status());
    so::Hyperparams hp;
    const std::pair<const char*, double> doubles[] = {{"lr", o->lr},
                                                      {"beta1", o->beta1},
                                                      {"beta2", o->beta2},
                                                      {"eps", o->eps},
                                                      {"weight_decay", o->weight_decay}};
    for (const auto& [k, v] : doubles)
      if (v != STRATA_UNDEF_DOUBLE) hp[k] = v;
    if (o->amsgrad != STRATA_UNDEF_INT) hp["amsgrad"] = o->amsgrad ? 1.0 : 0.0;
    so::OffloadOptions oo = cfg ? so::offload_options_from_config(*cfg) : so::OffloadOptions{};
    if (o->key_prefix) oo.key_prefix = o->key_prefix;
    if (o->sub_group_numel != STRATA_UNDEF_U64) oo.sub_group_numel = o->sub_group_numel;
    if (o->num_buffers != STRATA_UNDEF_INT) oo.num_buffers = o->num_buffers;
    if (o->host_budget_bytes != STRATA_UNDEF_U64) oo.host_budget_bytes = o->host_budget_bytes;
    if (o->num_threads != STRATA_UNDEF_INT) oo.num_threads = o->num_threads;
    // state_dtype (version 8): unset or an older struct = the file's, else fp32.
    if (o->struct_size >= offsetof(strata_optimizer_options_t, state_dtype) + sizeof(int) &&
        o->state_dtype != STRATA_UNDEF_INT) {
      if (o->state_dtype == STRATA_FLOAT32) {
        oo.state_dtype = strata::DType::kFloat32;
      } else if (o->state_dtype == STRATA_BFLOAT16) {
        oo.state_dtype = strata::DType::kBFloat16;
      } else {
        return invalid("state_dtype must be STRATA_FLOAT32 (" + std::to_string(STRATA_FLOAT32) +
                       ") or STRATA_BFLOAT16 (" + std::to_string(STRATA_BFLOAT16) + "), got " +
                       std::to_string(o->state_dtype));
      }
    }
    auto opt = resume ? so::OffloadedOptimizer::open(store->store, *factory, oo)
                      : so::OffloadedOptimizer::create(store->store, *factory, hp, oo);
    if (!resume && opt.status().code() == strata::StatusCode::kAlreadyExists) {
      return set_error(strata::already_exists(
          "strata_optimizer_create: store " + store->store->options().path +
          " already holds an optimizer under '" + oo.key_prefix +
          "' (strata_optimizer_create with resume = 1 reopens it)"));
    }
    if (!opt.ok()) return set_error(opt.status());
    auto handle = std::make_unique<strata_optimizer>();
    handle->opt = std::move(*opt);
    handle->rule_name = handle->opt->rule_name();
    for (int i = 0; i < handle->opt->num_states(); ++i)
      handle->state_names.push_back(handle->opt->state_name(i));
    handle->rule_defaults = std::move(rule_defaults);
    *out = handle.release();
    return STRATA_OK;
  });
}

strata_status_t strata_optimizer_close(strata_optimizer_t* o) {
  if (o == nullptr) return STRATA_OK;
  std::unique_ptr<strata_optimizer> owned(o);
  return guard([&]() -> strata_status_t {
    return owned->opt ? set_error(owned->opt->close()) : STRATA_OK;
  });
}

void strata_optimizer_free(strata_optimizer_t* o) {
  if (strata_optimizer_close(o) != STRATA_OK) {
    std::fprintf(stderr, "strata_optimizer_free: %s\n", strata_last_error());
  }
}

strata_status_t strata_optimizer_set_hyperparams(strata_optimizer_t* o, int group,
                                                 const char* const* keys,
                                                 const double* values, size_t n) {
  return guard([&]() -> strata_status_t {
    if (auto st = check_opt(o); !st.ok()) return set_error(st);
    if (n > 0 && (keys == nullptr || values == nullptr)) return invalid("keys or values is NULL");
    so::Hyperparams hp;
    for (size_t i = 0; i < n; ++i) {
      if (keys[i] == nullptr) return invalid("keys[" + std::to_string(i) + "] is NULL");
      hp[keys[i]] = values[i];
    }
    // The rule factory refuses unknown keys and values out of range, naming them.
    return set_error(o->opt->set_hyperparams(group, hp));
  });
}

strata_status_t strata_optimizer_hyperparam(strata_optimizer_t* o, int group, const char* key,
                                            double* value) {
  return guard([&]() -> strata_status_t {
    if (auto st = check_opt(o); !st.ok()) return set_error(st);
    if (key == nullptr || value == nullptr) return invalid("key or value output is NULL");
    auto hp = o->opt->hyperparams(group);
    if (!hp.ok()) return set_error(hp.status());
    auto it = hp->find(key);
    if (it != hp->end()) {
      *value = it->second;
      return STRATA_OK;
    }
    // Keys never set take the custom rule's or the built-in optimizer's default.
    if (auto d = o->rule_defaults.find(key); d != o->rule_defaults.end()) {
      *value = d->second;
      return STRATA_OK;
    }
    auto defaults = so::builtin_default_hyperparams(o->opt->rule_name());
    if (defaults.ok()) {
      auto d = defaults->find(key);
      if (d != defaults->end()) {
        *value = d->second;
        return STRATA_OK;
      }
    }
    return set_error(not_found("param group " + std::to_string(group) + " of optimizer '" +
                               o->opt->rule_name() + "' has no hyperparameter '" +
                               std::string(key) + "'"));
  });
}

strata_status_t strata_optimizer_add_param(strata_optimizer_t* o, const char* name, uint64_t numel,
                                           const float* init, strata_placement_t placement,
                                           uint32_t* param) {
  return guard([&]() -> strata_status_t {
    if (auto st = check_opt(o); !st.ok()) return set_error(st);
    if (name == nullptr || param == nullptr) return invalid("name or param output is NULL");
    if (placement < STRATA_PLACEMENT_AUTO || placement > STRATA_PLACEMENT_NVME)
      return invalid("invalid placement value " + std::to_string(static_cast<int>(placement)));
    // numel * 4 bytes (the fp32 master, each state) must fit the store's int64 sizes.
    constexpr uint64_t kMaxNumel = static_cast<uint64_t>(INT64_MAX) / sizeof(float);
    if (numel > kMaxNumel)
      return invalid("parameter '" + std::string(name) + "' has numel " +
                     std::to_string(numel) + ": numel * 4 bytes exceeds 2^63 - 1 (numel <= " +
                     std::to_string(kMaxNumel) + ")");
    auto h = o->opt->add_param(name, numel, init, 0, static_cast<so::Placement>(placement));
    if (!h.ok()) return set_error(h.status());
    *param = *h;
    return STRATA_OK;
  });
}

strata_status_t strata_optimizer_find_param(strata_optimizer_t* o, const char* name,
                                            uint32_t* param) {
  return guard([&]() -> strata_status_t {
    if (auto st = check_opt(o); !st.ok()) return set_error(st);
    if (name == nullptr || param == nullptr) return invalid("name or param output is NULL");
    auto h = o->opt->find_param(name);
    if (!h.ok()) return set_error(h.status());
    *param = *h;
    return STRATA_OK;
  });
}

strata_status_t strata_optimizer_set_grad(strata_optimizer_t* o, uint32_t param, const void* grad,
                                          strata_dtype_t dtype) {
  return guard([&]() -> strata_status_t {
    if (auto st = check_opt(o); !st.ok()) return set_error(st);
    if (dtype != STRATA_FLOAT32 && dtype != STRATA_FLOAT16 && dtype != STRATA_BFLOAT16)
      return invalid("set_grad of parameter " + std::to_string(param) + ": gradient dtype value " +
                     std::to_string(static_cast<int>(dtype)) +
                     " is not STRATA_FLOAT32, STRATA_FLOAT16 or STRATA_BFLOAT16");
    return set_error(o->opt->set_grad(param, grad, static_cast<DType>(dtype)));
  });
}

strata_status_t strata_optimizer_step(strata_optimizer_t* o, double max_grad_norm,
                                      float grad_scale, strata_step_stats_t* stats) {
  return guard([&]() -> strata_status_t {
    if (auto st = check_opt(o); !st.ok()) return set_error(st);
    if (!(max_grad_norm >= 0.0)) return invalid("max_grad_norm must be >= 0");
    so::StepOptions so_opts;
    so_opts.max_grad_norm = max_grad_norm;
    so_opts.grad_scale = grad_scale;
    auto r = o->opt->step(so_opts);
    if (!r.ok()) return set_error(r.status());
    if (stats != nullptr) {
      stats->skipped = r->skipped ? 1 : 0;
      stats->grad_norm = r->grad_norm;
      stats->clip_coef = r->clip_coef;
      stats->numel_updated = r->numel_updated;
      stats->bytes_read = r->bytes_read;
      stats->bytes_written = r->bytes_written;
      stats->seconds = r->seconds;
    }
    return STRATA_OK;
  });
}

strata_status_t strata_optimizer_read_param(strata_optimizer_t* o, uint32_t param, float* dst,
                                            uint64_t offset, uint64_t count) {
  return guard([&]() -> strata_status_t {
    if (auto st = check_opt(o); !st.ok()) return set_error(st);
    if (dst == nullptr && count > 0) return invalid("dst is NULL");
    return set_error(o->opt->read_param(param, dst, offset, count));
  });
}

strata_status_t strata_optimizer_step_count(strata_optimizer_t* o, uint32_t param, int64_t* step) {
  return guard([&]() -> strata_status_t {
    if (auto st = check_opt(o); !st.ok()) return set_error(st);
    if (step == nullptr) return invalid("step output is NULL");
    auto r = o->opt->step_count(param);
    if (!r.ok()) return set_error(r.status());
    *step = *r;
    return STRATA_OK;
  });
}

strata_status_t strata_optimizer_checkpoint(strata_optimizer_t* o) {
  return guard([&]() -> strata_status_t {
    if (auto st = check_opt(o); !st.ok()) return set_error(st);
    return set_error(o->opt->checkpoint());
  });
}

// ---- communicator -----------------------------------------------------------------------

strata_status_t strata_comm_init_from_env(strata_backend_t backend, strata_comm_t** out) {
  return guard([&]() -> strata_status_t {
    if (out == nullptr) return invalid("communicator output pointer is NULL");
    *out = nullptr;
    if (backend != STRATA_BACKEND_GLOO && backend != STRATA_BACKEND_NCCL)
      return invalid("invalid backend value " + std::to_string(static_cast<int>(backend)));
    auto c = create_communicator_from_env(static_cast<Backend>(backend));
    if (!c.ok()) return set_error(c.status());
    *out = new strata_comm{std::move(*c)};
    return STRATA_OK;
  });
}

void strata_comm_free(strata_comm_t* c) { delete c; }

int strata_comm_rank(const strata_comm_t* c) { return check_comm(c).ok() ? c->comm->rank() : -1; }
int strata_comm_size(const strata_comm_t* c) { return check_comm(c).ok() ? c->comm->size() : -1; }

strata_status_t strata_comm_all_reduce(strata_comm_t* c, const void* send, void* recv,
                                       size_t count, strata_dtype_t dtype, int op) {
  return guard([&]() -> strata_status_t {
    if (auto st = check_comm(c); !st.ok()) return set_error(st);
    if (op != 0 && op != 1) return invalid("op must be 0 (sum) or 1 (max)");
    if (strata_dtype_size(dtype) == 0)
      return invalid("all_reduce: dtype value " + std::to_string(static_cast<int>(dtype)) +
                     " is not a strata_dtype_t");
    return set_error(c->comm->all_reduce(send, recv, count, static_cast<DType>(dtype),
                                         static_cast<ReduceOp>(op)));
  });
}

strata_status_t strata_comm_all_gather(strata_comm_t* c, const void* send, void* recv,
                                       size_t count, strata_dtype_t dtype) {
  return guard([&]() -> strata_status_t {
    if (auto st = check_comm(c); !st.ok()) return set_error(st);
    if (strata_dtype_size(dtype) == 0)
      return invalid("all_gather: dtype value " + std::to_string(static_cast<int>(dtype)) +
                     " is not a strata_dtype_t");
    return set_error(c->comm->all_gather(send, recv, count, static_cast<DType>(dtype)));
  });
}

strata_status_t strata_comm_barrier(strata_comm_t* c) {
  return guard([&]() -> strata_status_t {
    if (auto st = check_comm(c); !st.ok()) return set_error(st);
    return set_error(c->comm->barrier());
  });
}

}  // extern "C"
