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
