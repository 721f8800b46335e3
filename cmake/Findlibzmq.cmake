# libzmq (Debian's libzmq3-dev) and cppzmq's header (cppzmq-dev): Debian's
# libzmq ships only a pkg-config file, and cppzmq's CMake config looks for a
# ZeroMQ package that is not there, so the headers and the library are found
# directly. Gives libzmq::libzmq; include <zmq.hpp> (C++) or <zmq.h>.
# Installed next to clmcacheConfig.cmake, which uses it for its dependency.
find_path(LIBZMQ_INCLUDE_DIR zmq.h)
find_path(CPPZMQ_INCLUDE_DIR zmq.hpp)
find_library(LIBZMQ_LIBRARY NAMES zmq)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(libzmq REQUIRED_VARS LIBZMQ_LIBRARY LIBZMQ_INCLUDE_DIR CPPZMQ_INCLUDE_DIR)
if(libzmq_FOUND AND NOT TARGET libzmq::libzmq)
  add_library(libzmq::libzmq UNKNOWN IMPORTED)
  set_target_properties(libzmq::libzmq PROPERTIES
    IMPORTED_LOCATION "${LIBZMQ_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${LIBZMQ_INCLUDE_DIR};${CPPZMQ_INCLUDE_DIR}")
endif()
mark_as_advanced(LIBZMQ_INCLUDE_DIR CPPZMQ_INCLUDE_DIR LIBZMQ_LIBRARY)
