# hnswlib ships headers only (Debian's libhnswlib-dev) and no CMake config.
# Its hnswlib.h defines non-inline functions: include it from exactly one .cpp.
find_path(HNSWLIB_INCLUDE_DIR hnswlib/hnswlib.h)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(hnswlib REQUIRED_VARS HNSWLIB_INCLUDE_DIR)
if(hnswlib_FOUND AND NOT TARGET hnswlib::hnswlib)
  add_library(hnswlib::hnswlib INTERFACE IMPORTED)
  set_target_properties(hnswlib::hnswlib PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${HNSWLIB_INCLUDE_DIR}")
endif()
