// examples/server/chat_api.hpp: the JSON of clm_server's OpenAI-style
// POST /v1/chat/completions: reading and checking a request, and writing the
// answer, the stream's chunks and errors. No sockets here: server.cpp calls
// these, and test_chat_api.cpp checks them alone.
//
//   clm_server::ChatRequest request;
//   if (auto error = clm_server::parse_chat_request(body, limits, request)) return reply(*error);
//   const auto prompt = tiny_llama::ByteTokenizer::apply_chat_template(request.messages);
//   if (auto error = clm_server::check_prompt_length(prompt.size(), limits)) return reply(*error);
//   ... generate ...
//   std::string json = clm_server::completion_json(header, content, "stop", usage);
//
// A request (fields OpenAI documents, plus vLLM's ignore_eos; others are ignored):
//   {"model": "tiny-llama", "messages": [{"role": "user", "content": "Hi"}],
//    "max_tokens": 64, "temperature": 0, "seed": 7, "stream": true,
//    "stream_options": {"include_usage": true}, "stop": ["\n\n"], "ignore_eos": false}
// Roles are system, user and assistant; content is a string. Errors have
// OpenAI's shape: {"error": {"message", "type", "param", "code"}}.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "byte_tokenizer.hpp"

namespace clm_server {

struct ApiError {
  int http_status = 400;
  std::string message = {};
  std::string type = "invalid_request_error";
  std::string param = {};    // the offending field, e.g. "messages[1].role"; empty: null
  std::string code = {};     // e.g. "context_length_exceeded"; empty: null
  double retry_after_s = 0;  // > 0: the answer says Retry-After (429, 503)
};

// {"error": {"message", "type", "param", "code"}}
std::string error_json(const ApiError& error);

struct RequestLimits {
  std::int32_t context_tokens = 8192;  // prompt + answer
  std::int32_t default_max_tokens = 256;
};

// A message marked with cache_control: the prompt up to the end of that
// message is pinned for ttl_seconds (300 or 3600) after the answer.
struct CacheBreakpoint {
  std::size_t message = 0;
  std::int32_t ttl_seconds = 300;
};
inline constexpr std::size_t kMaxCacheBreakpoints = 4;

struct ChatRequest {
  std::string model = "tiny-llama";  // echoed, not used
  std::vector<tiny_llama::ChatMessage> messages;
  std::int32_t max_tokens = 0;  // max_completion_tokens, else max_tokens, else the default
  float temperature = 1.0f;     // OpenAI's default; 0 is greedy
  std::optional<std::uint64_t> seed;
  bool stream = false;
  bool include_usage = false;                               // stream_options.include_usage
  std::vector<std::string> stop;                            // up to 4 strings; the answer ends before the first one
  bool ignore_eos = false;                                  // generate past <|eot_id|> (vLLM's extension)
  float top_p = 1.0f;                                       // (0, 1]
  std::int32_t top_k = 0;                                   // vLLM's; 0 or -1: no cut
  float presence_penalty = 0.0f, frequency_penalty = 0.0f;  // [-2, 2]
  std::string user;                                         // OpenAI's end-user id: checked, echoed nowhere
  std::map<std::string, std::string> metadata;              // up to 16 string pairs: checked, kept nowhere
  std::string prompt_cache_key;                             // OpenAI's: names a conversation
  std::string prompt_cache_retention = "in_memory";         // "in_memory", or "24h": the prompt pinned a day
  std::vector<CacheBreakpoint> cache_breakpoints;           // messages with cache_control, in order
};

// Every top-level field parse_chat_request honours; any other is refused
// (400 naming it), so that no field a client relies on is silently ignored.
extern const std::vector<std::string_view> kHonouredChatFields;

// Parses and checks a request body; on error `out` is unspecified.
std::optional<ApiError> parse_chat_request(std::string_view body, const RequestLimits& limits, ChatRequest& out);

// A prompt must leave room for at least one answer token in the context.
std::optional<ApiError> check_prompt_length(std::size_t prompt_tokens, const RequestLimits& limits);

// What every response and chunk of one completion repeats.
struct CompletionHeader {
  std::string id;  // "chatcmpl-..."
  std::int64_t created = 0;
  std::string model;
  bool include_usage = false;  // stream chunks carry "usage": null until the usage chunk
};

// Token counts as the generator reports them: host_tokens are the part of
// cached_tokens copied in from the host tier, storage_tokens the part of
// those that the host tier had fetched from storage.
struct CompletionUsage {
  std::int32_t prompt_tokens = 0;
  std::int32_t completion_tokens = 0;
  std::int32_t cached_tokens = 0;
  std::int32_t host_tokens = 0;
  std::int32_t storage_tokens = 0;
  double queue_seconds = 0;
  double ttft_seconds = 0;
  double total_seconds = 0;
  // CLM in the loop (--clm-dir): what it did for the request; absent without it.
  struct Clm {
    std::int32_t hits_exact = 0, hits_ann = 0, hits_fallback = 0, misses = 0;
    std::int32_t injected_steps = 0;
    bool recorded = false;
    std::string key;  // its suffix's key in the snapshot store (empty: none)
  };
  std::optional<Clm> clm = std::nullopt;
};

// A chat.completion. Besides OpenAI's fields, usage.prompt_tokens_details
// has cached_tokens_by_source {device, host, storage} (they sum to
// cached_tokens, as clm_cached_tokens_total{source} counts them), and
// "timings" {queue_seconds, ttft_seconds, total_seconds}, and with CLM in
// the loop "clm" {hits_exact, hits_ann, hits_fallback, misses, injected_steps,
// recorded, key}.
std::string completion_json(const CompletionHeader& header, std::string_view content, std::string_view finish_reason,
                            const CompletionUsage& usage);

// One chat.completion.chunk: the first carries the role, then content
// pieces, then one with finish_reason; with a usage, the usage chunk
// (no choices; usage and timings as in completion_json).
struct StreamChunk {
  bool role = false;
  std::string_view content = {};
  std::string_view finish_reason = {};  // empty: null
  const CompletionUsage* usage = nullptr;
};
std::string chunk_json(const CompletionHeader& header, const StreamChunk& chunk);

// A server-sent event: "data: <json>\n\n"; the stream ends with kSseDone.
std::string sse_event(std::string_view json);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

}  // namespace clm_server
