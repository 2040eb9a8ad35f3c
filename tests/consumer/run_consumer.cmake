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
# run(<name> <command...>): runs it, which must print "consumer ok".
function(run name)
  execute_process(COMMAND ${ARGN} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  message(STATUS "${name} printed: ${out}")
  if(rc OR NOT out MATCHES "consumer ok")
    message(FATAL_ERROR "${name} failed (rc=${rc}): ${out}${err}")
  endif()
endfunction()
set(_dirs ${BIN}-dirs)
file(REMOVE_RECURSE ${_dirs})
file(MAKE_DIRECTORY ${_dirs})
# 1. find_package(strata COMPONENTS ...): programs and a plugin that a C host dlopens.
foreach(exe IN ITEMS strata_consumer strata_store_consumer)
  run(${exe} ${BIN}/${exe})
endforeach()
run(strata_optimizer_consumer ${BIN}/strata_optimizer_consumer ${_dirs}/cmake)
run(strata_plugin_host ${BIN}/strata_plugin_host ${BIN}/libstrata_consumer_plugin.so
    ${_dirs}/plugin)
# 2. The plain compiler line of docs/guide-cpp.md.
set(_lib ${PREFIX}/${LIBDIR})
execute_process(COMMAND ${CXX} -std=c++20 -Wall -Wextra -Werror ${SRC}/optimizer_consumer.cpp
                        -I${PREFIX}/include -L${_lib} -Wl,-rpath,${_lib} -lstrata_optimizer
                        -lstrata_store -lstrata_base -o ${BIN}/consumer_cxx_line
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(rc)
  message(FATAL_ERROR "c++ -std=c++20 ... -lstrata_optimizer -lstrata_store -lstrata_base "
                      "against ${PREFIX} failed: ${err}")
endif()
run(consumer_cxx_line ${BIN}/consumer_cxx_line ${_dirs}/line)
# 3. pkg-config's flags for strata_optimizer (Requires: strata_store strata_base).
execute_process(COMMAND ${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${_lib}/pkgconfig
                        pkg-config --cflags --libs strata_optimizer
                OUTPUT_VARIABLE pc_flags ERROR_VARIABLE err RESULT_VARIABLE rc
                OUTPUT_STRIP_TRAILING_WHITESPACE)
if(rc OR NOT pc_flags MATCHES "-lstrata_optimizer" OR NOT pc_flags MATCHES "-lstrata_base")
  message(FATAL_ERROR "pkg-config --cflags --libs strata_optimizer (PKG_CONFIG_PATH="
                      "${_lib}/pkgconfig): rc ${rc}, '${pc_flags}' ${err}")
endif()
separate_arguments(pc_list UNIX_COMMAND "${pc_flags}")
execute_process(COMMAND ${CXX} -std=c++20 ${SRC}/optimizer_consumer.cpp ${pc_list}
                        -o ${BIN}/consumer_pkg_config RESULT_VARIABLE rc ERROR_VARIABLE err)
if(rc)
  message(FATAL_ERROR "c++ with pkg-config's flags (${pc_flags}) failed: ${err}")
endif()
run(consumer_pkg_config ${BIN}/consumer_pkg_config ${_dirs}/pc)
# A component that does not exist: find_package says which, and which exist.
file(WRITE ${BIN}-bogus/CMakeLists.txt "cmake_minimum_required(VERSION 3.25)\nproject(b C)\n"
     "find_package(strata CONFIG REQUIRED COMPONENTS store bogus)\n")
execute_process(COMMAND ${CMAKE_COMMAND} -S ${BIN}-bogus -B ${BIN}-bogus/build
                        -DCMAKE_PREFIX_PATH=${PREFIX}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc OR NOT err MATCHES "strata has no component 'bogus' \\(it has: c base communicator")
  message(FATAL_ERROR "find_package(strata COMPONENTS bogus): rc ${rc}, ${out}${err}")
endif()
# A client executable holds its own code, not strata's (the libraries are shared).
file(SIZE ${BIN}/strata_optimizer_consumer _size)
if(_size GREATER 4000000)
  message(FATAL_ERROR "strata_optimizer_consumer is ${_size} bytes: strata linked statically?")
endif()
# The installed C++ libraries export strata's symbols only (cmake/strata_cxx.map).
foreach(l IN ITEMS base store collectives optimizer)
  file(GLOB _so ${_lib}/libstrata_${l}.so.*.*)
  execute_process(COMMAND nm -DC --defined-only ${_so} OUTPUT_VARIABLE syms RESULT_VARIABLE rc)
  string(REGEX MATCHALL "[^\n]+" lines "${syms}")
  set(foreign "")
  set(own 0)
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^[0-9a-f]+ . " "" name "${line}")
    if(name MATCHES "^((vtable|VTT|typeinfo|typeinfo name|guard variable) for |(non-)?virtual thunk to )?strata::")
      math(EXPR own "${own} + 1")
    else()
      list(APPEND foreign "${name}")
    endif()
  endforeach()
  if(foreign OR own LESS 20)
    message(FATAL_ERROR "${_so} exports ${own} strata symbols and these others: ${foreign}")
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
file(GLOB _targets ${PREFIX}/lib*/cmake/strata/strataCxxTargets.cmake)
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
