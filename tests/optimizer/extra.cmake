# Optimizer tests beyond the GoogleTest executable: parity with torch.optim (pytest), which
# drives the real kernels through the small test-only executable optim_driver.
add_executable(optim_driver ${CMAKE_CURRENT_SOURCE_DIR}/optimizer/driver/optim_driver.cpp)
target_link_libraries(optim_driver PRIVATE strata::optimizer CLI11::CLI11)
if(STRATA_PYTHON)
  add_test(NAME optimizer.torch_parity
           COMMAND ${STRATA_PYTHON} -m pytest -q -p no:cacheprovider
                   ${CMAKE_CURRENT_SOURCE_DIR}/optimizer/test_torch_parity.py)
  set_tests_properties(optimizer.torch_parity PROPERTIES
    LABELS optimizer TIMEOUT 300
    ENVIRONMENT "STRATA_OPTIM_DRIVER=$<TARGET_FILE:optim_driver>")
endif()

# Offloaded optimizer (test_offload_resume.cpp): the child process that is SIGKILLed and
# resumed. Its source is also globbed into test_optimizer, where it compiles to nothing
# without STRATA_OFFLOAD_CRASH_CHILD_MAIN.
add_executable(offload_crash_child ${CMAKE_CURRENT_SOURCE_DIR}/optimizer/offload_crash_child.cpp)
target_compile_definitions(offload_crash_child PRIVATE STRATA_OFFLOAD_CRASH_CHILD_MAIN=1)
target_include_directories(offload_crash_child PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/optimizer)
target_link_libraries(offload_crash_child PRIVATE strata::strata)
add_dependencies(test_optimizer offload_crash_child)
target_compile_definitions(test_optimizer PRIVATE
  STRATA_OFFLOAD_CRASH_CHILD="$<TARGET_FILE:offload_crash_child>")

# Bit comparisons with torch's fp32 sequence: no FMA contraction beyond the explicit fmaf.
set_source_files_properties(${CMAKE_CURRENT_SOURCE_DIR}/optimizer/test_torch_exact.cpp
  PROPERTIES COMPILE_OPTIONS -ffp-contract=off)

# A topology whose kernel (OS) NUMA node numbers differ from hwloc's logical order: the
# kernel threads and the pinned memory of the offloaded optimizer must target one node.
set(_swapped_xml ${CMAKE_CURRENT_SOURCE_DIR}/optimizer/data/swapped_numa_nodes.xml)
target_compile_definitions(test_optimizer PRIVATE STRATA_SWAPPED_NUMA_XML="${_swapped_xml}")
add_test(NAME optimizer.numa_swapped_xml
         COMMAND test_optimizer --gtest_filter=OffloadNumaPlacement.*)
set_tests_properties(optimizer.numa_swapped_xml PROPERTIES
  LABELS optimizer TIMEOUT 120 ENVIRONMENT "HWLOC_XMLFILE=${_swapped_xml}")
