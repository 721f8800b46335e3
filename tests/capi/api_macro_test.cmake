# clm.h's CLM_API as each kind of Windows build sees it, simulated with the C
# compiler's preprocessor on any platform (ctest capi_api_macro):
#   cmake -DCC=<c compiler> -DHEADER=<clm.h> -DSHARED_DEFS=<a|b> -DSTATIC_DEFS=<a|b>
#         -DSTATIC_USER_DEFS=<a|b> -P api_macro_test.cmake
# SHARED_DEFS / STATIC_DEFS: the compile definitions of the shared and static
# libraries' own sources; STATIC_USER_DEFS: those the static library gives its
# users; '|'-separated.
foreach(var CC HEADER SHARED_DEFS STATIC_DEFS STATIC_USER_DEFS)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "api_macro_test.cmake: ${var} is not set")
  endif()
endforeach()

# expect(NAME "<defs>" EXPECTED): the expansion of CLM_API with -D<def> for each.
function(expect name defs expected)
  string(REPLACE "|" ";" defs "${defs}")
  set(flags)
  foreach(d IN LISTS defs)
    if(NOT d STREQUAL "")
      list(APPEND flags "-D${d}")
    endif()
  endforeach()
  execute_process(COMMAND ${CC} -E -dM ${flags} -x c ${HEADER}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(SEND_ERROR "${name}: the preprocessor failed (${rc}): ${err}")
    return()
  endif()
  if(NOT out MATCHES "#define CLM_API([^\n]*)")
    message(SEND_ERROR "${name}: CLM_API is not defined")
    return()
  endif()
  string(STRIP "${CMAKE_MATCH_1}" got)
  if(NOT got STREQUAL expected)
    message(SEND_ERROR "${name}: CLM_API is [${got}], expected [${expected}] (flags: ${flags})")
  else()
    message(STATUS "${name}: CLM_API is [${got}]")
  endif()
endfunction()

expect("Windows, building the DLL" "_WIN32|${SHARED_DEFS}" "__declspec(dllexport)")
expect("Windows, using the DLL" "_WIN32" "__declspec(dllimport)")
expect("Windows, building the static library" "_WIN32|${STATIC_DEFS}" "")
expect("Windows, using the static library" "_WIN32|${STATIC_USER_DEFS}" "")
expect("GCC or Clang elsewhere" "" "__attribute__((visibility(\"default\")))")
