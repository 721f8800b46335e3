// tests/fuzz/fuzz_chat_request.cpp: libFuzzer target for clm_server's chat
// request parser (examples/server/chat_api.hpp) on arbitrary bytes.
//
//   make build-fuzz && build-fuzz/tests/fuzz/fuzz_chat_request tests/fuzz/corpus/chat_request
//
// The input is the request body. A refusal is a 400 with a message and
// error_json of it is one JSON object {"error": {message, type, param,
// code}}; an accepted request has at least one message of a known role,
// max_tokens within the limits, a temperature in [0, 2], top_p in (0, 1],
// penalties in [-2, 2] and at most 4 non-empty stop strings.
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "chat_api.hpp"
#include "fuzz/fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  const clm_server::RequestLimits limits{.context_tokens = 512, .default_max_tokens = 16};
  clm_server::ChatRequest request;
  const std::optional<clm_server::ApiError> error = clm_server::parse_chat_request(body, limits, request);
  if (error) {
    FUZZ_CHECK(error->http_status == 400 && !error->message.empty(), "a refusal {} without a message",
               error->http_status);
    const nlohmann::json shape = nlohmann::json::parse(clm_server::error_json(*error), nullptr, false);
    FUZZ_CHECK(!shape.is_discarded() && shape.size() == 1 && shape.contains("error") && shape["error"].size() == 4,
               "error_json is not OpenAI's shape: {}", clm_server::error_json(*error));
    return 0;
  }
  FUZZ_CHECK(!request.messages.empty(), "an accepted request without messages");
  for (const auto& m : request.messages) {
    FUZZ_CHECK(m.role == "system" || m.role == "user" || m.role == "assistant", "role {}", m.role);
  }
  FUZZ_CHECK(request.max_tokens >= 1 && request.max_tokens < limits.context_tokens, "max_tokens {}",
             request.max_tokens);
  FUZZ_CHECK(request.temperature >= 0.0f && request.temperature <= 2.0f, "temperature {}", request.temperature);
  FUZZ_CHECK(request.top_p > 0.0f && request.top_p <= 1.0f, "top_p {}", request.top_p);
  FUZZ_CHECK(request.top_k >= 0, "top_k {}", request.top_k);
  FUZZ_CHECK(request.presence_penalty >= -2.0f && request.presence_penalty <= 2.0f, "presence_penalty");
  FUZZ_CHECK(request.frequency_penalty >= -2.0f && request.frequency_penalty <= 2.0f, "frequency_penalty");
  FUZZ_CHECK(request.stop.size() <= 4, "{} stop strings", request.stop.size());
  for (const auto& s : request.stop) FUZZ_CHECK(!s.empty(), "an empty stop string");
  FUZZ_CHECK(request.prompt_cache_retention == "in_memory" || request.prompt_cache_retention == "24h", "retention {}",
             request.prompt_cache_retention);
  FUZZ_CHECK(request.cache_breakpoints.size() <= clm_server::kMaxCacheBreakpoints, "{} breakpoints",
             request.cache_breakpoints.size());
  for (const auto& b : request.cache_breakpoints) {
    FUZZ_CHECK(b.message < request.messages.size() && (b.ttl_seconds == 300 || b.ttl_seconds == 3600),
               "breakpoint at message {} for {} s", b.message, b.ttl_seconds);
  }
  return 0;
}
