// examples/replay/workload.cpp: gsp generation, the JSONL and Mooncake
// readers (one JSON object per line, parsed by nlohmann-json), and the JSONL
// writer.
#include "workload.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <unordered_map>
#include <utility>

#include <sys/stat.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace clm::replay {
namespace {

constexpr std::int64_t kMaxTokenId = std::numeric_limits<std::int32_t>::max();

// ---- one JSON object per line, parsed by nlohmann-json -----------------------
// nlohmann-json (Debian nlohmann-json3-dev) parses each line; on top of it the
// two formats ask for what it does not check: a duplicate key is an error (it
// would keep the last one silently), nesting stays shallow, and integers are
// integers in range (it reads 2.5, 2e3 and 10^20 as floats).
using Json = nlohmann::json;

constexpr int kMaxNesting = 64;

// What went wrong on a line; column 0 when the error is about the whole object.
struct LineError {
  std::size_t column = 0;
  std::string message;
};

// Parses `line` as one JSON object into `out`.
bool parse_object_line(std::string_view line, Json& out, LineError& error) {
  std::vector<std::vector<std::string>> keys;  // of each object open at this point
  std::string problem;
  const Json::parser_callback_t check = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (!problem.empty()) return false;
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        if (depth >= kMaxNesting) problem = "values nested too deeply";
        if (event == Json::parse_event_t::object_start) keys.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case Json::parse_event_t::key: {
        std::vector<std::string>& seen = keys.back();  // few keys an object: a scan beats a hash set
        std::string key = parsed.get<std::string>();
        if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
          problem = fmt::format("duplicate key \"{}\"", key);
        } else {
          seen.push_back(std::move(key));
        }
        break;
      }
      default:
        break;
    }
    return problem.empty();
  };
  try {
    out = Json::parse(line.begin(), line.end(), check);
  } catch (const Json::parse_error& e) {
    error.column = e.byte;
    // what(): "[json.exception.parse_error.101] parse error at line 1, column 2: <message>"
    const std::string_view what = e.what();
    const std::size_t colon = what.find(": ", what.find("column"));
    error.message = std::string(colon == std::string_view::npos ? what : what.substr(colon + 2));
    return false;
  }
  if (!problem.empty()) {
    error.message = std::move(problem);
    return false;
  }
  if (!out.is_object()) {
    error.column = 1;
    error.message = "expected a JSON object";
    return false;
  }
  return true;
}

// `value` as an integer in [min_value, max_value].
bool integer_in(const Json& value, std::int64_t min_value, std::int64_t max_value, std::string_view what,
                std::int64_t& out, LineError& error) {
  if (!value.is_number_integer()) {
    error.message = value.is_number() ? fmt::format("{} must be an integer (found {})", what, value.dump())
                                      : fmt::format("expected an integer for {}, found {}", what, value.type_name());
    return false;
  }
  // An unsigned value past int64 is past every range asked for.
  const bool huge = value.is_number_unsigned() &&
                    value.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  const std::int64_t v = huge ? 0 : value.get<std::int64_t>();
  if (huge || v < min_value || v > max_value) {
    error.message = fmt::format("{} {} is outside [{}, {}]", what, value.dump(), min_value, max_value);
    return false;
  }
  out = v;
  return true;
}

// Appends the elements of an integer array in [0, max_value] to `out`.
bool int32_array(const Json& value, std::int64_t max_value, std::string_view key, std::string_view what,
                 std::vector<std::int32_t>& out, LineError& error) {
  if (!value.is_array()) {
    error.message = fmt::format("\"{}\" must be an array of integers, found {}", key, value.type_name());
    return false;
  }
  // No reserve: `out` may grow over many lines, and an exact reserve would copy it every time.
  for (const Json& element : value) {
    std::int64_t v = 0;
    if (!integer_in(element, 0, max_value, what, v, error)) return false;
    out.push_back(static_cast<std::int32_t>(v));
  }
  return true;
}

// Calls parse_line(object, error) for every non-blank line; prefixes errors
// with "source:line:" and, for syntax errors, the column.
template <class ParseLine>
Status for_each_json_line(std::string_view text, std::string_view source, ParseLine&& parse_line) {
  std::size_t line_number = 0;
  std::size_t start = 0;
  Json object;
  while (start < text.size()) {
    const std::size_t newline = text.find('\n', start);
    const std::size_t end = newline == std::string_view::npos ? text.size() : newline;
    const std::string_view line = text.substr(start, end - start);
    start = end + 1;
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;  // blank line
    LineError error;
    if (!parse_object_line(line, object, error) || !parse_line(object, error)) {
      return invalid_argument(error.column > 0
                                  ? fmt::format("{}:{}:{}: {}", source, line_number, error.column, error.message)
                                  : fmt::format("{}:{}: {}", source, line_number, error.message));
    }
  }
  return {};
}

std::uint64_t uniform_below(std::mt19937_64& rng, std::uint64_t bound) {
  // Draws below 2^64 mod bound would make small results likelier: redraw them.
  const std::uint64_t threshold = (std::uint64_t{0} - bound) % bound;
  for (;;) {
    const std::uint64_t x = rng();
    if (x >= threshold) return x % bound;
  }
}

class SaltIndex {
 public:
  explicit SaltIndex(std::vector<std::string>& salts) : salts_(salts) {
    for (std::size_t i = 0; i < salts_.size(); ++i) index_.emplace(salts_[i], static_cast<std::int32_t>(i));
  }
  std::int32_t intern(const std::string& salt) {
    auto [it, added] = index_.emplace(salt, static_cast<std::int32_t>(salts_.size()));
    if (added) salts_.push_back(salt);
    return it->second;
  }

 private:
  std::vector<std::string>& salts_;
  std::unordered_map<std::string, std::int32_t> index_;
};

Status require_requests(const Workload& workload, std::string_view source) {
  if (workload.requests.empty()) return invalid_argument(fmt::format("{}: no requests", source));
  return {};
}

}  // namespace

std::uint64_t Workload::total_prompt_tokens() const {
  std::uint64_t total = 0;
  for (const Request& r : requests) total += static_cast<std::uint64_t>(r.prompt_tokens);
  return total;
}

Workload generate_gsp(const GspParams& params) {
  std::mt19937_64 rng(params.seed);
  const auto vocabulary = static_cast<std::uint64_t>(params.vocabulary);
  auto draw_tokens = [&](std::int32_t count) {
    std::vector<std::int32_t> ids(static_cast<std::size_t>(count));
    for (std::int32_t& id : ids) id = static_cast<std::int32_t>(uniform_below(rng, vocabulary));
    return ids;
  };
  struct Draft {
    std::size_t group;
    std::vector<std::int32_t> question;
    std::vector<std::int32_t> output;
  };
  std::vector<std::vector<std::int32_t>> system_prompts;
  std::vector<Draft> drafts;
  for (std::int32_t g = 0; g < params.groups; ++g) {
    system_prompts.push_back(draw_tokens(params.system_prompt_tokens));
    for (std::int32_t p = 0; p < params.prompts_per_group; ++p) {
      std::vector<std::int32_t> question = draw_tokens(params.question_tokens);
      drafts.push_back(Draft{static_cast<std::size_t>(g), std::move(question), draw_tokens(params.output_tokens)});
    }
  }
  for (std::size_t i = drafts.size(); i > 1; --i) {  // Fisher-Yates
    std::swap(drafts[i - 1], drafts[uniform_below(rng, i)]);
  }

  Workload workload;
  workload.name = "gsp";
  workload.output_cached = true;
  const std::size_t per_request =
      static_cast<std::size_t>(params.system_prompt_tokens + params.question_tokens + params.output_tokens);
  workload.tokens.reserve(drafts.size() * per_request);
  for (const Draft& d : drafts) {
    Request r;
    r.offset = workload.tokens.size();
    r.prompt_tokens = params.system_prompt_tokens + params.question_tokens;
    r.output_tokens = params.output_tokens;
    const auto& system = system_prompts[d.group];
    workload.tokens.insert(workload.tokens.end(), system.begin(), system.end());
    workload.tokens.insert(workload.tokens.end(), d.question.begin(), d.question.end());
    workload.tokens.insert(workload.tokens.end(), d.output.begin(), d.output.end());
    workload.requests.push_back(r);
  }
  return workload;
}

Status parse_jsonl_workload(std::string_view text, std::string_view source, Workload& out) {
  Workload workload;
  workload.name = std::string(source);
  workload.output_cached = true;
  SaltIndex salts(workload.salts);
  std::vector<std::int32_t> prompt, output;
  std::string salt;
  CLM_RETURN_IF_ERROR(for_each_json_line(text, source, [&](const Json& line, LineError& error) {
    prompt.clear();
    output.clear();
    salt.clear();
    auto fail = [&](std::string message) {
      error.message = std::move(message);
      return false;
    };
    const auto p = line.find("prompt");
    if (p == line.end()) return fail("missing \"prompt\"");
    if (!int32_array(*p, kMaxTokenId, "prompt", "token id", prompt, error)) return false;
    if (const auto o = line.find("output"); o != line.end()) {
      if (!int32_array(*o, kMaxTokenId, "output", "token id", output, error)) return false;
    }
    if (const auto s = line.find("salt"); s != line.end() && !s->is_null()) {  // "salt": null is no salt
      if (!s->is_string()) return fail("\"salt\" must be a string");
      salt = s->get<std::string>();
    }
    if (prompt.empty()) return fail("\"prompt\" is empty");
    const std::size_t total = prompt.size() + output.size();
    if (total > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max() / 2)) {
      return fail("request is too long");
    }
    Request r;
    r.offset = workload.tokens.size();
    r.prompt_tokens = static_cast<std::int32_t>(prompt.size());
    r.output_tokens = static_cast<std::int32_t>(output.size());
    r.salt = salts.intern(salt);
    workload.tokens.insert(workload.tokens.end(), prompt.begin(), prompt.end());
    workload.tokens.insert(workload.tokens.end(), output.begin(), output.end());
    workload.requests.push_back(r);
    return true;
  }));
  CLM_RETURN_IF_ERROR(require_requests(workload, source));
  out = std::move(workload);
  return {};
}

Status read_jsonl_workload(const std::string& path, Workload& out) {
  std::string text;
  CLM_RETURN_IF_ERROR(read_file(path, text));
  return parse_jsonl_workload(text, path, out);
}

Status write_jsonl_workload(const Workload& workload, const std::string& path) {
  if (!workload.output_cached) {
    return invalid_argument(fmt::format("{}: its outputs have no token ids, so it has no JSONL form", workload.name));
  }
  // JSON strings are UTF-8: each salt is checked once, before the file exists,
  // so a salt without a JSONL form leaves no half-written file behind.
  for (std::size_t i = 0; i < workload.salts.size(); ++i) {
    try {
      (void)nlohmann::json(workload.salts[i]).dump();
    } catch (const nlohmann::json::type_error&) {
      return invalid_argument(fmt::format("{}: salt {} is not valid UTF-8", path, i));
    }
  }
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!file) return {StatusCode::io_error, fmt::format("{}: cannot create: {}", path, std::strerror(errno))};
  for (const Request& r : workload.requests) {
    nlohmann::ordered_json object;  // prompt, output, salt: in the order the format shows them
    const auto tokens = workload.prompt_and_output(r);
    object["prompt"] = workload.prompt(r);
    object["output"] = tokens.subspan(static_cast<std::size_t>(r.prompt_tokens));
    if (!workload.salt(r).empty()) object["salt"] = workload.salt(r);
    const std::string line = object.dump() + '\n';
    if (std::fwrite(line.data(), 1, line.size(), file.get()) != line.size()) {
      return {StatusCode::io_error, fmt::format("{}: write failed: {}", path, std::strerror(errno))};
    }
  }
  if (std::fclose(file.release()) != 0) {
    return {StatusCode::io_error, fmt::format("{}: write failed: {}", path, std::strerror(errno))};
  }
  return {};
}

Status parse_mooncake_trace(std::string_view text, std::string_view source, Workload& out) {
  // First the lines (blocks kept as hash ids), then the token arena, sized
  // once: the full trace expands to ~145M tokens.
  struct Line {
    std::int32_t input_length;
    std::int32_t output_length;
    std::size_t first_hash;
    std::size_t hash_count;
    double timestamp_ms;  // -1: none
  };
  std::vector<Line> lines;
  std::vector<std::int32_t> hashes;
  constexpr std::int64_t kMaxHash = (kMaxTokenId - (kMooncakeBlockTokens - 1)) / kMooncakeBlockTokens;
  constexpr std::int64_t kMaxLength = std::numeric_limits<std::int32_t>::max() / 4;
  CLM_RETURN_IF_ERROR(for_each_json_line(text, source, [&](const Json& line, LineError& error) {
    auto fail = [&](std::string message) {
      error.message = std::move(message);
      return false;
    };
    const auto input = line.find("input_length"), output = line.find("output_length"), ids = line.find("hash_ids");
    if (input == line.end()) return fail("missing \"input_length\"");
    if (output == line.end()) return fail("missing \"output_length\"");
    if (ids == line.end()) return fail("missing \"hash_ids\"");
    std::int64_t input_length = 0, output_length = 0;
    double timestamp_ms = -1;
    const std::size_t first_hash = hashes.size();
    if (const auto timestamp = line.find("timestamp"); timestamp != line.end()) {
      // Milliseconds; a missing one only costs the workload its turn timing.
      timestamp_ms = timestamp->is_number() ? timestamp->get<double>() : -1;
      if (!(timestamp_ms >= 0) || !std::isfinite(timestamp_ms)) {
        return fail(fmt::format("timestamp must be a number of milliseconds >= 0, found {}", timestamp->dump()));
      }
    }
    if (!integer_in(*input, 1, kMaxLength, "input_length", input_length, error) ||
        !integer_in(*output, 0, kMaxLength, "output_length", output_length, error) ||
        !int32_array(*ids, kMaxHash, "hash_ids", "hash id", hashes, error)) {
      return false;
    }
    const std::size_t count = hashes.size() - first_hash;
    const auto max_tokens = static_cast<std::int64_t>(count) * kMooncakeBlockTokens;
    if (input_length <= max_tokens - kMooncakeBlockTokens || input_length > max_tokens) {
      return fail(fmt::format("input_length {} does not fit {} blocks of {} tokens", input_length, count,
                              kMooncakeBlockTokens));
    }
    lines.push_back(Line{static_cast<std::int32_t>(input_length), static_cast<std::int32_t>(output_length), first_hash,
                         count, timestamp_ms});
    return true;
  }));

  Workload workload;
  workload.name = fmt::format("mooncake:{}", source);
  workload.output_cached = false;
  std::size_t total_tokens = 0;
  for (const Line& line : lines) total_tokens += static_cast<std::size_t>(line.input_length);
  workload.tokens.resize(total_tokens);
  workload.requests.reserve(lines.size());
  std::size_t offset = 0;
  for (const Line& line : lines) {
    std::int32_t* dst = workload.tokens.data() + offset;
    std::int32_t left = line.input_length;
    for (std::size_t b = 0; b < line.hash_count; ++b) {
      const std::int32_t base = hashes[line.first_hash + b] * kMooncakeBlockTokens;
      const std::int32_t n = std::min(left, kMooncakeBlockTokens);
      for (std::int32_t t = 0; t < n; ++t) *dst++ = base + t;
      left -= n;
    }
    workload.requests.push_back(Request{offset, line.input_length, line.output_length, 0});
    offset += static_cast<std::size_t>(line.input_length);
  }
  // Turn timing needs every timestamp, in arrival order.
  bool timed = true;
  for (std::size_t i = 0; i < lines.size() && timed; ++i) {
    timed = lines[i].timestamp_ms >= 0 && (i == 0 || lines[i].timestamp_ms >= lines[i - 1].timestamp_ms);
  }
  if (timed) {
    std::unordered_map<std::int32_t, std::size_t> last_owner;  // hash id -> latest request holding it
    for (std::size_t i = 0; i < lines.size(); ++i) {
      const std::int32_t* ids = hashes.data() + lines[i].first_hash;
      for (std::size_t b = lines[i].hash_count; b-- > 1;) {
        const auto owner = last_owner.find(ids[b]);
        if (owner == last_owner.end()) continue;
        Request& previous = workload.requests[owner->second];
        if (std::isinf(previous.seconds_to_next_turn)) {  // the first request to continue it
          previous.seconds_to_next_turn = (lines[i].timestamp_ms - lines[owner->second].timestamp_ms) / 1000.0;
        }
        break;
      }
      for (std::size_t b = 0; b < lines[i].hash_count; ++b) last_owner[ids[b]] = i;
    }
  }
  workload.has_turn_timing = timed;
  CLM_RETURN_IF_ERROR(require_requests(workload, source));
  out = std::move(workload);
  return {};
}

Status read_mooncake_trace(const std::string& path, Workload& out) {
  std::string text;
  CLM_RETURN_IF_ERROR(read_file(path, text));
  return parse_mooncake_trace(text, path, out);
}

Status load_workload(std::string_view spec, std::uint64_t gsp_seed, Workload& out) {
  if (spec == "gsp") {
    GspParams params;
    params.seed = gsp_seed;
    out = generate_gsp(params);
    return {};
  }
  constexpr std::string_view kMooncake = "mooncake:";
  if (spec.substr(0, kMooncake.size()) == kMooncake) {
    const std::string path(spec.substr(kMooncake.size()));
    if (path.empty()) return invalid_argument("--workload mooncake: needs a file, as mooncake:FILE");
    return read_mooncake_trace(path, out);
  }
  if (spec.empty()) return invalid_argument("--workload: empty");
  return read_jsonl_workload(std::string(spec), out);
}

Status read_file(const std::string& path, std::string& out) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file) return {StatusCode::io_error, fmt::format("{}: cannot open: {}", path, std::strerror(errno))};
  struct stat info {};
  if (::fstat(::fileno(file.get()), &info) != 0) {
    return {StatusCode::io_error, fmt::format("{}: cannot stat: {}", path, std::strerror(errno))};
  }
  if (S_ISDIR(info.st_mode)) return {StatusCode::io_error, fmt::format("{}: is a directory", path)};
  out.clear();
  if (S_ISREG(info.st_mode)) out.reserve(static_cast<std::size_t>(info.st_size));  // pipes grow as they go
  char buffer[1 << 16];
  for (;;) {
    const std::size_t n = std::fread(buffer, 1, sizeof buffer, file.get());
    out.append(buffer, n);
    if (n < sizeof buffer) break;
  }
  if (std::ferror(file.get())) {
    return {StatusCode::io_error, fmt::format("{}: cannot read: {}", path, std::strerror(errno))};
  }
  return {};
}

}  // namespace clm::replay
