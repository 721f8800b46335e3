// tests/fuzz/tokenizer_json_seed.hpp: small tokenizer.json files in Qwen3's
// format (examples/tokenizer: NFC, Qwen's Split regex + ByteLevel, byte-level
// BPE), for fuzz_tokenizer_json's seeds (make_corpus.cpp) and the tokenizer
// it loads first to see that a refused file leaves it alone. The vocabulary
// is GPT-2's 256 byte tokens plus a few merges of English and Chinese; the
// variants differ in what the loader has to handle.
//
//   nlohmann::json file = clm_fuzz::small_tokenizer_json(clm_fuzz::TokenizerSeed::qwen);
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace clm_fuzz {

enum class TokenizerSeed {
  qwen,            // as Qwen3 writes it: merges as [left, right] pairs, special added tokens
  legacy_merges,   // merges as "left right" strings (tokenizers before 0.20), no normaliser
  stripped_added,  // added tokens with lstrip/rstrip, a Sequence normaliser, ignore_merges
};

// The byte-level character of byte b, as UTF-8 (GPT-2's alphabet).
inline std::string byte_level_char(int b) {
  int next = 256;
  for (int x = 0; x < b; ++x) {
    const bool printable = (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF);
    if (!printable) ++next;
  }
  const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  const int c = printable ? b : next;
  std::string utf8;
  if (c < 0x80) {
    utf8 += static_cast<char>(c);
  } else {
    utf8 += static_cast<char>(0xC0 | (c >> 6));
    utf8 += static_cast<char>(0x80 | (c & 0x3F));
  }
  return utf8;
}

// A text's bytes in the byte-level alphabet: how a vocabulary writes the token.
inline std::string byte_level(const std::string& text) {
  std::string out;
  for (unsigned char b : text) out += byte_level_char(b);
  return out;
}

inline nlohmann::json small_tokenizer_json(TokenizerSeed seed) {
  using nlohmann::json;
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_char(b)] = b;
  // Merges in rank order, each result a token: " t" "he" " the" "in" "ing", and 你 and 好 from their bytes.
  const std::vector<std::pair<std::string, std::string>> merges = {
      {" ", "t"},       {"h", "e"},       {" t", "he"},         {"i", "n"},          {"in", "g"},
      {"\xE4", "\xBD"}, {"\xE5", "\xA5"}, {"\xE4\xBD", "\xA0"}, {"\xE5\xA5", "\xBD"}};
  std::int32_t next_id = 256;
  json merge_list = json::array();
  for (const auto& [left_bytes, right_bytes] : merges) {
    const std::string left = byte_level(left_bytes), right = byte_level(right_bytes);
    if (!vocab.contains(left + right)) vocab[left + right] = next_id++;
    if (seed == TokenizerSeed::legacy_merges) {
      merge_list.push_back(left + " " + right);
    } else {
      merge_list.push_back(json::array({left, right}));
    }
  }
  const std::string pattern =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
      "\\s+(?!\\S)|\\s+";
  json added = json::array();
  const bool strip = seed == TokenizerSeed::stripped_added;
  added.push_back({{"id", next_id++},
                   {"content", "<|im_start|>"},
                   {"special", true},
                   {"lstrip", false},
                   {"rstrip", strip},
                   {"single_word", false},
                   {"normalized", false}});
  added.push_back({{"id", next_id++},
                   {"content", "<|im_end|>"},
                   {"special", true},
                   {"lstrip", strip},
                   {"rstrip", false},
                   {"single_word", false},
                   {"normalized", false}});
  added.push_back({{"id", next_id++},
                   {"content", "<think>"},
                   {"special", false},
                   {"lstrip", false},
                   {"rstrip", false},
                   {"single_word", false},
                   {"normalized", false}});
  json normalizer = json{{"type", "NFC"}};
  if (seed == TokenizerSeed::legacy_merges) normalizer = nullptr;
  if (strip) normalizer = json{{"type", "Sequence"}, {"normalizers", json::array({json{{"type", "NFKC"}}})}};
  return json{
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", normalizer},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array(
             {json{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
              json{{"type", "ByteLevel"},
                   {"add_prefix_space", false},
                   {"trim_offsets", false},
                   {"use_regex", false}}})}}},
      {"post_processor", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}}},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", strip},
        {"vocab", vocab},
        {"merges", merge_list}}},
  };
}

}  // namespace clm_fuzz
