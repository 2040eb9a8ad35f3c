# Installs the libraries, headers and the CMake package: find_package(strata CONFIG)
# gives strata::strata (and strata::base, strata::communicator, strata::collectives,
# strata::store, strata::optimizer). strata::store and strata::optimizer do not link Gloo or
# NCCL (only strata::collectives does).
include(CMakePackageConfigHelpers)
set(STRATA_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/strata)
install(TARGETS strata_base strata_communicator strata_collectives strata_store strata_optimizer
                strata_strata
        EXPORT strataTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT strataTargets NAMESPACE strata:: DESTINATION ${STRATA_CMAKE_DIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/strataConfig.cmake.in
  ${PROJECT_BINARY_DIR}/strataConfig.cmake INSTALL_DESTINATION ${STRATA_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/strataConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/strataConfig.cmake ${PROJECT_BINARY_DIR}/strataConfigVersion.cmake
  ${CMAKE_CURRENT_LIST_DIR}/StrataDependencies.cmake
  DESTINATION ${STRATA_CMAKE_DIR})
# pkg-config: strata_c.pc for the C API (a shared library whose dependencies are inside it).
# The prefix is the one given at install time (cmake --install --prefix), so the file is
# written by an install(CODE) step rather than at configure time.
install(CODE "
  set(CMAKE_INSTALL_LIBDIR \"${CMAKE_INSTALL_LIBDIR}\")
  set(CMAKE_INSTALL_INCLUDEDIR \"${CMAKE_INSTALL_INCLUDEDIR}\")
  set(PROJECT_VERSION \"${PROJECT_VERSION}\")
  configure_file(\"${CMAKE_CURRENT_LIST_DIR}/strata_c.pc.in\"
                 \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/pkgconfig/strata_c.pc\" @ONLY)
  message(STATUS \"Installing: \$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/pkgconfig/strata_c.pc\")
")
