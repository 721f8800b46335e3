# Self-test of extract_c_example.cmake (ctest c_api_doc_extract):
#   cmake -DEXTRACT=extract_c_example.cmake -DWORK=<dir> -P extract_c_example_test.cmake
if(NOT DEFINED EXTRACT OR NOT DEFINED WORK)
  message(FATAL_ERROR "usage: cmake -DEXTRACT=<script> -DWORK=<dir> -P extract_c_example_test.cmake")
endif()
file(MAKE_DIRECTORY "${WORK}")
set(failures 0)

# extract(NAME DOC_TEXT EXPECTED_CODE|FAIL)
function(check name doc expected)
  file(WRITE "${WORK}/${name}.md" "${doc}")
  file(REMOVE "${WORK}/${name}.c")
  execute_process(COMMAND ${CMAKE_COMMAND} -DDOC=${WORK}/${name}.md -DOUT=${WORK}/${name}.c -P ${EXTRACT}
                  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
  if(expected STREQUAL "FAIL")
    if(rc EQUAL 0)
      message(SEND_ERROR "${name}: extraction should have failed")
    endif()
    return()
  endif()
  if(NOT rc EQUAL 0)
    message(SEND_ERROR "${name}: extraction failed (${rc})")
    return()
  endif()
  file(READ "${WORK}/${name}.c" got)
  # Drop the generated comment and the #line directive.
  string(REGEX REPLACE "^/\\*[^\n]*\\*/\n#line [0-9]+ \"[^\n]*\"\n" "" code "${got}")
  if(NOT code STREQUAL expected)
    message(SEND_ERROR "${name}: got [${code}], expected [${expected}]")
  endif()
endfunction()

set(fence "```")
check(first_of_many "Intro\n${fence}cpp\nint cpp;\n${fence}\n${fence}cmake\nset(x)\n${fence}\n${fence}c\nint first;\n${fence}\n${fence}c\nint second;\n${fence}\n"
      "int first;\n")
check(at_top "${fence}c\nint top;\n${fence}\n" "int top;\n")
check(indented_trailing_blanks "a\n   ${fence}c  \nint x;\n  ${fence}\n" "int x;\n")
check(crlf "a\r\n${fence}c\r\nint y;\r\nint z;\r\n${fence}\r\n" "int y;\nint z;\n")
check(brackets_semicolons "${fence}c\nint a[2] = {1, 2}; /* ; [ ] */\n${fence}\n" "int a[2] = {1, 2}; /* ; [ ] */\n")
check(not_c_plus_plus "${fence}c++\nint a;\n${fence}\n" FAIL)
check(no_block "${fence}cpp\nint a;\n${fence}\n" FAIL)
check(unclosed "${fence}c\nint a;\n" FAIL)
check(empty "${fence}c\n${fence}\n" FAIL)

# The #line directive names the document line where the code starts.
file(READ "${WORK}/first_of_many.c" got)
if(NOT got MATCHES "\n#line 9 \"")
  message(SEND_ERROR "first_of_many: wrong #line: ${got}")
endif()
