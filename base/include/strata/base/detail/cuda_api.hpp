// strata (internal) — the table of CUDA runtime functions strata calls, filled by dlsym from
// the library cuda_runtime_library() loaded (strata/base/gpu_libraries.hpp). Callers write
// `cudart()->cudaMalloc(&p, n)` instead of `cudaMalloc(&p, n)`; nothing links libcudart.
//
// Only meaningful in a build compiled against the CUDA toolkit's headers (STRATA_HAVE_CUDA,
// defined privately on strata's own targets); elsewhere this header declares nothing. Not a
// public API: the table grows whenever strata calls another function.
#pragma once

#ifdef STRATA_HAVE_CUDA
#include <cuda_runtime_api.h>

namespace strata::detail {

// The functions looked up, each by its name after macro expansion (so a header that maps a
// name to a versioned symbol, e.g. cudaX -> cudaX_ptsz, is followed exactly as a linked call
// would be). A library lacking any of them is treated as not loaded.
#define STRATA_CUDART_FUNCTIONS(X)                                                       \
  X(cudaGetDeviceCount) X(cudaSetDevice) X(cudaFree) X(cudaMemcpy) X(cudaMemcpyAsync)    \
  X(cudaMemset) X(cudaStreamCreateWithFlags) X(cudaStreamDestroy) X(cudaStreamQuery)     \
  X(cudaStreamSynchronize) X(cudaHostRegister) X(cudaHostUnregister)                     \
  X(cudaGetDeviceProperties) X(cudaDeviceGetPCIBusId) X(cudaPointerGetAttributes)        \
  X(cudaMemGetInfo) X(cudaGetErrorString) X(cudaGetErrorName) X(cudaGetLastError)        \
  X(cudaRuntimeGetVersion)

/// Pointers into the loaded CUDA runtime; every member is non-null in the object cudart()
/// returns. Members are named as the functions so call sites read as the CUDA API.
struct CudartApi {
#define STRATA_CUDART_MEMBER(fn) decltype(&::fn) fn = nullptr;
  STRATA_CUDART_FUNCTIONS(STRATA_CUDART_MEMBER)
#undef STRATA_CUDART_MEMBER
  // cuda_runtime.h (included by nccl.h) adds a template overload of cudaMalloc, so its
  // pointer type is spelled out rather than taken with decltype.
  cudaError_t (*cudaMalloc)(void** dev_ptr, size_t size) = nullptr;
};

/// The CUDA runtime's function table, loading the library on first call
/// (cuda_runtime_library()); nullptr when it could not be loaded — callers then behave as
/// on a host without a GPU.
/// \threadsafety safe to call concurrently; the table never changes once returned.
const CudartApi* cudart() noexcept;

}  // namespace strata::detail

#endif  // STRATA_HAVE_CUDA
