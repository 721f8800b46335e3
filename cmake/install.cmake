# Install rules: headers, both C libraries, a CMake package and a .pc file.
# Included from the top-level CMakeLists.txt once the targets exist.
include(CMakePackageConfigHelpers)

# The sanitizer builds leave the static library out of `all` (capi/CMakeLists.txt):
# their stage, used by the Go and Rust tests, holds the shared one only.
set(clm_installed_targets clmcache clmcache_core)
get_target_property(clm_static_excluded clmcache_static EXCLUDE_FROM_ALL)
if(NOT clm_static_excluded)
  list(APPEND clm_installed_targets clmcache_static)
endif()
install(TARGETS ${clm_installed_targets}
  EXPORT clmcacheTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_SOURCE_DIR}/capi/clm.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/clm DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The old paths of the headers that moved into folders by concept: one-line
# forwarding headers, marked deprecated (cmake/moved_headers.cmake).
include(${PROJECT_SOURCE_DIR}/cmake/moved_headers.cmake)
clm_write_forwarding_headers(${PROJECT_BINARY_DIR}/forwarding_headers clm_forwarding_headers)
install(FILES ${clm_forwarding_headers} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/clm)

set(clm_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/clmcache)
install(EXPORT clmcacheTargets NAMESPACE clmcache:: DESTINATION ${clm_cmake_dir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/clmcacheConfig.cmake.in
  ${PROJECT_BINARY_DIR}/clmcacheConfig.cmake INSTALL_DESTINATION ${clm_cmake_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/clmcacheConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/clmcacheConfig.cmake ${PROJECT_BINARY_DIR}/clmcacheConfigVersion.cmake
  ${PROJECT_SOURCE_DIR}/cmake/Findhiredis.cmake  # hiredis has no CMake package of its own
  ${PROJECT_SOURCE_DIR}/cmake/FindOpenCC.cmake  # nor has OpenCC
  ${PROJECT_SOURCE_DIR}/cmake/Findlibzmq.cmake  # nor has Debian's libzmq
  DESTINATION ${clm_cmake_dir})

# The .pc file finds its prefix from its own location (${pcfiledir}), so it
# stays right when the prefix is chosen at install time (cmake --install
# --prefix, as the install_stage test does) or the tree is moved.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(clm_pc_prefix "${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH clm_pc_up "/clm/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/clm")
  string(REGEX REPLACE "/$" "" clm_pc_up "${clm_pc_up}")
  set(clm_pc_prefix "\${pcfiledir}/${clm_pc_up}")
endif()
foreach(dir LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${dir}}")
    set(clm_pc_${dir} "${CMAKE_INSTALL_${dir}}")
  else()
    set(clm_pc_${dir} "\${prefix}/${CMAKE_INSTALL_${dir}}")
  endif()
endforeach()
# What a static link (pkg-config --static) needs besides libclmcache.a.
set(clm_pc_libs_private "-lfmt -lsqlite3 -lcrypto -lhiredis -lopencc -lzmq -lstdc++ -lm -lpthread")
if(CLM_HAVE_CUDA)
  string(APPEND clm_pc_libs_private " -L${CUDAToolkit_LIBRARY_DIR} -lcublas -lcudart")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/clmcache.pc.in ${PROJECT_BINARY_DIR}/clmcache.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/clmcache.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
