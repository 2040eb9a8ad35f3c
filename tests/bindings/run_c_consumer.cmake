# cmake -P script: installs strata into PREFIX, then builds tests/bindings/c_consumer/ (main.c, api_v6.c, api_v7.c, api_v8.c)
# twice against the installed files — with find_package(strata) + strata::c, and with a
# plain `cc -std=c99 -Wall -Werror ... -lstrata_c` — and runs both.
include(${CMAKE_CURRENT_LIST_DIR}/../common/consumer_build.cmake)
strata_install_fresh()
if(NOT EXISTS ${PREFIX}/include/strata/strata.h)
  message(FATAL_ERROR "strata.h was not installed to ${PREFIX}/include/strata")
endif()
# A C-only client needs none of the C++ libraries' packages, Threads included.
strata_build_against_prefix("the C consumer" -DCMAKE_DISABLE_FIND_PACKAGE_Threads=ON)
# The installed library exports the C API's strata_* symbols and nothing else.
file(GLOB _libs ${PREFIX}/${LIBDIR}/libstrata_c.so.*.*)
list(GET _libs 0 _lib)
execute_process(COMMAND nm -D --defined-only ${_lib} OUTPUT_VARIABLE syms RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "nm -D ${_lib} failed")
endif()
string(REGEX MATCHALL "[^\n]+" lines "${syms}")
set(foreign "")
set(api 0)
foreach(l IN LISTS lines)
  if(l MATCHES " strata_[A-Za-z0-9_]+$")
    math(EXPR api "${api} + 1")
  elseif(NOT l MATCHES " STRATA_C_[A-Z0-9_]+$")
    list(APPEND foreign "${l}")
  endif()
endforeach()
if(foreign OR api LESS 40)
  message(FATAL_ERROR "${_lib} exports ${api} strata_* symbols and these others: ${foreign}")
endif()
# ... and exactly the functions the installed strata.h declares (STRATA_C_API name(...)).
file(READ ${PREFIX}/include/strata/strata.h header)
string(REGEX MATCHALL "STRATA_C_API[^;(]*[ *](strata_[A-Za-z0-9_]+)\\(" decls "${header}")
set(declared "")
foreach(d IN LISTS decls)
  string(REGEX REPLACE ".*[ *](strata_[A-Za-z0-9_]+)\\($" "\\1" name "${d}")
  list(APPEND declared ${name})
endforeach()
set(exported "")
foreach(l IN LISTS lines)
  if(l MATCHES " (strata_[A-Za-z0-9_]+)$")
    list(APPEND exported ${CMAKE_MATCH_1})
  endif()
endforeach()
list(SORT declared)
list(REMOVE_DUPLICATES declared)
list(SORT exported)
set(not_exported ${declared})
list(REMOVE_ITEM not_exported ${exported})
set(not_declared ${exported})
list(REMOVE_ITEM not_declared ${declared})
if(not_exported OR not_declared)
  message(FATAL_ERROR "${_lib} and strata.h disagree: declared but not exported: "
                      "${not_exported}; exported but not declared: ${not_declared}")
endif()
list(LENGTH declared n_declared)
message(STATUS "libstrata_c exports the ${n_declared} functions strata.h declares")
# The plain compiler line a C user would type.
execute_process(COMMAND ${CC} -std=c99 -Wall -Wextra -Werror -pedantic -I${PREFIX}/include
                        ${SRC}/main.c ${SRC}/api_v6.c ${SRC}/api_v7.c ${SRC}/api_v8.c -o ${BIN}/strata_c_consumer_cc -L${PREFIX}/${LIBDIR}
                        -Wl,-rpath,${PREFIX}/${LIBDIR} -lstrata_c -lm
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(rc)
  message(FATAL_ERROR "cc -std=c99 -Wall -Werror against ${PREFIX} failed: ${err}")
endif()
# The same program built from the installed pkg-config file's flags.
execute_process(COMMAND ${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${PREFIX}/${LIBDIR}/pkgconfig
                        pkg-config --cflags --libs strata_c
                OUTPUT_VARIABLE pc_flags ERROR_VARIABLE err RESULT_VARIABLE rc
                OUTPUT_STRIP_TRAILING_WHITESPACE)
if(rc)
  message(FATAL_ERROR "pkg-config --cflags --libs strata_c (PKG_CONFIG_PATH="
                      "${PREFIX}/${LIBDIR}/pkgconfig) failed: ${err}")
endif()
separate_arguments(pc_list UNIX_COMMAND "${pc_flags}")
execute_process(COMMAND ${CC} -std=c99 -Wall -Wextra -Werror -pedantic ${SRC}/main.c ${SRC}/api_v6.c ${SRC}/api_v7.c ${SRC}/api_v8.c
                        -o ${BIN}/strata_c_consumer_pc ${pc_list} -lm
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(rc)
  message(FATAL_ERROR "cc with pkg-config's flags (${pc_flags}) failed: ${err}")
endif()
foreach(exe strata_c_consumer strata_c_consumer_cc strata_c_consumer_pc)
  execute_process(COMMAND ${BIN}/${exe} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  message(STATUS "${exe} printed: ${out}${err}")
  if(rc OR NOT out MATCHES "c consumer ok")
    message(FATAL_ERROR "${exe} failed (rc=${rc}): ${out}${err}")
  endif()
endforeach()
