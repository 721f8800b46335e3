# OpenCC (Debian's libopencc-dev; its dictionaries are libopencc-data): the
# suffix keyer's Traditional-to-Simplified Chinese folding
# (lib/store/chinese_fold.cpp). OpenCC ships a pkg-config file but no CMake
# package, so the header and library are found directly (as Findhiredis.cmake
# does), with pkg-config's paths as hints when it is there. Gives
#   OpenCC::OpenCC      include as <opencc/Converter.hpp>
#   OpenCC_VERSION      pkg-config's (Debian's 1.1.6 says 1.1.5), else the one in
#                       the library's file name (libopencc.so.1.1.5), else "unknown"
#   OPENCC_T2S_CONFIG   t2s.json, the configuration the library opens at run
#                       time: <prefix>/share/opencc next to the headers' prefix;
#                       not required here (only building clmcache needs it)
# Installed next to clmcacheConfig.cmake, which uses it for its dependency.
find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(PC_OPENCC QUIET opencc)
endif()
find_path(OPENCC_INCLUDE_DIR opencc/Converter.hpp HINTS ${PC_OPENCC_INCLUDEDIR})
find_library(OPENCC_LIBRARY NAMES opencc HINTS ${PC_OPENCC_LIBDIR})
if(OPENCC_INCLUDE_DIR)
  get_filename_component(_clm_opencc_prefix "${OPENCC_INCLUDE_DIR}" DIRECTORY)
  find_file(OPENCC_T2S_CONFIG t2s.json HINTS ${_clm_opencc_prefix}/share/opencc ${PC_OPENCC_PREFIX}/share/opencc
            NO_DEFAULT_PATH)
  unset(_clm_opencc_prefix)
endif()
set(OpenCC_VERSION unknown)
if(PC_OPENCC_VERSION)
  set(OpenCC_VERSION ${PC_OPENCC_VERSION})
elseif(OPENCC_LIBRARY)
  # No pkg-config (a bare build machine): the library's full file name.
  get_filename_component(_clm_opencc_real "${OPENCC_LIBRARY}" REALPATH)
  if(_clm_opencc_real MATCHES "libopencc\\.so\\.([0-9]+\\.[0-9]+\\.[0-9]+)$")
    set(OpenCC_VERSION ${CMAKE_MATCH_1})
  endif()
  unset(_clm_opencc_real)
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(OpenCC REQUIRED_VARS OPENCC_LIBRARY OPENCC_INCLUDE_DIR)
if(OpenCC_FOUND AND NOT TARGET OpenCC::OpenCC)
  add_library(OpenCC::OpenCC UNKNOWN IMPORTED)
  set_target_properties(OpenCC::OpenCC PROPERTIES
    IMPORTED_LOCATION "${OPENCC_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${OPENCC_INCLUDE_DIR}")
endif()
mark_as_advanced(OPENCC_INCLUDE_DIR OPENCC_LIBRARY OPENCC_T2S_CONFIG)
