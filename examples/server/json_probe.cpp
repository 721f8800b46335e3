// examples/server/json_probe.cpp: the JSON reader of test_server.sh (jq is
// not among the project's packages, and the test must not need python).
//
//   json_probe get PATH... < doc.json   each value on a line: a string as is, anything else as JSON
//   json_probe json PATH < doc.json     the value as JSON text (a string quoted, ready to go into a request)
//   json_probe bytes PATH < doc.json    the length of a string value in UTF-8 bytes (byte tokens)
//   json_probe sse < stream.txt         checks a chat.completion.chunk stream, prints a summary object:
//       {"chunks": N, "role": "assistant", "content": "...", "finish_reason": "stop", "usage": {...} or null}
//
// PATH is keys and array indexes joined by dots: choices.0.message.content.
// Exit 1 with a message on stderr when the input is not JSON, a path is
// missing, or the stream breaks a rule (each event "data: <JSON>\n\n",
// chunks of one id, whole-character UTF-8 content, one finish_reason, then
// the usage chunk if any, then "data: [DONE]" last).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <iterator>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace {

using nlohmann::json;

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "json_probe: %s\n", message.c_str());
  std::exit(1);
}

json parse(std::string_view text, std::string_view what) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    die(std::string(what) + " is not JSON: " + e.what() + "\n" + std::string(text.substr(0, 400)));
  }
}

const json& at_path(const json& doc, const std::string& path) {
  const json* node = &doc;
  std::size_t begin = 0;
  while (begin <= path.size()) {
    const std::size_t end = std::min(path.find('.', begin), path.size());
    const std::string key = path.substr(begin, end - begin);
    if (node->is_array() && !key.empty() && key.find_first_not_of("0123456789") == std::string::npos &&
        std::stoul(key) < node->size()) {
      node = &(*node)[std::stoul(key)];
    } else if (node->is_object() && node->contains(key)) {
      node = &(*node)[key];
    } else {
      die("no " + path + " in " + doc.dump().substr(0, 400));
    }
    begin = end + 1;
  }
  return *node;
}

json summarize_stream(const std::string& text) {
  json summary = {{"chunks", 0}, {"role", nullptr}, {"content", ""}, {"finish_reason", nullptr}, {"usage", nullptr}};
  std::string id;
  bool finished = false, done = false;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t end = text.find("\n\n", at);
    if (end == std::string::npos) die("an event does not end with a blank line: " + text.substr(at, 200));
    const std::string_view event = std::string_view(text).substr(at, end - at);
    at = end + 2;
    if (done) die("events after [DONE]");
    if (!event.starts_with("data: ")) die("an event is not 'data: ...': " + std::string(event.substr(0, 200)));
    const std::string_view data = event.substr(6);
    if (data == "[DONE]") {
      done = true;
      continue;
    }
    const json chunk = parse(data, "a chunk");
    if (chunk.contains("error")) die("the stream reports an error: " + chunk.dump());
    if (chunk.value("object", "") != "chat.completion.chunk") die("not a chat.completion.chunk: " + chunk.dump());
    if (id.empty()) id = chunk.at("id").get<std::string>();
    if (chunk.at("id") != id) die("chunks of two ids: " + id + " and " + chunk.at("id").dump());
    summary["chunks"] = summary["chunks"].get<int>() + 1;
    if (chunk.at("choices").empty()) {  // the usage chunk
      if (!finished) die("a usage chunk before the finish_reason");
      summary["usage"] = chunk.at("usage");
      continue;
    }
    if (finished) die("a chunk after the one with finish_reason: " + chunk.dump());
    const json& choice = chunk.at("choices").at(0);
    const json& delta = choice.at("delta");
    if (delta.contains("role")) {
      if (summary["chunks"] != 1) die("the role comes in a chunk other than the first");
      summary["role"] = delta["role"];
    }
    if (delta.contains("content"))
      summary["content"] = summary["content"].get<std::string>() + delta["content"].get<std::string>();
    if (!choice.at("finish_reason").is_null()) {
      finished = true;
      summary["finish_reason"] = choice["finish_reason"];
    }
  }
  if (!done) die("the stream does not end with data: [DONE]");
  if (!finished) die("no chunk has a finish_reason");
  return summary;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const std::string input{std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
  if (mode == "sse" && argc == 2) {
    std::printf("%s\n", summarize_stream(input).dump().c_str());
    return 0;
  }
  if ((mode != "get" || argc < 3) && ((mode != "json" && mode != "bytes") || argc != 3)) {
    die("usage: json_probe get PATH... | json_probe json PATH | json_probe bytes PATH | json_probe sse (input on "
        "stdin)");
  }
  const json doc = parse(input, "the input");
  for (int i = 2; i < argc; ++i) {
    const json& value = at_path(doc, argv[i]);
    if (mode == "bytes") {
      if (!value.is_string()) die(std::string(argv[i]) + " is not a string");
      std::printf("%zu\n", value.get_ref<const std::string&>().size());
    } else {
      std::printf("%s\n", mode == "get" && value.is_string() ? value.get<std::string>().c_str() : value.dump().c_str());
    }
  }
  return 0;
}
