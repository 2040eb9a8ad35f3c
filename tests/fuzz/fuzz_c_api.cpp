// Fuzz target: argument validation of the C API (bindings/c, strata.h) and the store's key
// handling behind it: a sequence of calls (put/get/delete/move/stat/list, byte ranges,
// evict/pin/unpin) with any dtype, ndim, shape, tier, flag, offset and size
// values, NULL pointers, and keys of any bytes, on one real store (and opens of further
// stores with any option values).
// Properties: every call returns a strata_status_t; a failed call leaves a message in
// strata_last_error(); a put that succeeds reads back the same bytes; nothing crashes,
// leaks, overflows or hangs.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "fuzz_check.hpp"
#include "fuzz_temp_dir.hpp"
#include "strata/strata.h"

namespace {

constexpr size_t kBufBytes = 1 << 16;  // the largest tensor a call passes a buffer for

/// Checks the outcome of one call: a known code; on failure, a message.
strata_status_t checked(strata_status_t rc, const char* call) {
  FUZZ_CHECK(rc >= STRATA_OK && rc <= STRATA_ERR_PERMISSION_DENIED, "%s returned %d", call,
             static_cast<int>(rc));
  if (rc != STRATA_OK) FUZZ_CHECK(strata_last_error()[0] != '\0', "%s: no message", call);
  return rc;
}

strata_store_options_t base_options(const std::string& path) {
  strata_store_options_t o = STRATA_STORE_OPTIONS_INIT;
  o.path = path.c_str();
  o.host_budget_bytes = 1 << 20;
  o.staging_bytes = 1 << 20;
  o.chunk_bytes = 1 << 16;
  o.worker_threads = 2;
  o.numa_node = -2;
  return o;
}

struct Fixture {
  std::string root = strata::fuzz::scratch_dir() + "/c_api";
  strata_store_t* store = nullptr;
  size_t runs = 0;
  std::vector<uint8_t> src = std::vector<uint8_t>(kBufBytes), dst = std::vector<uint8_t>(kBufBytes);

  /// The shared store; recreated empty every 1000 inputs so the catalog stays small.
  strata_store_t* get() {
    if (store != nullptr && ++runs % 1000 == 0) {
      checked(strata_store_close(store), "strata_store_close");
      store = nullptr;
    }
    if (store == nullptr) {
      std::error_code ec;
      std::filesystem::remove_all(root, ec);
      strata_store_options_t o = base_options(root);
      strata_status_t rc = strata_store_open(&o, &store);
      FUZZ_CHECK(rc == STRATA_OK, "open the shared store: %s", strata_last_error());
    }
    return store;
  }
};

/// A key: NULL, or bytes up to the first NUL.
std::string key_bytes(FuzzedDataProvider& in, bool* null) {
  *null = in.ConsumeIntegralInRange<int>(0, 15) == 0;
  return in.ConsumeRandomLengthString(24);
}

/// Bytes of a tensor of `dtype` and `shape` when it is valid and fits in kBufBytes.
bool small_tensor(int dtype, int ndim, const int64_t* shape, uint64_t* nbytes) {
  const size_t es = strata_dtype_size(static_cast<strata_dtype_t>(dtype));
  if (es == 0 || ndim < 0 || ndim > STRATA_MAX_NDIM || (ndim > 0 && shape == nullptr)) return false;
  uint64_t n = es;
  for (int i = 0; i < ndim; ++i) {
    if (shape[i] < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(shape[i]), &n)) return false;
  }
  *nbytes = n;
  return n <= kBufBytes;
}

void open_with_options(FuzzedDataProvider& in, const std::string& root) {
  const std::string path = root + "/" + std::to_string(in.ConsumeIntegralInRange<int>(0, 3));
  strata_store_options_t o = base_options(path);
  std::vector<std::string> dirs;
  std::vector<const char*> dir_ptrs;
  switch (in.ConsumeIntegralInRange<int>(0, 9)) {
    case 0: o.struct_size = in.ConsumeIntegral<size_t>(); break;
    case 1: o.version = in.ConsumeIntegral<int>(); break;
    case 2: o.path = in.ConsumeBool() ? nullptr : ""; break;
    case 3: o.chunk_bytes = in.ConsumeIntegral<uint64_t>(); break;
    case 4: o.worker_threads = in.ConsumeIntegral<int>(); break;
    case 5: o.numa_node = in.ConsumeIntegral<int>(); break;
    case 6: o.staging_bytes = in.ConsumeIntegralInRange<uint64_t>(0, 8 << 20); break;
    case 7:
      o.host_budget_bytes = in.ConsumeIntegralInRange<uint64_t>(0, 8 << 20);
      o.nvme_budget_bytes = in.ConsumeIntegral<uint64_t>();
      break;
    case 8: {
      const int n = in.ConsumeIntegralInRange<int>(0, 4);
      for (int i = 0; i < n; ++i) dirs.push_back(path + "/d" + in.ConsumeRandomLengthString(4));
      for (auto& d : dirs) dir_ptrs.push_back(in.ConsumeIntegralInRange<int>(0, 7) ? d.c_str() : nullptr);
      o.nvme_dirs = dir_ptrs.empty() ? nullptr : dir_ptrs.data();
      o.num_nvme_dirs = in.ConsumeBool() ? dir_ptrs.size() : in.ConsumeIntegralInRange<size_t>(0, 4);
      if (o.num_nvme_dirs > dir_ptrs.size()) o.nvme_dirs = nullptr;  // never read past the array
      break;
    }
    default:
      o.read_only = in.ConsumeIntegral<int>();
      o.create = in.ConsumeIntegral<int>();
      o.verify_checksums = in.ConsumeIntegral<int>();
      o.durability_on_flush = in.ConsumeIntegral<int>();
      break;
  }
  strata_store_t* s = nullptr;
  if (checked(strata_store_open(&o, &s), "strata_store_open") == STRATA_OK) {
    FUZZ_CHECK(s != nullptr, "open returned OK without a store");
    checked(strata_store_close(s), "strata_store_close");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture fx;
  FuzzedDataProvider in(data, size);
  strata_store_t* store = fx.get();
  for (int op = 0; op < 16 && in.remaining_bytes() > 0; ++op) {
    strata_store_t* s = in.ConsumeIntegralInRange<int>(0, 31) == 0 ? nullptr : store;
    bool null_key = false;
    const std::string key = key_bytes(in, &null_key);
    const char* k = null_key ? nullptr : key.c_str();
    switch (in.ConsumeIntegralInRange<int>(0, 13)) {
      case 0: {  // put (then read back)
        const int dtype = in.ConsumeBool() ? in.ConsumeIntegralInRange<int>(0, 9) : in.ConsumeIntegral<int>();
        const int ndim = in.ConsumeIntegralInRange<int>(-2, STRATA_MAX_NDIM + 2);
        int64_t shape[STRATA_MAX_NDIM + 2] = {};
        for (auto& d : shape) d = in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(0, 16) : in.ConsumeIntegral<int64_t>();
        const int64_t* sp = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? nullptr : shape;
        const int tier = in.ConsumeBool() ? in.ConsumeIntegralInRange<int>(1, 2) : in.ConsumeIntegral<int>();
        const uint32_t flags = in.ConsumeBool() ? in.ConsumeIntegralInRange<uint32_t>(0, 3) : in.ConsumeIntegral<uint32_t>();
        uint64_t nbytes = 0;
        const bool small = small_tensor(dtype, ndim, sp, &nbytes);
        for (size_t i = 0; i < nbytes && small; ++i) fx.src[i] = static_cast<uint8_t>(i * 7 + op);
        const void* src = small && in.ConsumeIntegralInRange<int>(0, 15) != 0 ? fx.src.data() : nullptr;
        strata_status_t rc;
        if (in.ConsumeBool()) {
          rc = strata_store_put(s, k, src, static_cast<strata_dtype_t>(dtype), ndim, sp,
                                static_cast<strata_tier_t>(tier), flags);
        } else {
          strata_future_t* f = nullptr;
          rc = strata_store_put_async(s, k, src, static_cast<strata_dtype_t>(dtype), ndim, sp,
                                      static_cast<strata_tier_t>(tier), flags, in.ConsumeIntegralInRange<int>(0, 15) ? &f : nullptr);
          if (rc == STRATA_OK) {
            FUZZ_CHECK(f != nullptr, "put_async OK without a future");
            rc = strata_future_wait(f);
            strata_future_free(f);
          }
        }
        if (checked(rc, "strata_store_put") == STRATA_OK && small && src != nullptr) {
          FUZZ_CHECK(checked(strata_store_get(s, k, fx.dst.data(), nbytes), "strata_store_get") == STRATA_OK,
                     "get after put: %s", strata_last_error());
          FUZZ_CHECK(std::memcmp(fx.dst.data(), fx.src.data(), nbytes) == 0, "bytes differ");
        }
        break;
      }
      case 1: {
        const uint64_t n = in.ConsumeBool() ? in.ConsumeIntegralInRange<uint64_t>(0, kBufBytes) : in.ConsumeIntegral<uint64_t>();
        checked(strata_store_get(s, k, n <= kBufBytes && in.ConsumeIntegralInRange<int>(0, 15) ? fx.dst.data() : nullptr, n),
                "strata_store_get");
        break;
      }
      case 2: checked(strata_store_delete(s, k), "strata_store_delete"); break;
      case 3: checked(strata_store_move(s, k, static_cast<strata_tier_t>(in.ConsumeIntegral<int>())), "strata_store_move"); break;
      case 4: {
        strata_future_t* f = nullptr;
        const strata_status_t rc = checked(
            strata_store_prefetch_async(s, k, static_cast<strata_tier_t>(in.ConsumeIntegralInRange<int>(-1, 3)),
                                        in.ConsumeBool() ? &f : nullptr),
            "strata_store_prefetch_async");
        if (rc == STRATA_OK && f != nullptr) {
          int ready = 0;
          checked(strata_future_poll(f, in.ConsumeBool() ? &ready : nullptr), "strata_future_poll");
          checked(strata_future_wait_for(f, in.ConsumeIntegralInRange<int64_t>(-5, 5)), "strata_future_wait_for");
          checked(strata_future_wait(f), "strata_future_wait");
        }
        strata_future_free(f);
        break;
      }
      case 5: {
        strata_object_info_t info = STRATA_OBJECT_INFO_INIT;
        if (in.ConsumeBool()) info.struct_size = in.ConsumeIntegralInRange<size_t>(0, sizeof info);
        if (checked(strata_store_stat(s, k, in.ConsumeIntegralInRange<int>(0, 15) ? &info : nullptr), "strata_store_stat") == STRATA_OK &&
            info.struct_size == sizeof info) {
          FUZZ_CHECK(info.ndim >= 0 && info.ndim <= STRATA_MAX_NDIM, "stat ndim %d", info.ndim);
        }
        break;
      }
      case 6: {
        char buf[64];
        size_t len = 0;
        const size_t n = in.ConsumeIntegralInRange<size_t>(0, sizeof buf);
        if (checked(strata_store_object_damage(s, k, in.ConsumeIntegralInRange<int>(0, 7) ? buf : nullptr, n,
                                               in.ConsumeBool() ? &len : nullptr),
                    "strata_store_object_damage") == STRATA_OK && n > 0) {
          FUZZ_CHECK(std::memchr(buf, '\0', n) != nullptr, "damage text not terminated");
        }
        break;
      }
      case 7: {
        strata_key_list_t* list = nullptr;
        if (checked(strata_store_list(s, k, in.ConsumeIntegralInRange<int>(0, 15) ? &list : nullptr), "strata_store_list") == STRATA_OK && list) {
          const size_t n = strata_key_list_size(list);
          for (size_t i = 0; i < n; ++i) FUZZ_CHECK(strata_key_list_get(list, i) != nullptr, "key %zu", i);
          FUZZ_CHECK(strata_key_list_get(list, n) == nullptr, "key past the end");
        }
        strata_key_list_free(list);
        break;
      }
      case 8: checked(strata_store_flush(s), "strata_store_flush"); break;
      case 9: {
        const int v = in.ConsumeIntegral<int>();
        FUZZ_CHECK(strata_status_name(static_cast<strata_status_t>(v)) != nullptr, "status name");
        FUZZ_CHECK(strata_tier_name(static_cast<strata_tier_t>(v)) != nullptr, "tier name");
        (void)strata_dtype_size(static_cast<strata_dtype_t>(v));
        checked(strata_future_wait(nullptr), "strata_future_wait(NULL)");
        break;
      }
      case 10: open_with_options(in, fx.root + "-open"); break;
      case 11: {  // byte ranges (version 6): any offset and size, NULL buffers
        const uint64_t off = in.ConsumeBool() ? in.ConsumeIntegralInRange<uint64_t>(0, kBufBytes) : in.ConsumeIntegral<uint64_t>();
        const uint64_t n = in.ConsumeBool() ? in.ConsumeIntegralInRange<uint64_t>(0, kBufBytes) : in.ConsumeIntegral<uint64_t>();
        const bool buf = n <= kBufBytes && in.ConsumeIntegralInRange<int>(0, 15) != 0;
        if (in.ConsumeBool()) {
          checked(strata_store_read_range(s, k, off, n, buf ? fx.dst.data() : nullptr), "strata_store_read_range");
        } else {
          checked(strata_store_write_range(s, k, off, n, buf ? fx.src.data() : nullptr), "strata_store_write_range");
        }
        break;
      }
      case 12: {  // evict / pin / unpin (version 6)
        const int which = in.ConsumeIntegralInRange<int>(0, 2);
        if (which == 0) checked(strata_store_evict(s, k), "strata_store_evict");
        if (which == 1) checked(strata_store_pin(s, k), "strata_store_pin");
        if (which == 2) checked(strata_store_unpin(s, k), "strata_store_unpin");
        break;
      }
      default: checked(strata_store_open(nullptr, nullptr), "strata_store_open(NULL)"); break;
    }
  }
  return 0;
}
