// strata::store (private) — the CUDA runtime calls of the device tier. Every function is
// defined in both builds; without CUDA (or without a GPU) they report Unimplemented /
// "no device".
#pragma once

#include <cstdint>

#include "strata/base/status.hpp"

namespace strata::store_detail {

/// True when built with CUDA and device `id` exists (cudaGetDeviceCount succeeded).
bool device_available(int id);
/// Free bytes on device `id` (cudaMemGetInfo); 0 without a device.
uint64_t device_free_bytes(int id);
/// True when `p` is device (or managed) memory per cudaPointerGetAttributes.
bool is_device_pointer(const void* p);

/// cudaMalloc on device `id`. \error ResourceExhausted on cudaErrorMemoryAllocation.
Result<void*> device_alloc(int id, uint64_t nbytes);
void device_free(int id, void* p);

/// A CUDA stream on device `id` (created lazily; one per object, not thread-safe).
class DeviceStream {
 public:
  explicit DeviceStream(int id) : id_(id) {}
  ~DeviceStream();
  DeviceStream(const DeviceStream&) = delete;
  DeviceStream& operator=(const DeviceStream&) = delete;
  /// cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault) on this stream.
  Status copy_async(void* dst, const void* src, uint64_t nbytes);
  /// cudaStreamSynchronize.
  Status synchronize();

 private:
  Status ensure();
  int id_;
  void* stream_ = nullptr;
};

}  // namespace strata::store_detail
