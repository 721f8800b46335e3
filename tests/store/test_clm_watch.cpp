// The CLM watch (clm/engine/clm_watch.hpp): low-SRC keys against a naive
// model that keeps every sighting with its time and takes exact medians, on
// fresh random data across half windows; then through an Engine with a
// snapshot store: sightings from lookups with the sequences' SRC scores (once
// per sequence and key), the store's events (versions, drift, the breaker's
// and an administrator's blacklists, an unblacklist) as events and JSON
// lines, names never the salt, metrics; bad input.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "clm/engine.hpp"
#include "test_support.hpp"

namespace {

std::int64_t now_ms = 0;
std::int64_t fake_clock() { return now_ms; }

struct NaiveWatch {
  std::int64_t half = 1;
  std::map<std::pair<std::string, std::string>, std::vector<std::pair<std::int64_t, float>>> seen;  // (epoch, score)
  // The keys low-SRC now: count and exact lower median over this half window and the one before.
  std::map<std::pair<std::string, std::string>, std::pair<std::uint64_t, float>> low(std::int64_t now,
                                                                                     std::int64_t min_sightings,
                                                                                     float low_src) const {
    std::map<std::pair<std::string, std::string>, std::pair<std::uint64_t, float>> out;
    const std::int64_t epoch = now / half;
    for (const auto& [k, v] : seen) {
      std::vector<float> in;
      for (const auto& [e, s] : v)
        if (e == epoch || e + 1 == epoch) in.push_back(s);
      if (static_cast<std::int64_t>(in.size()) < min_sightings) continue;
      std::sort(in.begin(), in.end());
      const float median = in[(in.size() + 1) / 2 - 1];
      if (median < low_src) out[k] = {in.size(), median};
    }
    return out;
  }
};

}  // namespace

TEST_CASE("clm watch: low-SRC keys equal a naive model's over sliding half windows", "[clm_watch]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  std::vector<std::string> lines;
  clm::ClmWatchConfig config;
  config.window_ms = 1000;
  config.min_sightings = 8;
  config.low_src = 0.2f;
  config.on_line = [&](std::string_view line) { lines.emplace_back(line); };
  clm::ClmWatch watch(config);
  now_ms = 1'000'000;
  watch.set_clock(&fake_clock);
  NaiveWatch model;
  model.half = 500;
  // Each key draws its scores well below or well above the threshold, so a
  // median known to 0.0125 is on the same side as the exact one.
  std::vector<std::pair<std::string, bool>> keys;
  for (int k = 0; k < 30; ++k) keys.emplace_back("KEY-" + std::to_string(k), k % 3 == 0);
  std::uniform_real_distribution<float> low(0.0f, 0.15f), high(0.3f, 1.0f);
  std::uint64_t turns = 0;
  std::set<std::pair<std::string, std::string>> flagged;
  for (int step = 0; step < 3000; ++step) {
    now_ms += std::uniform_int_distribution<int>(0, 3)(rng);
    const auto& [key, is_low] = keys[std::uniform_int_distribution<std::size_t>(0, keys.size() - 1)(rng)];
    const std::string tenant = step % 2 ? "acme" : "globex";
    const float score = is_low ? low(rng) : high(rng);
    watch.sighting("store-" + tenant, tenant, 0, key, score);
    model.seen[{tenant, key}].emplace_back(now_ms / 500, score);
    const auto expected = model.low(now_ms, config.min_sightings, config.low_src);
    // A low_src line each time a key turns low-SRC (it was not, as of its last sighting).
    const bool now_low = expected.count({tenant, key}) == 1;
    if (now_low && !flagged.count({tenant, key})) ++turns;
    if (now_low) {
      flagged.insert({tenant, key});
    } else {
      flagged.erase({tenant, key});
    }
    if (step % 97 != 0) continue;
    const clm::ClmAnomalyReport r = watch.report();
    std::map<std::pair<std::string, std::string>, std::pair<std::uint64_t, float>> got;
    for (const clm::LowSrcKey& k : r.low_src_keys) got[{k.tenant, k.key}] = {k.sightings, k.median_src};
    REQUIRE(got.size() == expected.size());
    for (const auto& [k, v] : expected) {
      INFO(k.first << " " << k.second);
      REQUIRE(got.count(k) == 1);
      CHECK(got[k].first == v.first);
      CHECK(std::abs(got[k].second - v.second) <= 0.0125f + 1e-6f);
    }
    for (std::size_t i = 1; i < r.low_src_keys.size(); ++i) {
      CHECK(r.low_src_keys[i - 1].sightings >= r.low_src_keys[i].sightings);
    }
  }
  CHECK(turns > 0);
  CHECK(watch.metrics().low_src_turns == turns);
  std::uint64_t low_lines = 0;
  for (const std::string& line : lines) {
    const nlohmann::json j = nlohmann::json::parse(line);
    CHECK(j.at("event") == "low_src");
    CHECK(j.at("sightings").get<std::uint64_t>() >= 8);
    CHECK(j.at("median_src").get<double>() < 0.2);
    ++low_lines;
  }
  CHECK(low_lines == turns);
  CHECK(watch.metrics().sightings == 3000);
  // A window later everything has aged out.
  now_ms += 2000;
  CHECK(watch.report().low_src_keys.empty());
}

TEST_CASE("clm watch: a full watch gives up its least seen key", "[clm_watch]") {
  clm::ClmWatchConfig config;
  config.max_keys = 4;
  config.min_sightings = 3;
  clm::ClmWatch watch(config);
  now_ms = 0;
  watch.set_clock(&fake_clock);
  for (int i = 0; i < 5; ++i) watch.sighting("t", "t", 0, "HOT", 0.05f);
  for (int k = 0; k < 20; ++k) watch.sighting("t", "t", 0, "COLD-" + std::to_string(k), 0.05f);
  CHECK(watch.metrics().watched_keys == 4);
  const clm::ClmAnomalyReport r = watch.report();
  REQUIRE(r.low_src_keys.size() == 1);
  CHECK(r.low_src_keys[0].key == "HOT");
  CHECK(r.low_src_keys[0].sightings == 5);
}

TEST_CASE("clm watch: a large full watch drops its least seen sixteenth, never a key seen more", "[clm_watch]") {
  clm::ClmWatchConfig config;
  config.max_keys = 64;
  config.min_sightings = 3;
  clm::ClmWatch watch(config);
  now_ms = 0;
  watch.set_clock(&fake_clock);
  // 32 keys seen 3 times (low-SRC), then 200 keys seen once each: the full watch keeps the 32.
  for (int k = 0; k < 32; ++k) {
    for (int i = 0; i < 3; ++i) watch.sighting("t", "t", 0, "HOT-" + std::to_string(k), 0.05f);
  }
  for (int k = 0; k < 200; ++k) {
    watch.sighting("t", "t", 0, "COLD-" + std::to_string(k), 0.05f);
    CHECK(watch.metrics().watched_keys <= 64);
  }
  CHECK(watch.metrics().watched_keys >= 64 - 64 / 16);
  CHECK(watch.report().low_src_keys.size() == 32);
}

namespace {

constexpr int kDim = 8, kHidden = 8;

// A head whose score is sigmoid(b2) whatever the rows: w1 and w2 zero.
std::shared_ptr<const clm::SrcHead> constant_head(float score) {
  clm::SrcHeadWeights w;
  w.hidden = kHidden;
  w.w1.assign(kHidden / 4 * kHidden, 0.0f);
  w.b1.assign(kHidden / 4, 0.0f);
  w.w2.assign(kHidden / 4, 0.0f);
  w.b2 = std::log(score / (1.0f - score));
  std::unique_ptr<clm::SrcHead> head;
  REQUIRE(clm::SrcHead::create(w, clm::Gelu::tanh, head).ok());
  return std::shared_ptr<const clm::SrcHead>(std::move(head));
}

// One sequence's snapshot lookup of one suffix.
clm::Status lookup_one(clm::Engine& engine, clm::SequenceId seq, const clm::SuffixRef& suffix, clm::SnapshotHit& hit) {
  std::vector<float> out(kDim);
  std::uint8_t apply = 0;
  return engine.lookup_snapshots(std::span(&seq, 1), std::span(&suffix, 1), {}, std::span(&hit, 1), out,
                                 std::span(&apply, 1));
}

struct WatchedEngine {
  std::vector<std::string> lines;
  std::unique_ptr<clm::Engine> engine;
  explicit WatchedEngine(bool with_store = true, clm::ClmWatchConfig watch = {}) {
    clm::EngineConfig config;
    config.pool.num_pages = 4096;
    config.pool.page_size = 4;
    config.pool.memory = clm::MemoryKind::none;
    if (with_store) {
      config.snapshot_store.path = ":memory:";
      config.snapshot_store.num_shards = 2;
      config.snapshot_store.snapshot_dim = kDim;
      config.snapshot_store.min_usage_threshold = 1;
      config.snapshot_store.blacklist_min_reports = 4;
      config.snapshot_store.lookup_timeout_us = 2'000'000;
    }
    config.src_gate.threshold_override = 0.0f;  // every step looks up
    config.clm_watch = std::move(watch);
    config.clm_watch.on_line = [this](std::string_view line) { lines.emplace_back(line); };
    const clm::Status s = clm::Engine::create(config, engine);
    INFO(s.message());
    REQUIRE(s.ok());
  }
  // A sequence of `salt` (named `tenant`) scored once by a head of `score`, then looking `key` up `times` times.
  void sequence(std::string_view salt, std::string_view tenant, float score, std::string_view key, int times) {
    clm::Admission a;
    const std::vector<std::int32_t> prompt = {11, 12, 13, 14, 15};
    REQUIRE(engine->admit(prompt, {.cache_salt = salt, .tenant = tenant}, a).ok());
    engine->set_src_head(constant_head(score));
    const std::vector<float> rows(kHidden, 0.5f);
    const std::vector<std::int32_t> token = {42}, indptr = {0, 1};
    clm::SrcDecision decision;
    REQUIRE(engine
                ->src_step(std::span(&a.seq, 1), clm::ConstActivationView::f32(rows, 1, kHidden), token, indptr,
                           std::span(&decision, 1))
                .ok());
    REQUIRE(std::abs(decision.score - score) < 1e-5f);
    for (int i = 0; i < times; ++i) {
      const clm::SuffixRef suffix{.text = key, .is_key = true, .group = "g"};
      clm::SnapshotHit hit;
      REQUIRE(lookup_one(*engine, a.seq, suffix, hit).ok());
    }
    REQUIRE(engine->finish(a.seq).ok());
  }
};

}  // namespace

TEST_CASE("clm watch through an Engine: lookups with SRC scores, the store's events, JSON lines", "[clm_watch]") {
  WatchedEngine w;
  const std::string secret_salt = "secret-salt-42";
  // A key that recurs with a low score: 20 sequences (named), another only 5 times.
  for (int i = 0; i < 20; ++i) w.sequence(secret_salt, "acme", 0.05f, "REFUND-ORDER", 3);  // 3 lookups, one sighting
  for (int i = 0; i < 5; ++i) w.sequence(secret_salt, "acme", 0.05f, "RARE-KEY", 1);
  // A key seen often with a high score, and one of an unnamed tenant.
  for (int i = 0; i < 25; ++i) w.sequence(secret_salt, "acme", 0.9f, "SHIP-ORDER", 1);
  const std::string unnamed_salt = "secret-salt-of-an-unnamed-tenant";
  for (int i = 0; i < 20; ++i) w.sequence(unnamed_salt, "", 0.1f, "UNNAMED-KEY", 1);
  clm::ClmAnomalyReport r;
  REQUIRE(w.engine->clm_anomalies(r).ok());
  REQUIRE(r.low_src_keys.size() == 2);
  std::map<std::string, clm::LowSrcKey> by_key;
  for (const auto& k : r.low_src_keys) by_key[k.key] = k;
  REQUIRE(by_key.count("REFUND-ORDER"));
  CHECK(by_key["REFUND-ORDER"].tenant == "acme");
  CHECK(by_key["REFUND-ORDER"].sightings == 20);
  CHECK(std::abs(by_key["REFUND-ORDER"].median_src - 0.05f) <= 0.0125f);
  REQUIRE(by_key.count("UNNAMED-KEY"));
  CHECK(by_key["UNNAMED-KEY"].tenant == clm::KvEventRecorder::salt_digest(unnamed_salt));
  CHECK(w.engine->metrics().clm_watch.sightings == 20 + 5 + 25 + 20);
  CHECK(w.engine->metrics().clm_watch.low_src_keys == 2);

  // The store's events: a version, a second one (far from the first), the breaker's blacklist, an
  // administrator's, an unblacklist.
  clm::Admission a;
  const std::vector<std::int32_t> prompt = {21, 22, 23, 24, 25};
  REQUIRE(w.engine->admit(prompt, {.cache_salt = secret_salt, .tenant = "acme"}, a).ok());
  const clm::SuffixRef suffix{.text = "REFUND-ORDER", .is_key = true, .group = "g"};
  std::vector<float> v1(kDim, 0.0f), v2(kDim, 0.0f);
  v1[0] = 1.0f;
  v2[1] = 1.0f;
  clm::RecordOutcome outcome;
  REQUIRE(w.engine->record_snapshot(a.seq, suffix, v1, outcome).ok());
  REQUIRE(outcome.result == clm::RecordResult::admitted);
  REQUIRE(w.engine->record_snapshot(a.seq, suffix, v2, outcome).ok());
  REQUIRE(outcome.result == clm::RecordResult::new_version);
  for (int i = 0; i < 4; ++i) {  // served and wrong, four times: the breaker blacklists it
    clm::SnapshotHit hit;
    REQUIRE(lookup_one(*w.engine, a.seq, suffix, hit).ok());
    REQUIRE(hit.level == clm::SnapshotLevel::exact);
    const std::uint8_t wrong = 0;
    REQUIRE(w.engine->report_snapshot_outcome(std::span(&a.seq, 1), std::span(&wrong, 1)).ok());
  }
  clm::SuffixKey ship;
  REQUIRE(clm::SuffixKeyer::from_host_key("SHIP-ORDER", "g", ship).ok());
  const std::string store_tenant = clm::Engine::snapshot_tenant(secret_salt, 0);
  REQUIRE(
      w.engine->snapshot_store()->blacklist_key(store_tenant, ship, "wrong answers reported by support", 9e12).ok());
  REQUIRE(w.engine->snapshot_store()->unblacklist_key(store_tenant, ship).ok());
  REQUIRE(w.engine->finish(a.seq).ok());

  REQUIRE(w.engine->clm_anomalies(r).ok());
  std::vector<std::string> kinds;
  for (const auto& e : r.events) {
    kinds.emplace_back(clm::clm_event_name(e.kind));
    CHECK(e.tenant.find("secret") == std::string::npos);
  }
  const std::vector<std::string> want = {"low_src",     "low_src",     "version_created", "version_created",
                                         "blacklisted", "blacklisted", "unblacklisted"};
  CHECK(kinds == want);
  // The JSON lines say the same, in order, with the reasons.
  REQUIRE(w.lines.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO(w.lines[i]);
    const nlohmann::json j = nlohmann::json::parse(w.lines[i]);
    CHECK(j.at("event") == want[i]);
    CHECK(w.lines[i].find("secret") == std::string::npos);
  }
  const nlohmann::json breaker = nlohmann::json::parse(w.lines[4]);
  CHECK(breaker.at("by") == "breaker");
  CHECK(breaker.at("key") == "REFUND-ORDER");
  CHECK(breaker.at("tenant") == "acme");
  CHECK(!breaker.at("reason").get<std::string>().empty());
  const nlohmann::json admin = nlohmann::json::parse(w.lines[5]);
  CHECK(admin.at("by") == "administrator");
  CHECK(admin.at("reason") == "wrong answers reported by support");
  CHECK(nlohmann::json::parse(w.lines[3]).at("version") == 2);
  const clm::ClmWatchMetrics m = w.engine->metrics().clm_watch;
  CHECK(m.store_events[static_cast<std::size_t>(clm::SnapshotStoreEvent::Kind::version_created)] == 2);
  CHECK(m.store_events[static_cast<std::size_t>(clm::SnapshotStoreEvent::Kind::blacklisted)] == 2);
  CHECK(m.store_events[static_cast<std::size_t>(clm::SnapshotStoreEvent::Kind::unblacklisted)] == 1);
  CHECK(m.low_src_turns == 2);
}

TEST_CASE("clm watch: bad input and the switch", "[clm_watch]") {
  SECTION("no snapshot store: the report is a failed precondition") {
    WatchedEngine w(false);
    clm::ClmAnomalyReport r;
    const clm::Status s = w.engine->clm_anomalies(r);
    CHECK(s.code() == clm::StatusCode::failed_precondition);
    CHECK(s.message().find("snapshot store") != std::string::npos);
  }
  SECTION("off: nothing counted, the report says so") {
    clm::ClmWatchConfig off;
    off.enabled = false;
    WatchedEngine w(true, off);
    w.sequence("s", "acme", 0.05f, "REFUND-ORDER", 1);
    CHECK(w.engine->metrics().clm_watch.sightings == 0);
    clm::ClmAnomalyReport r;
    CHECK(w.engine->clm_anomalies(r).code() == clm::StatusCode::failed_precondition);
    CHECK(w.lines.empty());
  }
  SECTION("configurations out of range are refused, naming the field") {
    for (const auto& [set, field] : std::vector<std::pair<void (*)(clm::ClmWatchConfig&), std::string>>{
             {[](clm::ClmWatchConfig& c) { c.window_ms = 0; }, "window_ms"},
             {[](clm::ClmWatchConfig& c) { c.min_sightings = 0; }, "min_sightings"},
             {[](clm::ClmWatchConfig& c) { c.low_src = 0.0f; }, "low_src"},
             {[](clm::ClmWatchConfig& c) { c.low_src = std::nanf(""); }, "low_src"},
             {[](clm::ClmWatchConfig& c) { c.max_keys = 0; }, "max_keys"},
             {[](clm::ClmWatchConfig& c) { c.max_events = -1; }, "max_events"}}) {
      clm::EngineConfig config;
      config.pool.num_pages = 16;
      config.pool.page_size = 4;
      config.pool.memory = clm::MemoryKind::none;
      set(config.clm_watch);
      std::unique_ptr<clm::Engine> engine;
      const clm::Status s = clm::Engine::create(config, engine);
      CHECK(s.code() == clm::StatusCode::invalid_argument);
      CHECK(s.message().find(field) != std::string::npos);
    }
  }
}

TEST_CASE("clm watch: lookups, records and reports from many threads at once", "[clm_watch][threads]") {
  WatchedEngine w;
  w.engine->set_src_head(constant_head(0.05f));
  constexpr int kThreads = 4, kSequences = 25;
  // Catch's assertions are not for other threads: failed calls are counted, then checked.
  std::atomic<int> failures{0};
  auto expect_ok = [&](const clm::Status& s) {
    if (!s.ok()) failures.fetch_add(1);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string key = "KEY-" + std::to_string(t);
      const clm::SuffixRef suffix{.text = key, .is_key = true, .group = "g"};
      for (int i = 0; i < kSequences; ++i) {
        clm::Admission a;
        const std::vector<std::int32_t> prompt = {100 + t, 12, 13, 14, 15};
        expect_ok(w.engine->admit(prompt, {.cache_salt = "salt", .tenant = "acme"}, a));
        const std::vector<float> rows(kHidden, 0.5f);
        const std::vector<std::int32_t> token = {42}, indptr = {0, 1};
        clm::SrcDecision decision;
        expect_ok(w.engine->src_step(std::span(&a.seq, 1), clm::ConstActivationView::f32(rows, 1, kHidden), token,
                                     indptr, std::span(&decision, 1)));
        for (int l = 0; l < 2; ++l) {
          clm::SnapshotHit hit;
          expect_ok(lookup_one(*w.engine, a.seq, suffix, hit));
        }
        std::vector<float> v(kDim, 0.0f);
        v[static_cast<std::size_t>(i % kDim)] = 1.0f;  // a new version now and then
        clm::RecordOutcome outcome;
        expect_ok(w.engine->record_snapshot(a.seq, suffix, v, outcome));
        expect_ok(w.engine->finish(a.seq));
      }
    });
  }
  std::thread reader([&] {
    for (int i = 0; i < 50; ++i) {
      clm::ClmAnomalyReport r;
      expect_ok(w.engine->clm_anomalies(r));
      (void)w.engine->metrics_text();
    }
  });
  for (auto& t : threads) t.join();
  reader.join();
  CHECK(failures.load() == 0);
  const clm::ClmWatchMetrics m = w.engine->metrics().clm_watch;
  CHECK(m.sightings == kThreads * kSequences);
  CHECK(m.low_src_keys == kThreads);
  clm::ClmAnomalyReport r;
  REQUIRE(w.engine->clm_anomalies(r).ok());
  CHECK(r.low_src_keys.size() == kThreads);
  std::uint64_t versions = m.store_events[static_cast<std::size_t>(clm::SnapshotStoreEvent::Kind::version_created)] +
                           m.store_events[static_cast<std::size_t>(clm::SnapshotStoreEvent::Kind::drift)];
  CHECK(versions >= kThreads);
  CHECK(w.lines.size() == kThreads + versions);  // a low_src line per key, one per version
}
