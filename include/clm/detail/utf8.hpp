// clm/detail/utf8.hpp: UTF-8 encoding of one code point, shared by the
// safetensors reader (JSON \u escapes) and the suffix keyer (full-width
// folding).
//
//   std::string s;
//   clm::detail::append_utf8(s, 0x8BA2);  // 订
#pragma once

#include <cstdint>
#include <string>

namespace clm::detail {

// Appends cp (at most U+10FFFF; callers check) as 1-4 bytes.
inline void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace clm::detail
