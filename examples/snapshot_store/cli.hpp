// examples/snapshot_store/cli.hpp: what the commands of `clm_store` share:
// exit codes and errors, the command line (Args), the shard databases read
// directly (Db, the store's layout), opening a store from the flags, and
// snapshots in JSON. main.cpp holds the commands that read and load a store
// and the command table; admin.cpp the commands an administrator changes a
// store with by hand.
//
//   int cmd_example(const clm_store_cli::Args& args) {
//     clm::SnapshotStoreConfig config = clm_store_cli::store_config(args, false);
//     auto store = clm_store_cli::open_store(config);   // throws Failure with the reason
//     ...
//   }
#pragma once

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "clm/status.hpp"
#include "clm/store/snapshot_store.hpp"
#include "clm/store/suffix_key.hpp"

namespace clm_store_cli {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

constexpr int kExitProblem = 1;  // key: some lines failed; check: the store is damaged
constexpr int kExitError = 2;    // bad flags or input, a store that cannot be opened or written

// A bad command line: the message, then a pointer to --help.
struct UsageError {
  std::string message;
};
// Anything else that stops a command: the message alone.
struct Failure {
  std::string message;
};

inline void check(const clm::Status& s, std::string_view context) {
  if (s.ok()) return;
  throw Failure{fmt::format("{}: {}: {}", context, s.code_name(), s.message())};
}

inline std::string hex(std::uint64_t v) { return fmt::format("{:016x}", v); }

inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

inline std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Milliseconds since the epoch as UTC, to the second: 2026-12-06T10:00:07Z.
inline std::string utc_ms(std::int64_t ms) {
  const std::time_t t = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

// The shortest decimal that reads back as `f`, as a double: JSON output then
// shows 0.1 for 0.1f, not 0.10000000149011612.
inline double tidy(float f) { return std::strtod(fmt::format("{}", f).c_str(), nullptr); }

inline std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// Tenants are bytes: printable ASCII as it is, anything else as \xNN.
inline std::string printable(std::string_view bytes) {
  std::string out;
  for (const char c : bytes) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f && c != '\\') {
      out += c;
    } else {
      out += fmt::format("\\x{:02x}", u);
    }
  }
  return out;
}

inline std::string human_bytes(std::uint64_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = -1;
  while (v >= 1024.0 && u < 3) {
    v /= 1024.0;
    ++u;
  }
  return fmt::format("{:.1f} {}", v, units[u]);
}

// nlohmann's messages start with "[json.exception.parse_error.101] ": keep what follows.
inline std::string json_message(const std::exception& e) {
  std::string_view m = e.what();
  if (m.substr(0, 1) == "[") {
    const auto close = m.find("] ");
    if (close != std::string_view::npos) m.remove_prefix(close + 2);
  }
  return std::string(m);
}

// ---- command lines ---------------------------------------------------------

// The flags after the command: `--flag VALUE` or `--flag=VALUE` for the
// command's value flags, bare `--switch`es, and positional arguments (all
// that follows `--` is positional). Anything else is refused at once.
class Args {
 public:
  Args(int argc, char** argv, int first, const std::vector<std::string_view>& value_flags,
       const std::vector<std::string_view>& switches, std::string_view command)
      : command_(command) {
    bool positional_only = false;
    for (int i = first; i < argc; ++i) {
      const std::string_view arg = argv[i];
      if (positional_only || arg.size() < 3 || arg.substr(0, 2) != "--") {
        if (!positional_only && arg == "--") {
          positional_only = true;
          continue;
        }
        positionals_.emplace_back(arg);
        continue;
      }
      std::string name(arg);
      std::optional<std::string> value;
      if (const auto eq = arg.find('='); eq != std::string_view::npos) {
        name = std::string(arg.substr(0, eq));
        value = std::string(arg.substr(eq + 1));
      }
      const bool is_value = std::find(value_flags.begin(), value_flags.end(), name) != value_flags.end();
      const bool is_switch = std::find(switches.begin(), switches.end(), name) != switches.end();
      if (!is_value && !is_switch) throw UsageError{fmt::format("unknown flag {} for `clm_store {}`", name, command)};
      if (is_switch) {
        if (value) throw UsageError{fmt::format("{} takes no value", name)};
        value = "";
      } else if (!value) {
        if (i + 1 >= argc) throw UsageError{fmt::format("{} needs a value", name)};
        value = argv[++i];
      }
      if (!values_.emplace(name, *value).second) throw UsageError{fmt::format("{} given twice", name)};
    }
  }

  const std::string& command() const { return command_; }
  const std::vector<std::string>& positionals() const { return positionals_; }
  void no_positionals() const {
    if (!positionals_.empty()) {
      throw UsageError{fmt::format("unexpected argument '{}' for `clm_store {}`", positionals_[0], command_)};
    }
  }

  bool has(const std::string& flag) const { return values_.count(flag) != 0; }
  std::optional<std::string> get(const std::string& flag) const {
    const auto it = values_.find(flag);
    if (it == values_.end()) return std::nullopt;
    return it->second;
  }
  std::string required(const std::string& flag) const {
    const auto v = get(flag);
    if (!v) throw UsageError{fmt::format("{} is required", flag)};
    if (v->empty()) throw UsageError{fmt::format("{}: empty", flag)};
    return *v;
  }
  template <class Int>
  std::optional<Int> integer(const std::string& flag, Int min_value, Int max_value) const {
    const auto v = get(flag);
    if (!v) return std::nullopt;
    Int value{};
    const auto [end, error] = std::from_chars(v->data(), v->data() + v->size(), value);
    if (error != std::errc() || end != v->data() + v->size() || v->empty()) {
      throw UsageError{fmt::format("{}: '{}' is not an integer (or is out of range)", flag, *v)};
    }
    if (value < min_value || value > max_value) {
      throw UsageError{fmt::format("{}: {} is not in [{}, {}]", flag, value, min_value, max_value)};
    }
    return value;
  }
  std::optional<double> real(const std::string& flag, double min_value, double max_value) const {
    const auto v = get(flag);
    if (!v) return std::nullopt;
    double value = 0;
    const auto [end, error] = std::from_chars(v->data(), v->data() + v->size(), value);
    if (error != std::errc() || end != v->data() + v->size() || v->empty() || !std::isfinite(value)) {
      throw UsageError{fmt::format("{}: '{}' is not a finite number", flag, *v)};
    }
    if (value < min_value || value > max_value) {
      throw UsageError{fmt::format("{}: {} is not in [{}, {}]", flag, value, min_value, max_value)};
    }
    return value;
  }

 private:
  std::string command_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> positionals_;
};

// ---- the store's files --------------------------------------------------------

inline std::string shard_path(const std::string& dir, std::int32_t shard) {
  return fmt::format("{}/shard-{:02}.db", dir, shard);
}

struct Layout {
  std::int32_t shards = 0;
  std::int32_t dim = 0;
};

// The shard count and snapshot_dim a store was created with (the library
// reads them from shard 0, read-only); nullopt when the directory holds no store.
inline std::optional<Layout> read_layout(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) throw Failure{fmt::format("{} is not a directory", dir)};
  clm::StoreLayout layout;
  const clm::Status s = clm::SnapshotStore::read_layout(dir, layout);
  if (s.code() == clm::StatusCode::not_found) return std::nullopt;
  if (!s.ok()) throw Failure{fmt::format("{}: {}", s.code_name(), s.message())};
  return Layout{layout.num_shards, layout.snapshot_dim};
}

inline std::uint64_t file_bytes(const std::string& path) {
  std::error_code ec;
  const std::uintmax_t n = fs::file_size(path, ec);
  return ec ? 0 : static_cast<std::uint64_t>(n);
}

// The index files of each shard: shard-NN.<tenant tag>.hnsw -> its bytes and
// those of the .meta beside it (temporary files are left out).
inline std::map<std::int32_t, std::map<std::string, std::uint64_t>> index_files(const std::string& dir) {
  std::map<std::int32_t, std::map<std::string, std::uint64_t>> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("shard-", 0) != 0 || !name.ends_with(".hnsw")) continue;
    std::int32_t shard = 0;
    const auto [end, error] = std::from_chars(name.data() + 6, name.data() + name.size(), shard);
    if (error != std::errc() || *end != '.') continue;
    const std::string path = entry.path().string();
    out[shard][path] = file_bytes(path) + file_bytes(path + ".meta");
  }
  if (ec) throw Failure{fmt::format("cannot list {}: {}", dir, ec.message())};
  return out;
}

// ---- opening a store --------------------------------------------------------

// --lexicons DIR (added to the built-in lexicons) and --replace-lexicons (DIR's only).
inline clm::SuffixKeyerConfig keyer_config(const Args& args) {
  clm::SuffixKeyerConfig keyer;
  if (const auto lexicons = args.get("--lexicons")) keyer.lexicon_dir = *lexicons;
  keyer.replace_builtin_lexicons = args.has("--replace-lexicons");
  if (keyer.replace_builtin_lexicons && keyer.lexicon_dir.empty()) {
    throw UsageError{"--replace-lexicons needs --lexicons DIR (the lexicons that replace the built-in ones)"};
  }
  return keyer;
}

// Every command that opens a store takes --lexicons: a store records the key
// rules (lexicons included) its keys were made under and opens under those only.
inline const std::vector<std::string_view> kStoreFlags = {"--store", "--shards", "--dim", "--lexicons"};

inline std::vector<std::string_view> flags(std::vector<std::string_view> a, const std::vector<std::string_view>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The config of the store at --store: shard count and snapshot_dim as it was
// created (--shards / --dim must agree), or from the flags for a new store
// when `may_create`.
inline clm::SnapshotStoreConfig store_config(const Args& args, bool may_create) {
  clm::SnapshotStoreConfig config;
  config.path = args.required("--store");
  if (config.path == ":memory:") throw UsageError{"--store :memory: would keep nothing: give a directory"};
  const auto shards = args.integer<std::int32_t>("--shards", 1, 256);
  const auto dim = args.integer<std::int32_t>("--dim", 1, 4096);
  if (const auto layout = read_layout(config.path)) {
    if (shards && *shards != layout->shards) {
      throw Failure{fmt::format("--shards {}: the store at {} has {} shards (fixed when it was created)", *shards,
                                config.path, layout->shards)};
    }
    if (dim && *dim != layout->dim) {
      throw Failure{fmt::format("--dim {}: the store at {} has snapshot_dim {} (fixed when it was created)", *dim,
                                config.path, layout->dim)};
    }
    config.num_shards = layout->shards;
    config.snapshot_dim = layout->dim;
  } else if (!may_create) {
    throw Failure{fmt::format("no snapshot store at {} (no {}); `clm_store ingest --dim N` creates one", config.path,
                              shard_path(config.path, 0))};
  } else {
    if (!dim) throw UsageError{fmt::format("{} holds no store yet: --dim is required to create one", config.path)};
    config.num_shards = shards.value_or(config.num_shards);
    config.snapshot_dim = *dim;
  }
  config.keyer = keyer_config(args);
  return config;
}

// The hint for a store refused for its key rules: most often a --lexicons left out.
inline std::string key_rules_hint(const clm::Status& s, const clm::SnapshotStoreConfig& config) {
  if (s.code() != clm::StatusCode::failed_precondition || s.message().find("key rules") == std::string::npos) return {};
  return config.keyer.lexicon_dir.empty()
             ? "\n  (a store made with --lexicons DIR opens with the same --lexicons DIR (and --replace-lexicons) "
               "only; rekey it only to change its rules)"
             : fmt::format("\n  (opened with --lexicons {}: is it the directory the store was made with?)",
                           config.keyer.lexicon_dir);
}

inline std::unique_ptr<clm::SnapshotStore> open_store(const clm::SnapshotStoreConfig& config) {
  std::unique_ptr<clm::SnapshotStore> store;
  const clm::Status s = clm::SnapshotStore::open(config, store);
  if (!s.ok()) {
    throw Failure{fmt::format("cannot open the store at {}: {}: {}{}", config.path, s.code_name(), s.message(),
                              key_rules_hint(s, config))};
  }
  return store;
}

// For the commands that only read (lookup, versions, blacklist --list, stats,
// check, evict --dry-run, plot): a read-only handle, which opens beside a server
// that holds the store and writes nothing.
inline std::unique_ptr<clm::SnapshotStore> open_reader(clm::SnapshotStoreConfig config) {
  config.read_only = true;
  return open_store(config);
}

// ---- snapshots in JSON -------------------------------------------------------

// A JSON array of `dim` numbers as floats; the reason in `error` when it is not one.
inline bool json_vector(const Json& j, std::int32_t dim, std::string_view what, std::vector<float>& out,
                        std::string& error) {
  if (!j.is_array()) {
    error = fmt::format("{} must be an array of {} numbers, not {}", what, dim, j.type_name());
    return false;
  }
  if (j.size() != static_cast<std::size_t>(dim)) {
    error = fmt::format("{} has {} values, the store's snapshot_dim is {}", what, j.size(), dim);
    return false;
  }
  out.resize(j.size());
  double norm = 0;
  for (std::size_t i = 0; i < j.size(); ++i) {
    const Json& v = j[i];
    if (!v.is_number()) {
      error = fmt::format("{}[{}] is {}, not a number", what, i, v.type_name());
      return false;
    }
    const double d = v.get<double>();
    if (!std::isfinite(d) || std::fabs(d) > static_cast<double>(std::numeric_limits<float>::max())) {
      error = fmt::format("{}[{}] = {} is not a finite float", what, i, d);
      return false;
    }
    out[i] = static_cast<float>(d);
    norm += static_cast<double>(out[i]) * out[i];
  }
  if (!(norm > 0)) {
    error = fmt::format("{} is all zeros: it has no direction", what);
    return false;
  }
  return true;
}

inline Json json_floats(std::span<const float> v) {
  Json a = Json::array();
  for (const float f : v) a.push_back(tidy(f));
  return a;
}

// Parses one JSON value; duplicate object keys are refused (nlohmann keeps the last).
inline bool parse_json(std::string_view text, Json& out, std::string& error) {
  std::vector<std::set<std::string>> keys;  // one set per open object
  std::string duplicate;
  const Json::parser_callback_t callback = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) keys.emplace_back();
    if (event == Json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == Json::parse_event_t::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second &&
        duplicate.empty()) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  try {
    out = Json::parse(text.begin(), text.end(), callback);
  } catch (const Json::exception& e) {
    error = json_message(e);
    return false;
  }
  if (!duplicate.empty()) {
    error = fmt::format("field \"{}\" given twice", duplicate);
    return false;
  }
  return true;
}

// ---- the suffix a command names ----------------------------------------------

// TEXT (one argument) or --text, or a host's --key with its --group: checked
// from the command line alone, before the store opens.
struct NamedSuffix {
  std::optional<std::string> text;
  std::string host_key, group;
};

inline NamedSuffix named_suffix(const Args& args) {
  if (args.positionals().size() > 1) {
    throw UsageError{"give the text as one argument (quote it), or with --text"};
  }
  NamedSuffix s;
  s.text = args.get("--text");
  if (!args.positionals().empty()) {
    if (s.text) throw UsageError{"give the text once: as an argument or with --text"};
    s.text = args.positionals()[0];
  }
  const auto host_key = args.get("--key");
  if (s.text.has_value() == host_key.has_value()) {
    throw UsageError{s.text ? "give a text or --key, not both" : "give a text (TEXT or --text) or --key"};
  }
  if (s.text && args.has("--group")) throw UsageError{"--group goes with --key"};
  s.host_key = host_key.value_or("");
  s.group = args.get("--group").value_or("");
  return s;
}

// The key of a named suffix: the text keyed by the store's keyer, or the host's key.
inline clm::SuffixKey key_of(const NamedSuffix& s, const clm::SnapshotStore& store) {
  clm::SuffixKey key;
  if (s.text) {
    check(store.keyer().make_key(*s.text, key), "the text");
  } else {
    check(clm::SuffixKeyer::from_host_key(s.host_key, s.group, key), "--key");
  }
  return key;
}

}  // namespace clm_store_cli
