// examples/tokenizer/qwen_split.hpp: the Split pre-tokenizer of Qwen2 and
// Qwen3's tokenizer.json as a hand-written scanner, one pass, linear time:
//
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// with behaviour "Isolated" (every match is a piece; this regex matches at
// every position, so there are no gaps). \p{L}, \p{N} and \s are ICU's
// General_Category L and N and White_Space property, as Oniguruma (Hugging
// Face's regex engine) defines them for Unicode; the contractions fold ASCII
// case only.
//
//   std::vector<clm_tokenizer::Piece> pieces;
//   clm_tokenizer::split_qwen_pieces("I'm 42", scratch, pieces);   // "I", "'m", " ", "4", "2"
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace clm_tokenizer {

// The exact pattern string this scanner implements, as tokenizer.json writes it.
inline constexpr std::string_view kQwenSplitPattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

// A piece of the text: bytes [begin, end).
struct Piece {
  std::uint32_t begin;
  std::uint32_t end;
};

// What the scanner keeps per code point; reused between calls to save allocations.
struct SplitScratch {
  std::vector<std::uint32_t> offsets;  // byte offset of each code point, and one past the end
  std::vector<std::uint8_t> classes;   // CharClass of each code point
  std::vector<char32_t> code_points;
};

// Appends the pieces of `text` (valid UTF-8, under 4 GiB) to `pieces`.
void split_qwen_pieces(std::string_view text, SplitScratch& scratch, std::vector<Piece>& pieces);

}  // namespace clm_tokenizer
