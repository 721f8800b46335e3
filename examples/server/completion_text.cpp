// examples/server/completion_text.cpp: UTF-8 and stop strings over a token stream (completion_text.hpp).
#include "completion_text.hpp"

#include <algorithm>
#include <string_view>

#include "byte_tokenizer.hpp"

namespace clm_server {

namespace {

// The bytes a sequence starting with `lead` has, as ByteTokenizer::valid_utf8
// reads it (0: not a lead byte).
std::size_t sequence_length(unsigned char lead) {
  return lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : (lead >> 3) == 0x1E ? 4 : 0;
}

// Where the unfinished character at the end of `bytes` starts (bytes.size()
// when there is none). Every byte that is not a continuation byte starts a
// step of valid_utf8, so decoding up to that byte decides exactly what
// decoding everything would decide there.
std::size_t unfinished_start(std::string_view bytes) {
  for (std::size_t back = 1; back <= std::min<std::size_t>(4, bytes.size()); ++back) {
    const auto byte = static_cast<unsigned char>(bytes[bytes.size() - back]);
    if ((byte & 0xC0) == 0x80) continue;  // a continuation byte
    return sequence_length(byte) > back ? bytes.size() - back : bytes.size();
  }
  return bytes.size();
}

}  // namespace

CompletionText::CompletionText(std::vector<std::string> stop_strings, TokenBytes token_bytes)
    : stop_strings_(std::move(stop_strings)), token_bytes_(std::move(token_bytes)) {
  std::erase_if(stop_strings_, [](const std::string& s) { return s.empty(); });
}

std::string CompletionText::push(std::int32_t token) {
  if (stopped_) return {};
  if (token_bytes_) {
    const std::size_t before = bytes_.size();
    token_bytes_(token, bytes_);
    if (bytes_.size() == before) return {};
  } else {
    if (token < 0 || token > 255) return {};  // special tokens have no text
    bytes_.push_back(static_cast<char>(token));
  }
  const std::size_t whole = unfinished_start(bytes_);
  if (whole == 0) return {};
  const std::string text = tiny_llama::ByteTokenizer::valid_utf8(std::string_view(bytes_).substr(0, whole));
  bytes_.erase(0, whole);
  return release(text);
}

std::string CompletionText::finish() {
  if (stopped_) return {};
  std::string out = release(tiny_llama::ByteTokenizer::valid_utf8(bytes_));
  bytes_.clear();
  if (!stopped_) out += held_;
  held_.clear();
  return out;
}

std::string CompletionText::release(const std::string& text) {
  held_ += text;
  std::size_t first_stop = std::string::npos;
  for (const std::string& stop : stop_strings_) first_stop = std::min(first_stop, held_.find(stop));
  if (first_stop != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first_stop);
    held_.clear();
    bytes_.clear();
    return out;
  }
  // Hold the longest end of the text that a stop string begins with. (Stop
  // strings are valid UTF-8, so that end starts on a character boundary.)
  std::size_t keep = 0;
  for (const std::string& stop : stop_strings_) {
    for (std::size_t n = std::min(stop.size() - 1, held_.size()); n > keep; --n) {
      if (std::string_view(held_).ends_with(std::string_view(stop).substr(0, n))) {
        keep = n;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

}  // namespace clm_server
