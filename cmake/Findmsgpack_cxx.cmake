# msgpack-c's C++ headers (Debian's libmsgpack-cxx-dev), used header-only and
# without Boost (MSGPACK_NO_BOOST), inside lib/events only: its CMake config
# would make every user of the library find Boost. Gives MSGPACK_INCLUDE_DIR.
find_path(MSGPACK_INCLUDE_DIR msgpack.hpp)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(msgpack_cxx REQUIRED_VARS MSGPACK_INCLUDE_DIR)
mark_as_advanced(MSGPACK_INCLUDE_DIR)
