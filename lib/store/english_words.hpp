// lib/store/english_words.hpp: the English words the suffix keyer knows are
// words, so that it never mends one into another. Built from a system word
// list at configure time (cmake/embed_words.cmake: Debian's wamerican), the
// words of 5 to 24 letters (proper names lower-cased: "paris" is no slip of "part"), compiled in.
//
//   if (!store_detail::is_english_word("rooom")) { /* a slip: try to mend it */ }
//   store_detail::is_english_word("older");  // true: a word, not a slip of "order"
//
// Internal to lib/store.
#pragma once

#include <cstdint>
#include <string_view>

namespace clm::store_detail {

// Whether `word` (lower-case ASCII) is in the list. Thread-safe; the index is
// built on first use.
bool is_english_word(std::string_view word);

// A fingerprint of the whole list (FNV-1a 64 of its text): part of the rules'
// fingerprint, since another list mends other words.
std::uint64_t english_words_fingerprint();

}  // namespace clm::store_detail
