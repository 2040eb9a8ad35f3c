// C API: byte ranges of objects, eviction and pinning (strata.h, since version
// 6).
#include <string>

#include "c_common.hpp"

using namespace strata;
using namespace strata::capi;

namespace {

/// Runs `start` (returning a Future<void>) after the handle and key checks;
/// *future gets it.
template <class Start>
strata_status_t start_async(strata_store_t* s, const char* key, strata_future_t** future,
                            Start start) {
  if (future == nullptr) return invalid("future output pointer is NULL");
  *future = nullptr;
  if (auto st = check_store(s); !st.ok()) return set_error(st);
  if (auto st = check_key(key); !st.ok()) return set_error(st);
  *future = wrap_future(start());
  if (*future == nullptr) return set_error(resource_exhausted("out of memory for a future"));
  return STRATA_OK;
}

/// Waits for and frees a future started by an *_async call that returned `rc`
/// (call it as `rc = start(..., &f); return wait_and_free(rc, f);`: the two
/// must be sequenced, since the order in which one call's arguments are
/// evaluated is unspecified).
strata_status_t wait_and_free(strata_status_t rc, strata_future_t* f) {
  if (rc != STRATA_OK) return rc;
  rc = strata_future_wait(f);
  strata_future_free(f);
  return rc;
}

}  // namespace

extern "C" {

strata_status_t strata_store_read_range_async(strata_store_t* s, const char* key, uint64_t offset,
                                              uint64_t nbytes, void* dst,
                                              strata_future_t** future) {
  return guard([&]() -> strata_status_t {
    if (dst == nullptr && nbytes > 0)
      return invalid("read_range '" + std::string(key ? key : "") + "': dst is NULL");
    return start_async(s, key, future,
                       [&] { return s->store->read_range_async(key, offset, nbytes, dst); });
  });
}

strata_status_t strata_store_read_range(strata_store_t* s, const char* key, uint64_t offset,
                                        uint64_t nbytes, void* dst) {
  strata_future_t* f = nullptr;
  const strata_status_t rc = strata_store_read_range_async(s, key, offset, nbytes, dst, &f);
  return wait_and_free(rc, f);
}

strata_status_t strata_store_write_range_async(strata_store_t* s, const char* key, uint64_t offset,
                                               uint64_t nbytes, const void* src,
                                               strata_future_t** future) {
  return guard([&]() -> strata_status_t {
    if (src == nullptr && nbytes > 0)
      return invalid("write_range '" + std::string(key ? key : "") + "': src is NULL");
    return start_async(s, key, future,
                       [&] { return s->store->write_range_async(key, offset, nbytes, src); });
  });
}

strata_status_t strata_store_write_range(strata_store_t* s, const char* key, uint64_t offset,
                                         uint64_t nbytes, const void* src) {
  strata_future_t* f = nullptr;
  const strata_status_t rc = strata_store_write_range_async(s, key, offset, nbytes, src, &f);
  return wait_and_free(rc, f);
}

strata_status_t strata_store_evict(strata_store_t* s, const char* key) {
  return guard([&]() -> strata_status_t {
    strata_future_t* f = nullptr;
    const strata_status_t rc = start_async(s, key, &f, [&] { return s->store->evict_async(key); });
    return wait_and_free(rc, f);
  });
}

strata_status_t strata_store_pin(strata_store_t* s, const char* key) {
  return guard([&]() -> strata_status_t {
    strata_future_t* f = nullptr;
    const strata_status_t rc = start_async(s, key, &f, [&] { return s->store->pin_async(key); });
    return wait_and_free(rc, f);
  });
}

strata_status_t strata_store_unpin(strata_store_t* s, const char* key) {
  return guard([&]() -> strata_status_t {
    strata_future_t* f = nullptr;
    const strata_status_t rc = start_async(s, key, &f, [&] { return s->store->unpin_async(key); });
    return wait_and_free(rc, f);
  });
}

}  // extern "C"
