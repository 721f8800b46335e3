// The Prometheus text of Engine::metrics_text (clm/metrics/metrics_text.hpp), read
// back by a parser of the exposition format written here: the format's rules
// (names, HELP and TYPE before samples, no family twice, float values,
// cumulative histogram buckets), the naming rules (clm_ prefix, _total on
// counters only), and every value against the EngineMetrics field it names,
// after random traffic with evictions, with a host tier and storage, and with
// a snapshot store.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "clm/engine.hpp"
#include "clm/metrics/metrics_text.hpp"
#include "store/store_test_support.hpp"  // TempDir, random_unit
#include "test_random.hpp"

using clm::Engine;
using clm::EngineMetrics;
using clm_test::random_tokens;
using Tokens = std::vector<std::int32_t>;

namespace {

// ---- the parser ---------------------------------------------------------------

// One scrape. Series are keyed by name plus their labels as written, sorted
// (`clm_x{a="1",b="2"}`).
struct Scrape {
  std::map<std::string, std::string> types;  // family -> counter | gauge | histogram
  std::map<std::string, double> series;
  std::map<std::string, std::string> family_of;  // series -> family
  // Histogram family -> its buckets in order: (le, cumulative count).
  std::map<std::string, std::vector<std::pair<double, double>>> buckets;
};

bool parse_value(const std::string& s, double& out) {
  static const std::regex kFloat(R"([-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?)");
  if (s == "+Inf" || s == "-Inf" || s == "NaN") {
    out = s == "NaN" ? std::nan("") : (s[0] == '+' ? HUGE_VAL : -HUGE_VAL);
    return true;
  }
  if (!std::regex_match(s, kFloat)) return false;
  out = std::strtod(s.c_str(), nullptr);
  return true;
}

bool ends_with(const std::string& s, std::string_view tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Reads `text` into `out`; returns what is wrong with it ("" when nothing).
std::string parse(const std::string& text, Scrape& out) {
  static const std::regex kHelp(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) (\S.*))");
  static const std::regex kType(R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (\S+))");
  static const std::regex kSample(R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+))");
  static const std::regex kLabel(R"(([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)\"(,|$))");
  out = Scrape{};
  if (text.empty() || text.back() != '\n') return "the text does not end with a newline";
  std::string family;  // the family whose samples may follow
  bool typed = false;  // ... and whether its TYPE was given
  std::set<std::string> with_samples;
  std::size_t begin = 0;
  for (int line_no = 1; begin < text.size(); ++line_no) {
    const std::size_t end = text.find('\n', begin);
    const std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    const std::string where = fmt::format("line {} \"{}\": ", line_no, line);
    std::smatch m;
    if (std::regex_match(line, m, kHelp)) {
      if (out.types.count(m[1]) || m[1] == family) return where + "a family declared twice";
      if (!family.empty() && !with_samples.count(family)) return where + "the previous family has no sample";
      family = m[1];
      typed = false;
      continue;
    }
    if (std::regex_match(line, m, kType)) {
      if (m[1] != family || typed) return where + "TYPE without its HELP just before";
      const std::string type = m[2];
      if (type != "counter" && type != "gauge" && type != "histogram") return where + "an unknown type";
      if (family.rfind("clm_", 0) != 0) return where + "a name without the clm_ prefix";
      if ((type == "counter") != ends_with(family, "_total")) return where + "_total on other than a counter";
      out.types[family] = type;
      typed = true;
      continue;
    }
    if (!std::regex_match(line, m, kSample)) return where + "neither HELP, TYPE nor a sample";
    if (family.empty() || !typed) return where + "a sample before its family's HELP and TYPE";
    const std::string name = m[1], type = out.types[family];
    const std::string suffix = name.substr(std::min(name.size(), family.size()));
    if (name.compare(0, family.size(), family) != 0 ||
        !(suffix.empty() ? type != "histogram"
                         : type == "histogram" && (suffix == "_bucket" || suffix == "_sum" || suffix == "_count"))) {
      return where + fmt::format("a sample outside its family {}", family);
    }
    std::map<std::string, std::string> labels;
    std::string rest = m[3];
    for (std::smatch l; !rest.empty(); rest = l.suffix()) {
      if (!std::regex_search(rest, l, kLabel, std::regex_constants::match_continuous)) return where + "bad labels";
      if (!labels.emplace(l[1], l[2]).second) return where + "a label given twice";
    }
    double value = 0;
    if (!parse_value(m[4], value)) return where + "a value that is not a float";
    std::string key = name;
    for (const auto& [label, v] : labels) key += fmt::format("{}{}=\"{}\"", key == name ? "{" : ",", label, v);
    if (!labels.empty()) key += "}";
    if (!out.series.emplace(key, value).second) return where + "a series given twice";
    out.family_of[key] = family;
    with_samples.insert(family);
    if (type == "counter" && !(value >= 0)) return where + "a negative counter";
    if (suffix == "_bucket") {
      double le = 0;
      if (!labels.count("le") || !parse_value(labels["le"], le)) return where + "a bucket without a float le";
      out.buckets[family].emplace_back(le, value);
    }
  }
  if (!family.empty() && !with_samples.count(family)) return "the last family has no sample";
  for (const auto& [name, type] : out.types) {
    if (type != "histogram") continue;
    const auto& b = out.buckets[name];
    if (b.empty() || b.back().first != HUGE_VAL) return name + ": no +Inf bucket";
    for (std::size_t i = 1; i < b.size(); ++i) {
      if (!(b[i].first > b[i - 1].first)) return name + ": bucket bounds not increasing";
      if (b[i].second < b[i - 1].second) return name + ": buckets not cumulative";
    }
    if (!out.series.count(name + "_sum") || !out.series.count(name + "_count")) return name + ": no _sum or _count";
    if (b.back().second != out.series[name + "_count"]) return name + ": +Inf bucket != _count";
  }
  return "";
}

Scrape parsed(const std::string& text) {
  Scrape s;
  const std::string problem = parse(text, s);
  INFO(text);
  INFO(problem);
  REQUIRE(problem.empty());
  return s;
}

// ---- the reference: each series and the EngineMetrics field it shows ---------

std::map<std::string, double> reference(const EngineMetrics& m) {
  std::map<std::string, double> e;
  const auto& c = m.cache;
  const auto& t = m.tiers;
  const auto& s = m.src;
  const auto& st = m.store;
  const auto& io = m.tiers.storage;
  auto put = [&](const std::string& series, auto value) { e[series] = static_cast<double>(value); };
  put(R"(clm_component_enabled{component="snapshot_store"})", m.has_snapshot_store);
  put(R"(clm_component_enabled{component="host_tier"})", m.has_tiers);
  put(R"(clm_component_enabled{component="storage_tier"})", t.has_storage);
  // Prefix cache (tokens, as vLLM counts).
  put("clm_prefix_cache_queries_total", c.tokens_queried);
  put("clm_prefix_cache_hits_total", c.tokens_hit + t.host_hit_tokens + t.storage_hit_tokens);
  put(R"(clm_cached_tokens_total{source="device"})", c.tokens_hit);
  put(R"(clm_cached_tokens_total{source="host"})", t.host_hit_tokens);
  put(R"(clm_cached_tokens_total{source="storage"})", t.storage_hit_tokens);
  put("clm_prefix_cache_lookups_total", c.match_calls);
  put("clm_inserted_tokens_total", c.inserted_tokens);
  put("clm_evicted_tokens_total", c.evicted_tokens);
  put("clm_evictions_total", c.evictions);
  put("clm_eviction_duration_seconds_sum", m.eviction_duration.sum_seconds);
  put("clm_eviction_duration_seconds_count", m.eviction_duration.count());
  put("clm_prefix_diverged_lookups_total", c.diverged_matches);
  const auto& w = m.clm_watch;
  put("clm_snapshot_src_sightings_total", w.sightings);
  put("clm_snapshot_watched_keys", w.watched_keys);
  put("clm_snapshot_low_src_keys", w.low_src_keys);
  put("clm_snapshot_low_src_turns_total", w.low_src_turns);
  put(R"(clm_snapshot_key_events_total{event="blacklisted"})", w.store_events[0]);
  put(R"(clm_snapshot_key_events_total{event="unblacklisted"})", w.store_events[1]);
  put(R"(clm_snapshot_key_events_total{event="version_created"})", w.store_events[2]);
  put(R"(clm_snapshot_key_events_total{event="drift"})", w.store_events[3]);
  put("clm_prefix_match_depth_tokens_sum", c.match_depth.sum_tokens);
  put("clm_prefix_match_depth_tokens_count",
      std::accumulate(c.match_depth.counts.begin(), c.match_depth.counts.end(), std::uint64_t{0}));
  put("clm_prefix_cache_tokens", c.cached_tokens);
  put("clm_evictable_tokens", c.evictable_tokens);
  put("clm_protected_tokens", c.protected_tokens);
  put("clm_prefix_cache_nodes", c.nodes);
  put("clm_prefix_cache_namespaces", c.namespaces);
  put("clm_prefix_cache_metadata_bytes", c.metadata_bytes);
  put(R"(clm_kv_pool_pages{state="used"})", c.pages_used);
  put(R"(clm_kv_pool_pages{state="free"})", c.pages_free);
  // Sequences.
  put("clm_sequences_admitted_total", m.admitted);
  put("clm_sequences_finished_total", m.finished);
  put("clm_sequences_aborted_total", m.aborted);
  put("clm_admissions_rejected_total", m.rejected);
  put("clm_active_sequences", m.active_sequences);
  put("clm_pins_active", m.pins_active);
  put("clm_pinned_pages", m.pinned_pages);
  put("clm_pin_budget_pages", m.pin_budget_pages);
  put(R"(clm_pins_total{event="created"})", m.pins_created);
  put(R"(clm_pins_total{event="refused"})", m.pins_refused);
  put(R"(clm_pins_total{event="expired"})", m.pins_expired);
  put(R"(clm_pins_total{event="refreshed"})", m.pins_refreshed);
  put("clm_priority_hints_active", m.priority_hints_active);
  put(R"(clm_priority_hints_total{event="created"})", m.priority_hints_created);
  put(R"(clm_priority_hints_total{event="replaced"})", m.priority_hints_replaced);
  put(R"(clm_priority_hints_total{event="expired"})", m.priority_hints_expired);
  // SRC head.
  put("clm_src_threshold", s.threshold);
  put("clm_src_scored_steps_total", s.steps);
  put("clm_src_unscored_steps_total", s.unscored_steps);
  put("clm_src_reuse_decisions_total", s.reuse_decisions);
  put(R"(clm_src_retrievals_total{result="found"})", s.retrievals_found);
  put(R"(clm_src_retrievals_total{result="failed"})", s.retrievals_failed);
  put("clm_src_breaker_trips_total", s.breaker_trips);
  put("clm_src_injections_total", s.injections);
  put("clm_src_baseline_sequences", s.baseline_sequences);
  put("clm_src_tracked_sequences", s.tracked_sequences);
  // Snapshot store.
  put(R"(clm_snapshot_lookups_total{level="exact"})", st.hits_exact);
  put(R"(clm_snapshot_lookups_total{level="ann"})", st.hits_ann);
  put(R"(clm_snapshot_lookups_total{level="fallback"})", st.hits_fallback);
  put(R"(clm_snapshot_lookups_total{level="miss"})", st.misses);
  put("clm_snapshot_busy_misses_total", st.busy_misses);
  put("clm_snapshot_blacklisted_skips_total", st.blacklisted_skips);
  put("clm_snapshot_blocked_pair_skips_total", st.blocked_pair_skips);
  put("clm_snapshot_ann_unavailable_total", st.ann_unavailable);
  put("clm_snapshot_records_total", st.records);
  put("clm_snapshot_counted_records_total", st.counted);
  put("clm_snapshot_abstained_records_total", st.abstained);
  put("clm_snapshot_admissions_total", st.admissions);
  put("clm_snapshot_confirmations_total", st.confirmations);
  put("clm_snapshot_versions_total", st.versions);
  put("clm_snapshot_drift_versions_total", st.drift_versions);
  put("clm_snapshot_versions_dropped_total", st.versions_dropped);
  put("clm_snapshot_evictions_total", st.evictions);
  put("clm_snapshot_corrupt_skipped_total", st.corrupt_skipped);
  put("clm_snapshot_index_rebuilds_total", st.index_rebuilds);
  put("clm_snapshot_outcome_reports_total", st.outcome_reports);
  put("clm_stored_snapshots", st.snapshots);
  put("clm_blacklisted_keys", st.blacklisted_keys);
  put("clm_blocked_snapshot_pairs", st.blocked_pairs);
  // Tiers.
  put(R"(clm_host_tier_pages{state="used"})", c.host_pages_used);
  put(R"(clm_host_tier_pages{state="free"})", c.host_pages_free);
  put("clm_host_tier_cached_tokens", c.host_cached_tokens);
  put("clm_host_tier_matched_tokens_total", c.host_tokens_hit);
  put("clm_host_tier_evicted_tokens_total", c.host_evicted_tokens);
  put("clm_host_tier_backed_up_tokens_total", c.backed_up_tokens);
  put("clm_host_tier_backed_up_pages_total", t.backed_up_pages);
  put("clm_host_tier_load_backs_total", t.load_backs);
  put("clm_host_tier_loaded_pages_total", t.loaded_pages);
  put("clm_host_tier_dropped_backups_total", t.dropped_backups);
  put("clm_storage_stored_pages_total", t.stored_pages);
  put("clm_storage_fetched_pages_total", t.fetched_pages);
  put("clm_storage_prefetch_timeouts_total", t.prefetch_timeouts);
  put("clm_storage_errors_total", t.storage_errors);
  put("clm_storage_dropped_fetches_total", t.dropped_fetches);
  put("clm_storage_merged_fetches_total", t.merged_fetches);
  put("clm_storage_queued_fetches", t.queued_fetches);
  put("clm_storage_breaker_trips_total", t.breaker_trips);
  put("clm_storage_breaker_skips_total", t.breaker_skips);
  put("clm_storage_breaker_state", t.breaker_state);
  put("clm_storage_backend_read_pages_total", io.pages_read);
  put("clm_storage_backend_written_pages_total", io.pages_written);
  put("clm_storage_backend_checked_pages_total", io.pages_checked);
  put("clm_storage_backend_missing_pages_total", io.pages_missing);
  put("clm_storage_backend_corrupt_pages_total", io.corrupt_pages);
  put("clm_storage_backend_foreign_model_pages_total", io.foreign_model_pages);
  put("clm_storage_backend_unsigned_pages_total", io.unsigned_pages);
  put("clm_storage_backend_forged_pages_total", io.forged_pages);
  put("clm_storage_backend_repaired_pages_total", io.repaired_pages);
  put("clm_tier_worker_failures_total", t.worker_failures);
  put("clm_storage_backend_dropped_writes_total", io.dropped_writes);
  put("clm_storage_backend_evicted_pages_total", io.evicted_pages);
  put("clm_storage_backend_errors_total", io.errors);
  put("clm_storage_backend_read_bytes_total", io.bytes_read);
  put("clm_storage_backend_written_bytes_total", io.bytes_written);
  // KV events.
  const auto& k = m.kv_events;
  put(R"(clm_component_enabled{component="kv_events"})", k.enabled);
  put("clm_kv_events_recorded_total", k.recorded_events);
  put("clm_kv_events_published_total", k.published_events);
  put("clm_kv_event_batches_published_total", k.published_batches);
  put("clm_kv_events_dropped_total", k.dropped_events);
  put("clm_kv_event_resyncs_total", k.resyncs);
  put("clm_kv_event_replay_requests_total", k.replay_requests);
  put("clm_kv_event_replay_refused_total", k.replay_refused);
  put("clm_kv_event_send_failures_total", k.send_failures);
  put("clm_kv_events_queued", k.queued_events);
  return e;
}

// Every series of `s` is the field the reference names, and the buckets are
// the histogram's, cumulated.
void check_against(const Scrape& s, const EngineMetrics& m) {
  const std::map<std::string, double> want = reference(m);
  std::map<std::string, double> got;
  for (const auto& [key, value] : s.series) {
    if (key.rfind("clm_eviction_duration_seconds_bucket", 0) != 0 &&
        key.rfind("clm_prefix_match_depth_tokens_bucket", 0) != 0) {
      got[key] = value;
    }
  }
  for (const auto& [key, value] : want) {
    INFO(key);
    REQUIRE(got.count(key) == 1);
    CHECK(got.at(key) == value);
  }
  for (const auto& [key, value] : got) {
    INFO(key);
    CHECK(want.count(key) == 1);  // nothing the reference does not know
  }
  const auto& b = s.buckets.at("clm_eviction_duration_seconds");
  const clm::DurationHistogram& h = m.eviction_duration;
  REQUIRE(b.size() == h.kBounds.size() + 1);
  double cumulative = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    cumulative += static_cast<double>(h.counts[i]);
    CHECK(b[i].first == (i < h.kBounds.size() ? h.kBounds[i] : HUGE_VAL));
    CHECK(b[i].second == cumulative);
  }
  // Match depths: bounds 0, 16, 32, ..., 2^20 tokens, then +Inf.
  const auto& d = s.buckets.at("clm_prefix_match_depth_tokens");
  REQUIRE(d.size() == 19);
  cumulative = 0;
  for (std::size_t i = 0; i < d.size(); ++i) {
    cumulative += static_cast<double>(m.cache.match_depth.counts[i]);
    CHECK(d[i].first == (i == 0 ? 0.0 : i < 18 ? std::ldexp(1.0, static_cast<int>(i) + 3) : HUGE_VAL));
    CHECK(d[i].second == cumulative);
  }
}

// What must hold between the series whatever the traffic.
void check_consistent(Scrape& s) {
  CHECK(s.series[R"(clm_cached_tokens_total{source="device"})"] +
            s.series[R"(clm_cached_tokens_total{source="host"})"] +
            s.series[R"(clm_cached_tokens_total{source="storage"})"] ==
        s.series["clm_prefix_cache_hits_total"]);
  CHECK(s.series["clm_prefix_cache_hits_total"] <= s.series["clm_prefix_cache_queries_total"]);
  CHECK(s.series["clm_evictable_tokens"] + s.series["clm_protected_tokens"] == s.series["clm_prefix_cache_tokens"]);
}

// Counters and histograms never go down from `before` to `after`.
void check_monotonic(const Scrape& before, const Scrape& after) {
  for (const auto& [key, value] : before.series) {
    const std::string& type = before.types.at(before.family_of.at(key));
    if (type == "gauge") continue;
    INFO(key);
    REQUIRE(after.series.count(key) == 1);
    CHECK(after.series.at(key) >= value);
  }
}

// ---- traffic ------------------------------------------------------------------

constexpr std::int32_t kVocab = 1000;  // few ids: conversations share prefixes

// A host's random mix: conversations over two system prompts and two tenants
// admitted, extended, finished (the next turn goes on from there) or aborted,
// on a pool small enough that admissions evict, and some are refused.
class Traffic {
 public:
  Traffic(Engine& engine, std::uint32_t seed) : engine_(engine), rng_(seed) {
    const Tokens systems[2] = {random_tokens(rng_, 24, kVocab), random_tokens(rng_, 24, kVocab)};
    for (int c = 0; c < 8; ++c) histories_.push_back(systems[c % 2]);
  }

  void run(int steps) {
    for (int i = 0; i < steps; ++i) {
      const auto action = rng_() % 10;
      if (running_.size() < 3 && action < 4) {
        admit();
      } else if (!running_.empty() && action < 7) {
        extend();
      } else if (!running_.empty()) {
        end(action < 9);
      }
    }
  }

  void end_all() {
    while (!running_.empty()) end(true);
  }

 private:
  struct Running {
    clm::SequenceId seq;
    std::size_t conversation;
    Tokens tokens;
  };

  void admit() {
    const std::size_t c = rng_() % histories_.size();
    if (histories_[c].size() > 80) histories_[c].resize(24);  // a new conversation on the same system prompt
    Tokens prompt = histories_[c];
    const Tokens user = random_tokens(rng_, 1 + rng_() % 12, kVocab);
    prompt.insert(prompt.end(), user.begin(), user.end());
    clm::Admission a;
    const clm::Status s = engine_.admit(prompt, {.cache_salt = c % 4 < 2 ? "tenant-a" : "tenant-b"}, a);
    INFO(s.message());
    REQUIRE((s.ok() || s.code() == clm::StatusCode::out_of_memory));
    if (s.ok()) running_.push_back({a.seq, c, std::move(prompt)});
  }

  void extend() {
    Running& r = running_[rng_() % running_.size()];
    const Tokens more = random_tokens(rng_, 1 + rng_() % 8, kVocab);
    std::vector<std::int64_t> slots;
    const clm::Status s = engine_.extend(r.seq, more, slots);
    INFO(s.message());
    REQUIRE((s.ok() || s.code() == clm::StatusCode::out_of_memory));
    if (s.ok()) r.tokens.insert(r.tokens.end(), more.begin(), more.end());
  }

  void end(bool finish) {
    const std::size_t i = rng_() % running_.size();
    const Running r = running_[i];
    running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
    if (finish) {
      REQUIRE(engine_.finish(r.seq).ok());
      histories_[r.conversation] = r.tokens;
    } else {
      REQUIRE(engine_.abort(r.seq).ok());
    }
  }

  Engine& engine_;
  std::mt19937 rng_;
  std::vector<Tokens> histories_;
  std::vector<Running> running_;
};

clm::EngineConfig small_config() {
  clm::EngineConfig config;
  config.pool.num_pages = 64;  // 256 tokens: a few conversations, then evictions
  config.pool.page_size = 4;
  config.pool.memory = clm::MemoryKind::none;
  return config;
}

std::unique_ptr<Engine> make_engine(const clm::EngineConfig& config) {
  std::unique_ptr<Engine> engine;
  const clm::Status s = Engine::create(config, engine);
  INFO(s.message());
  REQUIRE(s.ok());
  return engine;
}

// Two scrapes around more traffic: each parses, matches the metrics it was
// made of, is consistent, and nothing counted went down between them.
void scrape_twice(Engine& engine, Traffic& traffic) {
  traffic.run(300);
  engine.wait_for_tiers();
  const EngineMetrics first_metrics = engine.metrics();
  Scrape first = parsed(clm::format_metrics_text(first_metrics));
  check_against(first, first_metrics);
  check_consistent(first);

  traffic.run(300);
  traffic.end_all();
  engine.wait_for_tiers();
  if (engine.metrics().kv_events.enabled) REQUIRE(engine.flush_kv_events(std::chrono::seconds(10)).ok());
  // Quiet now: the Engine's own text is that of its metrics.
  const EngineMetrics second_metrics = engine.metrics();
  const std::string text = engine.metrics_text();
  CHECK(text == clm::format_metrics_text(second_metrics));
  Scrape second = parsed(text);
  check_against(second, second_metrics);
  check_consistent(second);
  check_monotonic(first, second);
  REQUIRE(engine.check_invariants().ok());

  // The traffic did what the test is about.
  CHECK(second_metrics.cache.tokens_hit > 0);
  CHECK(second_metrics.cache.evictions > 0);
  CHECK(second_metrics.eviction_duration.count() > 0);
  CHECK(second_metrics.eviction_duration.sum_seconds > 0);
}

}  // namespace

TEST_CASE("metrics text: the names the ecosystem uses are all there", "[metrics]") {
  auto engine = make_engine(small_config());
  const Scrape s = parsed(engine->metrics_text());
  for (const char* family :
       {"clm_prefix_cache_queries_total", "clm_prefix_cache_hits_total", "clm_cached_tokens_total",
        "clm_evictable_tokens", "clm_protected_tokens", "clm_evicted_tokens_total", "clm_eviction_duration_seconds",
        "clm_snapshot_lookups_total", "clm_src_breaker_trips_total", "clm_blacklisted_keys"}) {
    INFO(family);
    CHECK(s.types.count(family) == 1);
  }
  CHECK(s.types.at("clm_eviction_duration_seconds") == "histogram");
  for (const char* source : {"device", "host", "storage"}) {
    CHECK(s.series.count(fmt::format("clm_cached_tokens_total{{source=\"{}\"}}", source)) == 1);
  }
  for (const char* level : {"exact", "ann", "fallback", "miss"}) {
    CHECK(s.series.count(fmt::format("clm_snapshot_lookups_total{{level=\"{}\"}}", level)) == 1);
  }
  // A fresh engine: every value is its (mostly zero) field.
  check_against(s, engine->metrics());
  CHECK(s.series.at(R"(clm_kv_pool_pages{state="free"})") == 64);
}

TEST_CASE("metrics text: random traffic with evictions, every value is its field", "[metrics]") {
  const std::uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  for (clm::EvictionPolicy policy : {clm::EvictionPolicy::lru, clm::EvictionPolicy::slru}) {
    clm::EngineConfig config = small_config();
    config.eviction_policy = policy;
    auto engine = make_engine(config);
    Traffic traffic(*engine, seed);
    scrape_twice(*engine, traffic);
    CHECK(engine->metrics().rejected + engine->metrics().aborted > 0);
  }
}

TEST_CASE("metrics text: with a host tier and storage, hits by source add up", "[metrics][tiers]") {
  const std::uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  clm_test::TempDir dir;
  clm::EngineConfig config = small_config();
  config.pool.memory = clm::MemoryKind::host;  // the tiers copy KV bytes
  config.pool.num_layers = 2;
  config.pool.kv_heads = 1;
  config.pool.head_dim = 8;
  config.pool.dtype = clm::KvDType::f32;
  config.tiers.host_pages = 32;
  config.tiers.storage_url = "file://" + dir.str();
  config.model_id = "test-model";  // storage pages are one model's
  config.tiers.prefetch_policy = clm::PrefetchPolicy::wait_complete;
  config.kv_events.enabled = true;  // and its KV events, published to a socket no one reads
  config.kv_events.endpoint = "tcp://127.0.0.1:*";
  auto engine = make_engine(config);
  Traffic traffic(*engine, seed);
  scrape_twice(*engine, traffic);
  const EngineMetrics m = engine->metrics();
  CHECK(m.tiers.host_hit_tokens + m.tiers.storage_hit_tokens > 0);
  CHECK(m.kv_events.published_events > 0);
  CHECK(m.kv_events.published_events == m.kv_events.recorded_events);  // flushed, none dropped
  const Scrape s = parsed(engine->metrics_text());
  CHECK(s.series.at(R"(clm_component_enabled{component="storage_tier"})") == 1);
  CHECK(s.series.at(R"(clm_component_enabled{component="kv_events"})") == 1);
  CHECK(s.series.at(R"(clm_host_tier_pages{state="used"})") + s.series.at(R"(clm_host_tier_pages{state="free"})") ==
        32);
}

TEST_CASE("metrics text: snapshot lookups by level and the SRC breaker's counts", "[metrics][store]") {
  const std::uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  constexpr int kDim = 8;
  clm::EngineConfig config = small_config();
  config.snapshot_store.path = ":memory:";
  config.snapshot_store.num_shards = 1;
  config.snapshot_store.snapshot_dim = kDim;
  config.snapshot_store.min_usage_threshold = 1;
  config.snapshot_store.lookup_timeout_us = 2'000'000;
  auto engine = make_engine(config);
  std::vector<clm::SequenceId> ids;
  for (const char* tenant : {"a", "b"}) {
    clm::Admission a;
    REQUIRE(engine->admit(Tokens{1, 2, 3, 4, 5}, {.cache_salt = tenant}, a).ok());
    ids.push_back(a.seq);
  }
  const clm::SuffixRef key{.text = "ORDER-1", .is_key = true, .group = "orders"};
  clm::RecordOutcome outcome;
  REQUIRE(engine->record_snapshot(ids[0], key, clm_test::random_unit(rng, kDim), outcome).ok());
  const int rounds = 1 + static_cast<int>(rng() % 4);
  for (int round = 0; round < rounds; ++round) {
    const clm::SuffixRef suffixes[] = {key, key};
    clm::SnapshotHit hits[2];
    std::vector<float> snapshots(2 * kDim);
    std::uint8_t apply[2];
    REQUIRE(engine->lookup_snapshots(ids, suffixes, {}, hits, snapshots, apply).ok());
    REQUIRE(hits[0].level == clm::SnapshotLevel::exact);  // b is another tenant: a miss
    REQUIRE(hits[1].level == clm::SnapshotLevel::miss);
  }
  const EngineMetrics m = engine->metrics();
  const Scrape s = parsed(engine->metrics_text());
  check_against(s, m);
  CHECK(s.series.at(R"(clm_snapshot_lookups_total{level="exact"})") == rounds);
  CHECK(s.series.at(R"(clm_snapshot_lookups_total{level="miss"})") == rounds);
  CHECK(s.series.at(R"(clm_src_retrievals_total{result="found"})") == rounds);
  CHECK(s.series.at(R"(clm_stored_snapshots)") == 1);
  CHECK(s.series.at(R"(clm_component_enabled{component="snapshot_store"})") == 1);
  double levels = 0;
  for (const char* level : {"exact", "ann", "fallback", "miss"}) {
    levels += s.series.at(fmt::format("clm_snapshot_lookups_total{{level=\"{}\"}}", level));
  }
  CHECK(levels == static_cast<double>(m.store.lookups));
}

TEST_CASE("metrics text: eviction buckets are inclusive upper bounds", "[metrics]") {
  clm::DurationHistogram h;
  for (double seconds : {0.0, 1e-7, 1.5e-7, 2e-7, 0.1, 0.2, 7.0}) h.record(seconds);
  CHECK(h.counts[0] == 2);                     // 0 and 1e-7: le="1e-07"
  CHECK(h.counts[1] == 2);                     // 1.5e-7 and 2e-7
  CHECK(h.counts[h.kBounds.size() - 1] == 1);  // 0.1
  CHECK(h.counts.back() == 2);                 // +Inf
  CHECK(h.count() == 7);
  CHECK(h.sum_seconds == Approx(7.30000045));
  EngineMetrics m;
  m.eviction_duration = h;
  const Scrape s = parsed(clm::format_metrics_text(m));
  check_against(s, m);
  CHECK(s.series.at(R"(clm_eviction_duration_seconds_bucket{le="1e-07"})") == 2);
  CHECK(s.series.at(R"(clm_eviction_duration_seconds_bucket{le="+Inf"})") == 7);
}

TEST_CASE("metrics text: the test's parser refuses what breaks the format", "[metrics]") {
  const std::string ok = "# HELP clm_a_total A.\n# TYPE clm_a_total counter\nclm_a_total{x=\"1\"} 3\n";
  Scrape s;
  REQUIRE(parse(ok, s).empty());
  CHECK(s.series.at(R"(clm_a_total{x="1"})") == 3);
  REQUIRE(parse("# HELP clm_1a A.\n# TYPE clm_1a gauge\nclm_1a 1.5e-3\n", s).empty());
  CHECK(s.series.at("clm_1a") == 1.5e-3);
  const std::string h = "# HELP clm_h_seconds H.\n# TYPE clm_h_seconds histogram\n";
  const std::vector<std::string> bad = {
      "clm_a_total 3\n",                                                          // no HELP and TYPE
      ok + ok,                                                                    // a family twice
      ok.substr(0, ok.size() - 1),                                                // no final newline
      "# HELP clm_a_total A.\n# TYPE clm_a_total counter\nclm_a_total x\n",       // not a float
      "# HELP clm_a_total A.\nclm_a_total 1\n",                                   // no TYPE
      "# HELP clm_a A.\n# TYPE clm_a counter\nclm_a 1\n",                         // a counter without _total
      "# HELP clm_a_total A.\n# TYPE clm_a_total gauge\nclm_a_total 1\n",         // a gauge with it
      "# HELP a_total A.\n# TYPE a_total counter\na_total 1\n",                   // no clm_ prefix
      "# HELP clm_1 A.\n# TYPE clm_1 gauge\n1clm 1\n",                            // a name starting with a digit
      "# HELP clm_a_total A.\n# TYPE clm_a_total counter\nclm_b_total 1\n",       // outside its family
      "# HELP clm_a_total A.\n# TYPE clm_a_total counter\nclm_a_total -1\n",      // a counter below 0
      "# HELP clm_a_total A.\n# TYPE clm_a_total counter\nclm_a_total{x=1} 1\n",  // an unquoted label
      h + "clm_h_seconds_bucket{le=\"1\"} 2\nclm_h_seconds_bucket{le=\"+Inf\"} 1\n"
          "clm_h_seconds_sum 1\nclm_h_seconds_count 1\n",  // not cumulative
      h + "clm_h_seconds_bucket{le=\"1\"} 1\nclm_h_seconds_bucket{le=\"+Inf\"} 2\n"
          "clm_h_seconds_sum 1\nclm_h_seconds_count 3\n",                                    // +Inf != _count
      h + "clm_h_seconds_bucket{le=\"1\"} 1\nclm_h_seconds_sum 1\nclm_h_seconds_count 1\n",  // no +Inf
  };
  for (const std::string& text : bad) {
    INFO(text);
    CHECK_FALSE(parse(text, s).empty());
  }
}
