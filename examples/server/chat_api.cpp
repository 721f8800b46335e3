// examples/server/chat_api.cpp: request checks and response JSON (chat_api.hpp).
#include "chat_api.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace clm_server {

namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;  // responses keep OpenAI's field order

constexpr std::int64_t kMaxStopStrings = 4;  // as OpenAI

ApiError bad(std::string param, std::string message, std::string code) {
  return ApiError{
      .http_status = 400, .message = std::move(message), .param = std::move(param), .code = std::move(code)};
}

ApiError wrong_type(const std::string& param, std::string_view expected, const Json& value) {
  return bad(param, fmt::format("'{}' must be {}, got {}", param, expected, value.type_name()), "invalid_type");
}

ApiError unsupported(const std::string& param, std::string_view why) {
  return bad(param, fmt::format("'{}' is not supported by this server: {}", param, why), "unsupported_parameter");
}

ApiError missing(const std::string& param, std::string_view what) {
  return bad(param, fmt::format("'{}' is required: {}", param, what), "missing_required_parameter");
}

// The field `name` of `object`, or nullptr when it is absent or null (OpenAI
// treats an explicit null as "not given").
const Json* field(const Json& object, const char* name) {
  const auto it = object.find(name);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

std::optional<ApiError> read_integer(const Json& doc, const char* name, std::int64_t min, std::int64_t max,
                                     std::optional<std::int64_t>& out) {
  const Json* value = field(doc, name);
  if (!value) return std::nullopt;
  if (!value->is_number_integer()) return wrong_type(name, "an integer", *value);
  // JSON's non-negative integers are unsigned: one past int64 must not wrap.
  const bool in_range =
      value->is_number_unsigned()
          ? value->get<std::uint64_t>() <= static_cast<std::uint64_t>(max) && value->get<std::int64_t>() >= min
          : value->get<std::int64_t>() >= min && value->get<std::int64_t>() <= max;
  if (!in_range) {
    return bad(name, fmt::format("'{}' must be between {} and {}, got {}", name, min, max, value->dump()),
               "invalid_value");
  }
  out = value->get<std::int64_t>();
  return std::nullopt;
}

std::optional<ApiError> read_bool(const Json& object, const char* name, const std::string& param, bool& out) {
  const Json* value = field(object, name);
  if (!value) return std::nullopt;
  if (!value->is_boolean()) return wrong_type(param, "a boolean", *value);
  out = value->get<bool>();
  return std::nullopt;
}

// A message's cache_control: {"type": "ephemeral", "ttl": "5m" | "1h"}
// (Anthropic's breakpoint, as OpenAI-compatible gateways pass it on).
std::optional<ApiError> read_cache_control(const Json& value, const std::string& at, std::int32_t& ttl_seconds) {
  if (!value.is_object()) return wrong_type(at, "an object", value);
  ttl_seconds = 300;
  for (const auto& [key, v] : value.items()) {
    if (key == "type") {
      if (!v.is_string() || v.get_ref<const std::string&>() != "ephemeral") {
        return bad(at + ".type", fmt::format("'{}.type' must be \"ephemeral\"", at), "invalid_value");
      }
    } else if (key == "ttl") {
      const std::string ttl = v.is_string() ? v.get<std::string>() : std::string();
      if (ttl != "5m" && ttl != "1h") {
        return bad(at + ".ttl", fmt::format("'{}.ttl' must be \"5m\" or \"1h\" (at most 1h)", at), "invalid_value");
      }
      ttl_seconds = ttl == "1h" ? 3600 : 300;
    } else {
      return bad(at + "." + tiny_llama::ByteTokenizer::valid_utf8(key.substr(0, 64)),
                 fmt::format("'{}' takes only type and ttl", at), "unknown_parameter");
    }
  }
  if (!value.contains("type")) return missing(at + ".type", "\"ephemeral\"");
  return std::nullopt;
}

std::optional<ApiError> read_messages(const Json& doc, std::vector<tiny_llama::ChatMessage>& out,
                                      std::vector<CacheBreakpoint>& breakpoints) {
  const Json* messages = field(doc, "messages");
  if (!messages) return missing("messages", "a non-empty array of {\"role\", \"content\"} objects");
  if (!messages->is_array()) return wrong_type("messages", "an array", *messages);
  if (messages->empty()) return bad("messages", "'messages' must hold at least one message", "invalid_value");
  out.clear();
  breakpoints.clear();
  for (std::size_t i = 0; i < messages->size(); ++i) {
    const Json& message = (*messages)[i];
    const std::string at = fmt::format("messages[{}]", i);
    if (!message.is_object()) return wrong_type(at, "an object", message);
    for (const auto& [name, value] : message.items()) {
      if (name == "role" || name == "content") continue;
      const std::string shown = at + "." + tiny_llama::ByteTokenizer::valid_utf8(name.substr(0, 64));
      if (name == "cache_control") {
        if (value.is_null()) continue;
        CacheBreakpoint breakpoint{.message = i};
        if (auto error = read_cache_control(value, shown, breakpoint.ttl_seconds)) return error;
        if (breakpoints.size() == kMaxCacheBreakpoints) {
          return bad(shown, fmt::format("at most {} messages may carry cache_control", kMaxCacheBreakpoints),
                     "invalid_value");
        }
        breakpoints.push_back(breakpoint);
        continue;
      }
      return bad(shown, fmt::format("unrecognized message field: '{}'", shown), "unknown_parameter");
    }
    const Json* role = field(message, "role");
    if (!role) return missing(at + ".role", "one of system, user, assistant");
    if (!role->is_string()) return wrong_type(at + ".role", "a string", *role);
    const auto& name = role->get_ref<const std::string&>();
    if (name != "system" && name != "user" && name != "assistant") {
      return bad(at + ".role", fmt::format("'{}.role' must be one of system, user, assistant", at), "invalid_value");
    }
    const Json* content = field(message, "content");
    if (!content) return missing(at + ".content", "the message's text");
    if (!content->is_string()) return wrong_type(at + ".content", "a string", *content);
    out.push_back({name, content->get<std::string>()});
  }
  return std::nullopt;
}

std::optional<ApiError> read_stop(const Json& doc, std::vector<std::string>& out) {
  const Json* stop = field(doc, "stop");
  if (!stop) return std::nullopt;
  if (stop->is_string()) {
    if (stop->get_ref<const std::string&>().empty()) return bad("stop", "'stop' must not be empty", "invalid_value");
    out = {stop->get<std::string>()};
    return std::nullopt;
  }
  if (!stop->is_array()) return wrong_type("stop", "a string or an array of strings", *stop);
  if (static_cast<std::int64_t>(stop->size()) > kMaxStopStrings) {
    return bad("stop", fmt::format("'stop' holds at most {} strings", kMaxStopStrings), "invalid_value");
  }
  for (std::size_t i = 0; i < stop->size(); ++i) {
    const Json& s = (*stop)[i];
    const std::string at = fmt::format("stop[{}]", i);
    if (!s.is_string()) return wrong_type(at, "a string", s);
    if (s.get_ref<const std::string&>().empty())
      return bad(at, fmt::format("'{}' must not be empty", at), "invalid_value");
    out.push_back(s.get<std::string>());
  }
  return std::nullopt;
}

// A number in [min, max] into `out` (absent or null: left as is).
std::optional<ApiError> read_number(const Json& doc, const char* name, double min, double max, float& out) {
  const Json* value = field(doc, name);
  if (!value) return std::nullopt;
  if (!value->is_number()) return wrong_type(name, "a number", *value);
  const double v = value->get<double>();
  if (!(v >= min && v <= max)) {
    return bad(name, fmt::format("'{}' must be between {} and {}, got {}", name, min, max, value->dump()),
               "invalid_value");
  }
  out = static_cast<float>(v);
  return std::nullopt;
}

std::optional<ApiError> read_string(const Json& doc, const char* name, std::size_t max_bytes, std::string& out) {
  const Json* value = field(doc, name);
  if (!value) return std::nullopt;
  if (!value->is_string()) return wrong_type(name, "a string", *value);
  if (value->get_ref<const std::string&>().size() > max_bytes) {
    return bad(name, fmt::format("'{}' must be at most {} bytes", name, max_bytes), "invalid_value");
  }
  out = value->get<std::string>();
  return std::nullopt;
}

// Fields OpenAI (or vLLM) defines that this server cannot honour: refused
// when they ask for something, accepted when they ask for the default.
std::optional<ApiError> refuse_unsupported(const Json& doc) {
  for (const char* name : {"tools", "functions"}) {
    if (const Json* v = field(doc, name); v && !(v->is_array() && v->empty())) {
      return unsupported(name, "the model calls no tools");
    }
  }
  for (const char* name : {"tool_choice", "function_call"}) {
    if (const Json* v = field(doc, name); v && !(v->is_string() && v->get_ref<const std::string&>() == "none")) {
      return unsupported(name, "the model calls no tools");
    }
  }
  if (const Json* v = field(doc, "parallel_tool_calls"); v && !v->is_boolean()) {
    return wrong_type("parallel_tool_calls", "a boolean", *v);
  }
  if (const Json* v = field(doc, "logprobs"); v && !(v->is_boolean() && !v->get<bool>())) {
    return unsupported("logprobs", "no log probabilities are returned");
  }
  if (field(doc, "top_logprobs")) return unsupported("top_logprobs", "no log probabilities are returned");
  if (const Json* v = field(doc, "response_format")) {
    const bool text = v->is_object() && v->contains("type") && (*v)["type"] == "text" && v->size() == 1;
    if (!text) return unsupported("response_format", "only {\"type\": \"text\"}");
  }
  if (const Json* v = field(doc, "logit_bias"); v && !(v->is_object() && v->empty())) {
    return unsupported("logit_bias", "no logit biases");
  }
  for (const char* name : {"audio", "prediction", "web_search_options", "reasoning_effort", "modalities"}) {
    if (field(doc, name)) return unsupported(name, "text chat only");
  }
  if (const Json* v = field(doc, "store"); v && !(v->is_boolean() && !v->get<bool>())) {
    return unsupported("store", "completions are not stored");
  }
  if (const Json* v = field(doc, "service_tier");
      v && !(v->is_string() &&
             (v->get_ref<const std::string&>() == "auto" || v->get_ref<const std::string&>() == "default"))) {
    return unsupported("service_tier", "one tier: auto");
  }
  return std::nullopt;
}

std::string dump(const OrderedJson& json) {
  // Strings come from parsed JSON or from valid UTF-8; replace guards the rest.
  return json.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
}

OrderedJson usage_json(const CompletionUsage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details",
           {{"cached_tokens", u.cached_tokens},
            {"cached_tokens_by_source",
             {{"device", u.cached_tokens - u.host_tokens},
              {"host", u.host_tokens - u.storage_tokens},
              {"storage", u.storage_tokens}}}}}};
}

OrderedJson clm_json(const CompletionUsage::Clm& c) {
  return {{"hits_exact", c.hits_exact},
          {"hits_ann", c.hits_ann},
          {"hits_fallback", c.hits_fallback},
          {"misses", c.misses},
          {"injected_steps", c.injected_steps},
          {"recorded", c.recorded},
          {"key", c.key}};
}

OrderedJson timings_json(const CompletionUsage& u) {
  return {{"queue_seconds", u.queue_seconds}, {"ttft_seconds", u.ttft_seconds}, {"total_seconds", u.total_seconds}};
}

OrderedJson header_json(const CompletionHeader& header, std::string_view object) {
  return {{"id", header.id}, {"object", object}, {"created", header.created}, {"model", header.model}};
}

}  // namespace

const std::vector<std::string_view> kHonouredChatFields = {
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "n", "stop", "stream",
    "stream_options", "seed", "presence_penalty", "frequency_penalty", "user", "metadata", "prompt_cache_key",
    "prompt_cache_retention", "ignore_eos",
    // Accepted only when they ask for the default (refuse_unsupported).
    "tools", "functions", "tool_choice", "function_call", "parallel_tool_calls", "logprobs", "top_logprobs",
    "response_format", "logit_bias", "audio", "prediction", "web_search_options", "reasoning_effort", "modalities",
    "store", "service_tier"};

std::string error_json(const ApiError& error) {
  const auto null_if_empty = [](const std::string& s) { return s.empty() ? OrderedJson() : OrderedJson(s); };
  return dump({{"error",
                {{"message", error.message},
                 {"type", error.type},
                 {"param", null_if_empty(error.param)},
                 {"code", null_if_empty(error.code)}}}});
}

std::optional<ApiError> parse_chat_request(std::string_view body, const RequestLimits& limits, ChatRequest& out) {
  Json doc;
  try {
    doc = Json::parse(body);
  } catch (const Json::exception& e) {  // parse_error, or out_of_range for a number like 1e999
    std::string_view why = e.what();    // "[json.exception.parse_error.101] parse error at ..."
    if (const auto end = why.find("] "); end != std::string_view::npos) why.remove_prefix(end + 2);
    // The message quotes the bytes it choked on, which may be invalid UTF-8.
    return bad("", fmt::format("the body is not valid JSON: {}", tiny_llama::ByteTokenizer::valid_utf8(why)),
               "invalid_json");
  }
  if (!doc.is_object()) return wrong_type("body", "a JSON object", doc);
  for (const auto& [name, value] : doc.items()) {
    if (std::find(kHonouredChatFields.begin(), kHonouredChatFields.end(), name) == kHonouredChatFields.end()) {
      const std::string shown = tiny_llama::ByteTokenizer::valid_utf8(name.substr(0, 64));
      return bad(shown, fmt::format("unrecognized request argument supplied: '{}'", shown), "unknown_parameter");
    }
  }
  if (auto error = refuse_unsupported(doc)) return error;
  out = ChatRequest{};
  if (const Json* model = field(doc, "model")) {
    if (!model->is_string()) return wrong_type("model", "a string", *model);
    out.model = model->get<std::string>();
  }
  if (auto error = read_messages(doc, out.messages, out.cache_breakpoints)) return error;

  std::optional<std::int64_t> max_tokens, legacy_max_tokens, n;
  const std::int64_t most_tokens = std::max(1, limits.context_tokens - 1);
  if (auto error = read_integer(doc, "max_completion_tokens", 1, most_tokens, max_tokens)) return error;
  if (auto error = read_integer(doc, "max_tokens", 1, most_tokens, legacy_max_tokens)) return error;
  out.max_tokens =
      static_cast<std::int32_t>(max_tokens.value_or(legacy_max_tokens.value_or(limits.default_max_tokens)));
  if (auto error = read_integer(doc, "n", 1, 1, n)) return error;

  if (const Json* temperature = field(doc, "temperature")) {
    if (!temperature->is_number()) return wrong_type("temperature", "a number", *temperature);
    const double t = temperature->get<double>();
    if (!(t >= 0.0 && t <= 2.0)) {
      return bad("temperature", fmt::format("'temperature' must be between 0 and 2, got {}", temperature->dump()),
                 "invalid_value");
    }
    out.temperature = static_cast<float>(t);
  }
  if (const Json* s = field(doc, "seed")) {
    if (!s->is_number_integer()) return wrong_type("seed", "an integer", *s);
    out.seed = s->is_number_unsigned() ? s->get<std::uint64_t>() : static_cast<std::uint64_t>(s->get<std::int64_t>());
  }
  if (auto error = read_bool(doc, "stream", "stream", out.stream)) return error;
  if (const Json* options = field(doc, "stream_options")) {
    if (!options->is_object()) return wrong_type("stream_options", "an object", *options);
    if (auto error = read_bool(*options, "include_usage", "stream_options.include_usage", out.include_usage)) {
      return error;
    }
  }
  if (auto error = read_stop(doc, out.stop)) return error;
  if (auto error = read_bool(doc, "ignore_eos", "ignore_eos", out.ignore_eos)) return error;
  if (auto error = read_number(doc, "top_p", 0.0, 1.0, out.top_p)) return error;
  if (out.top_p <= 0.0f) return bad("top_p", "'top_p' must be greater than 0", "invalid_value");
  std::optional<std::int64_t> top_k;
  if (auto error = read_integer(doc, "top_k", -1, 1 << 20, top_k)) return error;
  out.top_k = top_k && *top_k > 0 ? static_cast<std::int32_t>(*top_k) : 0;
  if (auto error = read_number(doc, "presence_penalty", -2.0, 2.0, out.presence_penalty)) return error;
  if (auto error = read_number(doc, "frequency_penalty", -2.0, 2.0, out.frequency_penalty)) return error;
  if (auto error = read_string(doc, "user", 256, out.user)) return error;
  if (auto error = read_string(doc, "prompt_cache_key", 1024, out.prompt_cache_key)) return error;
  if (auto error = read_string(doc, "prompt_cache_retention", 32, out.prompt_cache_retention)) return error;
  if (out.prompt_cache_retention != "in_memory" && out.prompt_cache_retention != "24h") {
    return bad("prompt_cache_retention", "'prompt_cache_retention' must be \"in_memory\" or \"24h\"", "invalid_value");
  }
  if (const Json* metadata = field(doc, "metadata")) {
    if (!metadata->is_object()) return wrong_type("metadata", "an object of strings", *metadata);
    if (metadata->size() > 16) return bad("metadata", "'metadata' holds at most 16 pairs", "invalid_value");
    for (const auto& [key, value] : metadata->items()) {
      if (key.size() > 64 || !value.is_string() || value.get_ref<const std::string&>().size() > 512) {
        return bad("metadata", "'metadata' keys are at most 64 bytes and values strings of at most 512",
                   "invalid_value");
      }
      out.metadata.emplace(key, value.get<std::string>());
    }
  }
  return std::nullopt;
}

std::optional<ApiError> check_prompt_length(std::size_t prompt_tokens, const RequestLimits& limits) {
  if (prompt_tokens < static_cast<std::size_t>(limits.context_tokens)) return std::nullopt;
  return bad("messages",
             fmt::format("This model's maximum context length is {} tokens, but the messages take {} tokens; the "
                         "prompt and at least one answer token must fit. Shorten the messages.",
                         limits.context_tokens, prompt_tokens),
             "context_length_exceeded");
}

std::string completion_json(const CompletionHeader& header, std::string_view content, std::string_view finish_reason,
                            const CompletionUsage& usage) {
  OrderedJson json = header_json(header, "chat.completion");
  json["choices"] = OrderedJson::array({{{"index", 0},
                                         {"message", {{"role", "assistant"}, {"content", content}}},
                                         {"logprobs", nullptr},
                                         {"finish_reason", finish_reason}}});
  json["usage"] = usage_json(usage);
  json["timings"] = timings_json(usage);
  if (usage.clm) json["clm"] = clm_json(*usage.clm);
  return dump(json);
}

std::string chunk_json(const CompletionHeader& header, const StreamChunk& chunk) {
  OrderedJson json = header_json(header, "chat.completion.chunk");
  if (chunk.usage) {
    json["choices"] = OrderedJson::array();
    json["usage"] = usage_json(*chunk.usage);
    json["timings"] = timings_json(*chunk.usage);
    if (chunk.usage->clm) json["clm"] = clm_json(*chunk.usage->clm);
    return dump(json);
  }
  OrderedJson delta = OrderedJson::object();
  if (chunk.role) delta["role"] = "assistant";
  if (chunk.role || !chunk.content.empty()) delta["content"] = chunk.content;
  json["choices"] = OrderedJson::array(
      {{{"index", 0},
        {"delta", delta},
        {"logprobs", nullptr},
        {"finish_reason", chunk.finish_reason.empty() ? OrderedJson() : OrderedJson(chunk.finish_reason)}}});
  if (header.include_usage) json["usage"] = nullptr;
  return dump(json);
}

std::string sse_event(std::string_view json) { return fmt::format("data: {}\n\n", json); }

}  // namespace clm_server
