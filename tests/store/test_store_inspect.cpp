// The snapshot store's inspection API (snapshot_store.hpp, "inspection", and
// read_layout) against a naive model of what was recorded, on fresh random
// data: per-shard counts, a verify that finds a row damaged by hand (raw
// SQLite), and an eviction dry run that lists exactly what evict() then
// deletes.
#include <sqlite3.h>

#include <map>
#include <random>
#include <set>

#include <catch2/catch.hpp>

#include "clm/store/snapshot_store.hpp"
#include "store/store_test_support.hpp"
#include "test_support.hpp"

using clm::SnapshotLevel;
using clm::StatusCode;
using clm_test::host_key;
using clm_test::open_store;
using clm_test::random_unit;

namespace {

constexpr int kDim = 12;

clm::SnapshotStoreConfig inspect_config(const std::string& path, const clm_test::ManualClock& clock) {
  clm::SnapshotStoreConfig c;
  c.path = path;
  c.num_shards = 4;
  c.snapshot_dim = kDim;
  c.min_usage_threshold = 1;
  c.version_cosine = 0.99f;
  c.lookup_timeout_us = 2'000'000;
  c.rebuild_in_background = false;
  c.clock_ms = clock.fn();
  return c;
}

// Runs sql on a database by hand; the rows it changed.
int exec_sql(const std::string& db, const std::string& sql) {
  sqlite3* h = nullptr;
  REQUIRE(sqlite3_open(db.c_str(), &h) == SQLITE_OK);
  char* err = nullptr;
  const int rc = sqlite3_exec(h, sql.c_str(), nullptr, nullptr, &err);
  INFO((err ? err : ""));
  const int changed = sqlite3_changes(h);
  sqlite3_free(err);
  sqlite3_close(h);
  REQUIRE(rc == SQLITE_OK);
  return changed;
}

}  // namespace

TEST_CASE("inspection: counts per shard match a naive model, and layout without opening", "[store][inspect]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm_test::TempDir dir("inspect");
  clm_test::ManualClock clock;
  const clm::SnapshotStoreConfig c = inspect_config(dir.str(), clock);
  auto store = open_store(c);
  // Model: per shard, (tenant, key) -> versions; sightings below threshold are not used here.
  std::map<std::int32_t, std::map<std::pair<std::string, std::string>, int>> model;
  std::map<std::pair<std::string, std::string>, std::vector<float>> newest;
  for (int i = 0; i < 300; ++i) {
    const std::string tenant = fmt::format("t{}", rng() % 3);
    const auto k = rng() % 40;
    const clm::SuffixKey key = host_key(fmt::format("k{}", k), fmt::format("g{}", k % 5));  // a key has one group
    auto& last = newest[{tenant, key.key}];
    // A repeat of the newest vector confirms it; a fresh one is a new version.
    const bool fresh = last.empty() || rng() % 2 == 0;
    if (fresh) last = random_unit(rng, kDim);
    clm::RecordOutcome o;
    REQUIRE(store->record(tenant, key, last, o).ok());
    if (fresh) ++model[store->shard_of(tenant, key)][{tenant, key.key}];
  }
  std::vector<clm::ShardStatistics> stats;
  REQUIRE(store->shard_statistics(stats).ok());
  REQUIRE(stats.size() == 4);
  std::int64_t total_rows = 0;
  for (const clm::ShardStatistics& s : stats) {
    INFO("shard " << s.shard);
    const auto& m = model[s.shard];
    std::int64_t rows = 0, max_version = 0;
    std::set<std::string> tenants;
    for (const auto& [tk, versions] : m) {
      rows += versions;
      max_version = std::max<std::int64_t>(max_version, versions);
      tenants.insert(tk.first);
    }
    CHECK(s.rows == rows);
    CHECK(s.keys == static_cast<std::int64_t>(m.size()));
    CHECK(s.tenants == static_cast<std::int64_t>(tenants.size()));
    CHECK(s.max_version == max_version);
    CHECK(s.indexed == rows);  // every version is in its tenant's index
    CHECK(s.db_bytes > 0);
    total_rows += s.rows;
  }
  CHECK(total_rows == store->metrics().snapshots);
  REQUIRE(store->flush().ok());
  REQUIRE(store->shard_statistics(stats).ok());
  for (const clm::ShardStatistics& s : stats) {
    std::set<std::string> tenants;
    for (const auto& [tk, versions] : model[s.shard]) tenants.insert(tk.first);
    CHECK(s.index_files == static_cast<std::int64_t>(tenants.size()));  // one per tenant, once saved
    CHECK((s.index_bytes > 0) == !tenants.empty());
  }

  clm::StoreLayout layout;
  REQUIRE(clm::SnapshotStore::read_layout(dir.str(), layout).ok());  // beside the writer: no lock taken
  CHECK(layout.num_shards == 4);
  CHECK(layout.snapshot_dim == kDim);
  CHECK(layout.format == 4);
  CHECK(layout.key_rules == store->keyer().rules_fingerprint());
  CHECK(clm::SnapshotStore::read_layout((dir.path() / "none").string(), layout).code() == StatusCode::not_found);
  clm_test::TempDir other("inspect-other");
  exec_sql((other.path() / "shard-00.db").string(), "CREATE TABLE t (x)");
  CHECK(clm::SnapshotStore::read_layout(other.str(), layout).code() == StatusCode::failed_precondition);
}

TEST_CASE("inspection: verify finds a row damaged on disk, and a reader verifies too", "[store][inspect]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm_test::TempDir dir("verify");
  clm_test::ManualClock clock;
  clm::SnapshotStoreConfig c = inspect_config(dir.str(), clock);
  int victim_shard = 0;  // every key of group "g" lives in one shard
  {
    auto store = open_store(c);
    victim_shard = store->shard_of("t", host_key("k0"));
    for (int i = 0; i < 50; ++i) {
      clm::RecordOutcome o;
      REQUIRE(store->record("t", host_key(fmt::format("k{}", i)), random_unit(rng, kDim), o).ok());
    }
    REQUIRE(store->set_fallback("t", "*", random_unit(rng, kDim)).ok());
    clm::VerifyReport report;
    REQUIRE(store->verify(report).ok());
    CHECK(report.rows == 50);
    CHECK(report.fallbacks == 1);
    CHECK(report.damaged == 0);
    CHECK(report.integrity_ok);
    CHECK(report.problems.empty());
  }
  // Damage one row's BLOB by hand (a byte of its payload) and another's key.
  const std::string db = fmt::format("{}/shard-{:02}.db", dir.str(), victim_shard);
  REQUIRE(exec_sql(db,
                   "UPDATE semantic_snapshots SET snapshot = CAST(substr(snapshot, 1, 20) || X'FF' || X'FF' ||"
                   " substr(snapshot, 23) AS BLOB) WHERE id = (SELECT min(id) FROM semantic_snapshots)") == 1);
  REQUIRE(exec_sql(db,
                   "UPDATE semantic_snapshots SET suffix_key = suffix_key || 'x'"
                   " WHERE id = (SELECT max(id) FROM semantic_snapshots)") == 1);
  c.read_only = true;
  auto reader = open_store(c);
  clm::VerifyReport report;
  REQUIRE(reader->verify(report).ok());
  CHECK(report.rows == 50);
  CHECK(report.damaged == 2);
  REQUIRE(report.problems.size() == 2);
  CHECK(report.problems[0].find(fmt::format("shard {:02}", victim_shard)) != std::string::npos);
  CHECK(report.problems[1].find("fingerprint") != std::string::npos);
}

TEST_CASE("inspection: the eviction dry run lists exactly what evict() deletes, unwritten usage counted",
          "[store][inspect]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm_test::TempDir dir("evict-dry");
  clm_test::ManualClock clock;
  const clm::SnapshotStoreConfig c = inspect_config(dir.str(), clock);
  auto store = open_store(c);
  std::vector<clm::SuffixKey> keys;
  for (int i = 0; i < 120; ++i) {
    keys.push_back(host_key(fmt::format("k{}", i), fmt::format("g{}", i % 7)));
    clm::RecordOutcome o;
    REQUIRE(store->record("t", keys.back(), random_unit(rng, kDim), o).ok());
  }
  // Uses: some keys 5 times (kept whatever their age), some fewer; some
  // written (flush), some only in memory.
  std::vector<int> uses(keys.size());
  std::vector<float> out(kDim);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    uses[i] = static_cast<int>(rng() % 7);
    for (int u = 0; u < uses[i]; ++u) {
      clm::SnapshotHit hit;
      REQUIRE(store->lookup("t", keys[i], {}, hit, out).ok());
    }
    if (i == keys.size() / 2) REQUIRE(store->flush().ok());
  }
  clock.advance_ms(40LL * 24 * 3600 * 1000);
  std::set<std::string> expected;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (uses[i] < 5) expected.insert(keys[i].key);
  }
  std::vector<clm::EvictionCandidate> listed;
  REQUIRE(store->eviction_candidates(listed).ok());
  std::set<std::string> listed_keys;
  for (const auto& e : listed) {
    listed_keys.insert(e.key);
    CHECK(e.tenant == "t");
    CHECK(e.usage_count < 5);
  }
  CHECK(listed_keys == expected);
  CHECK(listed.size() == expected.size());
  CHECK(store->metrics().evictions == 0);  // a dry run deletes nothing
  clm::EvictionReport report;
  REQUIRE(store->evict(report).ok());
  CHECK(report.deleted == static_cast<std::int64_t>(expected.size()));
  for (std::size_t i = 0; i < keys.size(); ++i) {
    clm::SnapshotHit hit;
    REQUIRE(store->lookup("t", keys[i], {}, hit, out).ok());
    CHECK((hit.level == SnapshotLevel::exact) == (expected.count(keys[i].key) == 0));
  }
}
