// strata::store (private) — the CUDA runtime calls of the device tier, defined in gpu.cpp
// beside the public ones of gpu.hpp. Every function is defined in both builds; without
// CUDA (or without a GPU) they report Unimplemented / "no device".
#pragma once

#include <cstdint>

#include "strata/base/status.hpp"

namespace strata::store_detail {

/// True when built with CUDA and device `id` is in [0, gpu_count()).
/// \threadsafety safe.
bool device_available(int id);
/// Free bytes on device `id` (cudaMemGetInfo); 0 without that device. Makes `id` the
/// calling thread's current device.
uint64_t device_free_bytes(int id);
/// True when `p` is device (or managed) memory per cudaPointerGetAttributes; false for host
/// memory, null, or without a GPU. \threadsafety safe.
bool is_device_pointer(const void* p);

/// cudaMalloc of `nbytes` (at least 1) on device `id`, which becomes the calling thread's
/// current device. \error ResourceExhausted on cudaErrorMemoryAllocation; Internal naming
/// the CUDA error otherwise; Unimplemented without CUDA.
Result<void*> device_alloc(int id, uint64_t nbytes);
/// cudaFree of `p` (from device_alloc(id, ...)); null is a no-op.
void device_free(int id, void* p);

/// A CUDA stream on device `id`, created on first use (cudaStreamNonBlocking) and
/// destroyed with the object.
/// \threadsafety one object per thread.
class DeviceStream {
 public:
  explicit DeviceStream(int id) : id_(id) {}
  /// Copies on `external` (a cudaStream_t of the caller's, not destroyed here) when it is
  /// not null, else on a stream of its own created on first use.
  DeviceStream(int id, void* external) : id_(id), stream_(external), owned_(external == nullptr) {}
  ~DeviceStream();
  DeviceStream(const DeviceStream&) = delete;
  DeviceStream& operator=(const DeviceStream&) = delete;
  /// cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault) on this stream; both buffers
  /// must stay valid until synchronize() returns.
  /// \error Internal naming the CUDA error; Unimplemented without CUDA.
  Status copy_async(void* dst, const void* src, uint64_t nbytes);
  /// cudaStreamSynchronize (OK when nothing was queued). \error Internal naming the error.
  Status synchronize();

 private:
  Status ensure();
  int id_;
  void* stream_ = nullptr;
  bool owned_ = true;  // stream_ created (and destroyed) here
  bool device_set_ = false;
};

}  // namespace strata::store_detail
