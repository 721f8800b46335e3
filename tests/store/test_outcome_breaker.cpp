// Breaker (b) of the snapshot store (lib/store/outcome_breaker.hpp): the
// class against a naive model that keeps every report, on fresh random
// reports; and the store's use of it: a wrong level-2 serve blames the pair,
// never the served key's own exact hits.
#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>

#include "clm/store/snapshot_store.hpp"
#include "store/outcome_breaker.hpp"
#include "store/store_test_support.hpp"
#include "test_support.hpp"

using clm::SnapshotLevel;
using clm::StatusCode;
using clm::store_impl::BreakerSettings;
using clm::store_impl::OutcomeBreaker;
using clm_test::host_key;
using clm_test::open_store;
using clm_test::random_unit;

namespace {

constexpr int kDim = 16;

// What the breaker must decide, from every report kept (no window cap, no
// LRU): the accuracy over the reports of the last window_ms, capped to the
// last 512, once there are min_reports of them. Used where the test keeps
// the number of pairs within tracked_pairs.
struct NaiveBreaker {
  BreakerSettings s;
  std::map<std::tuple<std::string, std::uint64_t, std::uint64_t>, std::vector<std::pair<std::int64_t, bool>>> reports;
  std::map<std::tuple<std::string, std::uint64_t, std::uint64_t>, std::int64_t> blocked;  // until
  std::map<std::pair<std::string, std::uint64_t>, std::int64_t> blacklisted;              // until

  struct Decision {
    bool trips = false;
    bool whole_key = false;  // the served key is blacklisted (else the pair is blocked)
  };
  Decision report(const std::string& tenant, std::uint64_t q, std::uint64_t served, bool correct, std::int64_t now) {
    auto& all = reports[{tenant, q, served}];
    all.emplace_back(now, correct);
    std::vector<std::pair<std::int64_t, bool>> window;
    for (const auto& r : all) {
      if (r.first >= now - s.window_ms) window.push_back(r);
    }
    if (window.size() > OutcomeBreaker::kMaxReportsPerWindow) {
      window.erase(window.begin(), window.end() - static_cast<std::ptrdiff_t>(OutcomeBreaker::kMaxReportsPerWindow));
    }
    double right = 0;
    for (const auto& r : window) right += r.second ? 1 : 0;
    if (window.size() < static_cast<std::size_t>(s.min_reports) ||
        right / static_cast<double>(window.size()) >= s.accuracy) {
      return {};
    }
    all.clear();  // a trip forgets the reports that made it
    if (q == served) {
      blacklisted[{tenant, served}] = now + s.duration_ms;
      return {true, true};
    }
    blocked[{tenant, q, served}] = now + s.duration_ms;
    std::size_t in_force = 0;
    for (const auto& [k, until] : blocked) {
      if (std::get<0>(k) == tenant && std::get<2>(k) == served && until >= now) ++in_force;
    }
    if (in_force >= OutcomeBreaker::kMaxBlockedQueries) {
      blacklisted[{tenant, served}] = now + s.duration_ms;
      std::erase_if(blocked,
                    [&](const auto& e) { return std::get<0>(e.first) == tenant && std::get<2>(e.first) == served; });
      return {true, true};
    }
    return {true, false};
  }
  bool is_blocked(const std::string& tenant, std::uint64_t q, std::uint64_t served, std::int64_t now) const {
    const auto it = blocked.find({tenant, q, served});
    return it != blocked.end() && it->second >= now;
  }
};

}  // namespace

TEST_CASE("outcome breaker: windows, pair blocks and escalation match a naive model", "[store][breaker]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  BreakerSettings s;
  s.accuracy = 0.8;
  s.window_ms = 1000;
  s.min_reports = 5;
  s.duration_ms = 10'000;
  s.tracked_pairs = 128;  // more than the 80 pairs below: no window is dropped
  OutcomeBreaker breaker(s);
  NaiveBreaker naive{s, {}, {}, {}};
  const std::vector<std::string> tenants = {"a", "b"};
  std::int64_t now = 1'000'000;
  std::uint64_t trips = 0, whole = 0;
  for (int step = 0; step < 20'000; ++step) {
    now += std::uniform_int_distribution<int>(0, 4)(rng);
    const std::string& tenant = tenants[std::uniform_int_distribution<std::size_t>(0, 1)(rng)];
    // 10 query keys x 4 served keys (1..4 also query themselves: level 1).
    const std::uint64_t q = std::uniform_int_distribution<std::uint64_t>(1, 10)(rng);
    const std::uint64_t served = std::uniform_int_distribution<std::uint64_t>(1, 4)(rng);
    const bool correct = std::bernoulli_distribution(0.85)(rng);
    const auto trip = breaker.report(tenant, q, served, correct, now);
    const NaiveBreaker::Decision expected = naive.report(tenant, q, served, correct, now);
    INFO("step " << step << " tenant " << tenant << " q " << q << " served " << served);
    REQUIRE(trip.has_value() == expected.trips);
    if (trip) {
      ++trips;
      REQUIRE(trip->until_ms == now + s.duration_ms);
      REQUIRE(trip->whole_key == expected.whole_key);
      whole += trip->whole_key ? 1 : 0;
    }
    // Every pair's block agrees with the model after each step.
    for (const std::string& t : tenants) {
      for (std::uint64_t a = 1; a <= 10; ++a) {
        for (std::uint64_t b = 1; b <= 4; ++b) {
          if (a == b) continue;
          REQUIRE(breaker.pair_blocked(t, a, b, now) == naive.is_blocked(t, a, b, now));
        }
      }
      for (std::uint64_t b = 1; b <= 4; ++b) {
        std::size_t blocked = 0;
        for (std::uint64_t a = 1; a <= 10; ++a) blocked += naive.is_blocked(t, a, b, now) ? 1 : 0;
        REQUIRE(breaker.blocked_queries(t, b, now) == blocked);
      }
    }
    REQUIRE(breaker.windows() <= static_cast<std::size_t>(s.tracked_pairs));
  }
  WARN("trips " << trips << ", of them whole keys " << whole);
  CHECK(trips > 20);  // the random reports did exercise it
  CHECK(whole > 0);
}

TEST_CASE("outcome breaker: at most tracked_pairs windows, the least recently reported dropped first",
          "[store][breaker]") {
  BreakerSettings s;
  s.accuracy = 0.95;
  s.window_ms = 1'000'000;
  s.min_reports = 5;
  s.duration_ms = 1000;
  s.tracked_pairs = 4;
  const std::int64_t now = 1'000'000;
  for (const int others : {3, 4}) {
    OutcomeBreaker breaker(s);
    std::uint64_t fresh = 100;
    bool tripped = false;
    for (int i = 0; i < 5; ++i) {
      tripped = breaker.report("t", 1, 2, false, now).has_value();
      for (int o = 0; o < others; ++o) REQUIRE_FALSE(breaker.report("t", fresh++, 2, true, now).has_value());
      REQUIRE(breaker.windows() <= 4);
    }
    // With 3 others between its reports, (1, 2) stays among the 4 kept and
    // trips on its 5th wrong report; with 4, its window is dropped each time.
    CHECK(tripped == (others == 3));
    CHECK(breaker.pair_blocked("t", 1, 2, now) == (others == 3));
  }
}

namespace {

clm::SnapshotStoreConfig breaker_config(const std::string& path, const clm_test::ManualClock& clock) {
  clm::SnapshotStoreConfig c;
  c.path = path;
  c.num_shards = 2;
  c.snapshot_dim = kDim;
  c.min_usage_threshold = 1;
  c.blacklist_min_reports = 4;
  c.lookup_timeout_us = 2'000'000;  // never a busy miss on a loaded machine
  c.rebuild_in_background = false;
  c.clock_ms = clock.fn();
  return c;
}

// A lookup of tenant "t".
clm::SnapshotHit lookup(clm::SnapshotStore& store, const clm::SuffixKey& key, const std::vector<float>& query) {
  std::vector<float> out;
  return clm_test::lookup(store, "t", key, query, out);
}

}  // namespace

TEST_CASE("store breaker (b): a wrong level-2 serve blames the pair, never the neighbour's exact hits",
          "[store][breaker]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm_test::TempDir dir;
  clm_test::ManualClock clock;
  const clm::SnapshotStoreConfig c = breaker_config(dir.str(), clock);
  const std::vector<float> v = random_unit(rng, kDim);
  const clm::SuffixKey stored = host_key("REFUND-STATUS", "refund"), asked = host_key("REFUND-POLICY", "refund"),
                       other = host_key("REFUND-DELAY", "refund");
  {
    auto store = open_store(c);
    clm::RecordOutcome o;
    REQUIRE(store->record("t", stored, v, o).ok());
    const clm::SnapshotHit near = lookup(*store, asked, clm_test::noisy(v, 0.02, rng));
    REQUIRE(near.level == SnapshotLevel::ann);
    REQUIRE(near.key == "REFUND-STATUS");
    // REFUND-STATUS answers REFUND-POLICY wrongly, 4 times of 4; its own
    // exact hits are right.
    for (int i = 0; i < 4; ++i) {
      REQUIRE(store->report_outcome("t", stored, true).ok());
      REQUIRE(store->report_outcome("t", asked, near, false).ok());
    }
    CHECK_FALSE(store->is_blacklisted("t", stored));
    CHECK(lookup(*store, stored, v).level == SnapshotLevel::exact);
    CHECK(lookup(*store, asked, v).level == SnapshotLevel::miss);  // refused to REFUND-POLICY only
    const clm::SnapshotHit for_other = lookup(*store, other, v);
    CHECK(for_other.level == SnapshotLevel::ann);
    CHECK(for_other.key == "REFUND-STATUS");
    clm::SnapshotStoreMetrics m = store->metrics();
    CHECK(m.blocked_pairs == 1);
    CHECK(m.blocked_pair_skips == 1);
    CHECK(m.blacklisted_keys == 0);
    CHECK(m.outcome_reports == 8);

    // The block expires with blacklist_duration_ms.
    clock.advance_ms(c.blacklist_duration_ms + 1);
    CHECK(lookup(*store, asked, v).level == SnapshotLevel::ann);
    CHECK(store->metrics().blocked_pairs == 0);

    // Wrong for 8 query keys at once: the served key itself is blacklisted, persisted.
    for (int q = 0; q < 8; ++q) {
      const clm::SuffixKey query = host_key(fmt::format("REFUND-Q{}", q), "refund");
      const clm::SnapshotHit hit = lookup(*store, query, v);
      REQUIRE(hit.level == SnapshotLevel::ann);
      for (int i = 0; i < 4; ++i) REQUIRE(store->report_outcome("t", query, hit, false).ok());
      CHECK(store->is_blacklisted("t", stored) == (q == 7));
    }
    m = store->metrics();
    CHECK(m.blacklisted_keys == 1);
    CHECK(m.blocked_pairs == 0);  // the blacklist refuses it everywhere
  }
  auto store = open_store(c);
  CHECK(store->is_blacklisted("t", stored));
  CHECK(lookup(*store, stored, v).level == SnapshotLevel::miss);
  std::vector<clm::BlacklistEntry> entries;
  REQUIRE(store->list_blacklist(entries).ok());
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].key == "REFUND-STATUS");
  CHECK_FALSE(entries[0].by_hand);
  CHECK(entries[0].reason.find("wrong for 8 query keys") != std::string::npos);
}

TEST_CASE("store breaker (b): unblacklist_key lifts pair blocks, and bad reports change nothing", "[store][breaker]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm_test::ManualClock clock;
  clm::SnapshotStoreConfig c = breaker_config(":memory:", clock);
  const std::vector<float> v = random_unit(rng, kDim);
  const clm::SuffixKey stored = host_key("A", "g"), asked = host_key("B", "g");
  auto store = open_store(c);
  clm::RecordOutcome o;
  REQUIRE(store->record("t", stored, v, o).ok());
  const clm::SnapshotHit near = lookup(*store, asked, v);
  REQUIRE(near.level == SnapshotLevel::ann);

  // A miss, a served key whose fingerprint lies, an empty query key: refused, nothing counted.
  CHECK(store->report_outcome("t", asked, clm::SnapshotHit{}, false).code() == StatusCode::failed_precondition);
  clm::SnapshotHit forged = near;
  forged.fingerprint ^= 1;
  CHECK(store->report_outcome("t", asked, forged, false).code() == StatusCode::invalid_argument);
  CHECK(store->report_outcome("t", clm::SuffixKey{}, near, false).code() == StatusCode::invalid_argument);
  CHECK(store->metrics().outcome_reports == 0);
  c.blacklist_min_reports = 513;
  std::unique_ptr<clm::SnapshotStore> refused;
  CHECK(clm::SnapshotStore::open(c, refused).code() == StatusCode::invalid_argument);
  c.blacklist_min_reports = 4;
  c.blacklist_tracked_pairs = 0;
  CHECK(clm::SnapshotStore::open(c, refused).code() == StatusCode::invalid_argument);

  CHECK(store->unblacklist_key("t", stored).code() == StatusCode::not_found);
  // Three wrong reports, then a refused unblacklist_key: it forgets nothing,
  // so the fourth report blocks the pair.
  for (int i = 0; i < 3; ++i) REQUIRE(store->report_outcome("t", asked, near, false).ok());
  CHECK(store->unblacklist_key("t", stored).code() == StatusCode::not_found);
  REQUIRE(store->report_outcome("t", asked, near, false).ok());
  CHECK(store->metrics().blocked_pairs == 1);
  CHECK(lookup(*store, asked, v).level == SnapshotLevel::miss);
  REQUIRE(store->unblacklist_key("t", stored).ok());  // lifts the pair's block
  CHECK(store->metrics().blocked_pairs == 0);
  CHECK(lookup(*store, asked, v).level == SnapshotLevel::ann);
  CHECK(store->unblacklist_key("t", stored).code() == StatusCode::not_found);
}
