# The CUDA runtime and NCCL are loaded at run time (base/include/strata/base/gpu_libraries.hpp):
#   gpu_libraries.not_needed      no strata library or program has libcudart/libnccl/libcuda
#                                 as DT_NEEDED (readelf -d) or resolves one (ldd)
#   gpu_libraries.unloadable_env  STRATA_CUDART_LIBRARY / STRATA_NCCL_LIBRARY naming absent
#                                 files: `strata info` says why neither was loaded, and a C API
#                                 store + optimizer round trip runs (the device tier refuses)
#   gpu_libraries.hidden          the CPU-only host: the toolkit's library directories hidden
#                                 by an empty tmpfs in a private mount namespace (unshare -m;
#                                 skipped where the kernel or the sandbox refuses it), the same
#                                 checks
# All run tests/base/gpu_libraries/check.cmake with MODE set. Label `consumer` (not `base`):
# they check the built libraries and programs as a client sees them, which the sanitizer
# runs (labels base, store, optimizer, collectives; scripts/sanitizers.sh) do not build.
add_executable(strata_cpu_only_host ${CMAKE_CURRENT_SOURCE_DIR}/base/gpu_libraries/cpu_only_host.c)
target_link_libraries(strata_cpu_only_host PRIVATE strata::c)
target_compile_options(strata_cpu_only_host PRIVATE -Wall -Wextra -Werror)

set(_gpu_lib_files $<TARGET_FILE:strata_c> $<TARGET_FILE:strata_cli>
    $<TARGET_FILE:strata_cpu_only_host>)
foreach(_t strata_python strata_base_shared strata_store_shared strata_collectives_shared
           strata_optimizer_shared)
  if(TARGET ${_t})
    list(APPEND _gpu_lib_files $<TARGET_FILE:${_t}>)
  endif()
endforeach()
list(JOIN _gpu_lib_files "|" _gpu_lib_files)
set(_gpu_lib_args -DSTRATA=$<TARGET_FILE:strata_cli> -DCONSUMER=$<TARGET_FILE:strata_cpu_only_host>
    -DBUILT_WITH_CUDA=${STRATA_HAVE_CUDA} -DCUDA_MAJOR=${CUDAToolkit_VERSION_MAJOR} "-DFILES=${_gpu_lib_files}")
foreach(_mode not_needed unloadable_env hidden)
  add_test(NAME gpu_libraries.${_mode}
           COMMAND ${CMAKE_COMMAND} -DMODE=${_mode} ${_gpu_lib_args}
                   -DWORK=${CMAKE_CURRENT_BINARY_DIR}/gpu_libraries_${_mode}
                   -P ${CMAKE_CURRENT_SOURCE_DIR}/base/gpu_libraries/check.cmake)
  set_tests_properties(gpu_libraries.${_mode} PROPERTIES LABELS consumer TIMEOUT 120
                       SKIP_REGULAR_EXPRESSION "SKIP: ")
endforeach()
