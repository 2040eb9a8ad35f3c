// Private helpers of the C API: handle structs and the thread-local last error.
#pragma once

#include <memory>
#include <string>

#include "strata/base/future.hpp"
#include "strata/base/status.hpp"
#include "strata/strata.h"
#include "strata/store/config.hpp"
#include "strata/store/store.hpp"

struct strata_store {
  std::shared_ptr<strata::Store> store;
};

struct strata_future {
  strata::Future<void> future;
};

namespace strata::capi {

/// Records `s` as this thread's last error and returns its C code (STRATA_OK for OK).
strata_status_t set_error(const Status& s);
/// Shorthand for an InvalidArgument error naming `what`.
inline strata_status_t invalid(const std::string& what) { return set_error(invalid_argument(what)); }

/// Runs `f` (returning Status/Result) and converts exceptions (bad_alloc, ...) into codes.
template <class F>
strata_status_t guard(F&& f) noexcept {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return set_error(resource_exhausted("out of memory in the C API"));
  } catch (const std::exception& e) {
    return set_error(internal_error(std::string("exception in the C API: ") + e.what()));
  } catch (...) {
    return set_error(internal_error("unknown exception in the C API"));
  }
}

/// InvalidArgument when `s` is NULL or closed.
inline Status check_store(strata_store_t* s) {
  if (s == nullptr || !s->store) return invalid_argument("store handle is NULL");
  return Status::OK();
}

/// InvalidArgument for a NULL key.
inline Status check_key(const char* key) {
  if (key == nullptr) return invalid_argument("key is NULL");
  return Status::OK();
}

/// A strata_future_t* for `f`, or nullptr on allocation failure.
strata_future_t* wrap_future(Future<void> f);

}  // namespace strata::capi
