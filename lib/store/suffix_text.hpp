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

// Step 1 of make_key (see clm/store/suffix_key.hpp). The output is words of [a-z0-9] and
// other content code points, runs of separators as one ' ', none at either end.
Status normalise_text(std::string_view text, std::string& out);

// The words of normalised text: ASCII alnum runs and single other code points.
void split_units(std::string_view norm, std::vector<std::string_view>& units);

}  // namespace clm::store_detail
