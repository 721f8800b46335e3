// examples/server/chat_api.cpp: request checks and response JSON (chat_api.hpp).
#include "chat_api.hpp"

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

std::optional<ApiError> read_messages(const Json& doc, std::vector<tiny_llama::ChatMessage>& out) {
  const Json* messages = field(doc, "messages");
  if (!messages) return missing("messages", "a non-empty array of {\"role\", \"content\"} objects");
  if (!messages->is_array()) return wrong_type("messages", "an array", *messages);
  if (messages->empty()) return bad("messages", "'messages' must hold at least one message", "invalid_value");
  out.clear();
  for (std::size_t i = 0; i < messages->size(); ++i) {
    const Json& message = (*messages)[i];
    const std::string at = fmt::format("messages[{}]", i);
    if (!message.is_object()) return wrong_type(at, "an object", message);
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

OrderedJson timings_json(const CompletionUsage& u) {
  return {{"queue_seconds", u.queue_seconds}, {"ttft_seconds", u.ttft_seconds}, {"total_seconds", u.total_seconds}};
}

OrderedJson header_json(const CompletionHeader& header, std::string_view object) {
  return {{"id", header.id}, {"object", object}, {"created", header.created}, {"model", header.model}};
}

}  // namespace

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
  out = ChatRequest{};
  if (const Json* model = field(doc, "model")) {
    if (!model->is_string()) return wrong_type("model", "a string", *model);
    out.model = model->get<std::string>();
  }
  if (auto error = read_messages(doc, out.messages)) return error;

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
  return dump(json);
}

std::string chunk_json(const CompletionHeader& header, const StreamChunk& chunk) {
  OrderedJson json = header_json(header, "chat.completion.chunk");
  if (chunk.usage) {
    json["choices"] = OrderedJson::array();
    json["usage"] = usage_json(*chunk.usage);
    json["timings"] = timings_json(*chunk.usage);
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
