# tests/store/extra.cmake — helper executable for the store's crash and lock tests.
# test_store runs it as a subprocess (SIGKILL mid-stream of puts; a second process holding
# the lock); its path reaches the tests as STRATA_STORE_CRASH_HELPER.
add_executable(store_crash_helper ${CMAKE_CURRENT_SOURCE_DIR}/store/store_crash_helper/store_crash_helper.cpp)
target_link_libraries(store_crash_helper PRIVATE strata::strata GTest::gtest)
target_include_directories(store_crash_helper PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
if(TARGET test_store)
  # tests/store/data (topology XML files), by absolute path: __FILE__ is relative when
  # ccache's base_dir rewrites the compile line, and tests run in the build tree.
  target_compile_definitions(test_store PRIVATE
    STRATA_STORE_TEST_DATA="${CMAKE_CURRENT_SOURCE_DIR}/store/data")
  # Unit tests of the store's private classes (extent_allocator.hpp) include them by name.
  target_include_directories(test_store PRIVATE ${PROJECT_SOURCE_DIR}/store/src)
  add_dependencies(test_store store_crash_helper)
  target_compile_definitions(test_store PRIVATE
    STRATA_STORE_CRASH_HELPER="$<TARGET_FILE:store_crash_helper>")
endif()

# Partitioned objects: worker and its define for test_store.
include(${CMAKE_CURRENT_SOURCE_DIR}/store/partitioned/partitioned.cmake)
