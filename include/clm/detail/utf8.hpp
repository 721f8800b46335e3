// clm/detail/utf8.hpp: UTF-8 encoding of one code point, and the length of
// the well-formed sequence at an offset; shared by the safetensors reader and
// writer (JSON \u escapes, names checked), the suffix keyer (full-width
// folding) and JSON strings (clm/detail/json_string.hpp).
//
//   std::string s;
//   clm::detail::append_utf8(s, 0x8BA2);                // 订
//   std::size_t n = clm::detail::utf8_sequence_length(s, 0);  // 3; 0 for a bad byte
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

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

// The length (1-4) of the well-formed UTF-8 sequence that starts at s[i], or 0
// when s[i] starts none: a stray continuation byte, a truncated sequence, an
// overlong form, a surrogate or a code point past U+10FFFF.
inline std::size_t utf8_sequence_length(std::string_view s, std::size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  std::size_t len = 0;
  std::uint32_t cp = 0;
  std::uint32_t min = 0;
  if ((c & 0xE0) == 0xC0) {
    len = 2, cp = c & 0x1Fu, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3, cp = c & 0x0Fu, min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4, cp = c & 0x07u, min = 0x10000;
  } else {
    return 0;
  }
  if (s.size() - i < len) return 0;
  for (std::size_t k = 1; k < len; ++k) {
    const auto cc = static_cast<unsigned char>(s[i + k]);
    if ((cc & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (cc & 0x3Fu);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

}  // namespace clm::detail
