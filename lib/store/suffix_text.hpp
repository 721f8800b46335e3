// lib/store/suffix_text.hpp: the text layer of the suffix keyer
// (clm/store/suffix_key.hpp): strict UTF-8 decoding, the ASCII classes, step 1
// of make_key (normalisation) and the split of normalised text into units.
// Internal to lib/store: the entity patterns (entity_pattern.hpp), the lexicon
// loader (suffix_lexicon.hpp) and the key rules (suffix_key.cpp) all read
// text through it. One pass over the text, bounded work per code point.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "clm/status.hpp"

namespace clm::store_detail {

// Decodes the code point at s[i], advancing i; false on anything that is not
// well-formed UTF-8 (stray continuation bytes, overlongs, surrogates, code
// points past U+10FFFF, truncated sequences).
bool decode_utf8(std::string_view s, std::size_t& i, char32_t& cp);

constexpr bool is_ascii_alnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}
constexpr bool is_ascii_digit(char c) { return c >= '0' && c <= '9'; }

// What normalisation does with the punctuation that ends a clause.
enum class Clauses {
  keep,   // make_key's text: '|' for , ; ! | 。 and a full stop before a space, '?' for a question mark
          // (':' is in times: 18:45)
  merge,  // lexicon surfaces and entity patterns: every break is one ' '
};
constexpr char kClauseBreak = '|';  // not ',': "5,6" must read back as it was written (a decimal comma)
constexpr char kQuestionBreak = '?';

// ASCII symbols that are content of their own (a unit each): '$' and '%'
// tell amounts apart ("$20" is not "20%"), like the non-ASCII currency signs.
constexpr bool is_ascii_symbol_unit(char c) { return c == '$' || c == '%'; }

// Step 1 of make_key (see clm/store/suffix_key.hpp). The output is words of
// [a-z0-9] (a number may hold a decimal point: "7.25"; a comma grouping
// thousands is dropped: "1,000" is "1000"), '$', '%' and other content code
// points, separated by one break
// each: ' ', or with Clauses::keep kClauseBreak or kQuestionBreak (the
// strongest of a run); none at the start, and at the end only a '?'.
Status normalise_text(std::string_view text, std::string& out, Clauses clauses = Clauses::merge);

// The words of normalised text: ASCII alnum runs (with a number's decimal
// point), single other code points,
// and each clause or question break as a unit of its own.
void split_units(std::string_view norm, std::vector<std::string_view>& units);

}  // namespace clm::store_detail
