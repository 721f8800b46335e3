// lib/store/suffix_text.cpp: the suffix keyer's text layer (suffix_text.hpp):
// the UTF-8 decoder, the non-ASCII separators, the normaliser and the split
// into units.
#include "suffix_text.hpp"

#include <fmt/format.h>

#include "clm/detail/utf8.hpp"

namespace clm::store_detail {

bool decode_utf8(std::string_view s, std::size_t& i, char32_t& cp) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    cp = b0;
    ++i;
    return true;
  }
  std::size_t len = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
    cp = b0 & 0x1Fu;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    cp = b0 & 0x0Fu;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    cp = b0 & 0x07u;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // past U+10FFFF
  } else {
    return false;
  }
  if (s.size() - i < len) return false;
  for (std::size_t k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return false;
    cp = (cp << 6) | (b & 0x3Fu);
  }
  i += len;
  return true;
}

namespace {

// Non-ASCII whitespace, punctuation and invisible format characters: they
// separate words like ASCII punctuation does. Letters, digits, ideographs and
// symbols (currency, emoji) are content and stay.
bool is_separator(char32_t cp) {
  if (cp <= 0xA0) return true;  // C1 controls, NBSP (ASCII is decided by the caller)
  switch (cp) {                 // ¡ § « soft hyphen ¶ · » ¿, Ogham space, Mongolian vowel separator, ・, BOM
    case 0xA1:
    case 0xA7:
    case 0xAB:
    case 0xAD:
    case 0xB6:
    case 0xB7:
    case 0xBB:
    case 0xBF:
    case 0x1680:
    case 0x180E:
    case 0x30FB:
    case 0xFEFF:
      return true;
    default:
      break;
  }
  if (cp >= 0x2000 && cp <= 0x206F) return true;  // General Punctuation: spaces, dashes, quotes, ZW*
  if (cp >= 0x2E00 && cp <= 0x2E7F) return true;  // Supplemental Punctuation
  if (cp >= 0x3000 && cp <= 0x303F) {             // CJK Symbols and Punctuation, less its letters
    return !(cp == 0x3005 || cp == 0x3006 || cp == 0x3007 || (cp >= 0x3021 && cp <= 0x3029) ||
             (cp >= 0x3031 && cp <= 0x3035) || (cp >= 0x3038 && cp <= 0x303C));
  }
  if (cp >= 0xFE10 && cp <= 0xFE19) return true;  // vertical forms
  if (cp >= 0xFE30 && cp <= 0xFE6F) return true;  // CJK compatibility and small form variants
  if (cp >= 0xFF5F && cp <= 0xFF65) return true;  // half-width CJK punctuation
  return false;
}

// Whether out, before text[next], ends in "no" after a word, and the text
// goes on with a number or an id: "no." then abbreviates "number" ("item no.
// 3", "policy no. PN550921", "invoice no. INV-30077", "invoice no. INV 30077":
// an id's letters are capitals, at most four, before three digits or more).
// "No. Cancel it." and "the answer is no. SEND 2 boxes" go on with a word.
bool abbreviates_number(std::string_view out, std::string_view text, std::size_t next) {
  if (out.size() < 4 || !out.ends_with("no") || out[out.size() - 3] != ' ' || !is_ascii_alnum(out[out.size() - 4])) {
    return false;
  }
  while (next < text.size() && text[next] == ' ') ++next;
  if (next < text.size() && is_ascii_digit(text[next])) return true;
  constexpr std::size_t kMaxWord = 24;  // a bounded look ahead: linear however long the text
  std::size_t end = next, capitals = 0;
  bool digit = false;
  while (end < text.size() && end - next < kMaxWord && (is_ascii_alnum(text[end]) || text[end] == '-')) {
    digit = digit || is_ascii_digit(text[end]);
    capitals += text[end] >= 'A' && text[end] <= 'Z' ? 1 : 0;
    ++end;
  }
  if (digit) return true;
  if (end == next || capitals != end - next || capitals > 4 || end >= text.size()) return false;
  std::size_t digits = 0;
  while (end + 1 + digits < text.size() && digits < 3 && is_ascii_digit(text[end + 1 + digits])) ++digits;
  return digits == 3;
}

// Whether out ends in a title's abbreviation ("dr", "mr", "mrs", "ms") as a
// word of its own: "Dr. Patel" is no sentence ending after "dr".
bool abbreviates_title(std::string_view out) {
  for (std::string_view title : {"dr", "mr", "mrs", "ms"}) {
    if (out.ends_with(title) && (out.size() == title.size() || !is_ascii_alnum(out[out.size() - title.size() - 1]))) {
      return true;
    }
  }
  return false;
}

// Whether out ends in "no" right after a Chinese character, or after one and
// a space (订单No.4521, 订单 no 4521): there it is the sign for number, never
// the English "no".
bool number_sign_after_chinese(std::string_view out) {
  if (out.size() < 3 || !out.ends_with("no")) return false;
  const std::size_t before = out[out.size() - 3] == ' ' && out.size() >= 4 ? out.size() - 4 : out.size() - 3;
  return static_cast<unsigned char>(out[before]) >= 0x80;
}

// Whether text from `next` goes on, past a point and spaces, with a digit.
bool number_follows(std::string_view text, std::size_t next) {
  if (next < text.size() && text[next] == '.') ++next;
  while (next < text.size() && text[next] == ' ') ++next;
  return next < text.size() && is_ascii_digit(text[next]);
}

// A phone number written with its country's code is the number as dialled at
// home: "+1 (415) 555-0134" is "415-555-0134", "+44 7700 900123" "07700
// 900123", "+86 138 1234 5678" "13812345678". Returns how many bytes of
// text from `at` (the '+') the code takes, 0 where no such number follows,
// and in `home` what the code becomes.
std::size_t country_code(std::string_view text, std::size_t at, std::string_view& home) {
  struct Code {
    std::string_view digits, home;
    std::size_t min_digits, max_digits;  // of the number after the code
  };
  static constexpr Code kCodes[] = {{"1", "", 10, 10}, {"44", "0", 9, 10}, {"86", "", 11, 11}};
  for (const Code& code : kCodes) {
    if (text.substr(at + 1, code.digits.size()) != code.digits) continue;
    std::size_t next = at + 1 + code.digits.size(), digits = 0;
    for (std::size_t k = next; k < text.size() && k < next + 24; ++k) {
      const char c = text[k];
      if (is_ascii_digit(c)) {
        ++digits;
      } else if (c != ' ' && c != '-' && c != '(' && c != ')' && c != '.') {
        break;
      }
    }
    if (digits < code.min_digits || digits > code.max_digits) continue;
    home = code.home;
    return 1 + code.digits.size();
  }
  return 0;
}

}  // namespace

Status normalise_text(std::string_view text, std::string& out, Clauses clauses) {
  out.clear();
  out.reserve(text.size());
  // The strongest break since the last content: a clause break outranks a
  // space, a question mark outranks both.
  char pending = 0;
  auto rank = [](char c) { return c == kQuestionBreak ? 3 : c == kClauseBreak ? 2 : c == ' ' ? 1 : 0; };
  auto note = [&](char c) {
    if (clauses == Clauses::merge && c != 0) c = ' ';
    if (rank(c) > rank(pending)) pending = c;
  };
  std::size_t i = 0;
  while (i < text.size()) {
    const std::size_t at = i;
    char32_t cp = 0;
    if (!decode_utf8(text, i, cp)) return invalid_argument(fmt::format("invalid UTF-8 at byte {}", at));
    if (cp >= 0xFF01 && cp <= 0xFF5E) cp -= 0xFEE0;  // full-width ASCII (NFKC)
    if (cp == 0xFFE5) cp = 0xA5;                     // full-width yen sign (NFKC)
    if (cp < 0x80) {
      if (cp >= 'A' && cp <= 'Z') cp += 'a' - 'A';
      const char c = static_cast<char>(cp);
      // A point or comma between digits belongs to the number: "7.25" is not
      // "72.5", "1,000" is 1000, "7,25" (a decimal comma) is 7.25.
      if ((c == '.' || c == ',') && pending == 0 && !out.empty() && is_ascii_digit(out.back()) && i < text.size() &&
          is_ascii_digit(text[i])) {
        std::size_t digits = 0;
        while (i + digits < text.size() && is_ascii_digit(text[i + digits])) ++digits;
        if (c == '.' || digits != 3) out.push_back('.');  // a comma before exactly three digits groups thousands
        continue;
      }
      if (c == '+' && (out.empty() || pending != 0 || !is_ascii_alnum(out.back()))) {  // not "c++", "a+b"
        std::string_view home;
        if (const std::size_t code = country_code(text, at, home); code > 0) {
          i = at + code;
          if (!home.empty()) {
            if (pending != 0 && !out.empty()) out.push_back(pending);
            pending = 0;
            out += home;
          }
          note(' ');
          continue;
        }
      }
      if (!is_ascii_alnum(c) && !is_ascii_symbol_unit(c)) {
        // A full stop before a space ends a sentence ("No. Cancel it."); one
        // inside a word does not ("e.g", "no.789").
        const bool full_stop = c == '.' && (i >= text.size() || text[i] == ' ' || text[i] == '\n' || text[i] == '\t');
        if ((full_stop && abbreviates_number(out, text, i)) ||
            (c == '.' && pending == 0 && number_sign_after_chinese(out) && number_follows(text, i))) {
          // "item no. 3", "order no. 20231145": the word for number, not "no" and a full stop.
          out.replace(out.size() - 2, 2, "number");
          note(' ');
          continue;
        }
        if (full_stop && pending == 0 && abbreviates_title(out)) {
          note(' ');  // "Dr. Lee": a title and its name
          continue;
        }
        note(c == '?'                                                               ? kQuestionBreak
             : (c == ',' || c == ';' || c == '!' || c == kClauseBreak || full_stop) ? kClauseBreak
                                                                                    : ' ');
        continue;
      }
    } else if (cp == 0x3002 || cp == 0xFF61) {  // ideographic and half-width full stop: the end of a clause
      note(kClauseBreak);
      continue;
    } else if (is_separator(cp)) {  // U+3000 (ideographic space) and U+3001 (、, a list's comma) included
      note(' ');
      continue;
    }
    if (cp < 0x80 && is_ascii_digit(static_cast<char>(cp)) && (pending == 0 || pending == ' ') &&
        number_sign_after_chinese(out)) {
      out.replace(out.size() - 2, 2, "number");  // 订单no4521, 订单no 4521
      pending = ' ';
    }
    if (pending != 0 && !out.empty()) out.push_back(pending);
    pending = 0;
    detail::append_utf8(out, cp);
  }
  // A question mark at the end says what the text is: it stays.
  if (pending == kQuestionBreak && !out.empty()) out.push_back(kQuestionBreak);
  return Status::success();
}

void split_units(std::string_view norm, std::vector<std::string_view>& units) {
  units.clear();
  std::size_t i = 0;
  while (i < norm.size()) {
    const char c = norm[i];
    if (c == ' ') {
      ++i;
    } else if (is_ascii_alnum(c)) {
      std::size_t j = i;
      // A decimal point stays inside its number ("7.25": one unit).
      while (j < norm.size() &&
             (is_ascii_alnum(norm[j]) ||
              (norm[j] == '.' && j + 1 < norm.size() && is_ascii_digit(norm[j + 1]) && is_ascii_digit(norm[j - 1])))) {
        ++j;
      }
      units.push_back(norm.substr(i, j - i));
      i = j;
    } else {
      const auto b = static_cast<unsigned char>(c);
      // ASCII here is a break or a symbol unit; the rest is valid UTF-8 by construction.
      const std::size_t len = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
      units.push_back(norm.substr(i, len));
      i += len;
    }
  }
}

}  // namespace clm::store_detail
