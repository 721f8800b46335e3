// tests/fuzz/fuzz_tokenizer_json.cpp: libFuzzer target for the tokenizer.json
// loader of examples/tokenizer (clm_tokenizer::HfTokenizer::parse) and for
// encode and decode on the vocabulary a file loads.
//
//   make build-fuzz && build-fuzz/tests/fuzz/fuzz_tokenizer_json tests/fuzz/corpus/tokenizer_json
//
// The input is the file's text, then optionally a NUL byte and a text to
// encode (any bytes).
//
// Checks: no crash, leak, out-of-bounds read or undefined behaviour (ASan,
// UBSan), and no input slower than libFuzzer's -timeout (the pre-tokenizer
// and BPE are linear and n log n); a refused file is invalid_argument or
// unsupported with a message, and leaves the tokenizer it was loaded into as
// it was; a loaded file has 1..2^24 token ids, and on it: invalid UTF-8 is
// refused with invalid_argument and nothing appended; valid text encodes (with
// special tokens matched or as text) to ids that decode, the same ids twice;
// ASCII text (which no Unicode normal form changes) decodes to itself unless an
// added token strips the whitespace beside it; decode always writes valid
// UTF-8; the chat template either builds or is failed_precondition.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "fuzz/fuzz_support.hpp"
#include "fuzz/suffix_key_checks.hpp"  // clm_fuzz::valid_utf8, written apart from the tokenizer's own check
#include "fuzz/tokenizer_json_seed.hpp"
#include "hf_tokenizer.hpp"

namespace {

using clm_tokenizer::HfTokenizer;
using clm_tokenizer::SpecialTokens;

bool ascii(std::string_view s) {
  for (const char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

// Whether decode(encode(text)) must give ASCII text back under this file:
// not when an added token strips the whitespace beside it, nor when one takes
// a vocabulary token's id (it then decodes to its own text, as in Hugging
// Face's decoder, not to the bytes the vocabulary's byte-level text stands for).
bool ascii_round_trips(std::string_view file) {
  const nlohmann::json root = nlohmann::json::parse(file, nullptr, false);
  if (!root.is_object() || !root.contains("added_tokens") || !root["added_tokens"].is_array()) return true;
  std::vector<std::int64_t> vocab_ids;
  if (root.contains("model") && root["model"].is_object() && root["model"].contains("vocab") &&
      root["model"]["vocab"].is_object()) {
    for (const auto& [token, id] : root["model"]["vocab"].items()) {
      if (id.is_number_integer()) vocab_ids.push_back(id.get<std::int64_t>());
    }
  }
  std::sort(vocab_ids.begin(), vocab_ids.end());
  for (const auto& t : root["added_tokens"]) {
    if (!t.is_object()) continue;
    for (const char* flag : {"lstrip", "rstrip"}) {
      if (t.contains(flag) && t[flag].is_boolean() && t[flag].get<bool>()) return false;
    }
    if (t.contains("id") && t["id"].is_number_integer() &&
        std::binary_search(vocab_ids.begin(), vocab_ids.end(), t["id"].get<std::int64_t>())) {
      return false;
    }
  }
  return true;
}

void check_encode(const HfTokenizer& tok, std::string_view text, bool round_trips) {
  for (const SpecialTokens special : {SpecialTokens::match, SpecialTokens::as_text}) {
    std::vector<std::int32_t> ids{-7};  // what was there before must stay
    const clm::Status s = tok.encode(text, ids, special);
    if (!clm_fuzz::valid_utf8(text)) {
      FUZZ_CHECK(s.code() == clm::StatusCode::invalid_argument && !s.message().empty(), "invalid UTF-8 gave {}: '{}'",
                 s.code_name(), s.message());
      FUZZ_CHECK(ids.size() == 1 && ids[0] == -7, "a refused encode appended {} ids", ids.size() - 1);
      continue;
    }
    FUZZ_CHECK(s.ok(), "encode refused valid UTF-8: {}: {}", s.code_name(), s.message());
    FUZZ_CHECK(ids.size() >= 1 && ids[0] == -7, "encode changed what was in its output");
    ids.erase(ids.begin());
    for (const std::int32_t id : ids) {
      FUZZ_CHECK(id >= 0 && id < tok.vocab_size(), "id {} outside the vocabulary of {}", id, tok.vocab_size());
    }
    std::vector<std::int32_t> again;
    FUZZ_CHECK(tok.encode(text, again, special).ok() && again == ids, "encode is not a function of the text");
    std::string decoded;
    const clm::Status d = tok.decode(ids, decoded);
    FUZZ_CHECK(d.ok(), "encode gave ids that do not decode: {}", d.message());
    FUZZ_CHECK(clm_fuzz::valid_utf8(decoded), "decode wrote invalid UTF-8");
    if (round_trips && ascii(text)) {
      FUZZ_CHECK(decoded == text, "decode(encode(text)) differs from the ASCII text ({} bytes against {})",
                 decoded.size(), text.size());
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::size_t nul = input.find('\0');
  const std::string_view file = input.substr(0, nul);
  const std::string_view text = nul == std::string_view::npos ? std::string_view() : input.substr(nul + 1);

  // A tokenizer loaded before, to see that a refusal leaves it alone.
  static const std::string kept_file = clm_fuzz::small_tokenizer_json(clm_fuzz::TokenizerSeed::qwen).dump();
  HfTokenizer tok;
  FUZZ_CHECK(HfTokenizer::parse(kept_file, tok).ok(), "the seed tokenizer does not load");
  const std::int32_t kept_size = tok.vocab_size();

  const clm::Status s = HfTokenizer::parse(file, tok);
  if (!s.ok()) {
    FUZZ_CHECK((s.code() == clm::StatusCode::invalid_argument || s.code() == clm::StatusCode::unsupported) &&
                   !s.message().empty(),
               "refused with {}: '{}'", s.code_name(), s.message());
    FUZZ_CHECK(tok.loaded() && tok.vocab_size() == kept_size, "a refused file changed the tokenizer");
    return 0;
  }
  FUZZ_CHECK(tok.vocab_size() >= 1 && tok.vocab_size() <= (1 << 24), "vocab_size {}", tok.vocab_size());

  const bool round_trips = ascii_round_trips(file);
  check_encode(tok, text, round_trips);
  check_encode(tok, "Hello, the thing's 42 ins and outs\r\n\n  <|im_start|>user\nhi<|im_end|> <think>", round_trips);
  check_encode(tok, "你好，世界！ cafe\u0301 👨‍👩‍👧", round_trips);

  std::vector<std::int32_t> prompt;
  const std::vector<clm_tokenizer::ChatMessage> chat = {{"user", std::string(text.substr(0, 64))}};
  const clm::Status c = tok.apply_chat_template(chat, prompt);
  FUZZ_CHECK(c.ok() || c.code() == clm::StatusCode::failed_precondition ||
                 (c.code() == clm::StatusCode::invalid_argument && !clm_fuzz::valid_utf8(text.substr(0, 64))),
             "chat template: {}: {}", c.code_name(), c.message());
  return 0;
}
