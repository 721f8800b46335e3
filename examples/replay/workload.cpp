// examples/replay/workload.cpp: gsp generation, the JSONL and Mooncake
// readers (a small strict JSON scanner, one object per line), and the JSONL
// writer.
#include "workload.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <unordered_map>
#include <utility>

#include <sys/stat.h>

#include <fmt/format.h>

namespace clm::replay {
namespace {

constexpr std::int64_t kMaxTokenId = std::numeric_limits<std::int32_t>::max();

// ---- a strict JSON scanner for one line -------------------------------------
// Only what the two line formats need: objects, strings, integer arrays, and
// skipping any other value. The first error wins and records its column.
class JsonScanner {
 public:
  explicit JsonScanner(std::string_view text) : text_(text) {}

  const std::string& error() const { return error_; }
  std::size_t error_column() const { return error_pos_ + 1; }

  bool fail(std::string message) {
    if (error_.empty()) {
      error_ = std::move(message);
      error_pos_ = pos_;
    }
    return false;
  }

  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\r')) ++pos_;
  }
  bool at_end() {
    skip_space();
    return pos_ == text_.size();
  }
  char peek() {
    skip_space();
    return pos_ < text_.size() ? text_[pos_] : '\0';
  }
  bool expect(char c) {
    if (peek() != c) {
      return pos_ < text_.size() ? fail(fmt::format("expected '{}', found '{}'", c, text_[pos_]))
                                 : fail(fmt::format("expected '{}', found the end of the line", c));
    }
    ++pos_;
    return true;
  }

  // Calls on_key(key) for each key of an object; on_key must consume the value.
  template <class OnKey>
  bool parse_object(OnKey&& on_key) {
    if (!expect('{')) return false;
    if (peek() == '}') {
      ++pos_;
      return true;
    }
    std::string key;
    for (;;) {
      if (peek() != '"') return fail("expected a key string");
      if (!parse_string(key) || !expect(':')) return false;
      if (!on_key(key)) return false;
      const char next = peek();
      ++pos_;
      if (next == '}') return true;
      if (next != ',') {
        --pos_;
        return fail("expected ',' or '}' after a value");
      }
    }
  }

  bool parse_string(std::string& out) {
    out.clear();
    if (!expect('"')) return false;
    while (pos_ < text_.size()) {
      const char c = text_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) {
        --pos_;
        return fail("control character inside a string");
      }
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (pos_ == text_.size()) break;
      const char e = text_[pos_++];
      switch (e) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          std::uint32_t code = 0;
          if (!parse_hex4(code)) return false;
          if (code >= 0xD800 && code < 0xDC00) {  // a surrogate pair names one code point
            std::uint32_t low = 0;
            if (text_.substr(pos_, 2) != "\\u") return fail("unpaired UTF-16 surrogate in \\u escape");
            pos_ += 2;
            if (!parse_hex4(low)) return false;
            if (low < 0xDC00 || low >= 0xE000) return fail("unpaired UTF-16 surrogate in \\u escape");
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
          } else if (code >= 0xDC00 && code < 0xE000) {
            return fail("unpaired UTF-16 surrogate in \\u escape");
          }
          append_utf8(code, out);
          break;
        }
        default: --pos_; return fail(fmt::format("invalid escape '\\{}'", e));
      }
    }
    return fail("unterminated string");
  }

  // An integer in [min_value, max_value]; fractions and exponents are refused.
  bool parse_integer(std::int64_t min_value, std::int64_t max_value, std::string_view what, std::int64_t& out) {
    skip_space();
    const std::size_t start = pos_;
    const bool negative = pos_ < text_.size() && text_[pos_] == '-';
    if (negative) ++pos_;
    std::uint64_t magnitude = 0;
    const std::size_t digits_start = pos_;
    constexpr std::uint64_t kMagnitudeLimit = 100'000'000'000'000'000;  // far past any range asked for
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      if (magnitude > kMagnitudeLimit) {
        pos_ = start;
        return fail(fmt::format("{} is out of range", what));
      }
      magnitude = magnitude * 10 + static_cast<std::uint64_t>(text_[pos_] - '0');
      ++pos_;
    }
    if (pos_ == digits_start) {
      pos_ = start;
      return fail(fmt::format("expected an integer for {}", what));
    }
    if (pos_ < text_.size() && (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E')) {
      pos_ = start;
      return fail(fmt::format("{} must be an integer", what));
    }
    const std::int64_t value = negative ? -static_cast<std::int64_t>(magnitude) : static_cast<std::int64_t>(magnitude);
    if (value < min_value || value > max_value) {
      pos_ = start;
      return fail(fmt::format("{} {} is outside [{}, {}]", what, value, min_value, max_value));
    }
    out = value;
    return true;
  }

  // Appends the elements of an integer array in [0, max_value] to `out`.
  bool parse_int32_array(std::int64_t max_value, std::string_view what, std::vector<std::int32_t>& out) {
    if (!expect('[')) return false;
    if (peek() == ']') {
      ++pos_;
      return true;
    }
    for (;;) {
      std::int64_t value = 0;
      if (!parse_integer(0, max_value, what, value)) return false;
      out.push_back(static_cast<std::int32_t>(value));
      const char next = peek();
      ++pos_;
      if (next == ']') return true;
      if (next != ',') {
        --pos_;
        return fail(fmt::format("expected ',' or ']' in the {} array", what));
      }
    }
  }

  // Any JSON value, not kept (for keys the formats do not define).
  bool skip_value(int depth = 0) {
    if (depth > 64) return fail("values nested too deeply");
    const char c = peek();
    if (c == '"') {
      std::string ignored;
      return parse_string(ignored);
    }
    if (c == '{') {
      return parse_object([&](const std::string&) { return skip_value(depth + 1); });
    }
    if (c == '[') {
      ++pos_;
      if (peek() == ']') {
        ++pos_;
        return true;
      }
      for (;;) {
        if (!skip_value(depth + 1)) return false;
        const char next = peek();
        ++pos_;
        if (next == ']') return true;
        if (next != ',') {
          --pos_;
          return fail("expected ',' or ']' in an array");
        }
      }
    }
    if (c == '-' || (c >= '0' && c <= '9')) return skip_number();
    for (std::string_view word : {"true", "false", "null"}) {
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return true;
      }
    }
    return fail("expected a JSON value");
  }

 private:
  bool parse_hex4(std::uint32_t& code) {
    if (text_.size() - pos_ < 4) return fail("truncated \\u escape");
    code = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = text_[pos_++];
      std::uint32_t digit;
      if (h >= '0' && h <= '9') digit = static_cast<std::uint32_t>(h - '0');
      else if (h >= 'a' && h <= 'f') digit = static_cast<std::uint32_t>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') digit = static_cast<std::uint32_t>(h - 'A' + 10);
      else {
        --pos_;
        return fail("invalid hex digit in \\u escape");
      }
      code = code << 4 | digit;
    }
    return true;
  }

  static void append_utf8(std::uint32_t code, std::string& out) {
    auto byte = [&](std::uint32_t b) { out.push_back(static_cast<char>(static_cast<unsigned char>(b))); };
    if (code < 0x80) {
      byte(code);
    } else if (code < 0x800) {
      byte(0xC0 | code >> 6);
      byte(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      byte(0xE0 | code >> 12);
      byte(0x80 | (code >> 6 & 0x3F));
      byte(0x80 | (code & 0x3F));
    } else {
      byte(0xF0 | code >> 18);
      byte(0x80 | (code >> 12 & 0x3F));
      byte(0x80 | (code >> 6 & 0x3F));
      byte(0x80 | (code & 0x3F));
    }
  }

  bool skip_number() {
    const std::size_t start = pos_;
    auto digits = [&] {
      const std::size_t from = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
      return pos_ > from;
    };
    if (text_[pos_] == '-') ++pos_;
    bool ok = digits();
    if (ok && pos_ < text_.size() && text_[pos_] == '.') {
      ++pos_;
      ok = digits();
    }
    if (ok && pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      ok = digits();
    }
    if (!ok) {
      pos_ = start;
      return fail("malformed number");
    }
    return true;
  }

  std::string_view text_;
  std::size_t pos_ = 0;
  std::string error_;
  std::size_t error_pos_ = 0;
};

// Calls parse_line(scanner) for every non-blank line; prefixes errors with
// "source:line:column".
template <class ParseLine>
Status for_each_json_line(std::string_view text, std::string_view source, ParseLine&& parse_line) {
  std::size_t line_number = 0;
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t newline = text.find('\n', start);
    const std::size_t end = newline == std::string_view::npos ? text.size() : newline;
    const std::string_view line = text.substr(start, end - start);
    start = end + 1;
    ++line_number;
    JsonScanner scanner(line);
    if (scanner.at_end()) continue;  // blank line
    bool ok = parse_line(scanner);
    if (ok && !scanner.at_end()) ok = scanner.fail("unexpected characters after the object");
    if (!ok) {
      return invalid_argument(
          fmt::format("{}:{}:{}: {}", source, line_number, scanner.error_column(), scanner.error()));
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

void append_json_string(std::string_view s, fmt::memory_buffer& out) {
  out.push_back('"');
  for (const char c : s) {
    switch (c) {
      case '"': out.append(std::string_view("\\\"")); break;
      case '\\': out.append(std::string_view("\\\\")); break;
      case '\n': out.append(std::string_view("\\n")); break;
      case '\r': out.append(std::string_view("\\r")); break;
      case '\t': out.append(std::string_view("\\t")); break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          fmt::format_to(std::back_inserter(out), "\\u{:04x}", static_cast<unsigned>(static_cast<unsigned char>(c)));
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
}

void append_int_array(std::span<const std::int32_t> values, fmt::memory_buffer& out) {
  out.push_back('[');
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i) out.push_back(',');
    fmt::format_to(std::back_inserter(out), "{}", values[i]);
  }
  out.push_back(']');
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
  CLM_RETURN_IF_ERROR(for_each_json_line(text, source, [&](JsonScanner& scanner) {
    prompt.clear();
    output.clear();
    salt.clear();
    bool seen_prompt = false, seen_output = false, seen_salt = false;
    auto once = [&](bool& seen, const std::string& key) {
      if (seen) return scanner.fail(fmt::format("duplicate key \"{}\"", key));
      seen = true;
      return true;
    };
    const bool parsed = scanner.parse_object([&](const std::string& key) {
      if (key == "prompt") return once(seen_prompt, key) && scanner.parse_int32_array(kMaxTokenId, "token id", prompt);
      if (key == "output") return once(seen_output, key) && scanner.parse_int32_array(kMaxTokenId, "token id", output);
      if (key == "salt") {
        if (!once(seen_salt, key)) return false;
        if (scanner.peek() == 'n') return scanner.skip_value();  // "salt": null is no salt
        if (scanner.peek() != '"') return scanner.fail("\"salt\" must be a string");
        return scanner.parse_string(salt);
      }
      return scanner.skip_value();
    });
    if (!parsed) return false;
    if (!seen_prompt) return scanner.fail("missing \"prompt\"");
    if (prompt.empty()) return scanner.fail("\"prompt\" is empty");
    const std::size_t total = prompt.size() + output.size();
    if (total > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max() / 2)) {
      return scanner.fail("request is too long");
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
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!file) return {StatusCode::io_error, fmt::format("{}: cannot create: {}", path, std::strerror(errno))};
  fmt::memory_buffer line;
  for (const Request& r : workload.requests) {
    line.clear();
    line.append(std::string_view("{\"prompt\":"));
    append_int_array(workload.prompt(r), line);
    line.append(std::string_view(",\"output\":"));
    append_int_array(workload.prompt_and_output(r).subspan(static_cast<std::size_t>(r.prompt_tokens)), line);
    if (!workload.salt(r).empty()) {
      line.append(std::string_view(",\"salt\":"));
      append_json_string(workload.salt(r), line);
    }
    line.append(std::string_view("}\n"));
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
  };
  std::vector<Line> lines;
  std::vector<std::int32_t> hashes;
  constexpr std::int64_t kMaxHash = (kMaxTokenId - (kMooncakeBlockTokens - 1)) / kMooncakeBlockTokens;
  constexpr std::int64_t kMaxLength = std::numeric_limits<std::int32_t>::max() / 4;
  CLM_RETURN_IF_ERROR(for_each_json_line(text, source, [&](JsonScanner& scanner) {
    std::int64_t input_length = -1, output_length = -1;
    const std::size_t first_hash = hashes.size();
    bool seen_hashes = false, seen_timestamp = false;
    auto once = [&](bool seen, const std::string& key) {
      return seen ? scanner.fail(fmt::format("duplicate key \"{}\"", key)) : true;
    };
    const bool parsed = scanner.parse_object([&](const std::string& key) {
      if (key == "input_length") {
        return once(input_length >= 0, key) && scanner.parse_integer(1, kMaxLength, "input_length", input_length);
      }
      if (key == "output_length") {
        return once(output_length >= 0, key) && scanner.parse_integer(0, kMaxLength, "output_length", output_length);
      }
      if (key == "hash_ids") {
        if (!once(seen_hashes, key)) return false;
        seen_hashes = true;
        return scanner.parse_int32_array(kMaxHash, "hash id", hashes);
      }
      if (key == "timestamp") {
        if (!once(seen_timestamp, key)) return false;
        seen_timestamp = true;
      }
      return scanner.skip_value();
    });
    if (!parsed) return false;
    if (input_length < 0) return scanner.fail("missing \"input_length\"");
    if (output_length < 0) return scanner.fail("missing \"output_length\"");
    if (!seen_hashes) return scanner.fail("missing \"hash_ids\"");
    const std::size_t count = hashes.size() - first_hash;
    const auto max_tokens = static_cast<std::int64_t>(count) * kMooncakeBlockTokens;
    if (input_length <= max_tokens - kMooncakeBlockTokens || input_length > max_tokens) {
      return scanner.fail(fmt::format("input_length {} does not fit {} blocks of {} tokens", input_length, count,
                                      kMooncakeBlockTokens));
    }
    lines.push_back(Line{static_cast<std::int32_t>(input_length), static_cast<std::int32_t>(output_length),
                         first_hash, count});
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
