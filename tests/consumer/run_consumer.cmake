# cmake -P script: install strata, build the consumer project against it, run it.
include(${CMAKE_CURRENT_LIST_DIR}/../common/consumer_build.cmake)
strata_install_fresh()
# Every installed public header compiles on its own with plain -I (not CMake's -isystem)
# under strict warnings: a client building with -Werror includes any of them.
file(GLOB_RECURSE _headers RELATIVE ${PREFIX}/include ${PREFIX}/include/strata/*.hpp)
list(LENGTH _headers _n)
if(_n LESS 20)
  message(FATAL_ERROR "only ${_n} public C++ headers installed under ${PREFIX}/include/strata")
endif()
foreach(h IN LISTS _headers)
  file(WRITE ${BIN}-headers/one.cpp "#include <${h}>\n")
  execute_process(COMMAND ${CXX} -std=c++20 -Wall -Wextra -Wpedantic -Wshadow -Werror
                          -fsyntax-only -I${PREFIX}/include ${BIN}-headers/one.cpp
                  RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(rc)
    message(FATAL_ERROR "public header ${h} does not compile alone with -Wall -Wextra "
                        "-Wpedantic -Wshadow -Werror -I${PREFIX}/include:\n${err}")
  endif()
endforeach()
file(WRITE ${BIN}-headers/one.c "#include <strata/strata.h>\nint main(void) { return 0; }\n")
execute_process(COMMAND ${CC} -std=c99 -Wall -Wextra -Wpedantic -Wshadow -Werror -fsyntax-only
                        -I${PREFIX}/include ${BIN}-headers/one.c
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(rc)
  message(FATAL_ERROR "strata/strata.h does not compile alone as C99 with strict warnings:\n${err}")
endif()
message(STATUS "${_n} public C++ headers and strata.h compile alone with strict warnings")
strata_build_against_prefix("the consumer")
foreach(exe IN ITEMS strata_consumer strata_store_consumer)
  execute_process(COMMAND ${BIN}/${exe} OUTPUT_VARIABLE out RESULT_VARIABLE rc)
  message(STATUS "${exe} printed: ${out}")
  if(rc OR NOT out MATCHES "consumer ok")
    message(FATAL_ERROR "${exe} failed (rc=${rc}): ${out}")
  endif()
endforeach()
# A store-only program holds no Gloo or NCCL: not among its shared libraries (ldd), not
# among its symbols (nm), and strata::store's installed link interface names neither.
function(expect_no_backend tool pattern)
  execute_process(COMMAND ${tool} ${ARGN} ${BIN}/strata_store_consumer OUTPUT_VARIABLE text
                  RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "${tool} strata_store_consumer failed: ${rc}")
  endif()
  if(text MATCHES "${pattern}")
    message(FATAL_ERROR "strata_store_consumer (strata::store only): ${tool} shows Gloo or NCCL "
                        "(${CMAKE_MATCH_0})")
  endif()
endfunction()
expect_no_backend(ldd "libgloo|libnccl")
expect_no_backend(nm "gloo::|nccl[A-Z][a-zA-Z]+" -C)
file(GLOB _targets ${PREFIX}/lib*/cmake/strata/strataTargets.cmake)
file(READ ${_targets} _exported)
if(NOT _exported MATCHES "set_target_properties\\(strata::store PROPERTIES[^)]*\\)")
  message(FATAL_ERROR "strata::store not found in ${_targets}")
endif()
if(CMAKE_MATCH_0 MATCHES "collectives|gloo|nccl")
  message(FATAL_ERROR "strata::store's installed link interface names a backend:\n${CMAKE_MATCH_0}")
endif()
if(NOT EXISTS ${PREFIX}/bin/strata)
  message(FATAL_ERROR "the strata tool was not installed to ${PREFIX}/bin")
endif()
# The Python package: importable from where it was installed, and that directory under the
# default prefix /usr/local is one Debian's Python searches (without PYTHONPATH).
if(PYTHON)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env PYTHONPATH=${PREFIX}/${PYTHON_DIR}
                          ${PYTHON} -c "import strata, strata.torch; print(strata.__file__)"
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(rc OR NOT out STREQUAL "${PREFIX}/${PYTHON_DIR}/strata/__init__.py")
    message(FATAL_ERROR "import strata from ${PREFIX}/${PYTHON_DIR} failed: ${out}${err}")
  endif()
  if(EXISTS /etc/debian_version)
    execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=PYTHONPATH
                            ${PYTHON} -c "import sys; print(*sys.path, sep=';')"
                    OUTPUT_VARIABLE path OUTPUT_STRIP_TRAILING_WHITESPACE)
    list(FIND path "/usr/local/${PYTHON_DIR}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "cmake --install with the default prefix puts the Python package "
                          "in /usr/local/${PYTHON_DIR}, which ${PYTHON} does not search: ${path}")
    endif()
  endif()
endif()
