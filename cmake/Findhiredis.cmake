# hiredis (Debian's libhiredis-dev) ships a pkg-config file but no CMake
# config; its hiredis.pc also names the wrong libdir (/usr/lib) and adds
# -D_FILE_OFFSET_BITS=64 to its users. So the header and library are found
# directly. Gives hiredis::hiredis; include it as <hiredis/hiredis.h>.
# Installed next to clmcacheConfig.cmake, which uses it for its dependency.
find_path(HIREDIS_INCLUDE_DIR hiredis/hiredis.h)
find_library(HIREDIS_LIBRARY NAMES hiredis)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(hiredis REQUIRED_VARS HIREDIS_LIBRARY HIREDIS_INCLUDE_DIR)
if(hiredis_FOUND AND NOT TARGET hiredis::hiredis)
  add_library(hiredis::hiredis UNKNOWN IMPORTED)
  set_target_properties(hiredis::hiredis PROPERTIES
    IMPORTED_LOCATION "${HIREDIS_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${HIREDIS_INCLUDE_DIR}")
endif()
mark_as_advanced(HIREDIS_INCLUDE_DIR HIREDIS_LIBRARY)
