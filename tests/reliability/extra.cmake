# tests/reliability/extra.cmake — the crash loop's child process (its path reaches
# test_reliability as STRATA_CRASH_LOOP_CHILD) and the store's private headers for the
# fault-injection tests (store/src/io_fault.hpp).
add_executable(crash_loop_child ${CMAKE_CURRENT_SOURCE_DIR}/reliability/crash_child/crash_loop_child.cpp)
target_link_libraries(crash_loop_child PRIVATE strata::strata GTest::gtest)
target_include_directories(crash_loop_child PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
add_dependencies(test_reliability crash_loop_child)
target_compile_definitions(test_reliability PRIVATE
  STRATA_CRASH_LOOP_CHILD="$<TARGET_FILE:crash_loop_child>")
target_include_directories(test_reliability PRIVATE ${PROJECT_SOURCE_DIR}/store/src)
# The corruption tests read the catalog (SQLite) and run `strata store verify`.
target_link_libraries(test_reliability PRIVATE SQLite::SQLite3)
add_dependencies(test_reliability strata_cli)
target_compile_definitions(test_reliability PRIVATE STRATA_CLI="$<TARGET_FILE:strata_cli>")

# Concurrency: its own executable (label "concurrency") so that it can run alone under
# ThreadSanitizer; its child process reads a store beside the test's writer.
add_executable(store_reader_child ${CMAKE_CURRENT_SOURCE_DIR}/reliability/concurrency/store_reader_child.cpp)
target_link_libraries(store_reader_child PRIVATE strata::strata GTest::gtest)
target_include_directories(store_reader_child PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
add_executable(test_concurrency ${CMAKE_CURRENT_SOURCE_DIR}/reliability/concurrency/test_concurrency.cpp)
target_link_libraries(test_concurrency PRIVATE strata::strata GTest::gtest GTest::gtest_main)
target_include_directories(test_concurrency PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
add_dependencies(test_concurrency store_reader_child)
target_compile_definitions(test_concurrency PRIVATE
  STRATA_STORE_READER_CHILD="$<TARGET_FILE:store_reader_child>")
gtest_discover_tests(test_concurrency PROPERTIES LABELS concurrency DISCOVERY_TIMEOUT 60)
