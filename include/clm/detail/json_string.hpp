// clm/detail/json_string.hpp: a string as a JSON string literal, shared by
// the safetensors writer (its header) and the CLM watch's JSON lines:
// quotes, backslashes and control characters escaped, well-formed UTF-8 as it
// is, and each byte of anything else as U+FFFD, so the line is always JSON
// (a host's tenant name may be any bytes; the safetensors writer refuses
// names that are not UTF-8 before it gets here).
//
//   std::string line = "{\"key\":";
//   clm::detail::append_json_string(line, key);  // "ORDER-\"7\""
#pragma once

#include <string>
#include <string_view>

#include <fmt/format.h>

#include "clm/detail/utf8.hpp"

namespace clm::detail {

inline void append_json_string(std::string& out, std::string_view s) {
  out.push_back('"');
  for (std::size_t i = 0; i < s.size();) {
    const char c = s[i];
    const auto u = static_cast<unsigned char>(c);
    const std::size_t len = utf8_sequence_length(s, i);
    if (len == 0) {
      out += "\\ufffd";
      ++i;
      continue;
    }
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (u < 0x20) {
      out += fmt::format("\\u{:04x}", u);
    } else {
      out.append(s.substr(i, len));
    }
    i += len;
  }
  out.push_back('"');
}

}  // namespace clm::detail
