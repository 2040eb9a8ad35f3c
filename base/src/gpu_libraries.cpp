// strata::base — loading the CUDA runtime and NCCL at run time (gpu_libraries.hpp) and the
// function tables of detail/cuda_api.hpp and detail/nccl_api.hpp.
#include "strata/base/gpu_libraries.hpp"

#include <string>
#include <vector>

#ifdef STRATA_HAVE_CUDA
#include <dlfcn.h>
#include <link.h>

#include "strata/base/detail/cuda_api.hpp"
#include "strata/base/detail/nccl_api.hpp"
#include "strata/base/env.hpp"
#endif

namespace strata {
namespace {

#ifdef STRATA_HAVE_CUDA

#define STRATA_GPU_STR2(x) #x
#define STRATA_GPU_STR(x) STRATA_GPU_STR2(x)

// Build-time toolkit library directories (the last place looked), from CMake.
#ifndef STRATA_CUDART_BUILD_DIR
#define STRATA_CUDART_BUILD_DIR ""
#endif
#ifndef STRATA_NCCL_BUILD_DIR
#define STRATA_NCCL_BUILD_DIR ""
#endif

std::string dl_error() {
  const char* e = dlerror();
  return e != nullptr ? std::string(e) : std::string("no error text from dlerror()");
}

/// The file the dynamic loader mapped for `handle` (its link-map name, a full path when it
/// was found through a search), or `fallback`.
std::string mapped_path(void* handle, const std::string& fallback) {
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
      map->l_name[0] != '\0') {
    return map->l_name;
  }
  return fallback;
}

struct Candidate {
  std::string file;
  std::string source;  // "$STRATA_CUDART_LIBRARY", "soname", "build-time toolkit directory"
};

/// The search order of gpu_libraries.hpp: the variable alone when set, else the soname, then
/// the build-time directory.
std::vector<Candidate> candidates(const std::string& env_var, const std::string& soname,
                                  const std::string& build_dir) {
  std::optional<std::string> v = env_string(env_var.c_str());
  if (v && !v->empty()) return {{*v, "$" + env_var}};
  std::vector<Candidate> out{{soname, "soname"}};
  if (!build_dir.empty()) out.push_back({build_dir + "/" + soname, "build-time toolkit directory"});
  return out;
}

/// dlopens each candidate in turn until one opens and `resolve(handle, table)` (which
/// returns "" or why a symbol is missing) succeeds. Records every attempt in `info`.
template <class Table, class Resolve>
void load_library(GpuLibraryInfo& info, Table& table, const std::vector<Candidate>& cands,
                  Resolve resolve) {
  for (const Candidate& c : cands) {
    const std::string label = c.file + " (" + c.source + ")";
    (void)dlerror();
    void* handle = dlopen(c.file.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      info.attempts.push_back(label + ": " + dl_error());
      continue;
    }
    std::string missing = resolve(handle, table);
    if (!missing.empty()) {
      info.attempts.push_back(label + ": " + missing);
      table = Table{};
      dlclose(handle);
      continue;
    }
    // Never dlclose'd: the library stays for the life of the process, as if linked.
    info.loaded = true;
    info.path = mapped_path(handle, c.file);
    info.attempts.push_back(label + ": loaded " + info.path);
    return;
  }
  std::string joined;
  for (const std::string& a : info.attempts) joined += (joined.empty() ? "" : "; ") + a;
  info.error = info.name + " not loaded: " + joined;
}

#define STRATA_GPU_RESOLVE(fn)                                                       \
  (void)dlerror();                                                                   \
  t.fn = reinterpret_cast<decltype(t.fn)>(dlsym(handle, STRATA_GPU_STR(fn)));        \
  if (t.fn == nullptr) return std::string("dlsym(" STRATA_GPU_STR(fn) "): ") + dl_error();

std::string resolve_cudart(void* handle, detail::CudartApi& t) {
  STRATA_CUDART_FUNCTIONS(STRATA_GPU_RESOLVE)
  STRATA_GPU_RESOLVE(cudaMalloc)
  return {};
}

std::string resolve_nccl(void* handle, detail::NcclApi& t) {
  STRATA_NCCL_FUNCTIONS(STRATA_GPU_RESOLVE)
  return {};
}

#undef STRATA_GPU_RESOLVE

struct CudartState {
  GpuLibraryInfo info;
  detail::CudartApi api;
};

struct NcclState {
  GpuLibraryInfo info;
  detail::NcclApi api;
};

const CudartState& cudart_state() {
  static const CudartState state = [] {
    CudartState s;
    s.info.name = "CUDA runtime";
    s.info.env_var = "STRATA_CUDART_LIBRARY";
    s.info.built = true;
    const std::string soname = "libcudart.so." + std::to_string(CUDART_VERSION / 1000);
    load_library(s.info, s.api, candidates(s.info.env_var, soname, STRATA_CUDART_BUILD_DIR),
                 resolve_cudart);
    if (s.info.loaded) {
      int v = 0;
      if (s.api.cudaRuntimeGetVersion(&v) == cudaSuccess) {
        s.info.version = std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
      }
    }
    return s;
  }();
  return state;
}

const NcclState& nccl_state() {
  static const NcclState state = [] {
    NcclState s;
    s.info.name = "NCCL";
    s.info.env_var = "STRATA_NCCL_LIBRARY";
    s.info.built = true;
    const std::string soname = "libnccl.so." + std::to_string(NCCL_MAJOR);
    load_library(s.info, s.api, candidates(s.info.env_var, soname, STRATA_NCCL_BUILD_DIR),
                 resolve_nccl);
    if (s.info.loaded) {
      int v = 0;
      if (s.api.ncclGetVersion(&v) == ncclSuccess) {
        // NCCL_VERSION(X,Y,Z): X*1000+Y*100+Z up to 2.8, X*10000+Y*100+Z from 2.9.
        const int major = v >= 10000 ? v / 10000 : v / 1000;
        const int minor = v >= 10000 ? (v % 10000) / 100 : (v % 1000) / 100;
        s.info.version = std::to_string(major) + "." + std::to_string(minor) + "." +
                         std::to_string(v % 100);
      }
    }
    return s;
  }();
  return state;
}

#else  // !STRATA_HAVE_CUDA

GpuLibraryInfo not_built(const char* name, const char* env_var) {
  GpuLibraryInfo info;
  info.name = name;
  info.env_var = env_var;
  info.error = std::string(name) +
               " not loaded: strata was built without CUDA (STRATA_WITH_CUDA=OFF or no CUDA "
               "toolkit at configure time)";
  return info;
}

#endif

Status require(const GpuLibraryInfo& info, const std::string& what) {
  if (info.loaded) return Status::OK();
  const std::string prefix = what.empty() ? std::string() : what + ": ";
  if (!info.built) return unimplemented(prefix + info.error);
  return unavailable(prefix + info.error);
}

}  // namespace

const GpuLibraryInfo& cuda_runtime_library() noexcept {
#ifdef STRATA_HAVE_CUDA
  return cudart_state().info;
#else
  static const GpuLibraryInfo info = not_built("CUDA runtime", "STRATA_CUDART_LIBRARY");
  return info;
#endif
}

const GpuLibraryInfo& nccl_library() noexcept {
#ifdef STRATA_HAVE_CUDA
  return nccl_state().info;
#else
  static const GpuLibraryInfo info = not_built("NCCL", "STRATA_NCCL_LIBRARY");
  return info;
#endif
}

Status require_cuda_runtime(const std::string& what) {
  return require(cuda_runtime_library(), what);
}

Status require_nccl(const std::string& what) { return require(nccl_library(), what); }

#ifdef STRATA_HAVE_CUDA
namespace detail {

const CudartApi* cudart() noexcept {
  const CudartState& s = cudart_state();
  return s.info.loaded ? &s.api : nullptr;
}

const NcclApi* nccl() noexcept {
  const NcclState& s = nccl_state();
  return s.info.loaded ? &s.api : nullptr;
}

}  // namespace detail
#endif

}  // namespace strata
