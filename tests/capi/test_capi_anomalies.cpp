// The C ABI of CLM anomalies (clm_engine_clm_anomalies, the report's
// accessors, the engine options' watch settings and line callback, the
// metrics), as a host sees it: low-SRC keys against a naive model that keeps
// every sighting and takes exact medians, on fresh random traffic of named and
// unnamed tenants; the store's events in order with their fields and JSON
// lines; older struct versions; bad input.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "capi_engine.hpp"

namespace {

constexpr int32_t kDim = 8, kHidden = 8;

struct ReportFree {
  void operator()(clm_anomaly_report* r) const { clm_anomaly_report_free(r); }
};
using ReportPtr = std::unique_ptr<clm_anomaly_report, ReportFree>;

ReportPtr take_report(const clm_engine* e) {
  clm_anomaly_report* r = nullptr;
  REQUIRE_OK(clm_engine_clm_anomalies(&r, e));
  REQUIRE(r != nullptr);
  return ReportPtr(r);
}

clm_low_src_key low_key(const clm_anomaly_report* r, size_t i) {
  clm_low_src_key k;
  std::memset(&k, 0xAB, sizeof k);
  k.struct_size = sizeof k;
  REQUIRE_OK(clm_anomaly_report_low_src_key(&k, r, i));
  return k;
}

clm_watch_event event(const clm_anomaly_report* r, size_t i) {
  clm_watch_event e;
  std::memset(&e, 0xAB, sizeof e);
  e.struct_size = sizeof e;
  REQUIRE_OK(clm_anomaly_report_event(&e, r, i));
  return e;
}

std::string event_json(const clm_anomaly_report* r, size_t i) {
  size_t len = 0;
  CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_anomaly_report_event_json(nullptr, 0, &len, r, i));  // sizing call
  std::string line(len + 1, '\0');
  size_t again = 0;
  REQUIRE_OK(clm_anomaly_report_event_json(line.data(), line.size(), &again, r, i));
  CHECK(again == len);
  line.resize(len);
  return line;
}

std::string str(const char* p, size_t n) { return std::string(p, n); }

// The callback's lines, as a host keeps them.
struct Lines {
  std::vector<std::string> lines;
  static void on_line(const char* line, size_t len, void* data) {
    CHECK(line[len] == '\0');
    static_cast<Lines*>(data)->lines.emplace_back(line, len);
  }
};

clm_engine_options watched_options(Lines* lines, int64_t min_sightings = 10) {
  clm_engine_options o = engine_options(4096, 4);
  o.snapshot_store_path = ":memory:";
  o.snapshot_store_shards = 2;
  o.snapshot_dim = kDim;
  o.snapshot_min_usage = 1;
  o.snapshot_lookup_timeout_us = 2'000'000;
  o.src_threshold = 0.0f;  // every step looks up
  o.clm_watch_min_sightings = min_sightings;
  o.clm_watch_callback = lines ? &Lines::on_line : nullptr;
  o.clm_watch_callback_data = lines;
  return o;
}

// A head whose score is sigmoid(b2) whatever the rows: w1 and w2 zero.
void set_constant_head(clm_engine* e, float score) {
  const std::vector<float> w1(kHidden / 4 * kHidden, 0.0f), b1(kHidden / 4, 0.0f), w2(kHidden / 4, 0.0f);
  REQUIRE_OK(clm_engine_set_src_head(e, kHidden, w1.data(), b1.data(), w2.data(), std::log(score / (1.0f - score)),
                                     CLM_GELU_TANH));
}

// The options point into salt and tenant: they must outlive them.
clm_admit_options tenant_options(const std::string& salt, const std::string& tenant) {
  clm_admit_options a = admit_options();
  a.cache_salt = salt.data();
  a.cache_salt_len = salt.size();
  a.tenant = tenant.empty() ? nullptr : tenant.data();
  a.tenant_len = tenant.size();
  return a;
}

void lookup(clm_engine* e, clm_seq* seq, const std::string& key) {
  clm_snapshot_hit hit;
  std::vector<float> snapshot(kDim);
  uint8_t apply = 0;
  clm_seq* seqs[] = {seq};
  const char* suffixes[] = {key.data()};
  const size_t lens[] = {key.size()};
  REQUIRE_OK(clm_engine_lookup_snapshots(&hit, snapshot.data(), snapshot.size(), &apply, e, seqs, 1, suffixes, lens,
                                         nullptr, nullptr, CLM_SUFFIX_KEY, nullptr, 0));
}

// A sequence scored once by a head of `score`, then looking `key` up `times` times.
void scored_sequence(clm_engine* e, const clm_admit_options& a, float score, const std::string& key, int times) {
  SeqPtr s = admit(e, {11, 12, 13, 14, 15}, &a);
  set_constant_head(e, score);
  const std::vector<float> row(kHidden, 0.5f);
  const int32_t token = 42, indptr[] = {0, 1};
  clm_seq* seqs[] = {s.get()};
  clm_src_decision d;
  REQUIRE_OK(clm_engine_src_step(&d, e, seqs, 1, row.data(), CLM_DTYPE_F32, 1, kHidden, &token, indptr));
  REQUIRE(std::abs(d.score - score) < 1e-5f);
  for (int i = 0; i < times; ++i) lookup(e, s.get(), key);
  REQUIRE_OK(clm_seq_finish(s.get()));
}

clm_metrics metrics_of(const clm_engine* e) {
  clm_metrics m;
  std::memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  REQUIRE_OK(clm_engine_metrics(&m, e));
  return m;
}

bool is_salt_digest(const std::string& name) {
  if (name.size() != 37 || name.rfind("salt:", 0) != 0) return false;
  return std::all_of(name.begin() + 5, name.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
}

}  // namespace

TEST_CASE("clm anomalies: low-SRC keys equal a naive model's on random traffic, named as admitted",
          "[capi][clm_watch]") {
  const std::uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  Lines lines;
  const int64_t min_sightings = 10;
  EnginePtr e = make_engine(watched_options(&lines, min_sightings));
  struct Tenant {
    std::string salt, name;
  };
  const std::vector<Tenant> tenants = {
      {"secret-salt-acme", "acme"}, {"secret-salt-globex", "globex"}, {"secret-salt-unnamed", ""}};
  // Each key draws every score below or every score above the threshold (so
  // that a median known to 0.0125 is on the exact one's side) and is seen a
  // random number of times, some below min_sightings.
  std::map<std::pair<std::string, std::string>, std::vector<float>> model;  // (salt, key) -> scores
  std::map<std::string, std::string> name_of_salt;
  std::uniform_real_distribution<float> low(0.01f, 0.15f), high(0.3f, 0.99f);
  uint64_t sightings = 0;
  for (int k = 0; k < 12; ++k) {
    const std::string key = "KEY-" + std::to_string(k);
    // Key 0 is low-SRC and key 1 is not in every run; the others as drawn.
    const bool is_low = k < 2 ? k == 0 : std::bernoulli_distribution(0.5)(rng);
    const Tenant& t = tenants[std::uniform_int_distribution<size_t>(0, tenants.size() - 1)(rng)];
    const int sequences = k < 2 ? 15 : std::uniform_int_distribution<int>(3, 25)(rng);
    const clm_admit_options a = tenant_options(t.salt, t.name);
    for (int i = 0; i < sequences; ++i) {
      const float score = is_low ? low(rng) : high(rng);
      // Several lookups by one sequence are one sighting.
      scored_sequence(e.get(), a, score, key, std::uniform_int_distribution<int>(1, 3)(rng));
      model[{t.salt, key}].push_back(score);
      ++sightings;
    }
    name_of_salt[t.salt] = t.name;
  }
  // The model's low-SRC keys: count and exact lower median.
  std::map<std::string, std::pair<uint64_t, float>> want;  // key -> (sightings, median)
  for (auto& [id, scores] : model) {
    std::sort(scores.begin(), scores.end());
    const float median = scores[(scores.size() + 1) / 2 - 1];
    if (static_cast<int64_t>(scores.size()) >= min_sightings && median < 0.2f)
      want[id.second] = {scores.size(), median};
  }
  ReportPtr r = take_report(e.get());
  CHECK(clm_anomaly_report_window_ms(r.get()) == 3'600'000);
  CHECK(clm_anomaly_report_min_sightings(r.get()) == min_sightings);
  CHECK(clm_anomaly_report_low_src(r.get()) == 0.2f);
  REQUIRE(clm_anomaly_report_low_src_count(r.get()) == want.size());
  uint64_t previous = UINT64_MAX;
  for (size_t i = 0; i < want.size(); ++i) {
    const clm_low_src_key k = low_key(r.get(), i);
    const std::string key = str(k.key, k.key_len), tenant = str(k.tenant, k.tenant_len);
    INFO(key << " of " << tenant);
    REQUIRE(want.count(key) == 1);
    CHECK(k.sightings == want[key].first);
    CHECK(std::abs(k.median_src - want[key].second) <= 0.0125f);
    CHECK(k.sightings <= previous);  // the most seen first
    previous = k.sightings;
    CHECK(k.adapter_id == 0);
    CHECK(k.reserved == 0);
    CHECK(tenant.find("secret") == std::string::npos);
    const auto salt = std::find_if(model.begin(), model.end(), [&](const auto& m) { return m.first.second == key; });
    const std::string& name = name_of_salt[salt->first.first];
    if (name.empty()) {
      CHECK(is_salt_digest(tenant));
    } else {
      CHECK(tenant == name);
    }
  }
  const clm_metrics m = metrics_of(e.get());
  CHECK(m.clm_watch_sightings == sightings);
  CHECK(m.clm_watch_watched_keys == static_cast<int64_t>(model.size()));
  CHECK(m.clm_watch_low_src_keys == static_cast<int64_t>(want.size()));
  CHECK(m.clm_watch_low_src_turns == want.size());  // every score of a key on one side: each turns once
  // Each key's turn is one low_src event and one line, the same JSON.
  REQUIRE(clm_anomaly_report_event_count(r.get()) == want.size());
  REQUIRE(lines.lines.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const clm_watch_event ev = event(r.get(), i);
    CHECK(ev.kind == CLM_WATCH_EVENT_LOW_SRC);
    CHECK(ev.sightings == static_cast<uint64_t>(min_sightings));  // it turned at its min_sightings-th sighting
    CHECK(lines.lines[i] == event_json(r.get(), i));
    const nlohmann::json j = nlohmann::json::parse(lines.lines[i]);
    CHECK(j.at("event") == "low_src");
    CHECK(j.at("key") == str(ev.key, ev.key_len));
    CHECK(j.at("sightings") == min_sightings);
    CHECK(lines.lines[i].find("secret") == std::string::npos);
  }
}

TEST_CASE("clm anomalies: the store's events in order, with their fields and JSON lines", "[capi][clm_watch]") {
  Lines lines;
  EnginePtr e = make_engine(watched_options(&lines));
  const std::string salt = "secret-salt-acme", tenant = "acme";
  const clm_admit_options a = tenant_options(salt, tenant);
  SeqPtr s = admit(e.get(), {21, 22, 23, 24, 25}, &a);
  const std::string key = "REFUND-ORDER", reason = "wrong answers reported by support";
  std::vector<float> v1(kDim, 0.0f), v2(kDim, 0.0f);
  v1[0] = 1.0f;
  v2[1] = 1.0f;  // orthogonal: a new version
  int32_t result = 0, version = 0;
  REQUIRE_OK(clm_engine_record_snapshot(&result, &version, e.get(), s.get(), key.data(), key.size(), nullptr, 0,
                                        CLM_SUFFIX_KEY, v1.data(), v1.size()));
  CHECK(result == CLM_RECORD_ADMITTED);
  REQUIRE_OK(clm_engine_record_snapshot(&result, &version, e.get(), s.get(), key.data(), key.size(), nullptr, 0,
                                        CLM_SUFFIX_KEY, v2.data(), v2.size()));
  CHECK(result == CLM_RECORD_NEW_VERSION);
  const int64_t until = 4'102'444'800'000;  // 2100-01-01
  REQUIRE_OK(clm_engine_blacklist_snapshot_key(e.get(), salt.data(), salt.size(), 0, key.data(), key.size(), nullptr, 0,
                                               CLM_SUFFIX_KEY, reason.data(), reason.size(), until));
  REQUIRE_OK(clm_engine_unblacklist_snapshot_key(e.get(), salt.data(), salt.size(), 0, key.data(), key.size(), nullptr,
                                                 0, CLM_SUFFIX_KEY));
  REQUIRE_OK(clm_seq_finish(s.get()));

  ReportPtr r = take_report(e.get());
  const std::vector<int32_t> kinds = {CLM_WATCH_EVENT_VERSION_CREATED, CLM_WATCH_EVENT_VERSION_CREATED,
                                      CLM_WATCH_EVENT_BLACKLISTED, CLM_WATCH_EVENT_UNBLACKLISTED};
  const std::vector<std::string> names = {"version_created", "version_created", "blacklisted", "unblacklisted"};
  REQUIRE(clm_anomaly_report_event_count(r.get()) == kinds.size());
  REQUIRE(lines.lines.size() == kinds.size());
  int64_t previous_ms = 0;
  for (size_t i = 0; i < kinds.size(); ++i) {
    const clm_watch_event ev = event(r.get(), i);
    INFO("event " << i << ": " << lines.lines[i]);
    CHECK(ev.kind == kinds[i]);
    CHECK(str(ev.key, ev.key_len) == key);
    CHECK(str(ev.tenant, ev.tenant_len) == tenant);
    CHECK(ev.adapter_id == 0);
    CHECK(ev.time_ms >= previous_ms);
    previous_ms = ev.time_ms;
    CHECK(lines.lines[i] == event_json(r.get(), i));
    const nlohmann::json j = nlohmann::json::parse(lines.lines[i]);
    CHECK(j.at("event") == names[i]);
    CHECK(j.at("time_ms") == ev.time_ms);
  }
  CHECK(event(r.get(), 0).version == 1);
  CHECK(event(r.get(), 1).version == 2);
  const clm_watch_event black = event(r.get(), 2);
  CHECK(str(black.reason, black.reason_len) == reason);
  CHECK(black.until_ms == until);
  CHECK(black.by_breaker == 0);
  CHECK(nlohmann::json::parse(lines.lines[2]).at("by") == "administrator");
  const clm_metrics m = metrics_of(e.get());
  CHECK(m.clm_watch_key_events[CLM_WATCH_EVENT_BLACKLISTED] == 1);
  CHECK(m.clm_watch_key_events[CLM_WATCH_EVENT_UNBLACKLISTED] == 1);
  CHECK(m.clm_watch_key_events[CLM_WATCH_EVENT_VERSION_CREATED] == 2);
  CHECK(m.clm_watch_key_events[CLM_WATCH_EVENT_DRIFT] == 0);
  CHECK(m.clm_watch_sightings == 0);
}

TEST_CASE("clm anomalies: options, older versions and bad input", "[capi][clm_watch]") {
  const std::string kSalt = "s", kTenant = "t";
  SECTION("defaults") {
    const clm_engine_options o = engine_options(64, 4);
    CHECK(o.clm_watch == 1);
    CHECK(o.clm_watch_max_keys == 4096);
    CHECK(o.clm_watch_window_ms == 3'600'000);
    CHECK(o.clm_watch_min_sightings == 20);
    CHECK(o.clm_watch_low_src == 0.2f);
    CHECK(o.clm_watch_max_events == 1024);
    CHECK(o.clm_watch_callback == nullptr);
    CHECK(o.clm_watch_callback_data == nullptr);
  }
  SECTION("no snapshot store, or the watch off: the report is a failed precondition, the counts 0") {
    for (bool with_store : {false, true}) {
      clm_engine_options o = with_store ? watched_options(nullptr) : engine_options(64, 4);
      o.clm_watch = with_store ? 0 : 1;
      EnginePtr e = make_engine(o);
      if (with_store) {
        const clm_admit_options a = tenant_options(kSalt, kTenant);
        scored_sequence(e.get(), a, 0.05f, "KEY", 1);
      }
      clm_anomaly_report* r = reinterpret_cast<clm_anomaly_report*>(1);
      CHECK_STATUS(CLM_ERR_FAILED_PRECONDITION, clm_engine_clm_anomalies(&r, e.get()));
      CHECK(r == nullptr);
      CHECK(metrics_of(e.get()).clm_watch_sightings == 0);
    }
  }
  SECTION("a version-8 options caller gets the watch's defaults; a version-7 metrics caller nothing past its struct") {
    Lines unused;
    clm_engine_options full = watched_options(&unused);
    clm_engine_options o;
    std::memset(&o, 0xCD, sizeof o);  // what lies past a version-8 struct is not the caller's
    std::memcpy(&o, &full, offsetof(clm_engine_options, divergence_context_tokens) + sizeof(int32_t));
    o.struct_size = offsetof(clm_engine_options, divergence_context_tokens) + sizeof(int32_t);
    EnginePtr e = make_engine(o);
    for (int i = 0; i < 20; ++i) scored_sequence(e.get(), tenant_options(kSalt, kTenant), 0.05f, "KEY", 1);
    ReportPtr r = take_report(e.get());
    CHECK(clm_anomaly_report_min_sightings(r.get()) == 20);  // the default, not the caller's 10
    CHECK(clm_anomaly_report_low_src_count(r.get()) == 1);
    CHECK(unused.lines.empty());  // no callback in version 8
    clm_metrics m;
    std::memset(&m, 0xCD, sizeof m);
    m.struct_size = offsetof(clm_metrics, match_depth_sum_tokens) + sizeof(uint64_t);
    REQUIRE_OK(clm_engine_metrics(&m, e.get()));
    CHECK(m.has_snapshot_store == 1);
    const auto* tail = reinterpret_cast<const unsigned char*>(&m) + m.struct_size;
    for (size_t k = 0; k < sizeof m - m.struct_size; ++k) CHECK(tail[k] == 0xCD);
  }
  SECTION("one sequence looking up A, B, A, B, A is one sighting of each key") {
    EnginePtr e = make_engine(watched_options(nullptr, 2));
    SeqPtr seq = admit(e.get(), {11, 12, 13}, nullptr);
    set_constant_head(e.get(), 0.05f);
    const std::vector<float> row(kHidden, 0.5f);
    const int32_t token = 42, indptr[] = {0, 1};
    clm_seq* seqs[] = {seq.get()};
    clm_src_decision d;
    REQUIRE_OK(clm_engine_src_step(&d, e.get(), seqs, 1, row.data(), CLM_DTYPE_F32, 1, kHidden, &token, indptr));
    for (const char* key : {"KEY-A", "KEY-B", "KEY-A", "KEY-B", "KEY-A"}) lookup(e.get(), seq.get(), key);
    CHECK(metrics_of(e.get()).clm_watch_sightings == 2);
    CHECK(clm_anomaly_report_low_src_count(take_report(e.get()).get()) == 0);  // one sighting each, 2 needed
    REQUIRE_OK(clm_seq_finish(seq.get()));
  }
  SECTION("max_events 0: the report keeps no events, the callback still gets each line") {
    Lines lines;
    clm_engine_options o = watched_options(&lines, 3);
    o.clm_watch_max_events = 0;
    EnginePtr e = make_engine(o);
    for (int i = 0; i < 3; ++i) scored_sequence(e.get(), tenant_options(kSalt, kTenant), 0.05f, "KEY", 1);
    ReportPtr r = take_report(e.get());
    CHECK(clm_anomaly_report_event_count(r.get()) == 0);
    CHECK(clm_anomaly_report_low_src_count(r.get()) == 1);
    CHECK(lines.lines.size() == 1);
  }
  SECTION("out-of-range options are refused, naming the field") {
    struct Case {
      void (*set)(clm_engine_options&);
      const char* field;
    };
    for (const Case& c : {Case{[](clm_engine_options& o) { o.clm_watch = 2; }, "clm_watch"},
                          Case{[](clm_engine_options& o) { o.clm_watch_max_keys = 0; }, "max_keys"},
                          Case{[](clm_engine_options& o) { o.clm_watch_max_keys = (1 << 20) + 1; }, "max_keys"},
                          Case{[](clm_engine_options& o) { o.clm_watch_window_ms = 1; }, "window_ms"},
                          Case{[](clm_engine_options& o) { o.clm_watch_min_sightings = 0; }, "min_sightings"},
                          Case{[](clm_engine_options& o) { o.clm_watch_low_src = 0.0f; }, "low_src"},
                          Case{[](clm_engine_options& o) { o.clm_watch_low_src = 1.5f; }, "low_src"},
                          Case{[](clm_engine_options& o) { o.clm_watch_low_src = std::nanf(""); }, "low_src"},
                          Case{[](clm_engine_options& o) { o.clm_watch_max_events = -1; }, "max_events"}}) {
      clm_engine_options o = watched_options(nullptr);
      c.set(o);
      clm_engine* e = reinterpret_cast<clm_engine*>(1);
      CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_create(&e, &o));
      CHECK(e == nullptr);
      CHECK(std::string(clm_last_error()).find(c.field) != std::string::npos);
    }
  }
  SECTION("bad arguments") {
    Lines lines;
    EnginePtr e = make_engine(watched_options(&lines, 1));
    scored_sequence(e.get(), tenant_options(kSalt, kTenant), 0.05f, "KEY", 1);
    clm_anomaly_report* raw = nullptr;
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_clm_anomalies(nullptr, e.get()));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_engine_clm_anomalies(&raw, nullptr));
    CHECK(raw == nullptr);
    ReportPtr r = take_report(e.get());
    REQUIRE(clm_anomaly_report_low_src_count(r.get()) == 1);
    REQUIRE(clm_anomaly_report_event_count(r.get()) == 1);
    clm_low_src_key k = CLM_LOW_SRC_KEY_INIT;
    clm_watch_event ev = CLM_WATCH_EVENT_INIT;
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_anomaly_report_low_src_key(&k, r.get(), 1));  // past the last
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_anomaly_report_event(&ev, r.get(), 1));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_anomaly_report_low_src_key(nullptr, r.get(), 0));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_anomaly_report_low_src_key(&k, nullptr, 0));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_anomaly_report_event(nullptr, r.get(), 0));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_anomaly_report_event(&ev, nullptr, 0));
    k.struct_size = 12;
    ev.struct_size = 12;
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_anomaly_report_low_src_key(&k, r.get(), 0));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_anomaly_report_event(&ev, r.get(), 0));
    size_t len = 0;
    char small[4] = {'x', 'x', 'x', 'x'};
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_anomaly_report_event_json(small, sizeof small, &len, r.get(), 0));
    CHECK(len == lines.lines[0].size());
    CHECK(small[0] == 'x');  // nothing written
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_anomaly_report_event_json(small, sizeof small, nullptr, r.get(), 0));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_anomaly_report_event_json(small, sizeof small, &len, nullptr, 0));
    CHECK_STATUS(CLM_ERR_INVALID_ARGUMENT, clm_anomaly_report_event_json(small, sizeof small, &len, r.get(), 5));
    CHECK(clm_anomaly_report_low_src_count(nullptr) == 0);
    CHECK(clm_anomaly_report_event_count(nullptr) == 0);
    CHECK(clm_anomaly_report_window_ms(nullptr) == 0);
    CHECK(clm_anomaly_report_min_sightings(nullptr) == 0);
    CHECK(clm_anomaly_report_low_src(nullptr) == 0.0f);
    clm_anomaly_report_free(nullptr);
  }
}
