// examples/tokenizer/hf_tokenizer.hpp: a Hugging Face tokenizer loaded from its
// tokenizer.json: byte-level BPE as Qwen2 and Qwen3 ship it (NFC normaliser,
// their Split pre-tokenizer regex as a linear-time scanner over ICU's Unicode
// categories, ByteLevel, ranked merges), with its added and special tokens
// matched whole before BPE, decoding back to UTF-8, and the ChatML prompt the
// Qwen chat template builds. What a file asks for that this does not do
// (another model type, normaliser or pre-tokenizer regex) is refused with
// StatusCode::unsupported; a malformed file, or merges naming tokens the
// vocabulary lacks, with invalid_argument. No call throws.
//
//   clm_tokenizer::HfTokenizer tok;
//   clm::Status s = clm_tokenizer::HfTokenizer::load("tokenizer.json", tok);
//   std::vector<std::int32_t> ids;
//   s = tok.encode("Debian 是什么？", ids);                 // invalid UTF-8: invalid_argument
//   std::string text;
//   s = tok.decode(ids, text);                              // == "Debian 是什么？"
//   s = tok.apply_chat_template({{"system", faq}, {"user", "How do I install Debian?"}}, ids);
//
// A loaded tokenizer is immutable: encode and decode may run on many threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "clm/status.hpp"

namespace clm_tokenizer {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

// What encode does with the text of a special added token (<|im_start|>, ...)
// found in its input: `match` turns it into the token's id, as Hugging Face's
// encode does; `as_text` encodes it as ordinary text (Hugging Face's
// split_special_tokens), so that a user's message cannot forge the chat
// template's markers. Non-special added tokens (<think>) match either way.
enum class SpecialTokens { match, as_text };

class HfTokenizer {
 public:
  HfTokenizer();
  ~HfTokenizer();
  HfTokenizer(HfTokenizer&&) noexcept;
  HfTokenizer& operator=(HfTokenizer&&) noexcept;

  // Reads and parses a tokenizer.json; on failure `out` is left as it was.
  static clm::Status load(const std::string& path, HfTokenizer& out);
  // The same from the file's text (the fuzz target's entry point).
  static clm::Status parse(std::string_view json_text, HfTokenizer& out);

  bool loaded() const { return impl_ != nullptr; }
  // One more than the largest token id (model vocabulary and added tokens):
  // the size of a model's embedding and output layer for this tokenizer.
  std::int32_t vocab_size() const;

  // Appends the ids of `text` (valid UTF-8, else invalid_argument naming the
  // byte offset; nothing is appended then). No BOS or EOS is added: Qwen's
  // post-processor adds none, and the chat template places its own markers.
  clm::Status encode(std::string_view text, std::vector<std::int32_t>& out,
                     SpecialTokens special = SpecialTokens::match) const;

  // Replaces `out` with the text of `ids`, added tokens included as their
  // text; byte sequences that are not valid UTF-8 (a model may sample any
  // byte token) become U+FFFD. An id outside the vocabulary is invalid_argument.
  clm::Status decode(std::span<const std::int32_t> ids, std::string& out) const;
  // Appends the raw bytes of `ids`, unvalidated: for streaming, where one
  // character's bytes may arrive in two tokens.
  clm::Status decode_bytes(std::span<const std::int32_t> ids, std::string& out) const;

  // The id of an added token's or a vocabulary token's text (e.g.
  // "<|im_end|>"); not_found when there is none.
  clm::Status token_id(std::string_view token, std::int32_t& id) const;
  bool is_special(std::int32_t id) const;

  // The ChatML prompt of Qwen's chat template, appended to `out`:
  //   <|im_start|>role\ncontent<|im_end|>\n ... then <|im_start|>assistant\n
  // (add_generation_prompt). Roles and contents are encoded with
  // SpecialTokens::as_text. failed_precondition when the tokenizer has no
  // <|im_start|> or <|im_end|>.
  clm::Status apply_chat_template(std::span<const ChatMessage> messages, std::vector<std::int32_t>& out,
                                  bool add_generation_prompt = true) const;
  // One message as the template writes it, for a conversation that grows
  // turn by turn: <|im_start|>role\ncontent<|im_end|>\n.
  clm::Status append_chat_message(const ChatMessage& message, std::vector<std::int32_t>& out) const;
  // <|im_start|>assistant\n
  clm::Status append_generation_prompt(std::vector<std::int32_t>& out) const;
  // <|im_end|>: where an assistant's turn stops.
  std::int32_t end_of_turn_id() const;

  struct Impl;

 private:
  std::unique_ptr<const Impl> impl_;
};

}  // namespace clm_tokenizer
