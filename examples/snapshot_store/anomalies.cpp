// examples/snapshot_store/anomalies.cpp: `clm_store anomalies`: what an
// operator watches of CLM (docs/observability.md), from the JSON lines a
// serving process's CLM watch wrote (clm_server --clm-events FILE;
// clm::ClmWatchConfig::on_line) and, with --store, the store's blacklist as it
// is now: keys seen often with a low SRC score, keys blacklisted or let go and
// why, versions created and drift, per key, over the last hours.
//
//   $ clm_store anomalies --events /var/log/clm-events.jsonl --hours 24
//   low SRC (seen often, the head says no repeat): 1 key
//     acme  REFUND-ORDER  20 sightings, median SRC 0.062  since 2026-12-06T10:00:07Z
//   ...
#include "commands.hpp"

namespace clm_store_cli {

const std::string_view kAnomaliesUsage =
    "usage: clm_store anomalies --events FILE [--hours H] [--store DIR] [--json]\n"
    "\n"
    "Reads the JSON lines of a serving process's CLM watch (clm_server --clm-events FILE, or\n"
    "a host's EngineConfig::clm_watch.on_line; docs/observability.md) and reports, per key,\n"
    "over the last H hours (default 24; 0: every line):\n"
    "  - low SRC: keys seen at least min_sightings times in the watch's window with a median\n"
    "    SRC below its threshold (the keyer says the suffix repeats, the head says it does not:\n"
    "    a bad key rule or a bad head), with the sightings and median of the last such line;\n"
    "  - blacklists and unblacklists, by the breaker or an administrator, with the reason;\n"
    "  - versions created and drift (a version the drift window started), counted, the last\n"
    "    version named.\n"
    "With --store DIR, also the store's blacklist now (opened read-only, beside a server).\n"
    "\n"
    "  --events FILE    the JSON lines (one object each: time_ms, event, tenant, adapter_id, key, ...)\n"
    "  --hours H        how far back from now, in (0, 876000]; 0: every line (default 24)\n"
    "  --store DIR      the store whose blacklist to list too\n"
    "  --json           one JSON object instead of text\n"
    "\n"
    "Exit status 2 with a message naming the line: a line that is not a JSON object with\n"
    "time_ms, event, tenant and key of the right types, or an event this tool does not know.\n";

namespace {

struct KeyId {
  std::string tenant;
  std::int64_t adapter_id = 0;
  std::string key;
  auto operator<=>(const KeyId&) const = default;
};

struct KeyState {
  // low SRC: the last such line
  std::int64_t low_src_ms = 0;
  std::uint64_t sightings = 0;
  double median_src = 0;
  // blacklist: the last blacklist or unblacklist line
  std::int64_t blacklist_ms = 0;
  bool blacklisted = false;
  std::string reason, by;
  std::int64_t until_ms = 0;
  // versions
  std::uint64_t versions = 0, drifts = 0;
  std::int64_t last_version = 0;
};

template <class T>
T field(const Json& j, const char* name, const std::string& where) {
  const auto it = j.find(name);
  if (it == j.end()) throw Failure{fmt::format("{}: no \"{}\"", where, name)};
  try {
    return it->get<T>();
  } catch (const std::exception&) {
    throw Failure{fmt::format("{}: \"{}\" is not {}", where, name,
                              std::is_same_v<T, std::string> ? "a string" : "a number of the right kind")};
  }
}

}  // namespace

int cmd_anomalies(const Args& args) {
  args.no_positionals();
  const std::string path = args.required("--events");
  const double hours = args.real("--hours", 0.0, 876000.0).value_or(24.0);
  const std::int64_t since = hours > 0 ? now_ms() - static_cast<std::int64_t>(hours * 3600.0 * 1000.0) : 0;
  std::ifstream in(path);
  if (!in) throw Failure{fmt::format("cannot read {}", path)};
  std::map<KeyId, KeyState> keys;
  std::string line;
  std::int64_t lines = 0, counted = 0;
  while (std::getline(in, line)) {
    ++lines;
    if (line.empty()) continue;
    const std::string where = fmt::format("{}:{}", path, lines);
    Json j;
    try {
      j = Json::parse(line);
    } catch (const std::exception& e) {
      throw Failure{fmt::format("{}: not JSON: {}", where, json_message(e))};
    }
    if (!j.is_object()) throw Failure{fmt::format("{}: not a JSON object", where)};
    const auto time = field<std::int64_t>(j, "time_ms", where);
    const auto event = field<std::string>(j, "event", where);
    KeyId id{field<std::string>(j, "tenant", where), j.value("adapter_id", std::int64_t{0}),
             field<std::string>(j, "key", where)};
    if (event != "low_src" && event != "blacklisted" && event != "unblacklisted" && event != "version_created" &&
        event != "drift") {
      throw Failure{fmt::format("{}: unknown event \"{}\"", where, event)};
    }
    // Every line is checked, in the window or not: a file with a bad line is refused whole.
    KeyState line_state;
    if (event == "low_src") {
      line_state.low_src_ms = time;
      line_state.sightings = field<std::uint64_t>(j, "sightings", where);
      line_state.median_src = field<double>(j, "median_src", where);
    } else if (event == "blacklisted") {
      line_state.blacklisted = true;
      line_state.reason = field<std::string>(j, "reason", where);
      line_state.by = field<std::string>(j, "by", where);
      line_state.until_ms = field<std::int64_t>(j, "until_ms", where);
    } else if (event != "unblacklisted") {
      line_state.last_version = field<std::int64_t>(j, "version", where);
    }
    if (time < since) continue;
    ++counted;
    KeyState& k = keys[id];
    if (event == "low_src") {
      k.low_src_ms = time;
      k.sightings = line_state.sightings;
      k.median_src = line_state.median_src;
    } else if (event == "blacklisted" || event == "unblacklisted") {
      k.blacklist_ms = time;
      k.blacklisted = line_state.blacklisted;
      k.reason = line_state.reason;
      k.by = line_state.by;
      k.until_ms = line_state.until_ms;
    } else {
      ++(event == "drift" ? k.drifts : k.versions);
      k.last_version = line_state.last_version;
    }
  }
  if (in.bad()) throw Failure{fmt::format("cannot read {}", path)};

  std::vector<clm::BlacklistEntry> store_blacklist;
  if (const auto dir = args.get("--store")) {
    auto store = open_reader(store_config(args, false));
    check(store->list_blacklist(store_blacklist), "list_blacklist");
  }

  std::vector<std::pair<KeyId, KeyState>> low, listed, versioned;
  for (const auto& [id, k] : keys) {
    if (k.low_src_ms) low.emplace_back(id, k);
    if (k.blacklist_ms) listed.emplace_back(id, k);
    if (k.versions + k.drifts) versioned.emplace_back(id, k);
  }
  std::sort(low.begin(), low.end(),
            [](const auto& a, const auto& b) { return a.second.sightings > b.second.sightings; });
  std::sort(versioned.begin(), versioned.end(), [](const auto& a, const auto& b) {
    return a.second.versions + a.second.drifts > b.second.versions + b.second.drifts;
  });

  if (args.has("--json")) {
    Json out{{"events", path}, {"lines", lines}, {"in_window", counted}, {"hours", hours}};
    Json l = Json::array(), b = Json::array(), v = Json::array(), s = Json::array();
    for (const auto& [id, k] : low) {
      l.push_back({{"tenant", id.tenant},
                   {"adapter_id", id.adapter_id},
                   {"key", id.key},
                   {"sightings", k.sightings},
                   {"median_src", k.median_src},
                   {"time_ms", k.low_src_ms}});
    }
    for (const auto& [id, k] : listed) {
      b.push_back({{"tenant", id.tenant},
                   {"adapter_id", id.adapter_id},
                   {"key", id.key},
                   {"blacklisted", k.blacklisted},
                   {"by", k.by},
                   {"reason", k.reason},
                   {"until_ms", k.until_ms},
                   {"time_ms", k.blacklist_ms}});
    }
    for (const auto& [id, k] : versioned) {
      v.push_back({{"tenant", id.tenant},
                   {"adapter_id", id.adapter_id},
                   {"key", id.key},
                   {"versions", k.versions},
                   {"drifts", k.drifts},
                   {"last_version", k.last_version}});
    }
    for (const auto& e : store_blacklist) {
      s.push_back({{"tenant", printable(e.tenant)},
                   {"key", e.key},
                   {"until_ms", e.until_ms},
                   {"reason", e.reason},
                   {"by", e.by_hand ? "administrator" : "breaker"}});
    }
    out["low_src"] = std::move(l);
    out["blacklist_events"] = std::move(b);
    out["versions"] = std::move(v);
    if (args.has("--store")) out["store_blacklist"] = std::move(s);
    fmt::print("{}\n", dump(out));
    return 0;
  }
  fmt::print("{}: {} lines, {} in the last {}\n", path, lines, counted,
             hours > 0 ? fmt::format("{} hours", hours) : std::string("(all)"));
  fmt::print("low SRC (seen often, the head says no repeat): {} key(s)\n", low.size());
  for (const auto& [id, k] : low) {
    fmt::print("  {}  adapter {}  {}  {} sightings, median SRC {:.3f}  at {}\n", id.tenant, id.adapter_id, id.key,
               k.sightings, k.median_src, utc_ms(k.low_src_ms));
  }
  fmt::print("blacklisted or let go: {} key(s)\n", listed.size());
  for (const auto& [id, k] : listed) {
    if (k.blacklisted) {
      fmt::print("  {}  adapter {}  {}  blacklisted by the {} until {}: {}  at {}\n", id.tenant, id.adapter_id, id.key,
                 k.by, utc_ms(k.until_ms), k.reason, utc_ms(k.blacklist_ms));
    } else {
      fmt::print("  {}  adapter {}  {}  let go  at {}\n", id.tenant, id.adapter_id, id.key, utc_ms(k.blacklist_ms));
    }
  }
  fmt::print("versions created: {} key(s)\n", versioned.size());
  for (const auto& [id, k] : versioned) {
    fmt::print("  {}  adapter {}  {}  {} version(s), {} by drift, the last v{}\n", id.tenant, id.adapter_id, id.key,
               k.versions, k.drifts, k.last_version);
  }
  if (args.has("--store")) {
    fmt::print("the store's blacklist now: {} key(s)\n", store_blacklist.size());
    for (const auto& e : store_blacklist) {
      fmt::print("  \"{}\"  {}  until {}  {}  {}\n", printable(e.tenant), e.key, utc_ms(e.until_ms),
                 e.by_hand ? "by hand" : "breaker", e.reason);
    }
  }
  return 0;
}

}  // namespace clm_store_cli
