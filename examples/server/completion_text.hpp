// examples/server/completion_text.hpp: the text a client sees of generated
// byte tokens, piece by piece as they come. A token may be one byte of a
// multi-byte UTF-8 character: bytes wait until they make whole characters, so
// every piece is valid UTF-8 (a JSON string). Text that may be the start of a
// stop string waits too; once a stop string appears, the answer ends where
// the earliest one then in the text starts.
//
//   clm_server::CompletionText text({"\n\n"});
//   std::string piece = text.push(0xE4);  // "" (the first byte of 你)
//   piece = text.push(0xBD);              // ""
//   piece = text.push(0xA0);              // "你"
//   ... if (text.stopped()) cancel the generation ...
//   piece = text.finish();                // what is still held, at the end
//
// The pieces and finish() concatenate to ByteTokenizer::decode of the tokens
// (special tokens dropped, invalid bytes as U+FFFD), cut before the stop
// string; with a TokenBytes (a real tokenizer's decode_bytes), the same over
// the bytes it gives, one token after another.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace clm_server {

class CompletionText {
 public:
  // A token's bytes, appended to `out` (none for a special token). Unset: the
  // byte tokenizer's (ids 0-255 are bytes, the rest special).
  using TokenBytes = std::function<void(std::int32_t token, std::string& out)>;
  explicit CompletionText(std::vector<std::string> stop_strings = {}, TokenBytes token_bytes = {});

  // Adds one generated token; returns the text it completes (often empty).
  std::string push(std::int32_t token);
  // The end of generation: the text still held (an unfinished character as U+FFFD).
  std::string finish();
  // Whether a stop string appeared: nothing after it is returned.
  bool stopped() const { return stopped_; }

 private:
  // Adds complete characters; returns what no stop string can still claim.
  std::string release(const std::string& text);

  std::vector<std::string> stop_strings_;
  TokenBytes token_bytes_;
  std::string bytes_;  // the start of an unfinished UTF-8 character
  std::string held_;   // whole characters that may begin a stop string
  bool stopped_ = false;
};

}  // namespace clm_server
