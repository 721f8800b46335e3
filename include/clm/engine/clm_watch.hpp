// clm/engine/clm_watch.hpp: what an operator watches of CLM suffix reuse
// (the CLM design document's operations advice, docs/observability.md):
// suffix keys that recur often while the SRC head keeps saying "not a
// repeat" (a sign of a bad keyer rule or a bad head), and what the snapshot
// store did to keys: blacklisted or let go and why, versions created, drift.
// The Engine feeds it: each snapshot lookup with the sequence's last SRC
// score (once per sequence and key), each store event (SnapshotStoreEvent).
//
//   clm::ClmAnomalyReport report;
//   CLM_RETURN_IF_ERROR(engine->clm_anomalies(report));
//   for (const clm::LowSrcKey& k : report.low_src_keys)
//     fmt::print("{} {}: seen {} times, median SRC {:.3f}\n", k.tenant, k.key, k.sightings, k.median_src);
//   // config.clm_watch.on_line = [&](std::string_view line) { log << line << '\n'; };  // JSON lines
//
// A key is *low-SRC* once, in the window (two halves, as cache/divergence.hpp),
// it was seen at least min_sightings times with a median SRC below low_src.
// Scores go into 40 bins of 0.025, so the median is known to 0.0125. At most
// max_keys keys are watched (a full watch drops its least seen sixteenth for
// new ones) and the
// last max_events events kept. Each event, and each key that turns low-SRC,
// is also one JSON line for on_line. Thread-safe (its own lock); on_line is
// called under it, in order, and must not call back into the Engine.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "clm/detail/json_string.hpp"
#include "clm/status.hpp"
#include "clm/store/snapshot_store.hpp"

namespace clm {

struct ClmWatchConfig {
  bool enabled = true;
  std::int64_t window_ms = 3'600'000;  // >= 2
  std::int64_t min_sightings = 20;     // >= 1
  float low_src = 0.2f;                // (0, 1]
  std::int32_t max_keys = 4096;        // [1, 1 << 20]
  std::int32_t max_events = 1024;      // [0, 1 << 20]
  // Each event and each key turning low-SRC as one JSON line (no newline).
  std::function<void(std::string_view)> on_line;
};

inline Status check_clm_watch_config(const ClmWatchConfig& c) {
  if (c.window_ms < 2) return invalid_argument(fmt::format("clm_watch: window_ms must be >= 2, got {}", c.window_ms));
  if (c.min_sightings < 1) {
    return invalid_argument(fmt::format("clm_watch: min_sightings must be >= 1, got {}", c.min_sightings));
  }
  if (!(c.low_src > 0.0f && c.low_src <= 1.0f)) {
    return invalid_argument(fmt::format("clm_watch: low_src must be in (0, 1], got {}", c.low_src));
  }
  if (c.max_keys < 1 || c.max_keys > (1 << 20)) {
    return invalid_argument(fmt::format("clm_watch: max_keys must be in [1, 2^20], got {}", c.max_keys));
  }
  if (c.max_events < 0 || c.max_events > (1 << 20)) {
    return invalid_argument(fmt::format("clm_watch: max_events must be in [0, 2^20], got {}", c.max_events));
  }
  return {};
}

struct LowSrcKey {
  std::string tenant;  // the tenant's name (AdmitOptions::tenant), else its salt's digest
  std::int32_t adapter_id = 0;
  std::string key;
  std::uint64_t sightings = 0;  // in the window
  float median_src = 0.0f;      // to 0.0125
};

struct ClmEvent {
  enum class Kind : std::uint8_t { blacklisted, unblacklisted, version_created, drift, low_src };
  Kind kind = Kind::version_created;
  std::int64_t time_ms = 0;  // since the Unix epoch
  std::string tenant;        // as LowSrcKey::tenant
  std::int32_t adapter_id = 0;
  std::string key;
  std::string reason;           // blacklisted
  std::int64_t until_ms = 0;    // blacklisted
  std::int32_t version = 0;     // version_created, drift
  bool by_breaker = false;      // blacklisted
  std::uint64_t sightings = 0;  // low_src
  float median_src = 0.0f;      // low_src
};
const char* clm_event_name(ClmEvent::Kind kind);
std::string clm_event_json(const ClmEvent& e);  // one line

struct ClmAnomalyReport {
  std::vector<LowSrcKey> low_src_keys;  // the most seen first
  std::vector<ClmEvent> events;         // the last max_events, oldest first
  std::int64_t window_ms = 0;
  std::int64_t min_sightings = 0;
  float low_src = 0.0f;
};

struct ClmWatchMetrics {
  std::uint64_t sightings = 0;                  // lookups recorded with a score
  std::uint64_t low_src_turns = 0;              // times a key turned low-SRC
  std::array<std::uint64_t, 4> store_events{};  // by SnapshotStoreEvent::Kind
  std::int64_t watched_keys = 0;
  std::int64_t low_src_keys = 0;  // watched keys low-SRC as of their last sighting
};

class ClmWatch {
 public:
  using Clock = std::int64_t (*)();  // ms since the Unix epoch
  static std::int64_t system_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  static constexpr std::size_t kBins = 40;

  // Takes a checked config (check_clm_watch_config).
  explicit ClmWatch(ClmWatchConfig config) : config_(std::move(config)) {}
  void set_clock(Clock clock) { clock_ = clock; }  // tests

  // A lookup of `key` by a sequence of store tenant `tenant` (named
  // `tenant_name`) whose last SRC score was `score`.
  void sighting(std::string_view tenant, std::string_view tenant_name, std::int32_t adapter_id, std::string_view key,
                float score) {
    if (!config_.enabled || key.empty()) return;
    std::lock_guard lock(mutex_);
    const std::int64_t now = clock_();
    const std::int64_t epoch = now / half_window();
    std::string id = watch_key(tenant, key);
    auto it = keys_.find(id);
    if (it == keys_.end()) {
      if (keys_.size() >= static_cast<std::size_t>(config_.max_keys)) drop_least_seen(epoch);
      Watched w;
      w.tenant_name = std::string(tenant_name);
      w.adapter_id = adapter_id;
      w.key = std::string(key);
      w.epoch = epoch;
      it = keys_.emplace(std::move(id), std::move(w)).first;
      names_[std::string(tenant)] = std::string(tenant_name);
    }
    Watched& w = it->second;
    roll(w, epoch);
    const auto bin = static_cast<std::size_t>(std::clamp(score, 0.0f, 1.0f) * kBins);
    ++w.bins[0][std::min(bin, kBins - 1)];
    ++metrics_.sightings;
    const std::uint64_t seen = count(w);
    const float median = median_of(w);
    const bool low = seen >= static_cast<std::uint64_t>(config_.min_sightings) && median < config_.low_src;
    if (low && !w.flagged) {
      ++metrics_.low_src_turns;
      ClmEvent e;
      e.kind = ClmEvent::Kind::low_src;
      e.time_ms = now;
      e.tenant = w.tenant_name;
      e.adapter_id = w.adapter_id;
      e.key = w.key;
      e.sightings = seen;
      e.median_src = median;
      emit(std::move(e));
    }
    w.flagged = low;
  }

  // Names store tenant `tenant` `name` in the events that follow (a record
  // names its sequence's tenant before the store's events for it); an empty
  // name changes nothing.
  void name_tenant(std::string_view tenant, std::string_view name) {
    if (!config_.enabled || name.empty()) return;
    std::lock_guard lock(mutex_);
    auto it = names_.find(std::string(tenant));
    if (it == names_.end()) {
      names_.emplace(std::string(tenant), std::string(name));
    } else if (it->second != name) {
      it->second.assign(name);
    }
  }

  // What the store did. `salt` and `adapter_id`: the parts of the event's
  // store tenant (Engine::snapshot_tenant_parts); the tenant is named as its
  // sightings or records named it, else by name_of_salt(salt).
  void store_event(const SnapshotStoreEvent& se, std::string_view salt, std::int32_t adapter_id,
                   const std::function<std::string(std::string_view)>& name_of_salt) {
    if (!config_.enabled) return;
    std::lock_guard lock(mutex_);
    ++metrics_.store_events[static_cast<std::size_t>(se.kind)];
    ClmEvent e;
    e.kind = static_cast<ClmEvent::Kind>(static_cast<std::uint8_t>(se.kind));
    e.time_ms = clock_();
    e.adapter_id = adapter_id;
    const auto named = names_.find(std::string(se.tenant));
    e.tenant = named != names_.end() ? named->second : name_of_salt(salt);
    e.key = std::string(se.key);
    e.reason = std::string(se.reason);
    e.until_ms = se.until_ms;
    e.version = se.version;
    e.by_breaker = se.by_breaker;
    emit(std::move(e));
  }

  ClmAnomalyReport report() {
    std::lock_guard lock(mutex_);
    ClmAnomalyReport r;
    r.window_ms = config_.window_ms;
    r.min_sightings = config_.min_sightings;
    r.low_src = config_.low_src;
    const std::int64_t epoch = clock_() / half_window();
    for (auto& [id, w] : keys_) {
      roll(w, epoch);
      const std::uint64_t seen = count(w);
      const float median = median_of(w);
      if (seen < static_cast<std::uint64_t>(config_.min_sightings) || !(median < config_.low_src)) continue;
      r.low_src_keys.push_back({w.tenant_name, w.adapter_id, w.key, seen, median});
    }
    std::sort(r.low_src_keys.begin(), r.low_src_keys.end(), [](const LowSrcKey& a, const LowSrcKey& b) {
      return a.sightings != b.sightings ? a.sightings > b.sightings
                                        : std::tie(a.tenant, a.key) < std::tie(b.tenant, b.key);
    });
    r.events.assign(events_.begin(), events_.end());
    return r;
  }

  ClmWatchMetrics metrics() const {
    std::lock_guard lock(mutex_);
    ClmWatchMetrics m = metrics_;
    m.watched_keys = static_cast<std::int64_t>(keys_.size());
    for (const auto& [id, w] : keys_) m.low_src_keys += w.flagged ? 1 : 0;
    return m;
  }

 private:
  struct Watched {
    std::string tenant_name;
    std::int32_t adapter_id = 0;
    std::string key;
    std::int64_t epoch = 0;  // the half window bins[0] counts
    std::array<std::array<std::uint32_t, kBins>, 2> bins{};
    bool flagged = false;  // low-SRC as of its last sighting
  };

  std::int64_t half_window() const { return std::max<std::int64_t>(1, config_.window_ms / 2); }
  static std::string watch_key(std::string_view tenant, std::string_view key) {
    std::string id(tenant);
    id.push_back('\0');
    id.append(key);
    return id;
  }
  static void roll(Watched& w, std::int64_t epoch) {
    if (w.epoch == epoch) return;
    if (w.epoch + 1 == epoch) {
      w.bins[1] = w.bins[0];
    } else {
      w.bins[1] = {};
    }
    w.bins[0] = {};
    w.epoch = epoch;
  }
  static std::uint64_t count(const Watched& w) {
    std::uint64_t n = 0;
    for (std::size_t b = 0; b < kBins; ++b) n += std::uint64_t{w.bins[0][b]} + w.bins[1][b];
    return n;
  }
  // The midpoint of the bin holding the lower median.
  static float median_of(const Watched& w) {
    const std::uint64_t n = count(w);
    if (n == 0) return 0.0f;
    const std::uint64_t half = (n + 1) / 2;
    std::uint64_t cumulative = 0;
    for (std::size_t b = 0; b < kBins; ++b) {
      cumulative += std::uint64_t{w.bins[0][b]} + w.bins[1][b];
      if (cumulative >= half) return (static_cast<float>(b) + 0.5f) / static_cast<float>(kBins);
    }
    return 1.0f;
  }
  // A full watch gives up its least seen sixteenth at once (at least one
  // key), so that a stream of new keys scans the table once per max_keys / 16
  // of them, not once each.
  void drop_least_seen(std::int64_t epoch) {
    std::vector<std::pair<std::uint64_t, std::unordered_map<std::string, Watched>::iterator>> by_seen;
    by_seen.reserve(keys_.size());
    for (auto it = keys_.begin(); it != keys_.end(); ++it) {
      roll(it->second, epoch);
      by_seen.emplace_back(count(it->second), it);
    }
    const std::size_t drop = std::max<std::size_t>(1, by_seen.size() / 16);
    std::nth_element(by_seen.begin(), by_seen.begin() + static_cast<std::ptrdiff_t>(drop - 1), by_seen.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    for (std::size_t i = 0; i < drop; ++i) keys_.erase(by_seen[i].second);
  }
  void emit(ClmEvent e) {
    if (config_.on_line) config_.on_line(clm_event_json(e));
    if (config_.max_events == 0) return;
    if (events_.size() >= static_cast<std::size_t>(config_.max_events)) events_.pop_front();
    events_.push_back(std::move(e));
  }

  const ClmWatchConfig config_;
  Clock clock_ = &system_ms;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, Watched> keys_;       // store tenant \0 key
  std::unordered_map<std::string, std::string> names_;  // store tenant -> its name at its last new key or record
  std::deque<ClmEvent> events_;
  ClmWatchMetrics metrics_;
};

inline const char* clm_event_name(ClmEvent::Kind kind) {
  switch (kind) {
    case ClmEvent::Kind::blacklisted:
      return "blacklisted";
    case ClmEvent::Kind::unblacklisted:
      return "unblacklisted";
    case ClmEvent::Kind::version_created:
      return "version_created";
    case ClmEvent::Kind::drift:
      return "drift";
    case ClmEvent::Kind::low_src:
      return "low_src";
  }
  return "unknown";
}

inline std::string clm_event_json(const ClmEvent& e) {
  std::string j = fmt::format("{{\"time_ms\":{},\"event\":\"{}\",\"tenant\":", e.time_ms, clm_event_name(e.kind));
  detail::append_json_string(j, e.tenant);
  j += fmt::format(",\"adapter_id\":{},\"key\":", e.adapter_id);
  detail::append_json_string(j, e.key);
  switch (e.kind) {
    case ClmEvent::Kind::blacklisted:
      j += ",\"reason\":";
      detail::append_json_string(j, e.reason);
      j += fmt::format(",\"until_ms\":{},\"by\":\"{}\"", e.until_ms, e.by_breaker ? "breaker" : "administrator");
      break;
    case ClmEvent::Kind::version_created:
    case ClmEvent::Kind::drift:
      j += fmt::format(",\"version\":{}", e.version);
      break;
    case ClmEvent::Kind::low_src:
      j += fmt::format(",\"sightings\":{},\"median_src\":{}", e.sightings, e.median_src);
      break;
    case ClmEvent::Kind::unblacklisted:
      break;
  }
  j.push_back('}');
  return j;
}

}  // namespace clm
