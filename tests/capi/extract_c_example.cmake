# Writes the first ```c fenced block of a Markdown document to a .c file.
#   cmake -DDOC=docs/c-api.md -DOUT=build/.../example.c -P extract_c_example.cmake
#
# The opening fence is a line that is exactly ```c (up to three spaces of
# indentation, trailing blanks and a CR allowed): ```cpp, ```cmake or
# ```c++ blocks are not it. The block ends at the next line that starts with
# ``` (after the same indentation). A #line directive maps compiler messages
# back to the document. Missing block or fence: a fatal error, so the build fails.
if(NOT DEFINED DOC OR NOT DEFINED OUT)
  message(FATAL_ERROR "usage: cmake -DDOC=<file.md> -DOUT=<file.c> -P extract_c_example.cmake")
endif()
file(READ "${DOC}" text)
string(REPLACE "\r\n" "\n" text "${text}")
# Anchor every line start, including the first, on a newline.
set(text "\n${text}")

string(REGEX MATCH "\n[ ]?[ ]?[ ]?```c[ \t]*\n" opening "${text}")
if(NOT opening)
  message(FATAL_ERROR "${DOC}: no ```c fenced block")
endif()
# The first occurrence of the matched text is where the leftmost match starts.
string(FIND "${text}" "${opening}" start)
string(LENGTH "${opening}" opening_length)
math(EXPR body_start "${start} + ${opening_length}")
string(SUBSTRING "${text}" ${body_start} -1 rest)

# The line of the document where the code starts (for #line).
string(SUBSTRING "${text}" 0 ${body_start} before)
string(REGEX MATCHALL "\n" newlines "${before}")
list(LENGTH newlines code_line)  # the leading "\n" we added makes this 1-based

# The closing fence: the first line of `rest` that starts with ```.
set(rest "\n${rest}")
string(REGEX MATCH "\n[ ]?[ ]?[ ]?```" closing "${rest}")
if(NOT closing)
  message(FATAL_ERROR "${DOC}:${code_line}: the ```c block is not closed")
endif()
string(FIND "${rest}" "${closing}" end)
string(SUBSTRING "${rest}" 1 ${end} code)  # drop our leading "\n"; keep the final one
if(code STREQUAL "")
  message(FATAL_ERROR "${DOC}:${code_line}: the ```c block is empty")
endif()

set(content "/* Generated from ${DOC} (its first ```c block) at build time. Do not edit. */\n")
string(APPEND content "#line ${code_line} \"${DOC}\"\n${code}")
file(WRITE "${OUT}" "${content}")
