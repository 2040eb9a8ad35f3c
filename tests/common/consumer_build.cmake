# Helpers of the `cmake -P` scripts that build a program against an installed strata
# (tests/consumer/run_consumer.cmake, tests/bindings/run_c_consumer.cmake). They read
# STRATA_BUILD_DIR, PREFIX, SRC, BIN and GENERATOR, which the scripts are given with -D.

# Removes PREFIX and BIN, then installs the build in STRATA_BUILD_DIR into PREFIX.
function(strata_install_fresh)
  file(REMOVE_RECURSE ${PREFIX} ${BIN})
  execute_process(COMMAND ${CMAKE_COMMAND} --install ${STRATA_BUILD_DIR} --prefix ${PREFIX}
                  RESULT_VARIABLE rc OUTPUT_QUIET)
  if(rc)
    message(FATAL_ERROR "cmake --install failed: ${rc}")
  endif()
endfunction()

# Configures the CMake project in SRC into BIN against PREFIX and builds it; `what` names
# it in the error ("the consumer", "the C consumer"). The packages strata's libraries use
# inside (Boost, CLI11, nlohmann_json, SQLite, pkg-config's, CUDA) are made unfindable: the
# installed package must not need them. Further arguments go to the configure step.
function(strata_build_against_prefix what)
  set(hidden "")
  foreach(p IN ITEMS Boost CLI11 nlohmann_json SQLite3 PkgConfig CUDAToolkit)
    list(APPEND hidden -DCMAKE_DISABLE_FIND_PACKAGE_${p}=ON)
  endforeach()
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${SRC} -B ${BIN} -G ${GENERATOR}
                          -DCMAKE_PREFIX_PATH=${PREFIX} ${hidden} ${ARGN} RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "configuring ${what} against ${PREFIX} failed: ${rc}")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${BIN} RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "building ${what} failed: ${rc}")
  endif()
endfunction()
