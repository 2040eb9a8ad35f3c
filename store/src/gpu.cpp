// strata::store — CUDA runtime helpers (see gpu.hpp).
#include "strata/store/gpu.hpp"

#include <algorithm>
#include <cctype>

#ifdef STRATA_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace strata {

bool built_with_cuda() noexcept {
#ifdef STRATA_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

int gpu_count() noexcept {
#ifdef STRATA_HAVE_CUDA
  static const int count = [] {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // clear the (non-sticky) error
      return 0;
    }
    return n;
  }();
  return count;
#else
  return 0;
#endif
}

#ifdef STRATA_HAVE_CUDA
namespace {
Status cuda_status(cudaError_t err, const std::string& what) {
  return internal_error(what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}
Status check_index(int index) {
  if (index < 0 || index >= gpu_count()) {
    return out_of_range("GPU index " + std::to_string(index) + " is not in [0, " +
                        std::to_string(gpu_count()) + ")");
  }
  return Status::OK();
}
}  // namespace
#endif

Status host_register(void* ptr, uint64_t nbytes) {
#ifdef STRATA_HAVE_CUDA
  if (ptr == nullptr || nbytes == 0) {
    return invalid_argument("host_register: null pointer or 0 bytes");
  }
  if (gpu_count() == 0) return unavailable("host_register: no GPU present");
  cudaError_t err = cudaHostRegister(ptr, nbytes, cudaHostRegisterDefault);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return cuda_status(err, "cudaHostRegister(" + std::to_string(nbytes) + " bytes)");
  }
  return Status::OK();
#else
  (void)ptr;
  (void)nbytes;
  return unimplemented("host_register: strata was built without CUDA");
#endif
}

Status host_unregister(void* ptr) {
#ifdef STRATA_HAVE_CUDA
  if (ptr == nullptr) return invalid_argument("host_unregister: null pointer");
  if (gpu_count() == 0) return unavailable("host_unregister: no GPU present");
  cudaError_t err = cudaHostUnregister(ptr);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return cuda_status(err, "cudaHostUnregister");
  }
  return Status::OK();
#else
  (void)ptr;
  return unimplemented("host_unregister: strata was built without CUDA");
#endif
}

Result<std::string> gpu_pci_bus_id(int index) {
#ifdef STRATA_HAVE_CUDA
  STRATA_RETURN_IF_ERROR(check_index(index));
  char buf[64] = {0};
  cudaError_t err = cudaDeviceGetPCIBusId(buf, sizeof(buf), index);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return cuda_status(err, "cudaDeviceGetPCIBusId(" + std::to_string(index) + ")");
  }
  // CUDA prints "00000000:65:00.0" (8-digit domain, upper case); hwloc and sysfs use
  // "0000:65:00.0".
  std::string id(buf);
  std::transform(id.begin(), id.end(), id.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  auto colon = id.find(':');
  if (colon != std::string::npos && colon > 4) id = id.substr(colon - 4);
  return id;
#else
  return unimplemented("gpu_pci_bus_id(" + std::to_string(index) +
                       "): strata was built without CUDA");
#endif
}

Result<std::string> gpu_name(int index) {
#ifdef STRATA_HAVE_CUDA
  STRATA_RETURN_IF_ERROR(check_index(index));
  cudaDeviceProp prop{};
  cudaError_t err = cudaGetDeviceProperties(&prop, index);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return cuda_status(err, "cudaGetDeviceProperties(" + std::to_string(index) + ")");
  }
  return std::string(prop.name);
#else
  return unimplemented("gpu_name(" + std::to_string(index) + "): strata was built without CUDA");
#endif
}

Result<uint64_t> gpu_memory_bytes(int index) {
#ifdef STRATA_HAVE_CUDA
  STRATA_RETURN_IF_ERROR(check_index(index));
  cudaDeviceProp prop{};
  cudaError_t err = cudaGetDeviceProperties(&prop, index);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return cuda_status(err, "cudaGetDeviceProperties(" + std::to_string(index) + ")");
  }
  return static_cast<uint64_t>(prop.totalGlobalMem);
#else
  return unimplemented("gpu_memory_bytes(" + std::to_string(index) +
                       "): strata was built without CUDA");
#endif
}

}  // namespace strata
