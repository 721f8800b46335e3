#!/usr/bin/env bash
# Builds examples/c out of tree against an installed clmcache, the ways a C
# host would, and runs it.
#
#   c_consumer.sh MODE STAGE_DIR EXAMPLE_DIR WORK_DIR
#
# MODE:
#   cmake              find_package(clmcache) + clmcache::clmcache; the binary
#                      must find libclmcache.so.0 through its RUNPATH alone
#   cmake-static       the same with clmcache::clmcache_static
#   pkg-config         cc -std=c99 chatbot.c $(pkg-config --cflags --libs clmcache),
#                      run with LD_LIBRARY_PATH=$(pkg-config --variable=libdir clmcache)
#   pkg-config-static  libclmcache.a plus pkg-config --static --libs; the binary
#                      must not need libclmcache.so at all
# Each run uses a fresh directory under WORK_DIR, removed when it passes.
# Environment: CMAKE (cmake to use), CC (C compiler), CMAKE_GENERATOR,
# CLM_BUILD_TYPE (the consumer's build type), PKG_CONFIG (pkg-config to use).
set -euo pipefail

# shellcheck source=consumer_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/consumer_common.sh"
consumer_begin c_consumer "cmake|cmake-static|pkg-config|pkg-config-static STAGE_DIR EXAMPLE_DIR WORK_DIR" "$@"
example=$(cd "$3" && pwd -P)
cmake=${CMAKE:-cmake}
cc=${CC:-cc}
pkg_config=${PKG_CONFIG:-pkg-config}
build_type=${CLM_BUILD_TYPE:-Release}

[[ -f "$stage/include/clm.h" ]] || fail "no clm.h under $stage/include: did install_stage run?"

# Runs the chatbot and checks that it says OK.
run_chatbot() {
  local exe=$1
  shift
  local out
  if ! out=$("$@" "$exe" 2>&1); then
    printf '%s\n' "$out" | tail -n 20 >&2
    fail "$exe exited non-zero"
  fi
  printf '%s\n' "$out" | tail -n 4
  grep -q '^chatbot: OK' <<<"$out" || fail "$exe did not report OK"
}

# ldd must resolve libclmcache.so.0 to the staged copy.
check_resolves_to_stage() {
  local exe=$1 libdir=$2 resolved
  shift 2
  resolved=$("$@" ldd "$exe" | awk '$1 == "libclmcache.so.0" { print $3 }')
  [[ -n "$resolved" && "$resolved" != "not" ]] || fail "libclmcache.so.0 is not found for $exe"
  [[ "$(realpath "$resolved")" == "$(realpath "$libdir")"/* ]] ||
    fail "libclmcache.so.0 resolves to $resolved, not under $libdir"
  echo "libclmcache.so.0 => $resolved"
}

case $mode in
  cmake | cmake-static)
    static=OFF
    [[ $mode == cmake-static ]] && static=ON
    # Only the stage: no cache from a previous run, no prefix from the environment.
    env -u CMAKE_PREFIX_PATH -u LD_LIBRARY_PATH "$cmake" -S "$example" -B "$work/build" \
      -DCMAKE_BUILD_TYPE="$build_type" -DCMAKE_PREFIX_PATH="$stage" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
      -DCMAKE_C_COMPILER="$cc" -DCLM_CHATBOT_STATIC=$static >"$work/configure.log" 2>&1 ||
      { cat "$work/configure.log" >&2; fail "configuring examples/c against $stage"; }
    grep -q "clmcache_DIR:PATH=$stage/" "$work/build/CMakeCache.txt" ||
      fail "find_package(clmcache) did not use the stage: $(grep clmcache_DIR "$work/build/CMakeCache.txt")"
    "$cmake" --build "$work/build" >"$work/build.log" 2>&1 || { cat "$work/build.log" >&2; fail "building"; }
    exe=$work/build/chatbot
    if [[ $static == ON ]]; then
      if readelf -d "$exe" | grep -q 'NEEDED.*libclmcache'; then fail "static build still needs libclmcache.so"; fi
      run_chatbot "$exe" env -u LD_LIBRARY_PATH
    else
      # No LD_LIBRARY_PATH: the RUNPATH CMake writes for the imported target must do.
      readelf -d "$exe" | grep -E 'RPATH|RUNPATH' || fail "no RPATH/RUNPATH in $exe"
      check_resolves_to_stage "$exe" "$stage/lib" env -u LD_LIBRARY_PATH
      run_chatbot "$exe" env -u LD_LIBRARY_PATH
    fi
    ;;
  pkg-config | pkg-config-static)
    export PKG_CONFIG_PATH=$stage/lib/pkgconfig
    unset PKG_CONFIG_LIBDIR PKG_CONFIG_SYSROOT_DIR
    "$pkg_config" --exists --print-errors clmcache || fail "pkg-config does not find clmcache in $PKG_CONFIG_PATH"
    "$pkg_config" --atleast-version=0.1 clmcache || fail "clmcache.pc is older than 0.1"
    libdir=$("$pkg_config" --variable=libdir clmcache)
    [[ "$(realpath "$libdir")" == "$(realpath "$stage/lib")" ]] ||
      fail "clmcache.pc's libdir is $libdir, not the stage's $stage/lib (prefix not relocated?)"
    echo "pkg-config: clmcache $("$pkg_config" --modversion clmcache): $("$pkg_config" --cflags --libs clmcache)"
    exe=$work/chatbot
    # Static users define CLM_STATIC (clm.h's CLM_API), shared ones must not.
    static_cflags=$("$pkg_config" --static --cflags clmcache)
    [[ " $static_cflags " == *" -DCLM_STATIC "* ]] || fail "pkg-config --static --cflags lacks -DCLM_STATIC: $static_cflags"
    [[ " $("$pkg_config" --cflags clmcache) " != *" -DCLM_STATIC "* ]] || fail "pkg-config --cflags (shared) defines CLM_STATIC"
    if [[ $mode == pkg-config ]]; then
      # shellcheck disable=SC2046 # word splitting of the flags is wanted
      "$cc" -std=c99 -Wall -Wextra -Wpedantic -Werror "$example/chatbot.c" \
        $("$pkg_config" --cflags --libs clmcache) -o "$exe" || fail "compiling with pkg-config flags"
      check_resolves_to_stage "$exe" "$libdir" env LD_LIBRARY_PATH="$libdir"
      run_chatbot "$exe" env LD_LIBRARY_PATH="$libdir"
    else
      # -l:libclmcache.a picks the archive over the .so in the same directory.
      libs=$("$pkg_config" --static --libs clmcache)
      echo "pkg-config --static --libs: $libs"
      libs=${libs//-lclmcache/-l:libclmcache.a}
      # shellcheck disable=SC2046,SC2086 # word splitting of the flags is wanted
      "$cc" -std=c99 -Wall -Wextra -Wpedantic -Werror "$example/chatbot.c" \
        $static_cflags $libs -o "$exe" || fail "linking statically with pkg-config --static flags"
      if readelf -d "$exe" | grep -q 'NEEDED.*libclmcache'; then fail "static build still needs libclmcache.so"; fi
      run_chatbot "$exe" env -u LD_LIBRARY_PATH
    fi
    ;;
  *)
    echo "unknown mode: $mode" >&2
    exit 2
    ;;
esac
echo "c_consumer[$mode]: OK"
