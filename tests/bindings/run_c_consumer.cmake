# cmake -P script: installs strata into PREFIX, then builds tests/bindings/c_consumer/main.c
# twice against the installed files — with find_package(strata) + strata::c, and with a
# plain `cc -std=c99 -Wall -Werror ... -lstrata_c` — and runs both.
include(${CMAKE_CURRENT_LIST_DIR}/../common/consumer_build.cmake)
strata_install_fresh()
if(NOT EXISTS ${PREFIX}/include/strata/strata.h)
  message(FATAL_ERROR "strata.h was not installed to ${PREFIX}/include/strata")
endif()
strata_build_against_prefix("the C consumer")
# The plain compiler line a C user would type.
execute_process(COMMAND ${CC} -std=c99 -Wall -Wextra -Werror -pedantic -I${PREFIX}/include
                        ${SRC}/main.c -o ${BIN}/strata_c_consumer_cc -L${PREFIX}/${LIBDIR}
                        -Wl,-rpath,${PREFIX}/${LIBDIR} -lstrata_c -lm
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(rc)
  message(FATAL_ERROR "cc -std=c99 -Wall -Werror against ${PREFIX} failed: ${err}")
endif()
foreach(exe strata_c_consumer strata_c_consumer_cc)
  execute_process(COMMAND ${BIN}/${exe} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  message(STATUS "${exe} printed: ${out}${err}")
  if(rc OR NOT out MATCHES "c consumer ok")
    message(FATAL_ERROR "${exe} failed (rc=${rc}): ${out}${err}")
  endif()
endforeach()
