// clm/detail/json_string.hpp: a string as a JSON string literal, shared by
// the safetensors writer (its header) and the CLM watch's JSON lines:
// quotes, backslashes and control characters escaped, other bytes as they
// are (callers pass UTF-8).
//
//   std::string line = "{\"key\":";
//   clm::detail::append_json_string(line, key);  // "ORDER-\"7\""
#pragma once

#include <string>
#include <string_view>

#include <fmt/format.h>

namespace clm::detail {

inline void append_json_string(std::string& out, std::string_view s) {
  out.push_back('"');
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (u < 0x20) {
      out += fmt::format("\\u{:04x}", u);
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
}

}  // namespace clm::detail
