# Collectives: a helper process for the multi-process tests. test_collectives starts it N
# times through launch_local() (real processes talking over loopback).
add_executable(strata_coll_worker ${CMAKE_CURRENT_SOURCE_DIR}/collectives/worker/coll_worker.cpp)
target_link_libraries(strata_coll_worker PRIVATE strata::collectives)
target_include_directories(strata_coll_worker PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})  # common/
if(STRATA_HAVE_CUDA)
  # Headers only: CUDA calls go through strata::base's run-time loader (detail/cuda_api.hpp).
  foreach(_t strata_coll_worker test_collectives)
    target_include_directories(${_t} SYSTEM PRIVATE ${STRATA_CUDA_INCLUDE_DIRS})
    target_compile_definitions(${_t} PRIVATE STRATA_HAVE_CUDA=1)
  endforeach()
endif()
if(TARGET test_collectives)
  add_dependencies(test_collectives strata_coll_worker)
  target_compile_definitions(test_collectives PRIVATE
    STRATA_COLL_WORKER="$<TARGET_FILE:strata_coll_worker>")
endif()
