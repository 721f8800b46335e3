// examples/tokenizer/qwen_split.cpp: the scanner of qwen_split.hpp. At each
// position the alternatives are tried in the regex's order; each is decided by
// looking at most two code points ahead, except the whitespace ones, which
// look at the whitespace run they start (consumed right after), so the whole
// text is scanned a bounded number of times.
#include "qwen_split.hpp"

#include <unicode/uchar.h>
#include <unicode/utf8.h>

namespace clm_tokenizer {
namespace {

enum CharClass : std::uint8_t {
  kLetter,   // \p{L}
  kNumber,   // \p{N}
  kNewline,  // \r or \n
  kSpace,    // any other \s
  kOther,    // [^\s\p{L}\p{N}]
};

CharClass classify(char32_t c) {
  if (c < 0x80) {  // ASCII without ICU: most of most texts
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return kLetter;
    if (c >= '0' && c <= '9') return kNumber;
    if (c == '\r' || c == '\n') return kNewline;
    if (c == ' ' || (c >= 0x09 && c <= 0x0D)) return kSpace;
    return kOther;
  }
  const auto c32 = static_cast<UChar32>(c);
  const std::uint32_t mask = U_GET_GC_MASK(c32);
  if ((mask & U_GC_L_MASK) != 0) return kLetter;
  if ((mask & U_GC_N_MASK) != 0) return kNumber;
  if (u_isUWhiteSpace(c32)) return kSpace;
  return kOther;
}

char32_t ascii_lower(char32_t c) { return (c >= 'A' && c <= 'Z') ? c + ('a' - 'A') : c; }

// (?i:'s|'t|'re|'ve|'m|'ll|'d) at i: the length matched, or 0.
std::size_t contraction_at(const std::vector<char32_t>& cp, std::size_t i, std::size_t n) {
  if (cp[i] != U'\'' || i + 1 >= n) return 0;
  const char32_t a = ascii_lower(cp[i + 1]);
  if (a == U's' || a == U't' || a == U'm' || a == U'd') return 2;
  if (i + 2 >= n) return 0;
  const char32_t b = ascii_lower(cp[i + 2]);
  if ((a == U'r' && b == U'e') || (a == U'v' && b == U'e') || (a == U'l' && b == U'l')) return 3;
  return 0;
}

}  // namespace

void split_qwen_pieces(std::string_view text, SplitScratch& scratch, std::vector<Piece>& pieces) {
  auto& offsets = scratch.offsets;
  auto& classes = scratch.classes;
  auto& cp = scratch.code_points;
  offsets.clear();
  classes.clear();
  cp.clear();
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(text.data());
  const auto length = static_cast<std::int32_t>(text.size());
  for (std::int32_t at = 0; at < length;) {
    offsets.push_back(static_cast<std::uint32_t>(at));
    UChar32 c;
    U8_NEXT(bytes, at, length, c);  // the caller validated the text: c >= 0
    cp.push_back(static_cast<char32_t>(c));
    classes.push_back(classify(static_cast<char32_t>(c)));
  }
  const std::size_t n = cp.size();
  offsets.push_back(static_cast<std::uint32_t>(length));

  auto letters_end = [&](std::size_t j) {
    while (j < n && classes[j] == kLetter) ++j;
    return j;
  };
  std::size_t i = 0;
  while (i < n) {
    const std::uint8_t c = classes[i];
    std::size_t end = 0;
    if (const std::size_t len = contraction_at(cp, i, n); len != 0) {
      end = i + len;
    } else if (c == kLetter) {  // \p{L}+
      end = letters_end(i + 1);
    } else if ((c == kSpace || c == kOther) && i + 1 < n && classes[i + 1] == kLetter) {
      end = letters_end(i + 2);  // [^\r\n\p{L}\p{N}]\p{L}+
    } else if (c == kNumber) {   // \p{N}: one digit a piece
      end = i + 1;
    } else if (c == kOther || (cp[i] == U' ' && i + 1 < n && classes[i + 1] == kOther)) {
      std::size_t j = c == kOther ? i : i + 1;  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
      while (j < n && classes[j] == kOther) ++j;
      while (j < n && classes[j] == kNewline) ++j;
      end = j;
    } else {
      // Whitespace: its run [i, run_end), and the last \r or \n in it.
      std::size_t run_end = i;
      std::size_t last_newline = n;
      while (run_end < n && (classes[run_end] == kSpace || classes[run_end] == kNewline)) {
        if (classes[run_end] == kNewline) last_newline = run_end;
        ++run_end;
      }
      if (last_newline != n) {
        end = last_newline + 1;  // \s*[\r\n]+: \s* gives back all after the last newline
      } else if (run_end == n) {
        end = run_end;  // \s+(?!\S) at the end of the text
      } else if (run_end - i >= 2) {
        end = run_end - 1;  // \s+(?!\S): leaves the last one to lead the next word
      } else {
        end = run_end;  // \s+
      }
    }
    pieces.push_back({offsets[i], offsets[end]});
    i = end;
  }
}

}  // namespace clm_tokenizer
