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
# it in the error ("the consumer", "the C consumer").
function(strata_build_against_prefix what)
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${SRC} -B ${BIN} -G ${GENERATOR}
                          -DCMAKE_PREFIX_PATH=${PREFIX} RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "configuring ${what} against ${PREFIX} failed: ${rc}")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${BIN} RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "building ${what} failed: ${rc}")
  endif()
endfunction()
