# Installs the libraries, headers, the CMake package and pkg-config files.
#
# CMake: find_package(strata CONFIG [COMPONENTS ...]) with the components
#   c            strata::c — the C API (libstrata_c.so; needs nothing else)
#   base, communicator, store, collectives, optimizer, strata
#                strata::<name> — the shared C++ libraries (cmake/StrataShared.cmake;
#                need Threads only). strata::store and strata::optimizer do not link Gloo
#                or NCCL (only strata::collectives does).
# No COMPONENTS: all of them. Each component's targets come from their own export file, so a
# client of strata::c reads no C++ target and finds no dependency.
# pkg-config: strata_c, strata_base, strata_store, strata_collectives, strata_optimizer and
# strata (all four C++ libraries).
include(CMakePackageConfigHelpers)
set(STRATA_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/strata)
install(TARGETS strata_base_shared strata_communicator_shared strata_store_shared
                strata_collectives_shared strata_optimizer_shared strata_strata_shared
        EXPORT strataCxxTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT strataCxxTargets NAMESPACE strata:: DESTINATION ${STRATA_CMAKE_DIR})
install(EXPORT strataCTargets NAMESPACE strata:: DESTINATION ${STRATA_CMAKE_DIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/strataConfig.cmake.in
  ${PROJECT_BINARY_DIR}/strataConfig.cmake INSTALL_DESTINATION ${STRATA_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/strataConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/strataConfig.cmake ${PROJECT_BINARY_DIR}/strataConfigVersion.cmake
  DESTINATION ${STRATA_CMAKE_DIR})
# pkg-config files. The prefix is the one given at install time (cmake --install --prefix),
# so they are written by an install(CODE) step rather than at configure time.
#   <name> <description> <Requires> <-l library or empty>
set(_pc_files
  "strata_c|C API of strata, a tiered GPU/host/NVMe tensor store with an offloaded optimizer||strata_c"
  "strata_base|strata's base: status and result, futures, units, logging, thread pool||strata_base"
  "strata_store|strata's tiered object store: io_uring engine, pinned pool, topology, tiers|strata_base|strata_store"
  "strata_collectives|strata's communicators (Gloo, NCCL) and TCP rendezvous store|strata_base|strata_collectives"
  "strata_optimizer|strata's CPU optimizer kernels and offloaded optimizer step|strata_store strata_base|strata_optimizer"
  "strata|strata's C++ libraries: store, collectives, optimizer, base|strata_optimizer strata_collectives strata_store strata_base|")
foreach(pc IN LISTS _pc_files)
  string(REPLACE "|" ";" f "${pc}")
  list(GET f 0 PC_NAME)
  list(GET f 1 PC_DESCRIPTION)
  list(GET f 2 PC_REQUIRES)
  list(GET f 3 PC_LIB)
  # "\\\${libdir}": still "${libdir}" after the install script's own evaluation
  if(PC_LIB)
    set(PC_LIBS "-L\\\${libdir} -Wl,-rpath,\\\${libdir} -l${PC_LIB}")
  else()
    set(PC_LIBS "")
  endif()
  install(CODE "
    set(CMAKE_INSTALL_LIBDIR \"${CMAKE_INSTALL_LIBDIR}\")
    set(CMAKE_INSTALL_INCLUDEDIR \"${CMAKE_INSTALL_INCLUDEDIR}\")
    set(PROJECT_VERSION \"${PROJECT_VERSION}\")
    set(PC_NAME \"${PC_NAME}\")
    set(PC_DESCRIPTION \"${PC_DESCRIPTION}\")
    set(PC_REQUIRES \"${PC_REQUIRES}\")
    set(PC_LIBS \"${PC_LIBS}\")
    configure_file(\"${CMAKE_CURRENT_LIST_DIR}/strata.pc.in\"
                   \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/pkgconfig/${PC_NAME}.pc\" @ONLY)
    message(STATUS \"Installing: \$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/pkgconfig/${PC_NAME}.pc\")
  ")
endforeach()
