// examples/server/test_chat_api.cpp: clm_server's JSON without sockets: the
// requests it reads (fields, defaults) and the ones it refuses (each with
// OpenAI's error shape, the field named), the responses and stream chunks it
// writes (parsed back), and CompletionText against ByteTokenizer::decode and
// a plain search for the stop strings, over random byte streams.
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "byte_tokenizer.hpp"
#include "chat_api.hpp"
#include "completion_text.hpp"
#include "test_support.hpp"  // fresh_seed

namespace {

using clm_server::ApiError;
using clm_server::ChatRequest;
using clm_server::CompletionText;
using clm_server::RequestLimits;
using nlohmann::json;
using tiny_llama::ByteTokenizer;

constexpr RequestLimits kLimits{.context_tokens = 1024, .default_max_tokens = 32};

std::optional<ApiError> parse(const std::string& body, ChatRequest& out) {
  return clm_server::parse_chat_request(body, kLimits, out);
}

bool is_valid_utf8(const std::string& s) { return ByteTokenizer::valid_utf8(s) == s; }

}  // namespace

TEST_CASE("a chat request is read with every field") {
  ChatRequest r;
  const auto error = parse(R"({"model": "m-1", "messages": [{"role": "system", "content": "Be brief."},
      {"role": "user", "content": "你好 \"there\""}, {"role": "assistant", "content": ""}],
      "max_tokens": 10, "temperature": 0.5, "seed": 42, "stream": true,
      "stream_options": {"include_usage": true}, "stop": ["\n\n", "END"], "ignore_eos": true,
      "top_p": 0.9, "user": "someone", "top_k": 40, "presence_penalty": -0.5, "frequency_penalty": 1.5,
      "metadata": {"ticket": "T-1"}, "prompt_cache_key": "conv-7", "prompt_cache_retention": "in_memory",
      "n": 1, "logprobs": false, "response_format": {"type": "text"}, "tools": [], "tool_choice": "none",
      "logit_bias": {}, "store": false, "service_tier": "auto"})",
                           r);
  REQUIRE_FALSE(error);
  CHECK(r.model == "m-1");
  REQUIRE(r.messages.size() == 3);
  CHECK(r.messages[0].role == "system");
  CHECK(r.messages[0].content == "Be brief.");
  CHECK(r.messages[1].role == "user");
  CHECK(r.messages[1].content == "你好 \"there\"");
  CHECK(r.messages[2].content.empty());
  CHECK(r.max_tokens == 10);
  CHECK(r.temperature == 0.5f);
  CHECK(r.seed == 42u);
  CHECK(r.stream);
  CHECK(r.include_usage);
  CHECK(r.stop == std::vector<std::string>{"\n\n", "END"});
  CHECK(r.ignore_eos);
  CHECK(r.top_p == 0.9f);
  CHECK(r.top_k == 40);
  CHECK(r.presence_penalty == -0.5f);
  CHECK(r.frequency_penalty == 1.5f);
  CHECK(r.user == "someone");
  CHECK(r.metadata == std::map<std::string, std::string>{{"ticket", "T-1"}});
  CHECK(r.prompt_cache_key == "conv-7");
  CHECK(r.prompt_cache_retention == "in_memory");
  CHECK(r.cache_breakpoints.empty());
}

TEST_CASE("retention: 24h and cache_control breakpoints are read") {
  ChatRequest r;
  REQUIRE_FALSE(parse(R"({"messages": [{"role": "system", "content": "S", "cache_control": {"type": "ephemeral"}},
      {"role": "user", "content": "U", "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
      "prompt_cache_retention": "24h"})",
                      r));
  CHECK(r.prompt_cache_retention == "24h");
  REQUIRE(r.cache_breakpoints.size() == 2);
  CHECK(r.cache_breakpoints[0].message == 0);
  CHECK(r.cache_breakpoints[0].ttl_seconds == 300);
  CHECK(r.cache_breakpoints[1].message == 1);
  CHECK(r.cache_breakpoints[1].ttl_seconds == 3600);
  std::string five = R"({"messages": [)";
  for (int i = 0; i < 5; ++i) {
    five += std::string(i ? "," : "") + R"({"role": "user", "content": "x", "cache_control": {"type": "ephemeral"}})";
  }
  const auto error = parse(five + "]}", r);
  REQUIRE(error);
  CHECK(error->param == "messages[4].cache_control");
}

TEST_CASE("a minimal chat request gets the defaults") {
  ChatRequest r;
  REQUIRE_FALSE(parse(R"({"messages": [{"role": "user", "content": "Hi"}]})", r));
  CHECK(r.model == "tiny-llama");
  CHECK(r.max_tokens == kLimits.default_max_tokens);
  CHECK(r.temperature == 1.0f);
  CHECK_FALSE(r.seed);
  CHECK_FALSE(r.stream);
  CHECK_FALSE(r.include_usage);
  CHECK(r.stop.empty());
  CHECK_FALSE(r.ignore_eos);

  SECTION("null means not given") {
    REQUIRE_FALSE(parse(R"({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": null,
        "temperature": null, "seed": null, "stop": null, "stream": null})",
                        r));
    CHECK(r.max_tokens == kLimits.default_max_tokens);
    CHECK(r.temperature == 1.0f);
  }
  SECTION("max_completion_tokens wins over max_tokens") {
    REQUIRE_FALSE(parse(R"({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5,
        "max_completion_tokens": 7})",
                        r));
    CHECK(r.max_tokens == 7);
  }
  SECTION("one stop string, a negative seed, the largest max_tokens") {
    REQUIRE_FALSE(parse(R"({"messages": [{"role": "user", "content": "Hi"}], "stop": "x", "seed": -1,
        "max_tokens": 1023})",
                        r));
    CHECK(r.stop == std::vector<std::string>{"x"});
    CHECK(r.seed == ~std::uint64_t{0});
    CHECK(r.max_tokens == 1023);
  }
}

TEST_CASE("bad chat requests are refused with a 400 that names the field") {
  struct Case {
    std::string body, param, code, says;
  };
  const std::string user = R"("messages": [{"role": "user", "content": "Hi"}])";
  const std::vector<Case> cases = {
      {R"({"messages": [)", "", "invalid_json", "not valid JSON"},
      {"", "", "invalid_json", "not valid JSON"},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\"}]}", "", "invalid_json", "not valid JSON"},
      {"[1, 2]", "body", "invalid_type", "must be a JSON object"},
      {"{}", "messages", "missing_required_parameter", "'messages' is required"},
      {R"({"messages": "Hi"})", "messages", "invalid_type", "must be an array, got string"},
      {R"({"messages": []})", "messages", "invalid_value", "at least one message"},
      {R"({"messages": [7]})", "messages[0]", "invalid_type", "must be an object, got number"},
      {R"({"messages": [{"content": "Hi"}]})", "messages[0].role", "missing_required_parameter", "is required"},
      {R"({"messages": [{"role": "user", "content": "a"}, {"role": "robot", "content": "Hi"}]})", "messages[1].role",
       "invalid_value", "system, user, assistant"},
      {R"({"messages": [{"role": 1, "content": "Hi"}]})", "messages[0].role", "invalid_type", "a string"},
      {R"({"messages": [{"role": "user"}]})", "messages[0].content", "missing_required_parameter", "is required"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content", "invalid_type",
       "must be a string, got number"},
      {R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]})", "messages[0].content",
       "invalid_type", "got array"},
      {"{" + user + R"(, "max_tokens": 0})", "max_tokens", "invalid_value", "between 1 and 1023, got 0"},
      {"{" + user + R"(, "max_tokens": -3})", "max_tokens", "invalid_value", "between 1 and 1023"},
      {"{" + user + R"(, "max_tokens": 1024})", "max_tokens", "invalid_value", "between 1 and 1023, got 1024"},
      {"{" + user + R"(, "max_tokens": 18446744073709551615})", "max_tokens", "invalid_value", "between 1 and 1023"},
      {"{" + user + R"(, "max_tokens": 2.5})", "max_tokens", "invalid_type", "an integer"},
      {"{" + user + R"(, "max_tokens": "10"})", "max_tokens", "invalid_type", "an integer, got string"},
      {"{" + user + R"(, "max_completion_tokens": 0})", "max_completion_tokens", "invalid_value", "between 1"},
      {"{" + user + R"(, "n": 2})", "n", "invalid_value", "between 1 and 1"},
      {"{" + user + R"(, "temperature": -0.1})", "temperature", "invalid_value", "between 0 and 2"},
      {"{" + user + R"(, "temperature": 2.5})", "temperature", "invalid_value", "between 0 and 2"},
      {"{" + user + R"(, "temperature": 1e999})", "", "invalid_json", "number overflow"},
      {"{" + user + R"(, "temperature": "hot"})", "temperature", "invalid_type", "a number, got string"},
      {"{" + user + R"(, "seed": 1.5})", "seed", "invalid_type", "an integer"},
      {"{" + user + R"(, "stream": "yes"})", "stream", "invalid_type", "a boolean, got string"},
      {"{" + user + R"(, "stream_options": true})", "stream_options", "invalid_type", "an object"},
      {"{" + user + R"(, "stream_options": {"include_usage": 1}})", "stream_options.include_usage", "invalid_type",
       "a boolean"},
      {"{" + user + R"(, "stop": ""})", "stop", "invalid_value", "must not be empty"},
      {"{" + user + R"(, "stop": ["a", 3]})", "stop[1]", "invalid_type", "a string, got number"},
      {"{" + user + R"(, "stop": ["a", "b", "c", "d", "e"]})", "stop", "invalid_value", "at most 4"},
      {"{" + user + R"(, "stop": 3})", "stop", "invalid_type", "a string or an array"},
      {"{" + user + R"(, "ignore_eos": "no"})", "ignore_eos", "invalid_type", "a boolean"},
      {"{" + user + R"(, "model": 3})", "model", "invalid_type", "a string"},
      // Nothing is ignored: an unknown field, or one asking for what this server cannot do, is refused.
      {"{" + user + R"(, "temprature": 0.5})", "temprature", "unknown_parameter", "unrecognized request argument"},
      {"{" + user + R"(, "tools": [{"type": "function"}]})", "tools", "unsupported_parameter", "no tools"},
      {"{" + user + R"(, "tool_choice": "auto"})", "tool_choice", "unsupported_parameter", "no tools"},
      {"{" + user + R"(, "logprobs": true})", "logprobs", "unsupported_parameter", "log probabilities"},
      {"{" + user + R"(, "top_logprobs": 2})", "top_logprobs", "unsupported_parameter", "log probabilities"},
      {"{" + user + R"(, "response_format": {"type": "json_object"}})", "response_format", "unsupported_parameter",
       "only"},
      {"{" + user + R"(, "logit_bias": {"5": 10}})", "logit_bias", "unsupported_parameter", "no logit biases"},
      {"{" + user + R"(, "audio": {}})", "audio", "unsupported_parameter", "text chat only"},
      {"{" + user + R"(, "store": true})", "store", "unsupported_parameter", "not stored"},
      {"{" + user + R"(, "prompt_cache_retention": "forever"})", "prompt_cache_retention", "invalid_value",
       "in_memory"},
      {R"({"messages": [{"role": "user", "content": "Hi", "cache_control": {"type": "ephemeral", "ttl": "2h"}}]})",
       "messages[0].cache_control.ttl", "invalid_value", "at most 1h"},
      {R"({"messages": [{"role": "user", "content": "Hi", "cache_control": {"type": "persistent"}}]})",
       "messages[0].cache_control.type", "invalid_value", "ephemeral"},
      {R"({"messages": [{"role": "user", "content": "Hi", "cache_control": {"ttl": "5m"}}]})",
       "messages[0].cache_control.type", "missing_required_parameter", "is required"},
      {R"({"messages": [{"role": "user", "content": "Hi", "cache_control": "yes"}]})", "messages[0].cache_control",
       "invalid_type", "an object"},
      {R"({"messages": [{"role": "user", "content": "Hi", "nom": "x"}]})", "messages[0].nom", "unknown_parameter",
       "unrecognized message field"},
      {"{" + user + R"(, "top_p": 0})", "top_p", "invalid_value", "greater than 0"},
      {"{" + user + R"(, "top_p": 1.5})", "top_p", "invalid_value", "between 0 and 1"},
      {"{" + user + R"(, "top_k": -2})", "top_k", "invalid_value", "between -1"},
      {"{" + user + R"(, "presence_penalty": 3})", "presence_penalty", "invalid_value", "between -2 and 2"},
      {"{" + user + R"(, "frequency_penalty": "x"})", "frequency_penalty", "invalid_type", "a number"},
      {"{" + user + R"(, "user": 5})", "user", "invalid_type", "a string"},
      {"{" + user + R"(, "metadata": {"k": 1}})", "metadata", "invalid_value", "strings"},
      {"{" + user + R"(, "prompt_cache_key": []})", "prompt_cache_key", "invalid_type", "a string"},
  };
  for (const Case& c : cases) {
    INFO(c.body);
    ChatRequest r;
    const std::optional<ApiError> error = parse(c.body, r);
    REQUIRE(error);
    CHECK(error->http_status == 400);
    CHECK(error->type == "invalid_request_error");
    CHECK(error->param == c.param);
    CHECK(error->code == c.code);
    CHECK_THAT(error->message, Catch::Contains(c.says));
    const json shape = json::parse(clm_server::error_json(*error));
    CHECK(shape.size() == 1);
    CHECK(shape.at("error").size() == 4);
    CHECK(shape["error"]["message"] == error->message);
    CHECK(shape["error"]["type"] == "invalid_request_error");
    CHECK(shape["error"]["param"] == (c.param.empty() ? json() : json(c.param)));
    CHECK(shape["error"]["code"] == c.code);
  }
}

TEST_CASE("a deeply nested body is refused, not a crash") {
  ChatRequest r;
  const std::string deep = "{\"messages\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  const auto error = parse(deep, r);
  REQUIRE(error);
  CHECK(error->param == "messages[0]");
}

TEST_CASE("a prompt must leave room for one answer token") {
  CHECK_FALSE(clm_server::check_prompt_length(1023, kLimits));
  const auto error = clm_server::check_prompt_length(1024, kLimits);
  REQUIRE(error);
  CHECK(error->http_status == 400);
  CHECK(error->param == "messages");
  CHECK(error->code == "context_length_exceeded");
  CHECK_THAT(error->message, Catch::Contains("maximum context length is 1024 tokens") &&
                                 Catch::Contains("the messages take 1024 tokens"));
  CHECK(clm_server::check_prompt_length(5000, kLimits));
}

TEST_CASE("a chat.completion has OpenAI's fields, and where its cached tokens came from") {
  const clm_server::CompletionHeader header{.id = "chatcmpl-1", .created = 1700000000, .model = "m"};
  const clm_server::CompletionUsage usage{.prompt_tokens = 100,
                                          .completion_tokens = 20,
                                          .cached_tokens = 64,
                                          .host_tokens = 16,
                                          .storage_tokens = 4,
                                          .queue_seconds = 0.25,
                                          .ttft_seconds = 0.5,
                                          .total_seconds = 2.0};
  const json j = json::parse(clm_server::completion_json(header, "你好\n\"x\"", "length", usage));
  CHECK(j["id"] == "chatcmpl-1");
  CHECK(j["object"] == "chat.completion");
  CHECK(j["created"] == 1700000000);
  CHECK(j["model"] == "m");
  REQUIRE(j["choices"].size() == 1);
  CHECK(j["choices"][0]["index"] == 0);
  CHECK(j["choices"][0]["message"] == json{{"role", "assistant"}, {"content", "你好\n\"x\""}});
  CHECK(j["choices"][0]["finish_reason"] == "length");
  CHECK(j["usage"]["prompt_tokens"] == 100);
  CHECK(j["usage"]["completion_tokens"] == 20);
  CHECK(j["usage"]["total_tokens"] == 120);
  CHECK(j["usage"]["prompt_tokens_details"]["cached_tokens"] == 64);
  CHECK(j["usage"]["prompt_tokens_details"]["cached_tokens_by_source"] ==
        json{{"device", 48}, {"host", 12}, {"storage", 4}});
  CHECK(j["timings"] == json{{"queue_seconds", 0.25}, {"ttft_seconds", 0.5}, {"total_seconds", 2.0}});
}

TEST_CASE("stream chunks: role, content, finish, usage") {
  clm_server::CompletionHeader header{.id = "chatcmpl-2", .created = 7, .model = "m", .include_usage = false};
  const auto chunk = [&](const clm_server::StreamChunk& c) { return json::parse(clm_server::chunk_json(header, c)); };

  json first = chunk({.role = true});
  CHECK(first["id"] == "chatcmpl-2");
  CHECK(first["object"] == "chat.completion.chunk");
  CHECK(first["created"] == 7);
  CHECK(first["choices"][0]["delta"] == json{{"role", "assistant"}, {"content", ""}});
  CHECK(first["choices"][0]["finish_reason"].is_null());
  CHECK_FALSE(first.contains("usage"));

  json piece = chunk({.content = "é"});
  CHECK(piece["choices"][0]["delta"] == json{{"content", "é"}});
  CHECK(piece["choices"][0]["index"] == 0);

  json last = chunk({.finish_reason = "stop"});
  CHECK(last["choices"][0]["delta"] == json::object());
  CHECK(last["choices"][0]["finish_reason"] == "stop");

  header.include_usage = true;
  CHECK(chunk({.content = "a"})["usage"].is_null());
  const clm_server::CompletionUsage usage{.prompt_tokens = 3, .completion_tokens = 2, .cached_tokens = 0};
  json with_usage = chunk({.usage = &usage});
  CHECK(with_usage["choices"] == json::array());
  CHECK(with_usage["usage"]["total_tokens"] == 5);
  CHECK(with_usage["timings"].contains("ttft_seconds"));

  CHECK(clm_server::sse_event("{}") == "data: {}\n\n");
  CHECK(clm_server::kSseDone == "data: [DONE]\n\n");
}

TEST_CASE("CompletionText gives whole characters that add up to ByteTokenizer::decode") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  // Characters of 1 to 4 bytes, stray continuation and invalid bytes, special tokens.
  const std::vector<std::string> alphabet = {"a", "\n", "é", "你", "🙂", "\x80", "\xff", "\xe4\xbd"};
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<std::int32_t> tokens;
    const int length = std::uniform_int_distribution<int>(0, 40)(rng);
    for (int i = 0; i < length; ++i) {
      if (rng() % 10 == 0) {
        tokens.push_back(ByteTokenizer::kEndOfTurn + static_cast<std::int32_t>(rng() % 30));
        continue;
      }
      for (unsigned char byte : alphabet[rng() % alphabet.size()]) tokens.push_back(byte);
    }
    CompletionText text;
    std::string joined;
    for (std::int32_t t : tokens) {
      const std::string piece = text.push(t);
      CHECK(is_valid_utf8(piece));
      joined += piece;
    }
    const std::string rest = text.finish();
    CHECK(is_valid_utf8(rest));
    joined += rest;
    CHECK(joined == ByteTokenizer::decode(tokens));
    CHECK_FALSE(text.stopped());
  }
}

TEST_CASE("CompletionText sends each character as soon as it is whole") {
  CompletionText text;
  const std::string ni = "你";
  CHECK(text.push(static_cast<unsigned char>(ni[0])).empty());
  CHECK(text.push(static_cast<unsigned char>(ni[1])).empty());
  CHECK(text.push(static_cast<unsigned char>(ni[2])) == ni);
  CHECK(text.push('a') == "a");
  CHECK(text.push(0xE4).empty());
  CHECK(text.finish() == "\xEF\xBF\xBD");  // an unfinished character at the end
}

TEST_CASE("CompletionText ends the answer before the first stop string") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const std::vector<std::string> alphabet = {"a", "b", "\n", "你"};
  const auto random_text = [&](int min, int max) {
    std::string s;
    for (int n = std::uniform_int_distribution<int>(min, max)(rng); n > 0; --n) s += alphabet[rng() % alphabet.size()];
    return s;
  };
  for (int trial = 0; trial < 500; ++trial) {
    const std::string full = random_text(0, 30);
    std::vector<std::string> stops;
    for (int n = std::uniform_int_distribution<int>(1, 4)(rng); n > 0; --n) stops.push_back(random_text(1, 4));
    // Generation stops when a stop string first appears as the text grows;
    // the answer is cut where the earliest stop string then in it starts.
    std::size_t cut = std::string::npos;
    for (std::size_t end = 1; end <= full.size() && cut == std::string::npos; ++end) {
      for (const std::string& s : stops) cut = std::min(cut, full.substr(0, end).find(s));
    }
    const std::string expected = full.substr(0, cut);
    INFO("text '" << full << "' stops '" << fmt::format("{}", fmt::join(stops, "' '")) << "'");

    CompletionText text(stops);
    std::string joined;
    for (unsigned char byte : full) {
      const std::string piece = text.push(byte);
      CHECK(is_valid_utf8(piece));
      joined += piece;
      // Nothing after the stop string, and no part of it, is ever sent.
      CHECK(expected.starts_with(joined));
    }
    joined += text.finish();
    CHECK(joined == expected);
    CHECK(text.stopped() == (cut != std::string::npos));
  }
}

TEST_CASE("CompletionText holds a possible stop string back, then lets it go") {
  CompletionText text({"STOP"});
  CHECK(text.push('S').empty());
  CHECK(text.push('T').empty());
  CHECK(text.push('x') == "STx");
  CHECK(text.push('S').empty());
  CHECK(text.finish() == "S");
  CHECK_FALSE(text.stopped());

  CompletionText stopping({"\n\n"});
  CHECK(stopping.push('a') == "a");
  CHECK(stopping.push('\n').empty());
  CHECK(stopping.push('\n').empty());
  CHECK(stopping.stopped());
  CHECK(stopping.push('b').empty());
  CHECK(stopping.finish().empty());
}
