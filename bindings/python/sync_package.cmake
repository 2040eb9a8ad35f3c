# Makes ${DST} (the build tree's strata/ package) hold exactly the pure-Python files of
# ${SRC} (bindings/python/strata): copies new and changed ones, and removes the .py/.pyi
# files that no longer exist in the source (a module moved or deleted must not stay
# importable from the build tree). The compiled extension (_strata*.so) is left alone.
# Usage: cmake -DSRC=<dir> -DDST=<dir> -P sync_package.cmake
file(GLOB_RECURSE _src RELATIVE ${SRC} ${SRC}/*.py ${SRC}/*.pyi ${SRC}/py.typed)
foreach(_f IN LISTS _src)
  get_filename_component(_d ${DST}/${_f} DIRECTORY)
  file(MAKE_DIRECTORY ${_d})
  execute_process(COMMAND ${CMAKE_COMMAND} -E copy_if_different ${SRC}/${_f} ${DST}/${_f})
endforeach()
file(GLOB_RECURSE _dst RELATIVE ${DST} ${DST}/*.py ${DST}/*.pyi ${DST}/*.pyc)
foreach(_f IN LISTS _dst)
  string(REGEX REPLACE "__pycache__/([^/.]+)\\.[^/]*\\.pyc$" "\\1.py" _origin ${_f})
  if(NOT EXISTS ${SRC}/${_origin})
    file(REMOVE ${DST}/${_f})
  endif()
endforeach()
