# Finds strata's dependencies (Debian 12 packages; see scripts/install-deps.sh).
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(URING REQUIRED IMPORTED_TARGET liburing)
pkg_check_modules(HWLOC REQUIRED IMPORTED_TARGET hwloc)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
pkg_check_modules(HWY REQUIRED IMPORTED_TARGET libhwy)
find_package(Boost 1.74 REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(SQLite3 REQUIRED)

# Gloo: Debian's libgloo-dev ships headers and a shared library without a CMake package.
find_path(GLOO_INCLUDE_DIR gloo/config.h REQUIRED)
find_library(GLOO_LIBRARY gloo REQUIRED)
if(NOT TARGET strata_dep_gloo)
  add_library(strata_dep_gloo INTERFACE IMPORTED)
  target_include_directories(strata_dep_gloo INTERFACE ${GLOO_INCLUDE_DIR})
  target_link_libraries(strata_dep_gloo INTERFACE ${GLOO_LIBRARY})
endif()

# CUDA runtime and NCCL: optional, and never linked. A CUDA build compiles against the
# toolkit's headers (cuda_runtime_api.h, nccl.h) for types only; strata::base loads
# libcudart.so.<major> and libnccl.so.2 at run time with dlopen (base/src/gpu_libraries.cpp),
# so no strata library or program has them as DT_NEEDED and one build runs on hosts with and
# without them. Found in /usr/local/cuda (or CUDAToolkit_ROOT).
#   STRATA_CUDA_INCLUDE_DIRS   the toolkit's and nccl.h's include directories
#   STRATA_CUDART_BUILD_DIR    directory of the toolkit's libcudart (the loader's last resort)
#   STRATA_NCCL_BUILD_DIR      directory of libnccl, likewise ("" when only nccl.h was found)
set(STRATA_HAVE_CUDA OFF)
if(STRATA_WITH_CUDA)
  if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_TARGET_DIR}/lib64)
    if(NCCL_INCLUDE_DIR)
      set(STRATA_HAVE_CUDA ON)
      set(STRATA_CUDA_INCLUDE_DIRS ${CUDAToolkit_INCLUDE_DIRS} ${NCCL_INCLUDE_DIR})
      list(REMOVE_DUPLICATES STRATA_CUDA_INCLUDE_DIRS)
      set(STRATA_CUDART_BUILD_DIR "${CUDAToolkit_LIBRARY_DIR}")
      set(STRATA_NCCL_BUILD_DIR "")
      if(NCCL_LIBRARY)
        get_filename_component(STRATA_NCCL_BUILD_DIR "${NCCL_LIBRARY}" DIRECTORY)
      endif()
    endif()
  endif()
endif()
message(STATUS "strata: CUDA runtime + NCCL headers (libraries loaded at run time): ${STRATA_HAVE_CUDA}")
