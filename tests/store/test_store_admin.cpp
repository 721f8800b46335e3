// The snapshot store's administration (clm/store/snapshot_store.hpp,
// "administration") against a naive model of what must be served after each
// step, on fresh random vectors; what it refuses; and the migration of a
// store the previous format wrote (tests/data/snapshot_store_format2).
#include <sqlite3.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <set>

#include <catch2/catch.hpp>

#include "clm/store/snapshot_store.hpp"
#include "store/store_test_support.hpp"
#include "test_support.hpp"

#ifndef CLM_TEST_DATA_DIR
#error "CLM_TEST_DATA_DIR must name tests/data (tests/CMakeLists.txt)"
#endif

using clm::SnapshotLevel;
using clm::StatusCode;
using clm_test::host_key;
using clm_test::lookup;
using clm_test::open_store;
using clm_test::random_unit;

namespace {

constexpr int kDim = 24;
constexpr double kF16 = 2e-3;  // a unit vector's entries through f16

clm::SnapshotStoreConfig admin_config(const std::string& path, const clm_test::ManualClock& clock) {
  clm::SnapshotStoreConfig c;
  c.path = path;
  c.num_shards = 3;
  c.snapshot_dim = kDim;
  c.min_usage_threshold = 1;
  c.lookup_timeout_us = 2'000'000;  // never a busy miss on a loaded machine
  c.rebuild_in_background = false;
  c.clock_ms = clock.fn();
  return c;
}

// The model: every version of every key, and what an administrator did.
struct ModelVersion {
  std::vector<float> v;
  std::int64_t confirmations = 0;
};
struct ModelKey {
  std::map<std::int32_t, ModelVersion> versions;
  std::int32_t pinned = 0;
  // What lookup must serve: the pin, else the newest stable version, else the newest.
  std::int32_t served() const {
    if (pinned) return pinned;
    for (auto it = versions.rbegin(); it != versions.rend(); ++it) {
      if (it->second.confirmations >= 1) return it->first;
    }
    return versions.empty() ? 0 : versions.rbegin()->first;
  }
};

void check_against_model(clm::SnapshotStore& store, const std::vector<clm::SuffixKey>& keys,
                         const std::vector<ModelKey>& model, const std::string& tenant) {
  std::vector<float> out;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const ModelKey& m = model[i];
    INFO("key " << keys[i].key << ", served " << m.served() << ", pinned " << m.pinned);
    const clm::SnapshotHit hit = lookup(store, tenant, keys[i], {}, out);
    std::vector<clm::SnapshotVersionInfo> listed;
    const clm::Status listed_status = store.list_versions(tenant, keys[i], listed);
    if (m.versions.empty()) {
      CHECK(hit.level == SnapshotLevel::miss);
      CHECK(listed_status.code() == StatusCode::not_found);
      continue;
    }
    REQUIRE(hit.level == SnapshotLevel::exact);
    CHECK(hit.version == m.served());
    CHECK(hit.pinned == (m.pinned != 0));
    CHECK(clm_test::max_abs_diff(out, m.versions.at(m.served()).v) < kF16);
    REQUIRE(listed_status.ok());
    REQUIRE(listed.size() == m.versions.size());
    auto expected = m.versions.rbegin();
    for (const clm::SnapshotVersionInfo& v : listed) {  // newest first
      CHECK(v.version == expected->first);
      CHECK(v.confirmations == expected->second.confirmations);
      CHECK(v.readable);
      CHECK(v.pinned == (v.version == m.pinned));
      CHECK(v.served == (v.version == m.served()));
      ++expected;
    }
    // Level 2 finds only the served version: a query at its vector, under
    // a key of the same group with no row, is answered by it.
    const clm::SuffixKey probe = host_key("probe-" + keys[i].key, "g");
    const clm::SnapshotHit near = lookup(store, tenant, probe, m.versions.at(m.served()).v, out);
    REQUIRE(near.level == SnapshotLevel::ann);
    CHECK(near.key == keys[i].key);
    CHECK(near.version == m.served());
  }
}

}  // namespace

TEST_CASE("admin: pin, unpin, roll back and delete follow a naive model of the served version", "[store][admin]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm_test::TempDir dir("admin");
  clm_test::ManualClock clock;
  const clm::SnapshotStoreConfig c = admin_config(dir.str(), clock);
  auto store = open_store(c);
  const std::string tenant = "tenant-admin";
  std::vector<clm::SuffixKey> keys;
  for (int i = 0; i < 4; ++i) keys.push_back(host_key("admin-key-" + std::to_string(i), "g"));
  std::vector<ModelKey> model(keys.size());
  for (int step = 0; step < 160; ++step) {
    const std::size_t i = rng() % keys.size();
    ModelKey& m = model[i];
    const int op = static_cast<int>(rng() % 10);
    INFO("step " << step << " op " << op << " key " << keys[i].key);
    if (op < 4 || m.versions.empty()) {  // record: a new version, or a confirmation of the newest
      const bool confirm = !m.versions.empty() && rng() % 2 == 0;
      const std::vector<float> v = confirm ? m.versions.rbegin()->second.v : random_unit(rng, kDim);
      clm::RecordOutcome out;
      REQUIRE(store->record(tenant, keys[i], v, out).ok());
      if (confirm) {
        REQUIRE(out.result == clm::RecordResult::confirmed);
        ++m.versions.rbegin()->second.confirmations;
      } else {
        const std::int32_t version = m.versions.empty() ? 1 : m.versions.rbegin()->first + 1;
        REQUIRE(out.version == version);
        std::vector<float> stored = v;  // as the store keeps it, through f16
        m.versions[version] = {stored, 0};
      }
    } else if (op < 6) {  // pin a random existing version
      auto it = m.versions.begin();
      std::advance(it, static_cast<std::ptrdiff_t>(rng() % m.versions.size()));
      REQUIRE(store->pin_version(tenant, keys[i], it->first).ok());
      m.pinned = it->first;
    } else if (op == 6) {  // unpin
      const clm::Status s = store->unpin_version(tenant, keys[i]);
      CHECK(s.code() == (m.pinned ? StatusCode::ok : StatusCode::not_found));
      m.pinned = 0;
    } else if (op < 9) {  // roll back to a random existing version
      auto it = m.versions.begin();
      std::advance(it, static_cast<std::ptrdiff_t>(rng() % m.versions.size()));
      const std::int32_t to = it->first;
      std::int64_t deleted = -1;
      REQUIRE(store->roll_back(tenant, keys[i], to, deleted).ok());
      std::int64_t expected = 0;
      for (auto v = m.versions.upper_bound(to); v != m.versions.end();) {
        v = m.versions.erase(v);
        ++expected;
      }
      CHECK(deleted == expected);
      if (m.pinned > to) m.pinned = 0;
    } else {  // delete the key
      std::int64_t deleted = -1;
      REQUIRE(store->delete_key(tenant, keys[i], deleted).ok());
      CHECK(deleted == static_cast<std::int64_t>(m.versions.size()));
      m = ModelKey{};
    }
    check_against_model(*store, keys, model, tenant);
  }
  // Pins and rows are persisted: a reopened store serves the same.
  store.reset();
  store = open_store(c);
  check_against_model(*store, keys, model, tenant);
  std::int64_t rows = 0;
  for (const ModelKey& m : model) rows += static_cast<std::int64_t>(m.versions.size());
  CHECK(store->metrics().snapshots == rows);
}

TEST_CASE("admin: a pin holds while new versions are recorded, until it is lifted", "[store][admin]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm_test::ManualClock clock;
  auto store = open_store(admin_config(":memory:", clock));
  const clm::SuffixKey key = host_key("pinned-key");
  const std::vector<float> v1 = random_unit(rng, kDim), v2 = random_unit(rng, kDim), v3 = random_unit(rng, kDim);
  clm::RecordOutcome out;
  REQUIRE(store->record("t", key, v1, out).ok());
  REQUIRE(store->pin_version("t", key, 1).ok());
  REQUIRE(store->record("t", key, v2, out).ok());
  REQUIRE(store->record("t", key, v2, out).ok());  // version 2 is stable now, and still waits
  REQUIRE(store->record("t", key, v3, out).ok());
  CHECK(out.version == 3);
  std::vector<float> got;
  clm::SnapshotHit hit = lookup(*store, "t", key, {}, got);
  CHECK(hit.version == 1);
  CHECK(hit.pinned);
  CHECK(clm_test::max_abs_diff(got, v1) < kF16);
  REQUIRE(store->unpin_version("t", key).ok());
  hit = lookup(*store, "t", key, {}, got);
  CHECK(hit.version == 2);  // the newest stable one
  CHECK_FALSE(hit.pinned);
  CHECK(clm_test::max_abs_diff(got, v2) < kF16);
}

TEST_CASE("admin: blacklist by hand with a reason and an expiry, lift it, list it with the breaker's",
          "[store][admin][breaker]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm_test::TempDir dir("admin-blacklist");
  clm_test::ManualClock clock;
  clm::SnapshotStoreConfig c = admin_config(dir.str(), clock);
  c.blacklist_min_reports = 4;
  auto store = open_store(c);
  const clm::SuffixKey hand = host_key("by-hand"), tripped = host_key("tripped"), future = host_key("not-yet-stored");
  const std::vector<float> v = random_unit(rng, kDim);
  clm::RecordOutcome out;
  REQUIRE(store->record("t", hand, v, out).ok());
  REQUIRE(store->record("t", tripped, random_unit(rng, kDim), out).ok());
  const std::int64_t now = *clock.now;
  REQUIRE(store->blacklist_key("t", hand, "served a refund answer to a cancel question", now + 60'000).ok());
  REQUIRE(store->blacklist_key("t", future, "a key we know is wrong", now + 120'000).ok());
  for (int i = 0; i < 4; ++i) REQUIRE(store->report_outcome("t", tripped, false).ok());
  std::vector<float> got;
  CHECK(lookup(*store, "t", hand, {}, got).level == SnapshotLevel::miss);
  CHECK(lookup(*store, "t", tripped, {}, got).level == SnapshotLevel::miss);

  std::vector<clm::BlacklistEntry> listed;
  REQUIRE(store->list_blacklist(listed).ok());
  REQUIRE(listed.size() == 3);
  std::map<std::string, clm::BlacklistEntry> by_key;
  for (const auto& e : listed) by_key[e.key] = e;
  CHECK(by_key.at("by-hand").by_hand);
  CHECK(by_key.at("by-hand").reason == "served a refund answer to a cancel question");
  CHECK(by_key.at("by-hand").until_ms == now + 60'000);
  CHECK(by_key.at("not-yet-stored").until_ms == now + 120'000);
  CHECK_FALSE(by_key.at("tripped").by_hand);
  CHECK(by_key.at("tripped").reason.find("breaker: 0 of 4") == 0);
  CHECK(by_key.at("tripped").until_ms == now + c.blacklist_duration_ms);

  // Persisted: a reopened store refuses the same keys and lists the same.
  store.reset();
  store = open_store(c);
  CHECK(lookup(*store, "t", hand, {}, got).level == SnapshotLevel::miss);
  std::vector<clm::BlacklistEntry> again;
  REQUIRE(store->list_blacklist(again).ok());
  CHECK(again.size() == 3);

  // Lifted by hand: served again; lifted by time: gone from the list.
  REQUIRE(store->unblacklist_key("t", hand).ok());
  const clm::SnapshotHit hit = lookup(*store, "t", hand, {}, got);
  CHECK(hit.level == SnapshotLevel::exact);
  CHECK(clm_test::max_abs_diff(got, v) < kF16);
  REQUIRE(store->unblacklist_key("t", tripped).ok());
  CHECK(lookup(*store, "t", tripped, {}, got).level == SnapshotLevel::exact);
  REQUIRE(store->report_outcome("t", tripped, false).ok());  // the old outcomes were forgotten: no trip at 1
  CHECK(lookup(*store, "t", tripped, {}, got).level == SnapshotLevel::exact);
  clock.advance_ms(120'001);
  REQUIRE(store->list_blacklist(again).ok());
  CHECK(again.empty());
  CHECK(store->unblacklist_key("t", future).code() == StatusCode::not_found);  // expired
}

TEST_CASE("admin: delete a tenant everywhere, with its index files, and other tenants keep theirs", "[store][admin]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm_test::TempDir dir("admin-tenant");
  clm_test::ManualClock clock;
  clm::SnapshotStoreConfig c = admin_config(dir.str(), clock);
  c.min_usage_threshold = 2;
  auto store = open_store(c);
  std::map<std::string, std::vector<std::pair<clm::SuffixKey, std::vector<float>>>> rows;
  for (const std::string tenant : {"gone", "kept"}) {
    for (int i = 0; i < 30; ++i) {
      const clm::SuffixKey k = host_key(fmt::format("{}-{}", tenant, i), fmt::format("g{}", i % 7));
      const std::vector<float> v = random_unit(rng, kDim);
      clm::RecordOutcome out;
      REQUIRE(store->record(tenant, k, v, out).ok());
      REQUIRE(store->record(tenant, k, v, out).ok());  // admitted at the second sighting
      rows[tenant].emplace_back(k, v);
    }
    clm::RecordOutcome out;
    REQUIRE(store->record(tenant, host_key(tenant + "-seen-once"), random_unit(rng, kDim), out).ok());
    REQUIRE(store->pin_version(tenant, rows[tenant][0].first, 1).ok());
    REQUIRE(store->blacklist_key(tenant, rows[tenant][1].first, "test", *clock.now + 1000).ok());
    REQUIRE(store->set_fallback(tenant, "GREETING", random_unit(rng, kDim)).ok());
  }
  REQUIRE(store->flush().ok());
  auto index_files = [&](const std::string& tenant) {
    int n = 0;
    const std::string tag = fmt::format("{:016x}", clm::key_fingerprint(tenant));
    for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
      n += e.path().filename().string().find(tag) != std::string::npos ? 1 : 0;
    }
    return n;
  };
  REQUIRE(index_files("gone") > 0);
  const std::int64_t before = store->metrics().snapshots;

  clm::TenantDeletionReport report;
  REQUIRE(store->delete_tenant("gone", report).ok());
  CHECK(report.rows == 30);
  CHECK(report.sightings == 1);
  CHECK(report.blacklist == 1);
  CHECK(report.pins == 1);
  CHECK(report.fallbacks == 1);
  CHECK(index_files("gone") == 0);
  CHECK(store->metrics().snapshots == before - 30);
  std::vector<float> got;
  clm::SuffixKey greeting;
  REQUIRE(store->keyer().make_key("hello", greeting).ok());
  CHECK(lookup(*store, "gone", greeting, {}, got).level == SnapshotLevel::miss);
  CHECK(lookup(*store, "kept", greeting, {}, got).level == SnapshotLevel::fallback);
  for (const auto& [k, v] : rows["gone"]) {
    CHECK(lookup(*store, "gone", k, v, got).level == SnapshotLevel::miss);  // nor by level 2
  }
  for (std::size_t i = 2; i < rows["kept"].size(); ++i) {
    CHECK(lookup(*store, "kept", rows["kept"][i].first, {}, got).level == SnapshotLevel::exact);
  }
  CHECK(store->delete_tenant("gone", report).code() == StatusCode::not_found);
  // Nothing comes back at reopen (no index file, no row).
  store.reset();
  store = open_store(c);
  CHECK(index_files("gone") == 0);
  for (const auto& [k, v] : rows["gone"]) CHECK(lookup(*store, "gone", k, v, got).level == SnapshotLevel::miss);
  CHECK(store->metrics().snapshots == before - 30);
}

TEST_CASE("admin: bad input gets a clear status and changes nothing", "[store][admin][errors]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm_test::ManualClock clock;
  auto store = open_store(admin_config(":memory:", clock));
  const clm::SuffixKey key = host_key("stored"), missing = host_key("missing");
  const std::vector<float> v = random_unit(rng, kDim);
  clm::RecordOutcome out;
  REQUIRE(store->record("t", key, v, out).ok());
  const std::int64_t now = *clock.now;
  std::int64_t deleted = 7;
  std::vector<clm::SnapshotVersionInfo> versions;
  clm::TenantDeletionReport report;
  CHECK(store->delete_key("t", missing, deleted).code() == StatusCode::not_found);
  CHECK(deleted == 0);
  CHECK(store->delete_key("other-tenant", key, deleted).code() == StatusCode::not_found);
  CHECK(store->delete_tenant("nobody", report).code() == StatusCode::not_found);
  CHECK(store->list_versions("t", missing, versions).code() == StatusCode::not_found);
  CHECK(store->unblacklist_key("t", key).code() == StatusCode::not_found);
  CHECK(store->unpin_version("t", key).code() == StatusCode::not_found);
  CHECK(store->pin_version("t", key, 2).code() == StatusCode::not_found);
  CHECK(store->pin_version("t", key, 0).code() == StatusCode::not_found);
  CHECK(store->pin_version("t", missing, 1).code() == StatusCode::not_found);
  CHECK(store->roll_back("t", key, 5, deleted).code() == StatusCode::not_found);
  CHECK(store->blacklist_key("t", key, "", now + 1000).code() == StatusCode::invalid_argument);
  CHECK(store->blacklist_key("t", key, std::string(1025, 'x'), now + 1000).code() == StatusCode::invalid_argument);
  CHECK(store->blacklist_key("t", key, "too late", now).code() == StatusCode::invalid_argument);
  clm::SuffixKey forged = key;
  forged.fingerprint ^= 1;
  CHECK(store->delete_key("t", forged, deleted).code() == StatusCode::invalid_argument);
  CHECK(store->pin_version("t", forged, 1).code() == StatusCode::invalid_argument);
  // Nothing changed: the key serves its one version, unpinned, not blacklisted.
  std::vector<float> got;
  const clm::SnapshotHit hit = lookup(*store, "t", key, {}, got);
  CHECK(hit.level == SnapshotLevel::exact);
  CHECK(hit.version == 1);
  CHECK_FALSE(hit.pinned);
  CHECK(clm_test::max_abs_diff(got, v) < kF16);
  std::vector<clm::BlacklistEntry> listed;
  REQUIRE(store->list_blacklist(listed).ok());
  CHECK(listed.empty());
  CHECK(store->metrics().snapshots == 1);
}

namespace {

// The vectors tests/data/snapshot_store_format2 was written with (its README).
std::vector<float> format2_vector(int i, int version) {
  std::vector<double> v(8);
  double n = 0;
  for (int j = 0; j < 8; ++j) {
    v[static_cast<std::size_t>(j)] = std::sin(1.7 * i + 0.9 * version + 0.31 * j);
    n += v[static_cast<std::size_t>(j)] * v[static_cast<std::size_t>(j)];
  }
  std::vector<float> out(8);
  for (int j = 0; j < 8; ++j)
    out[static_cast<std::size_t>(j)] = static_cast<float>(v[static_cast<std::size_t>(j)] / std::sqrt(n));
  return out;
}

std::int64_t meta_value(const std::string& db_path, const char* name) {
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK);
  sqlite3_stmt* q = nullptr;
  REQUIRE(sqlite3_prepare_v2(db, "SELECT value FROM store_meta WHERE name = ?1", -1, &q, nullptr) == SQLITE_OK);
  sqlite3_bind_text(q, 1, name, -1, SQLITE_STATIC);
  const std::int64_t value = sqlite3_step(q) == SQLITE_ROW ? sqlite3_column_int64(q, 0) : -1;
  sqlite3_finalize(q);
  sqlite3_close(db);
  return value;
}

void set_key_rules(const std::string& db_path, std::uint64_t rules) {
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open(db_path.c_str(), &db) == SQLITE_OK);
  const std::string sql =
      fmt::format("UPDATE store_meta SET value = {} WHERE name = 'key_rules'", static_cast<std::int64_t>(rules));
  REQUIRE(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr) == SQLITE_OK);
  sqlite3_close(db);
}

void check_format2_rows(clm::SnapshotStore& store) {
  std::vector<float> got;
  for (int i = 0; i < 6; ++i) {
    const std::string tenant = i % 2 ? "tenant-b" : "tenant-a";
    const int newest = 1 + i % 3;
    const clm::SuffixKey k = host_key("host-key-" + std::to_string(i), "");
    INFO("host-key-" << i);
    const clm::SnapshotHit hit = lookup(store, tenant, k, {}, got);
    REQUIRE(hit.level == SnapshotLevel::exact);
    CHECK(hit.version == newest);
    CHECK(clm_test::max_abs_diff(got, format2_vector(i, newest)) < kF16);
    std::vector<clm::SnapshotVersionInfo> versions;
    REQUIRE(store.list_versions(tenant, k, versions).ok());
    CHECK(versions.size() == static_cast<std::size_t>(newest));
  }
  // The key the rules of that day made of "cancel order 789" (no details:
  // its group is the key), spelt out so that later rules change nothing here.
  const clm::SuffixKey cancel = host_key("CANCEL-ORDER-789", "");
  const clm::SnapshotHit hit = lookup(store, "tenant-a", cancel, {}, got);
  REQUIRE(hit.level == SnapshotLevel::exact);
  CHECK(hit.version == 2);  // 取消订单789's, under the same key
  CHECK(clm_test::max_abs_diff(got, format2_vector(102, 1)) < kF16);
  // The breaker's entry, in force at the store's clock, from before reasons.
  const clm::SuffixKey bad = host_key("host-key-blacklisted", "");
  CHECK(lookup(store, "tenant-a", bad, {}, got).level == SnapshotLevel::miss);
  std::vector<clm::BlacklistEntry> listed;
  REQUIRE(store.list_blacklist(listed).ok());
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].key == "host-key-blacklisted");
  CHECK(listed[0].until_ms == 1764986400000);
  CHECK(listed[0].reason.empty());
  CHECK_FALSE(listed[0].by_hand);
  clm::SuffixKey hello;  // a greeting: low-information, served only by its fallback
  hello.key = "GREETING";
  hello.fingerprint = clm::key_fingerprint(hello.key);
  hello.group = hello.fingerprint;
  hello.low_information = true;
  hello.abstain_reason = "a greeting or thanks only";
  CHECK(lookup(store, "tenant-a", hello, {}, got).level == SnapshotLevel::fallback);
  CHECK(clm_test::max_abs_diff(got, format2_vector(60, 1)) < kF16);
  // A migrated store takes the new administration (a reader refuses it).
  const clm::SuffixKey k2 = host_key("host-key-2", "");
  if (store.config().read_only) {
    CHECK(store.pin_version("tenant-a", k2, 1).code() == StatusCode::failed_precondition);
    return;
  }
  REQUIRE(store.pin_version("tenant-a", k2, 1).ok());
  CHECK(lookup(store, "tenant-a", k2, {}, got).version == 1);
}

}  // namespace

TEST_CASE("a store of format 2, as the previous release wrote it, migrates in place and serves its rows",
          "[store][admin][migration]") {
  const std::string data = std::string(CLM_TEST_DATA_DIR) + "/snapshot_store_format2";
  REQUIRE(std::filesystem::exists(data + "/shard-00.db"));
  clm_test::ManualClock clock;
  *clock.now = 1764900000000 + 1000;  // the store's own day: its blacklist entry is in force
  auto copy_of_data = [&](const clm_test::TempDir& dir) {
    for (const auto& e : std::filesystem::directory_iterator(data)) {
      if (e.path().extension() != ".md") std::filesystem::copy_file(e.path(), dir.path() / e.path().filename());
    }
  };
  clm::SnapshotStoreConfig c = admin_config("", clock);
  c.num_shards = 2;
  c.snapshot_dim = 8;
  c.version_cosine = 0.99f;
  std::unique_ptr<clm::SuffixKeyer> keyer;
  REQUIRE(clm::SuffixKeyer::create(c.keyer, keyer).ok());

  SECTION("opened under the rules it recorded: open migrates") {
    clm_test::TempDir dir("format2");
    copy_of_data(dir);
    c.path = dir.str();
    // As if this library's key rules were those the store was made under:
    // what open() does to a format-2 store of today's rules.
    for (int s = 0; s < 2; ++s) {
      const std::string db = fmt::format("{}/shard-{:02}.db", dir.str(), s);
      REQUIRE(meta_value(db, "format") == 2);
      set_key_rules(db, keyer->rules_fingerprint());
    }
    {
      auto store = open_store(c);
      check_format2_rows(*store);
    }
    for (int s = 0; s < 2; ++s) CHECK(meta_value(fmt::format("{}/shard-{:02}.db", dir.str(), s), "format") == 4);
    auto again = open_store(c);  // a migrated store opens as it is
    std::vector<float> got;
    CHECK(lookup(*again, "tenant-a", host_key("host-key-2", ""), {}, got).version == 1);  // the pin held
  }
  SECTION("read-only: refused until a writer migrates it, and left as it was") {
    clm_test::TempDir dir("format2-reader");
    copy_of_data(dir);
    c.path = dir.str();
    for (int s = 0; s < 2; ++s)
      set_key_rules(fmt::format("{}/shard-{:02}.db", dir.str(), s), keyer->rules_fingerprint());
    clm::SnapshotStoreConfig reader = c;
    reader.read_only = true;
    std::unique_ptr<clm::SnapshotStore> store;
    const clm::Status refused = clm::SnapshotStore::open(reader, store);
    CHECK(refused.code() == StatusCode::failed_precondition);
    CHECK(refused.message().find("read-write") != std::string::npos);
    CHECK(meta_value(dir.str() + "/shard-00.db", "format") == 2);
    CHECK_FALSE(std::filesystem::exists(dir.path() / "LOCK"));
    { auto writer = open_store(c); }  // migrates
    store = open_store(reader);
    check_format2_rows(*store);
  }
  SECTION("under other rules: refused, then adopted (which migrates too)") {
    clm_test::TempDir dir("format2-adopt");
    copy_of_data(dir);
    c.path = dir.str();
    std::unique_ptr<clm::SnapshotStore> store;
    if (meta_value(dir.str() + "/shard-00.db", "key_rules") != static_cast<std::int64_t>(keyer->rules_fingerprint())) {
      const clm::Status refused = clm::SnapshotStore::open(c, store);
      CHECK(refused.code() == StatusCode::failed_precondition);
      CHECK(refused.message().find("rekey") != std::string::npos);
      CHECK(meta_value(dir.str() + "/shard-00.db", "format") == 2);  // a refused open writes nothing
    }
    clm::RekeyReport report;
    REQUIRE(clm::SnapshotStore::rekey(c, true, report).ok());
    CHECK(report.old_format == 2);
    for (int s = 0; s < 2; ++s) CHECK(meta_value(fmt::format("{}/shard-{:02}.db", dir.str(), s), "format") == 4);
    store = open_store(c);
    check_format2_rows(*store);
  }
}

namespace {

// Each column of `table` in the database, by name.
std::vector<std::string> columns_of(const std::string& db_path, const char* table) {
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK);
  sqlite3_stmt* q = nullptr;
  REQUIRE(sqlite3_prepare_v2(db, "SELECT name FROM pragma_table_info(?1)", -1, &q, nullptr) == SQLITE_OK);
  sqlite3_bind_text(q, 1, table, -1, SQLITE_STATIC);
  std::vector<std::string> out;
  while (sqlite3_step(q) == SQLITE_ROW) out.emplace_back(reinterpret_cast<const char*>(sqlite3_column_text(q, 0)));
  sqlite3_finalize(q);
  sqlite3_close(db);
  return out;
}

}  // namespace

TEST_CASE("a store of format 3 migrates in place: the usage columns move to their own database, the counts kept",
          "[store][admin][migration]") {
  const std::string data = std::string(CLM_TEST_DATA_DIR) + "/snapshot_store_format3";
  REQUIRE(std::filesystem::exists(data + "/shard-00.db"));
  constexpr std::int64_t kDay0Ms = 1796428800000, kDayMs = 86'400'000;  // its README
  clm_test::ManualClock clock;
  *clock.now = kDay0Ms + 6 * kDayMs;
  clm_test::TempDir dir("format3");
  for (const auto& e : std::filesystem::directory_iterator(data)) {
    if (e.path().extension() != ".md") std::filesystem::copy_file(e.path(), dir.path() / e.path().filename());
  }
  clm::SnapshotStoreConfig c = admin_config(dir.str(), clock);
  c.num_shards = 2;
  c.snapshot_dim = 8;
  c.version_cosine = 0.99f;
  std::unique_ptr<clm::SuffixKeyer> keyer;
  REQUIRE(clm::SuffixKeyer::create(c.keyer, keyer).ok());
  for (int s = 0; s < 2; ++s) {
    const std::string db = fmt::format("{}/shard-{:02}.db", dir.str(), s);
    REQUIRE(meta_value(db, "format") == 3);
    set_key_rules(db, keyer->rules_fingerprint());
  }
  {  // As if a migration had committed its copy of shard 1's counts, then crashed: the next one copies again.
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open((dir.str() + "/shard-01.usage.db").c_str(), &db) == SQLITE_OK);
    REQUIRE(sqlite3_exec(db,
                         "CREATE TABLE snapshot_usage (id INTEGER PRIMARY KEY, usage_count INTEGER NOT NULL,"
                         " last_used INTEGER NOT NULL); INSERT INTO snapshot_usage VALUES (1, 3, 1796428800)",
                         nullptr, nullptr, nullptr) == SQLITE_OK);
    sqlite3_close(db);
  }
  auto store = open_store(c);
  for (int s = 0; s < 2; ++s) {
    const std::string db = fmt::format("{}/shard-{:02}.db", dir.str(), s);
    CHECK(meta_value(db, "format") == 4);
    const std::vector<std::string> cols = columns_of(db, "semantic_snapshots");
    CHECK(std::find(cols.begin(), cols.end(), "usage_count") == cols.end());
    CHECK(std::find(cols.begin(), cols.end(), "last_used") == cols.end());
    CHECK(columns_of(fmt::format("{}/shard-{:02}.usage.db", dir.str(), s), "snapshot_usage") ==
          std::vector<std::string>{"id", "usage_count", "last_used"});
  }
  std::vector<float> got;
  for (int i = 0; i < 6; ++i) {
    const std::string tenant = i % 2 ? "tenant-b" : "tenant-a";
    const int served = i == 2 ? 1 : 1 + i % 3;  // host-key-2 is pinned to version 1
    const clm::SuffixKey k = host_key("host-key-" + std::to_string(i), "");
    INFO("host-key-" << i);
    const clm::SnapshotHit hit = lookup(*store, tenant, k, {}, got);
    REQUIRE(hit.level == SnapshotLevel::exact);
    CHECK(hit.version == served);
    CHECK(hit.pinned == (i == 2));
    CHECK(clm_test::max_abs_diff(got, format2_vector(i, served)) < kF16);
  }
  // The counts and times of use came along, and the lookups above (day 6)
  // add to them.
  auto version_info = [&](const std::string& tenant, const char* key, std::int32_t version) {
    std::vector<clm::SnapshotVersionInfo> versions;
    REQUIRE(store->list_versions(tenant, host_key(key, ""), versions).ok());
    for (const auto& v : versions)
      if (v.version == version) return v;
    FAIL("no version " << version << " of " << key);
    return clm::SnapshotVersionInfo{};
  };
  REQUIRE(store->flush().ok());
  CHECK(version_info("tenant-a", "host-key-0", 1).usage_count == 3 + 1);
  CHECK(version_info("tenant-a", "host-key-0", 1).last_used_s == *clock.now / 1000);
  CHECK(version_info("tenant-b", "host-key-1", 2).usage_count == 2 + 1);
  CHECK(version_info("tenant-b", "host-key-1", 1).usage_count == 0);
  CHECK(version_info("tenant-b", "host-key-1", 1).last_used_s == kDay0Ms / 1000);  // made on day 0, never used
  CHECK(version_info("tenant-a", "host-key-4", 1).usage_count == 0);
  // The hand-made blacklist entry and the fallback.
  CHECK(lookup(*store, "tenant-b", host_key("host-key-blacklisted", ""), {}, got).level == SnapshotLevel::miss);
  std::vector<clm::BlacklistEntry> listed;
  REQUIRE(store->list_blacklist(listed).ok());
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].reason == "served a refund answer to a cancel");
  CHECK(listed[0].by_hand);
  CHECK(listed[0].until_ms == kDay0Ms + 35 * kDayMs);
  clm::VerifyReport verified;
  REQUIRE(store->verify(verified).ok());
  CHECK(verified.damaged == 0);
  CHECK(verified.rows == 13);
  // Eviction reads the moved counts: on day 34, what was used on day 6 (the
  // six served versions) or made on day 5 (the blacklisted key) stays; the 6
  // rows made on day 0 and never used go.
  *clock.now = kDay0Ms + 34 * kDayMs;
  store.reset();
  c.evict_min_usage = 1;
  store = open_store(c);
  std::vector<clm::EvictionCandidate> candidates;
  REQUIRE(store->eviction_candidates(candidates).ok());
  CHECK(candidates.size() == 6);
  for (const auto& cand : candidates) CHECK(cand.usage_count == 0);
  clm::EvictionReport report;
  REQUIRE(store->evict(report).ok());
  CHECK(report.deleted == 6);
  REQUIRE(store->verify(verified).ok());
  CHECK(verified.damaged == 0);
  CHECK(verified.rows == 7);
  store.reset();
  // A reader needs the usage database a writer makes: without it, refused.
  std::filesystem::remove(dir.path() / "shard-01.usage.db");
  clm::SnapshotStoreConfig reader = c;
  reader.read_only = true;
  const clm::Status refused = clm::SnapshotStore::open(reader, store);
  CHECK(refused.code() == StatusCode::failed_precondition);
  CHECK(refused.message().find("usage database") != std::string::npos);
  store = open_store(c);  // a writer makes an empty one: the counts are gone, the rows serve
  CHECK(lookup(*store, "tenant-a", host_key("host-key-0", ""), {}, got).level == SnapshotLevel::exact);
  store.reset();
  store = open_store(reader);
  CHECK(lookup(*store, "tenant-a", host_key("host-key-0", ""), {}, got).level == SnapshotLevel::exact);
}

TEST_CASE("a key keeps at most max_versions_per_key versions: the oldest unpinned ones go, index entries too",
          "[store][admin][versions]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm_test::ManualClock clock;
  clm::SnapshotStoreConfig c = admin_config(":memory:", clock);
  c.max_versions_per_key = 3;
  auto store = open_store(c);
  const clm::SuffixKey key = host_key("capped", "g");
  std::map<std::int32_t, std::vector<float>> made;
  std::set<std::int32_t> expected;
  auto record_new = [&](std::int32_t version) {
    made[version] = random_unit(rng, kDim);
    clm::RecordOutcome out;
    REQUIRE(store->record("t", key, made[version], out).ok());
    REQUIRE(out.version == version);
  };
  auto check_kept = [&](const std::set<std::int32_t>& want) {
    std::vector<clm::SnapshotVersionInfo> listed;
    REQUIRE(store->list_versions("t", key, listed).ok());
    std::set<std::int32_t> have;
    for (const auto& v : listed) have.insert(v.version);
    CHECK(have == want);
    std::vector<float> got;
    for (const auto& [version, v] : made) {  // level 2 finds no deleted version
      const clm::SnapshotHit near = lookup(*store, "t", host_key("probe", "g"), v, got);
      if (!want.count(version)) CHECK((near.level == SnapshotLevel::miss || near.version != version));
    }
  };
  record_new(1);
  REQUIRE(store->pin_version("t", key, 1).ok());
  for (std::int32_t v = 2; v <= 6; ++v) record_new(v);
  check_kept({1, 5, 6});  // the pinned one stays, the oldest others went
  CHECK(store->metrics().versions_dropped == 3);
  REQUIRE(store->unpin_version("t", key).ok());
  record_new(7);
  check_kept({5, 6, 7});
  CHECK(store->metrics().versions_dropped == 4);
  CHECK(store->metrics().snapshots == 3);
  c.max_versions_per_key = 0;
  std::unique_ptr<clm::SnapshotStore> refused;
  CHECK(clm::SnapshotStore::open(c, refused).code() == StatusCode::invalid_argument);
}
