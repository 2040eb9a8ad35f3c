// strata::store — every CUDA runtime call of strata: the public helpers of gpu.hpp
// (counting GPUs, page-locking host memory, naming devices) and the device tier's private
// ones (gpu_detail.hpp: allocation, pointer queries, streams). Compiled against the CUDA
// runtime's headers when STRATA_HAVE_CUDA and calling it through the table strata::base
// fills at run time (detail/cuda_api.hpp: dlopen, never linked); when that library cannot be
// loaded there are zero GPUs, as when it reports no device. Without STRATA_HAVE_CUDA every
// function is still defined and reports no GPU (Unimplemented where an error is returned).
#include "strata/store/gpu.hpp"

#include <algorithm>
#include <cctype>
#include <string>

#include "gpu_detail.hpp"

#include "strata/base/gpu_libraries.hpp"

#ifdef STRATA_HAVE_CUDA
#include "strata/base/detail/cuda_api.hpp"
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
    const detail::CudartApi* cu = detail::cudart();
    if (cu == nullptr) return 0;  // the CUDA runtime could not be loaded: no GPU
    int n = 0;
    cudaError_t err = cu->cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      (void)cu->cudaGetLastError();  // clear the (non-sticky) error
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

/// The loaded CUDA runtime; only called after gpu_count() > 0 or require_cuda_runtime()
/// succeeded (so it is loaded).
const detail::CudartApi& cuda() { return *detail::cudart(); }

/// Unavailable "<what>: no GPU present", with why the CUDA runtime is not loaded when it is
/// not (naming each file tried and dlerror()).
Status no_gpu(const std::string& what) {
  const GpuLibraryInfo& lib = cuda_runtime_library();
  return unavailable(what + ": no GPU present" + (lib.loaded ? "" : " (" + lib.error + ")"));
}

/// Internal "<what>: <error name> (<error string>)".
Status cuda_error(cudaError_t err, const std::string& what) {
  return internal_error(what + ": " + cuda().cudaGetErrorName(err) + " (" +
                        cuda().cudaGetErrorString(err) + ")");
}

/// OK for cudaSuccess; ResourceExhausted for cudaErrorMemoryAllocation; else cuda_error().
Status cuda_status(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return Status::OK();
  Status st = cuda_error(err, what);
  if (err == cudaErrorMemoryAllocation) return resource_exhausted(st.message());
  return st;
}

Status check_index(int index) {
  if (index < 0 || index >= gpu_count()) {
    if (!cuda_runtime_library().loaded) {
      return out_of_range("GPU index " + std::to_string(index) + " is not in [0, 0): " +
                          cuda_runtime_library().error);
    }
    return out_of_range("GPU index " + std::to_string(index) + " is not in [0, " +
                        std::to_string(gpu_count()) + ")");
  }
  return Status::OK();
}

Result<cudaDeviceProp> device_properties(int index) {
  STRATA_RETURN_IF_ERROR(check_index(index));
  cudaDeviceProp prop{};
  cudaError_t err = cuda().cudaGetDeviceProperties(&prop, index);
  if (err != cudaSuccess) {
    (void)cuda().cudaGetLastError();
    return cuda_error(err, "cudaGetDeviceProperties(" + std::to_string(index) + ")");
  }
  return prop;
}

}  // namespace
#endif

Status host_register(void* ptr, uint64_t nbytes) {
#ifdef STRATA_HAVE_CUDA
  if (ptr == nullptr || nbytes == 0) {
    return invalid_argument("host_register: null pointer or 0 bytes");
  }
  if (gpu_count() == 0) return no_gpu("host_register");
  cudaError_t err = cuda().cudaHostRegister(ptr, nbytes, cudaHostRegisterDefault);
  if (err != cudaSuccess) {
    (void)cuda().cudaGetLastError();
    return cuda_error(err, "cudaHostRegister(" + std::to_string(nbytes) + " bytes)");
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
  if (gpu_count() == 0) return no_gpu("host_unregister");
  cudaError_t err = cuda().cudaHostUnregister(ptr);
  if (err != cudaSuccess) {
    (void)cuda().cudaGetLastError();
    return cuda_error(err, "cudaHostUnregister");
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
  cudaError_t err = cuda().cudaDeviceGetPCIBusId(buf, sizeof(buf), index);
  if (err != cudaSuccess) {
    (void)cuda().cudaGetLastError();
    return cuda_error(err, "cudaDeviceGetPCIBusId(" + std::to_string(index) + ")");
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
  STRATA_ASSIGN_OR_RETURN(cudaDeviceProp prop, device_properties(index));
  return std::string(prop.name);
#else
  return unimplemented("gpu_name(" + std::to_string(index) + "): strata was built without CUDA");
#endif
}

Result<uint64_t> gpu_memory_bytes(int index) {
#ifdef STRATA_HAVE_CUDA
  STRATA_ASSIGN_OR_RETURN(cudaDeviceProp prop, device_properties(index));
  return static_cast<uint64_t>(prop.totalGlobalMem);
#else
  return unimplemented("gpu_memory_bytes(" + std::to_string(index) +
                       "): strata was built without CUDA");
#endif
}

// ---------------------------------------------------------------- the device tier

namespace store_detail {

#ifdef STRATA_HAVE_CUDA

bool device_available(int id) { return id >= 0 && id < gpu_count(); }

uint64_t device_free_bytes(int id) {
  if (!device_available(id)) return 0;
  size_t free_b = 0, total = 0;
  cuda().cudaSetDevice(id);
  if (cuda().cudaMemGetInfo(&free_b, &total) != cudaSuccess) return 0;
  return free_b;
}

bool is_device_pointer(const void* p) {
  if (p == nullptr || gpu_count() == 0) return false;
  cudaPointerAttributes a{};
  if (cuda().cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cuda().cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

Result<void*> device_alloc(int id, uint64_t nbytes) {
  STRATA_RETURN_IF_ERROR(require_cuda_runtime("device tier"));
  STRATA_RETURN_IF_ERROR(cuda_status(cuda().cudaSetDevice(id), "cudaSetDevice"));
  void* p = nullptr;
  cudaError_t e = cuda().cudaMalloc(&p, nbytes ? nbytes : 1);
  if (e != cudaSuccess) {
    cuda().cudaGetLastError();
    return cuda_status(e, "cudaMalloc of " + std::to_string(nbytes) + " bytes on device " +
                              std::to_string(id));
  }
  return p;
}

void device_free(int id, void* p) {
  if (!p || detail::cudart() == nullptr) return;
  cuda().cudaSetDevice(id);
  cuda().cudaFree(p);
}

DeviceStream::~DeviceStream() {
  if (stream_ && owned_) cuda().cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

Status DeviceStream::ensure() {
  if (stream_ && !owned_ && !device_set_) {
    // The caller's stream (StoreOptions::device_stream): copy with its device current.
    STRATA_RETURN_IF_ERROR(require_cuda_runtime("device tier"));
    STRATA_RETURN_IF_ERROR(cuda_status(cuda().cudaSetDevice(id_), "cudaSetDevice"));
    device_set_ = true;
  }
  if (stream_) return Status::OK();
  STRATA_RETURN_IF_ERROR(require_cuda_runtime("device tier"));
  STRATA_RETURN_IF_ERROR(cuda_status(cuda().cudaSetDevice(id_), "cudaSetDevice"));
  cudaStream_t s;
  STRATA_RETURN_IF_ERROR(cuda_status(
      cuda().cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"));
  stream_ = s;
  return Status::OK();
}

Status DeviceStream::copy_async(void* dst, const void* src, uint64_t nbytes) {
  STRATA_RETURN_IF_ERROR(ensure());
  if (nbytes == 0) return Status::OK();
  return cuda_status(cuda().cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault,
                                            static_cast<cudaStream_t>(stream_)),
                     "cudaMemcpyAsync of " + std::to_string(nbytes) + " bytes");
}

Status DeviceStream::synchronize() {
  if (!stream_) return Status::OK();
  return cuda_status(cuda().cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)),
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

}  // namespace store_detail
}  // namespace strata
