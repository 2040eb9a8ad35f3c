# strata_add_component(NAME <name> [DEPS <targets...>] [PRIVATE_DEPS <targets...>])
# Creates library target strata_<name> (alias strata::<name>, exported as strata::<name>)
# from <name>/src/*.cpp with public headers in <name>/include.
function(strata_add_component)
  cmake_parse_arguments(A "" "NAME" "DEPS;PRIVATE_DEPS" ${ARGN})
  file(GLOB_RECURSE srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/*.cpp
       ${CMAKE_CURRENT_SOURCE_DIR}/src/*.cc)
  if(NOT srcs)
    set(srcs ${CMAKE_CURRENT_BINARY_DIR}/empty_${A_NAME}.cpp)
    file(WRITE ${srcs} "// ${A_NAME}: no sources yet\nnamespace strata { int ${A_NAME}_component_placeholder = 0; }\n")
  endif()
  add_library(strata_${A_NAME} ${srcs})
  add_library(strata::${A_NAME} ALIAS strata_${A_NAME})
  set_target_properties(strata_${A_NAME} PROPERTIES EXPORT_NAME ${A_NAME} OUTPUT_NAME strata_${A_NAME})
  target_include_directories(strata_${A_NAME}
    PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
           $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
    PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
  target_link_libraries(strata_${A_NAME} PUBLIC ${A_DEPS} PRIVATE ${A_PRIVATE_DEPS})
  target_compile_features(strata_${A_NAME} PUBLIC cxx_std_20)
  if(STRATA_HAVE_CUDA)
    target_compile_definitions(strata_${A_NAME} PRIVATE STRATA_HAVE_CUDA=1)
  endif()
  install(DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endfunction()
