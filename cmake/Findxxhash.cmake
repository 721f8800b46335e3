# xxHash's header (Debian's libxxhash-dev), used header-only (XXH_INLINE_ALL)
# inside lib/events only, for the KV events' block hashes (XXH3): nothing to
# link, so the library's users need nothing of it. Gives XXHASH_INCLUDE_DIR.
find_path(XXHASH_INCLUDE_DIR xxhash.h)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(xxhash REQUIRED_VARS XXHASH_INCLUDE_DIR)
mark_as_advanced(XXHASH_INCLUDE_DIR)
