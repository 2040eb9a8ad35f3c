// strata (internal) — the table of NCCL functions strata calls, filled by dlsym from the
// library nccl_library() loaded (strata/base/gpu_libraries.hpp); nothing links libnccl.
// Only meaningful with STRATA_HAVE_CUDA (see cuda_api.hpp); not a public API.
#pragma once

#ifdef STRATA_HAVE_CUDA
#include <nccl.h>

namespace strata::detail {

#define STRATA_NCCL_FUNCTIONS(X)                                                           \
  X(ncclGetVersion) X(ncclGetErrorString) X(ncclGetUniqueId) X(ncclCommInitRankConfig)     \
  X(ncclCommGetAsyncError) X(ncclCommFinalize) X(ncclCommDestroy) X(ncclCommAbort)         \
  X(ncclAllGather) X(ncclReduceScatter) X(ncclAllReduce) X(ncclBroadcast)

/// Pointers into the loaded NCCL; every member is non-null in the object nccl() returns.
struct NcclApi {
#define STRATA_NCCL_MEMBER(fn) decltype(&::fn) fn = nullptr;
  STRATA_NCCL_FUNCTIONS(STRATA_NCCL_MEMBER)
#undef STRATA_NCCL_MEMBER
};

/// NCCL's function table, loading the library on first call (nccl_library()); nullptr when
/// it could not be loaded. \threadsafety safe to call concurrently.
const NcclApi* nccl() noexcept;

}  // namespace strata::detail

#endif  // STRATA_HAVE_CUDA
