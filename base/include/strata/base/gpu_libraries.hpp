// strata::base — the CUDA runtime and NCCL, loaded at run time (dlopen) rather than linked,
// so that one build of strata runs on hosts with and without them (as KvikIO loads cuFile).
//
// A build made against the CUDA toolkit (STRATA_HAVE_CUDA) uses the toolkit's headers for
// types only; no strata library or program has libcudart or libnccl among its DT_NEEDED
// entries. The first call that needs one of them loads it, once per process, trying in order:
//   1. the path in the environment variable (STRATA_CUDART_LIBRARY, STRATA_NCCL_LIBRARY) —
//      when set (non-empty) it is the only candidate, so a wrong path is reported, not
//      silently replaced by another copy;
//   2. the soname (libcudart.so.<major of the build's toolkit>, libnccl.so.2), found the
//      way the dynamic loader finds any library (LD_LIBRARY_PATH, RUNPATH, ld.so.cache);
//   3. the same file in the toolkit's library directory seen at build time (e.g.
//      /usr/local/cuda/lib64/libcudart.so.13).
// A library that cannot be loaded (or lacks a function strata calls) leaves every GPU path
// reporting "no GPU" — gpu_count() is 0, the device tier and the NCCL backend are
// Unavailable with a message naming each file tried and dlerror() — never a crash.
#pragma once

#include <string>
#include <vector>

#include "strata/base/status.hpp"

namespace strata {

/// What happened when strata loaded (or tried to load) one GPU library.
struct GpuLibraryInfo {
  /// "CUDA runtime" or "NCCL".
  std::string name;
  /// The environment variable that names its file: "STRATA_CUDART_LIBRARY" /
  /// "STRATA_NCCL_LIBRARY".
  std::string env_var;
  /// True when this build of strata was compiled against the library's headers; false means
  /// the library is never loaded (built with STRATA_WITH_CUDA=OFF or without a toolkit).
  bool built = false;
  /// True when the library was loaded and every function strata calls was found in it.
  bool loaded = false;
  /// The file loaded, as the dynamic loader resolved it (e.g.
  /// "/usr/local/cuda-13.0/lib/libcudart.so.13"); empty when not loaded.
  std::string path;
  /// The library's own version, e.g. "13.0" (cudaRuntimeGetVersion) or "2.27.7"
  /// (ncclGetVersion); empty when not loaded.
  std::string version;
  /// Each candidate tried, in order, with dlopen's/dlsym's error for those that failed
  /// ("libcudart.so.13: cannot open shared object file: No such file or directory").
  std::vector<std::string> attempts;
  /// Why it is not loaded — "strata was built without CUDA" or "<name> not loaded: " followed
  /// by the attempts joined by "; " — empty when loaded.
  std::string error;
};

/// Loads the CUDA runtime on first call (see the file comment for the search order) and
/// describes the outcome; later calls return the same object. Loading never throws or
/// aborts; a failure is recorded in the result.
/// \returns a reference valid for the life of the process.
/// \threadsafety safe to call concurrently (the load happens once).
const GpuLibraryInfo& cuda_runtime_library() noexcept;

/// As cuda_runtime_library(), for NCCL (only the NCCL communicator backend needs it).
/// \threadsafety safe to call concurrently.
const GpuLibraryInfo& nccl_library() noexcept;

/// OK when the CUDA runtime is loaded; otherwise Unavailable carrying
/// cuda_runtime_library().error (which names each file tried and dlerror()), or Unimplemented
/// when strata was built without CUDA. \param what prefixes the message ("device tier: ...").
/// \threadsafety safe.
Status require_cuda_runtime(const std::string& what);

/// As require_cuda_runtime(), for NCCL. \threadsafety safe.
Status require_nccl(const std::string& what);

}  // namespace strata
