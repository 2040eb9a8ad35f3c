# The installed C++ libraries: one shared library per component (libstrata_base.so,
# libstrata_store.so, libstrata_collectives.so, libstrata_optimizer.so), linked from the
# objects of the static component libraries that strata's own programs, tests and Python
# module use. Each carries its third-party dependencies (io_uring, hwloc, SQLite, Gloo, ...)
# as its own shared-library dependencies, so a client's link interface holds only strata's
# libraries (and Threads): find_package(strata COMPONENTS store) finds nothing else, and a
# store-only client does not load Gloo or NCCL. Exported symbols: strata's own (namespace
# strata, its vtables and type information), through cmake/strata_cxx.map; template
# instances of other libraries stay local.
#
# Targets: strata_<name>_shared (exported as strata::<name>), strata_communicator_shared
# (the header-only Communicator interface over the shared base) and strata_strata_shared
# (strata::strata, every component), all in the export set strataCxxTargets.

# strata_add_shared(<name>): strata_<name>_shared from the objects of strata_<name>.
function(strata_add_shared name)
  set(static strata_${name})
  add_library(strata_${name}_shared SHARED $<TARGET_OBJECTS:${static}>)
  set_target_properties(strata_${name}_shared PROPERTIES
    OUTPUT_NAME strata_${name} EXPORT_NAME ${name} LINKER_LANGUAGE CXX
    VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}
    INSTALL_RPATH "$ORIGIN")
  target_include_directories(strata_${name}_shared PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/${name}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_compile_features(strata_${name}_shared PUBLIC cxx_std_20)
  # The static library's dependencies: what it passes on (INTERFACE_LINK_LIBRARIES without
  # $<LINK_ONLY:>) stays public, the rest private; strata's static libraries become their
  # shared counterparts.
  get_target_property(all ${static} LINK_LIBRARIES)
  get_target_property(iface ${static} INTERFACE_LINK_LIBRARIES)
  set(public "")
  set(private "")
  foreach(dep IN LISTS all)
    if(dep MATCHES "^strata_(base|store|collectives|optimizer|communicator)$")
      set(dep ${dep}_shared)
      set(is_public ON)
    else()
      list(FIND iface ${dep} at)
      if(at EQUAL -1)
        set(is_public OFF)
      else()
        set(is_public ON)
      endif()
    endif()
    if(is_public)
      list(APPEND public ${dep})
    else()
      list(APPEND private ${dep})
    endif()
  endforeach()
  target_link_libraries(strata_${name}_shared PUBLIC ${public} PRIVATE ${private})
  target_link_options(strata_${name}_shared PRIVATE -Wl,--no-undefined)
  if(NOT STRATA_SANITIZE AND NOT STRATA_FUZZ)
    target_link_options(strata_${name}_shared PRIVATE
                        -Wl,--version-script=${PROJECT_SOURCE_DIR}/cmake/strata_cxx.map)
    set_property(TARGET strata_${name}_shared APPEND PROPERTY LINK_DEPENDS
                 ${PROJECT_SOURCE_DIR}/cmake/strata_cxx.map)
  endif()
endfunction()

strata_add_shared(base)
add_library(strata_communicator_shared INTERFACE)
set_target_properties(strata_communicator_shared PROPERTIES EXPORT_NAME communicator)
target_include_directories(strata_communicator_shared INTERFACE
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/collectives/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_link_libraries(strata_communicator_shared INTERFACE strata_base_shared)
strata_add_shared(collectives)
strata_add_shared(store)
strata_add_shared(optimizer)
add_library(strata_strata_shared INTERFACE)
set_target_properties(strata_strata_shared PROPERTIES EXPORT_NAME strata)
target_link_libraries(strata_strata_shared INTERFACE strata_optimizer_shared strata_store_shared
                      strata_collectives_shared strata_base_shared)
