// C API: errors, futures and the store (strata.h).
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "c_common.hpp"
#include "strata/base/env.hpp"

namespace strata::capi {
namespace {
thread_local std::string t_last_error;
thread_local int t_last_errno = 0;
}  // namespace

strata_status_t set_error(const Status& s) {
  if (s.ok()) return STRATA_OK;
  try {
    t_last_error = s.to_string();
  } catch (...) {
    t_last_error.clear();
  }
  t_last_errno = s.sys_errno();
  return static_cast<strata_status_t>(static_cast<int>(s.code()));
}

strata_future_t* wrap_future(Future<void> f) {
  return new (std::nothrow) strata_future{std::move(f)};
}

namespace {

bool valid_tier(strata_tier_t t) { return t >= STRATA_TIER_DEVICE && t <= STRATA_TIER_NVME; }

/// The TensorDesc of a put of `key`; errors name the key ("put 'k': ...").
Result<TensorDesc> make_desc(const char* key, strata_dtype_t dtype, int ndim,
                             const int64_t* shape) {
  const std::string what = "put '" + std::string(key) + "': ";
  const auto dt = static_cast<DType>(dtype);
  if (static_cast<int>(dtype) < 0 || static_cast<int>(dtype) >= kNumDTypes)
    return invalid_argument(what + "dtype value " + std::to_string(static_cast<int>(dtype)) +
                            " is not a strata_dtype_t");
  if (ndim < 0 || ndim > STRATA_MAX_NDIM)
    return invalid_argument(what + "ndim " + std::to_string(ndim) + " outside 0.." +
                            std::to_string(STRATA_MAX_NDIM));
  if (ndim > 0 && shape == nullptr) return invalid_argument(what + "shape is NULL with ndim > 0");
  TensorDesc d{dt, {}};
  for (int i = 0; i < ndim; ++i) {
    if (shape[i] < 0)
      return invalid_argument(what + "shape[" + std::to_string(i) + "] = " +
                              std::to_string(shape[i]) + " is negative");
    d.shape.push_back(shape[i]);
  }
  return d;
}

}  // namespace
}  // namespace strata::capi

using namespace strata;
using namespace strata::capi;

extern "C" {

const char* strata_last_error(void) { return t_last_error.c_str(); }
int strata_last_errno(void) { return t_last_errno; }

const char* strata_status_name(strata_status_t status) {
  const int v = static_cast<int>(status);
  if (v < 0 || v > static_cast<int>(StatusCode::kPermissionDenied)) return "Unknown";
  // status_code_name returns views of string literals: NUL-terminated.
  return status_code_name(static_cast<StatusCode>(v)).data();
}

int strata_c_api_version(void) { return STRATA_C_API_VERSION; }

size_t strata_dtype_size(strata_dtype_t dtype) {
  const int v = static_cast<int>(dtype);
  if (v < 0 || v >= kNumDTypes) return 0;
  return dtype_size(static_cast<DType>(v));
}

const char* strata_tier_name(strata_tier_t tier) {
  if (!valid_tier(tier)) return "invalid";
  return tier_name(static_cast<Tier>(tier)).data();
}

// ---- futures ----------------------------------------------------------------------------

strata_status_t strata_future_poll(strata_future_t* f, int* ready) {
  if (f == nullptr || ready == nullptr) return invalid("future or ready is NULL");
  *ready = f->future.ready() ? 1 : 0;
  return STRATA_OK;
}

strata_status_t strata_future_wait(strata_future_t* f) {
  if (f == nullptr) return invalid("future is NULL");
  return set_error(f->future.result().status());
}

strata_status_t strata_future_wait_for(strata_future_t* f, int64_t timeout_ms) {
  if (f == nullptr) return invalid("future is NULL");
  if (timeout_ms < 0) return invalid("timeout_ms " + std::to_string(timeout_ms) + " < 0");
  if (!f->future.wait_for(std::chrono::milliseconds(timeout_ms)))
    return set_error(deadline_exceeded("future not ready within " + std::to_string(timeout_ms) +
                                       " ms"));
  return set_error(f->future.result().status());
}

void strata_future_free(strata_future_t* f) { delete f; }

// ---- store ------------------------------------------------------------------------------

strata_status_t strata_store_open(const strata_store_options_t* o, strata_store_t** out) {
  return strata_store_open_config(nullptr, o, out);
}

strata_status_t strata_store_open_config(const char* config_file, const strata_store_options_t* o,
                                         strata_store_t** out) {
  return guard([&]() -> strata_status_t {
    if (out == nullptr) return invalid("store output pointer is NULL");
    *out = nullptr;
    if (o == nullptr) return invalid("options is NULL");
    if (o->struct_size < offsetof(strata_store_options_t, device_id) + sizeof(int) ||
        o->version < 1)
      return invalid("options not initialized with STRATA_STORE_OPTIONS_INIT (struct_size " +
                     std::to_string(o->struct_size) + ", version " +
                     std::to_string(o->version) + ")");
    if (o->path == nullptr || o->path[0] == '\0') return invalid("options.path is empty");
    auto env = StoreOptions::from_config(config_file != nullptr ? config_file : "");
    if (!env.ok()) return set_error(env.status());
    StoreOptions so = std::move(*env);
    so.path = o->path;
    if (o->num_nvme_dirs > 0 && o->nvme_dirs == nullptr)
      return invalid("options.nvme_dirs is NULL with num_nvme_dirs > 0");
    if (o->num_nvme_dirs > 0) so.nvme_dirs.clear();  // the file's, unless given here
    for (size_t i = 0; i < o->num_nvme_dirs; ++i) {
      if (o->nvme_dirs[i] == nullptr) return invalid("options.nvme_dirs[" + std::to_string(i) + "] is NULL");
      so.nvme_dirs.emplace_back(o->nvme_dirs[i]);
    }
    if (o->host_budget_bytes != STRATA_UNDEF_U64) so.host_budget_bytes = o->host_budget_bytes;
    if (o->nvme_budget_bytes != STRATA_UNDEF_U64) so.nvme_budget_bytes = o->nvme_budget_bytes;
    if (o->device_budget_bytes != STRATA_UNDEF_U64) so.device_budget_bytes = o->device_budget_bytes;
    if (o->chunk_bytes != STRATA_UNDEF_U64) so.chunk_bytes = o->chunk_bytes;
    if (o->staging_bytes != STRATA_UNDEF_U64) so.staging_bytes = o->staging_bytes;
    if (o->verify_checksums != STRATA_UNDEF_INT) so.verify_checksums = o->verify_checksums != 0;
    if (o->durability_on_flush != STRATA_UNDEF_INT)
      so.durability = o->durability_on_flush ? Durability::kOnFlush : Durability::kOnPut;
    if (o->read_only != STRATA_UNDEF_INT) so.read_only = o->read_only != 0;
    if (o->create != STRATA_UNDEF_INT) so.create = o->create != 0;
    if (o->worker_threads != STRATA_UNDEF_INT) {
      if (o->worker_threads < 1) return invalid("options.worker_threads must be >= 1");
      so.worker_threads = static_cast<uint32_t>(o->worker_threads);
    }
    if (o->numa_node != STRATA_UNDEF_INT) so.numa_node = o->numa_node;
    if (o->device_id != STRATA_UNDEF_INT) so.device_id = o->device_id;
    // Version 7 fields, when the caller's struct has them.
    auto has = [&](size_t offset, size_t size) { return o->struct_size >= offset + size; };
    if (has(offsetof(strata_store_options_t, pinned_initial_bytes), sizeof(uint64_t)) &&
        o->pinned_initial_bytes != STRATA_UNDEF_U64)
      so.pinned_initial_bytes = o->pinned_initial_bytes;
    if (has(offsetof(strata_store_options_t, pinned_grow_bytes), sizeof(uint64_t)) &&
        o->pinned_grow_bytes != STRATA_UNDEF_U64) {
      if (o->pinned_grow_bytes == 0) return invalid("options.pinned_grow_bytes must be > 0");
      so.pinned_grow_bytes = o->pinned_grow_bytes;
    }
    if (has(offsetof(strata_store_options_t, pinned_alloc_cuda_registered), sizeof(int))) {
      if ((o->pinned_alloc == nullptr) != (o->pinned_free == nullptr))
        return invalid(std::string("options.pinned_alloc and options.pinned_free: ") +
                       (o->pinned_alloc ? "pinned_free" : "pinned_alloc") +
                       " is NULL (set both or neither)");
      so.pinned_allocator.alloc = o->pinned_alloc;
      so.pinned_allocator.free = o->pinned_free;
      so.pinned_allocator.ctx = o->pinned_alloc_ctx;
      so.pinned_allocator.cuda_registered = o->pinned_alloc_cuda_registered != 0;
    }
    if (has(offsetof(strata_store_options_t, cuda_stream), sizeof(void*)))
      so.device_stream = o->cuda_stream;
    auto st = Store::open(std::move(so));
    if (!st.ok()) return set_error(st.status());
    *out = new strata_store{std::shared_ptr<Store>(std::move(*st))};
    return STRATA_OK;
  });
}

strata_status_t strata_store_set_cuda_stream(strata_store_t* s, void* cuda_stream) {
  return guard([&]() -> strata_status_t {
    if (auto st = check_store(s); !st.ok()) return set_error(st);
    return set_error(s->store->set_device_stream(cuda_stream));
  });
}

strata_status_t strata_store_close(strata_store_t* s) {
  if (s == nullptr) return STRATA_OK;
  return guard([&]() -> strata_status_t {
    Status st = s->store ? s->store->close() : Status::OK();
    delete s;
    return set_error(st);
  });
}

strata_status_t strata_store_put_async(strata_store_t* s, const char* key, const void* src,
                                       strata_dtype_t dtype, int ndim, const int64_t* shape,
                                       strata_tier_t tier, uint32_t flags,
                                       strata_future_t** future) {
  return guard([&]() -> strata_status_t {
    if (future == nullptr) return invalid("future output pointer is NULL");
    *future = nullptr;
    if (auto st = check_store(s); !st.ok()) return set_error(st);
    if (auto st = check_key(key); !st.ok()) return set_error(st);
    if (!valid_tier(tier))
      return invalid("put '" + std::string(key) + "': tier value " +
                     std::to_string(static_cast<int>(tier)) + " is not a strata_tier_t");
    if ((flags & ~(STRATA_PUT_OVERWRITE | STRATA_PUT_PIN)) != 0)
      return invalid("put '" + std::string(key) + "': unknown put flags " + std::to_string(flags));
    auto desc = make_desc(key, dtype, ndim, shape);
    if (!desc.ok()) return set_error(desc.status());
    if (src == nullptr && desc->nbytes() > 0) return invalid("src is NULL for key '" + std::string(key) + "'");
    PutOptions po;
    po.tier = static_cast<Tier>(tier);
    po.overwrite = (flags & STRATA_PUT_OVERWRITE) != 0;
    po.pin = (flags & STRATA_PUT_PIN) != 0;
    *future = wrap_future(s->store->put_async(key, src, *desc, po));
    if (*future == nullptr) return set_error(resource_exhausted("out of memory for a future"));
    return STRATA_OK;
  });
}

strata_status_t strata_store_put(strata_store_t* s, const char* key, const void* src,
                                 strata_dtype_t dtype, int ndim, const int64_t* shape,
                                 strata_tier_t tier, uint32_t flags) {
  strata_future_t* f = nullptr;
  strata_status_t rc = strata_store_put_async(s, key, src, dtype, ndim, shape, tier, flags, &f);
  if (rc != STRATA_OK) return rc;
  rc = strata_future_wait(f);
  strata_future_free(f);
  return rc;
}

strata_status_t strata_store_get_async(strata_store_t* s, const char* key, void* dst,
                                       uint64_t nbytes, strata_future_t** future) {
  return guard([&]() -> strata_status_t {
    if (future == nullptr) return invalid("future output pointer is NULL");
    *future = nullptr;
    if (auto st = check_store(s); !st.ok()) return set_error(st);
    if (auto st = check_key(key); !st.ok()) return set_error(st);
    if (dst == nullptr && nbytes > 0) return invalid("dst is NULL for key '" + std::string(key) + "'");
    *future = wrap_future(s->store->get_bytes_async(key, dst, nbytes));
    if (*future == nullptr) return set_error(resource_exhausted("out of memory for a future"));
    return STRATA_OK;
  });
}

strata_status_t strata_store_get(strata_store_t* s, const char* key, void* dst, uint64_t nbytes) {
  strata_future_t* f = nullptr;
  strata_status_t rc = strata_store_get_async(s, key, dst, nbytes, &f);
  if (rc != STRATA_OK) return rc;
  rc = strata_future_wait(f);
  strata_future_free(f);
  return rc;
}

strata_status_t strata_store_delete(strata_store_t* s, const char* key) {
  return guard([&]() -> strata_status_t {
    if (auto st = check_store(s); !st.ok()) return set_error(st);
    if (auto st = check_key(key); !st.ok()) return set_error(st);
    return set_error(s->store->remove(key));
  });
}

strata_status_t strata_store_move(strata_store_t* s, const char* key, strata_tier_t tier) {
  return guard([&]() -> strata_status_t {
    if (auto st = check_store(s); !st.ok()) return set_error(st);
    if (auto st = check_key(key); !st.ok()) return set_error(st);
    if (!valid_tier(tier)) return invalid("invalid tier value " + std::to_string(static_cast<int>(tier)));
    return set_error(s->store->move(key, static_cast<Tier>(tier)));
  });
}

strata_status_t strata_store_prefetch_async(strata_store_t* s, const char* key,
                                            strata_tier_t tier, strata_future_t** future) {
  return guard([&]() -> strata_status_t {
    if (future == nullptr) return invalid("future output pointer is NULL");
    *future = nullptr;
    if (auto st = check_store(s); !st.ok()) return set_error(st);
    if (auto st = check_key(key); !st.ok()) return set_error(st);
    if (!valid_tier(tier)) return invalid("invalid tier value " + std::to_string(static_cast<int>(tier)));
    *future = wrap_future(s->store->prefetch_async(key, static_cast<Tier>(tier)));
    if (*future == nullptr) return set_error(resource_exhausted("out of memory for a future"));
    return STRATA_OK;
  });
}

strata_status_t strata_store_flush(strata_store_t* s) {
  return guard([&]() -> strata_status_t {
    if (auto st = check_store(s); !st.ok()) return set_error(st);
    return set_error(s->store->flush());
  });
}

strata_status_t strata_store_stat(strata_store_t* s, const char* key, strata_object_info_t* info) {
  return guard([&]() -> strata_status_t {
    if (auto st = check_store(s); !st.ok()) return set_error(st);
    if (auto st = check_key(key); !st.ok()) return set_error(st);
    // Version-1 structs end at `pinned` (offsetof(damaged) is their sizeof): accept them and
    // fill only the fields that struct_size covers.
    if (info == nullptr || info->struct_size < offsetof(strata_object_info_t, damaged))
      return invalid("info is NULL or not initialized with STRATA_OBJECT_INFO_INIT");
    const bool has_damaged =
        info->struct_size >= offsetof(strata_object_info_t, damaged) + sizeof(int);
    auto r = s->store->stat(key);
    if (!r.ok()) return set_error(r.status());
    if (r->shape.size() > STRATA_MAX_NDIM)
      return invalid("object '" + std::string(key) + "' has " + std::to_string(r->shape.size()) +
                     " dims, more than STRATA_MAX_NDIM");
    info->dtype = static_cast<strata_dtype_t>(r->dtype);
    info->ndim = static_cast<int>(r->shape.size());
    for (int i = 0; i < STRATA_MAX_NDIM; ++i)
      info->shape[i] = i < info->ndim ? r->shape[static_cast<size_t>(i)] : 0;
    info->nbytes = r->nbytes;
    info->tier = static_cast<strata_tier_t>(r->tier);
    info->on_nvme = r->on_nvme ? 1 : 0;
    info->dirty = r->dirty ? 1 : 0;
    info->pinned = r->pinned ? 1 : 0;
    if (has_damaged) info->damaged = r->damage.empty() ? 0 : 1;
    return STRATA_OK;
  });
}

strata_status_t strata_store_object_damage(strata_store_t* s, const char* key, char* buf,
                                           size_t buf_size, size_t* length) {
  return guard([&]() -> strata_status_t {
    if (auto st = check_store(s); !st.ok()) return set_error(st);
    if (auto st = check_key(key); !st.ok()) return set_error(st);
    if (buf == nullptr && buf_size > 0) return invalid("buf is NULL with buf_size > 0");
    auto r = s->store->stat(key);
    if (!r.ok()) return set_error(r.status());
    const std::string& d = r->damage;
    if (length != nullptr) *length = d.size();
    if (buf_size > 0) {
      size_t n = std::min(d.size(), buf_size - 1);
      std::memcpy(buf, d.data(), n);
      buf[n] = '\0';
    }
    return STRATA_OK;
  });
}

}  // extern "C"

struct strata_key_list {
  std::vector<std::string> keys;
};

extern "C" {

strata_status_t strata_store_list(strata_store_t* s, const char* prefix, strata_key_list_t** list) {
  return guard([&]() -> strata_status_t {
    if (list == nullptr) return invalid("list output pointer is NULL");
    *list = nullptr;
    if (auto st = check_store(s); !st.ok()) return set_error(st);
    auto l = std::make_unique<strata_key_list>();
    for (auto& info : s->store->list(prefix ? std::string_view(prefix) : std::string_view()))
      l->keys.push_back(std::move(info.key));
    *list = l.release();
    return STRATA_OK;
  });
}

size_t strata_key_list_size(const strata_key_list_t* list) {
  return list ? list->keys.size() : 0;
}

const char* strata_key_list_get(const strata_key_list_t* list, size_t i) {
  if (list == nullptr || i >= list->keys.size()) return nullptr;
  return list->keys[i].c_str();
}

void strata_key_list_free(strata_key_list_t* list) { delete list; }

strata_status_t strata_store_stats(strata_store_t* s, strata_store_stats_t* out) {
  return guard([&]() -> strata_status_t {
    if (auto st = check_store(s); !st.ok()) return set_error(st);
    if (out == nullptr || out->struct_size < sizeof(size_t))
      return invalid("stats is NULL or not initialized with STRATA_STORE_STATS_INIT");
    // Every field after struct_size is 8 bytes, in stat_fields() order.
    const std::vector<StatField> fields = stat_fields(s->store->stats());
    static_assert(sizeof(uint64_t) == sizeof(double));
    STRATA_CHECK(sizeof(strata_store_stats_t) == sizeof(size_t) + 8 * fields.size());
    strata_store_stats_t full{};
    auto* p = reinterpret_cast<unsigned char*>(&full) + sizeof(size_t);
    for (const StatField& f : fields) {
      if (f.is_seconds) {
        std::memcpy(p, &f.seconds, 8);
      } else {
        std::memcpy(p, &f.value, 8);
      }
      p += 8;
    }
    const size_t n = std::min(out->struct_size, sizeof(full)) - sizeof(size_t);
    std::memcpy(reinterpret_cast<unsigned char*>(out) + sizeof(size_t),
                reinterpret_cast<unsigned char*>(&full) + sizeof(size_t), n);
    return STRATA_OK;
  });
}

strata_status_t strata_store_reset_stats(strata_store_t* s) {
  return guard([&]() -> strata_status_t {
    if (auto st = check_store(s); !st.ok()) return set_error(st);
    s->store->reset_stats();
    return STRATA_OK;
  });
}

}  // extern "C"
