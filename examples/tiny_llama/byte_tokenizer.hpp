// examples/tiny_llama/byte_tokenizer.hpp: a byte-level tokenizer with a
// Llama-3-style chat template. Every UTF-8 byte is one token (ids 0-255), so
// English and Chinese text alike round-trip exactly; ids 256-259 are the
// template's special tokens; the rest of the vocabulary is unused.
//
//   std::vector<tiny_llama::ChatMessage> chat = {{"system", faq}, {"user", "How do I install Debian?"}};
//   std::vector<std::int32_t> prompt = tiny_llama::ByteTokenizer::apply_chat_template(chat);
//   std::string text = tiny_llama::ByteTokenizer::decode(generated);  // valid UTF-8
//
// A conversation's prompt for turn k+1 starts with the whole token sequence of
// turn k (its prompt, the answer, <|eot_id|>): that is what prefix reuse finds.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tiny_llama {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

struct ByteTokenizer {
  static constexpr std::int32_t kBeginOfText = 256;
  static constexpr std::int32_t kStartHeader = 257;
  static constexpr std::int32_t kEndHeader = 258;
  static constexpr std::int32_t kEndOfTurn = 259;
  static constexpr std::int32_t kFirstUnused = 260;

  static void encode(std::string_view text, std::vector<std::int32_t>& out) {
    for (unsigned char byte : text) out.push_back(byte);
  }
  static std::vector<std::int32_t> encode(std::string_view text) {
    std::vector<std::int32_t> out;
    encode(text, out);
    return out;
  }

  // <|begin_of_text|>, then per message <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>,
  // then (add_generation_prompt) the assistant's header.
  static std::vector<std::int32_t> apply_chat_template(const std::vector<ChatMessage>& messages,
                                                       bool add_generation_prompt = true) {
    std::vector<std::int32_t> out{kBeginOfText};
    for (const ChatMessage& m : messages) {
      append_message(m, out);
    }
    if (add_generation_prompt) append_header("assistant", out);
    return out;
  }
  static void append_message(const ChatMessage& m, std::vector<std::int32_t>& out) {
    append_header(m.role, out);
    encode(m.content, out);
    out.push_back(kEndOfTurn);
  }
  static void append_header(std::string_view role, std::vector<std::int32_t>& out) {
    out.push_back(kStartHeader);
    encode(role, out);
    out.push_back(kEndHeader);
    encode("\n\n", out);
  }

  // The bytes of the byte tokens, special and unused ids dropped, made valid
  // UTF-8 (each invalid or truncated sequence becomes U+FFFD): a randomly
  // initialised model samples any byte, and JSON needs valid text.
  static std::string decode(const std::vector<std::int32_t>& tokens) {
    std::string bytes;
    for (std::int32_t t : tokens) {
      if (t >= 0 && t < 256) bytes.push_back(static_cast<char>(t));
    }
    return valid_utf8(bytes);
  }

  static std::string valid_utf8(std::string_view in) {
    std::string out;
    std::size_t i = 0;
    while (i < in.size()) {
      const auto b = static_cast<unsigned char>(in[i]);
      std::size_t len = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 0;
      bool ok = len > 0 && i + len <= in.size();
      for (std::size_t j = 1; ok && j < len; ++j) ok = (static_cast<unsigned char>(in[i + j]) & 0xC0) == 0x80;
      if (ok && len > 1) {  // no overlong forms, surrogates or code points past U+10FFFF
        std::uint32_t cp = b & (0x7F >> len);
        for (std::size_t j = 1; j < len; ++j) cp = (cp << 6) | (static_cast<unsigned char>(in[i + j]) & 0x3F);
        static constexpr std::uint32_t kMinimum[] = {0, 0, 0x80, 0x800, 0x10000};
        ok = cp >= kMinimum[len] && cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF);
      }
      if (ok) {
        out.append(in.substr(i, len));
        i += len;
      } else {
        out.append("\xEF\xBF\xBD");
        ++i;
      }
    }
    return out;
  }
};

}  // namespace tiny_llama
