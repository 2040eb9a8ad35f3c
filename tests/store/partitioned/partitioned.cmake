# tests/store/partitioned — partitioned objects (put/fetch over ranks, reduce_scatter_grads).
# partition_worker is started N times by test_store (test_partitioned.cpp) through
# launch_local(): real processes over loopback, each with its own store directory.
add_executable(partition_worker ${CMAKE_CURRENT_SOURCE_DIR}/store/partitioned/partition_worker.cpp)
target_link_libraries(partition_worker PRIVATE strata::strata)
target_include_directories(partition_worker PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})  # common/
if(TARGET test_store)
  add_dependencies(test_store partition_worker)
  target_compile_definitions(test_store PRIVATE
    STRATA_PARTITION_WORKER="$<TARGET_FILE:partition_worker>")
endif()
