# In CI a test whose tool is missing must fail the configure, not vanish
# (ctest ci_missing_tool_fails_configure). Configures the project in a
# temporary folder with CI=1 and each tool's program forced to "not found"
# (-D<var>=FALSE: find_program keeps a set variable), and expects an error
# naming the test that would have gone missing (or the tool); then once without CI, which
# must configure.
#   cmake -DSOURCE=<repo> -DWORK=<temporary folder> -P missing_tool_test.cmake
foreach(var SOURCE WORK)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "missing_tool_test.cmake: ${var} is not set")
  endif()
endforeach()

# configure(<CI value> <-D...> OUT rc output)
function(configure ci define out_rc out_text)
  file(REMOVE_RECURSE ${WORK})
  execute_process(COMMAND ${CMAKE_COMMAND} -E env CI=${ci}
                          ${CMAKE_COMMAND} -S ${SOURCE} -B ${WORK} -DCLM_CUDA=OFF ${define}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(${out_rc} ${rc} PARENT_SCOPE)
  string(REGEX REPLACE "[ \n]+" " " flat "${out}${err}")  # CMake wraps its error lines
  set(${out_text} "${flat}" PARENT_SCOPE)
endfunction()

foreach(case "CLM_GO|go_test" "CLM_CARGO|rust_cargo_test" "CLM_ABIDW|abi_check" "CLM_PKG_CONFIG|pkg-config not found")
  string(REPLACE "|" ";" parts "${case}")
  list(GET parts 0 var)
  list(GET parts 1 test)
  configure(1 -D${var}=FALSE rc text)
  if(rc EQUAL 0)
    message(SEND_ERROR "${var} missing with CI=1: the configure succeeded; ${test} vanished silently")
  elseif(NOT text MATCHES "${test}" OR NOT text MATCHES "CI is set")
    message(SEND_ERROR "${var} missing with CI=1: the configure failed, but not naming ${test} and CI:\n${text}")
  else()
    message(STATUS "${var} missing with CI=1: refused, naming ${test}")
  endif()
endforeach()

configure(0 -DCLM_GO=FALSE rc text)
if(NOT rc EQUAL 0)
  message(SEND_ERROR "go missing without CI: the configure should succeed with a note:\n${text}")
elseif(NOT text MATCHES "go not found")
  message(SEND_ERROR "go missing without CI: no note says go_test is skipped:\n${text}")
endif()
file(REMOVE_RECURSE ${WORK})
