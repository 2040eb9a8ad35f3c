// strata::store (private) — CUDA runtime calls of the device tier (see store_device.hpp).
#include "store_device.hpp"

#include <string>

#ifdef STRATA_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace strata::store_detail {

#ifdef STRATA_HAVE_CUDA
namespace {
Status cuda_status(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return Status::OK();
  std::string msg = what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
  if (e == cudaErrorMemoryAllocation) return resource_exhausted(msg);
  return internal_error(msg);
}
}  // namespace

bool device_available(int id) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return id >= 0 && id < n;
}

uint64_t device_free_bytes(int id) {
  if (!device_available(id)) return 0;
  size_t free_b = 0, total = 0;
  cudaSetDevice(id);
  if (cudaMemGetInfo(&free_b, &total) != cudaSuccess) return 0;
  return free_b;
}

bool is_device_pointer(const void* p) {
  if (p == nullptr) return false;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return false;
  }
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

Result<void*> device_alloc(int id, uint64_t nbytes) {
  STRATA_RETURN_IF_ERROR(cuda_status(cudaSetDevice(id), "cudaSetDevice"));
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, nbytes ? nbytes : 1);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return cuda_status(e, "cudaMalloc of " + std::to_string(nbytes) + " bytes on device " +
                              std::to_string(id));
  }
  return p;
}

void device_free(int id, void* p) {
  if (!p) return;
  cudaSetDevice(id);
  cudaFree(p);
}

DeviceStream::~DeviceStream() {
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

Status DeviceStream::ensure() {
  if (stream_) return Status::OK();
  STRATA_RETURN_IF_ERROR(cuda_status(cudaSetDevice(id_), "cudaSetDevice"));
  cudaStream_t s;
  STRATA_RETURN_IF_ERROR(cuda_status(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                                     "cudaStreamCreate"));
  stream_ = s;
  return Status::OK();
}

Status DeviceStream::copy_async(void* dst, const void* src, uint64_t nbytes) {
  STRATA_RETURN_IF_ERROR(ensure());
  if (nbytes == 0) return Status::OK();
  return cuda_status(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault,
                                     static_cast<cudaStream_t>(stream_)),
                     "cudaMemcpyAsync of " + std::to_string(nbytes) + " bytes");
}

Status DeviceStream::synchronize() {
  if (!stream_) return Status::OK();
  return cuda_status(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)),
                     "cudaStreamSynchronize");
}

#else  // !STRATA_HAVE_CUDA

bool device_available(int) { return false; }
uint64_t device_free_bytes(int) { return 0; }
bool is_device_pointer(const void*) { return false; }
Result<void*> device_alloc(int, uint64_t) {
  return unimplemented("device tier: strata was built without CUDA");
}
void device_free(int, void*) {}
DeviceStream::~DeviceStream() = default;
Status DeviceStream::ensure() { return unimplemented("device tier: strata was built without CUDA"); }
Status DeviceStream::copy_async(void*, const void*, uint64_t) { return ensure(); }
Status DeviceStream::synchronize() { return Status::OK(); }

#endif

}  // namespace strata::store_detail
