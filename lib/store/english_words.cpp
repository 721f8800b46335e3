// lib/store/english_words.cpp: lookups in the compiled-in English word list
// (english_words.hpp). The list is sorted text, one word a line, in chunks;
// the index is a sorted vector of views into it, searched by bisection.
#include "english_words.hpp"

#include <algorithm>
#include <cstddef>
#include <string_view>
#include <vector>

#include "clm/store/suffix_key.hpp"

namespace clm::english_words_data {
extern const char* const kChunks[];
extern const std::size_t kChunkCount;
extern const std::size_t kCount;
}  // namespace clm::english_words_data

namespace clm::store_detail {

namespace {

const std::vector<std::string_view>& index() {
  static const std::vector<std::string_view> words = [] {
    std::vector<std::string_view> out;
    out.reserve(english_words_data::kCount);
    for (std::size_t c = 0; c < english_words_data::kChunkCount; ++c) {
      const std::string_view text(english_words_data::kChunks[c]);
      std::size_t start = 0;
      for (std::size_t end = text.find('\n'); end != std::string_view::npos; end = text.find('\n', start)) {
        out.push_back(text.substr(start, end - start));
        start = end + 1;
      }
    }
    return out;
  }();
  return words;
}

}  // namespace

bool is_english_word(std::string_view word) {
  const auto& words = index();
  return std::binary_search(words.begin(), words.end(), word);
}

std::uint64_t english_words_fingerprint() {
  // FNV-1a 64 (key_fingerprint) of the whole list, chunk after chunk.
  static const std::uint64_t fingerprint = [] {
    std::uint64_t h = key_fingerprint("");
    for (std::size_t c = 0; c < english_words_data::kChunkCount; ++c) {
      for (const char ch : std::string_view(english_words_data::kChunks[c])) {
        h ^= static_cast<unsigned char>(ch);
        h *= 0x100000001b3ULL;
      }
    }
    return h;
  }();
  return fingerprint;
}

}  // namespace clm::store_detail
