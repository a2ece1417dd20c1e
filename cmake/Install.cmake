# cmake --install: headers, the library and a package config, so that a user's project does
#   find_package(LightningFabric REQUIRED)  and  target_link_libraries(app PRIVATE lightning::fabric)
include(CMakePackageConfigHelpers)
set(LF_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/LightningFabric)

install(TARGETS lightning_fabric EXPORT LightningFabricTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY lib/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(FILES ${PROJECT_BINARY_DIR}/lib/generated/lightning/fabric/version.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/lightning/fabric)
install(EXPORT LightningFabricTargets NAMESPACE lightning:: DESTINATION ${LF_CMAKE_DIR})

configure_package_config_file(cmake/LightningFabricConfig.cmake.in
  ${PROJECT_BINARY_DIR}/LightningFabricConfig.cmake INSTALL_DESTINATION ${LF_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/LightningFabricConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/LightningFabricConfig.cmake
              ${PROJECT_BINARY_DIR}/LightningFabricConfigVersion.cmake
        DESTINATION ${LF_CMAKE_DIR})
# The launcher: the LibTorch-free front end and the program it execs, side by side.
install(TARGETS lightning-run lightning-run-launcher RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
