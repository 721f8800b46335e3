// Usage counts and level 1's remembered rows (snapshot_store.hpp,
// "Durability"): the background write of the counts never holds the shard's
// lock, so lookups go on while it waits for SQLite (held here by a second
// connection, as another process's write would), and every count reaches the
// database; level 1 serves what a naive model says after each write, with the
// row it remembered or not.
#include <sqlite3.h>

#include <chrono>
#include <map>
#include <random>
#include <thread>

#include <catch2/catch.hpp>

#include "clm/store/snapshot_store.hpp"
#include "store/store_test_support.hpp"
#include "test_support.hpp"

using clm::SnapshotLevel;
using clm_test::host_key;
using clm_test::random_unit;

namespace {

constexpr int kDim = 8;
constexpr int kRows = 4200;  // past the 4,096 pending rows that start a background write

std::int64_t sum_usage(const std::string& db) {
  sqlite3* h = nullptr;
  REQUIRE(sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK);
  sqlite3_stmt* q = nullptr;
  REQUIRE(sqlite3_prepare_v2(h, "SELECT coalesce(sum(usage_count), 0) FROM snapshot_usage", -1, &q, nullptr) ==
          SQLITE_OK);
  REQUIRE(sqlite3_step(q) == SQLITE_ROW);
  const std::int64_t sum = sqlite3_column_int64(q, 0);
  sqlite3_finalize(q);
  sqlite3_close(h);
  return sum;
}

}  // namespace

TEST_CASE("usage: the background write waits for SQLite without the shard's lock, and lookups go on",
          "[store][usage]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm_test::TempDir dir("usage");
  clm::SnapshotStoreConfig c;
  c.path = dir.str();
  c.num_shards = 1;
  c.snapshot_dim = kDim;
  c.min_usage_threshold = 1;
  c.lookup_timeout_us = 500'000;   // a lookup held by the shard's lock misses after 0.5 s
  c.write_busy_timeout_ms = 3000;  // the background write waits up to 3 s for SQLite
  c.rebuild_in_background = false;
  auto store = [&] {
    std::unique_ptr<clm::SnapshotStore> s;
    REQUIRE(clm::SnapshotStore::open(c, s).ok());
    return s;
  }();
  std::vector<clm::SuffixKey> keys;
  std::vector<clm::SnapshotRecord> records;
  std::vector<std::vector<float>> vs;
  for (int i = 0; i < kRows; ++i) {
    keys.push_back(host_key(fmt::format("k{}", i), "g"));
    vs.push_back(random_unit(rng, kDim));
  }
  for (int i = 0; i < kRows; ++i)
    records.push_back({"t", &keys[static_cast<std::size_t>(i)], vs[static_cast<std::size_t>(i)]});
  std::vector<clm::RecordOutcome> outcomes(records.size());
  REQUIRE(store->record_batch(records, outcomes).ok());
  REQUIRE(store->flush().ok());
  const std::string db = dir.str() + "/shard-00.usage.db";  // the counts' own database (store format 4)
  CHECK(sum_usage(db) == 0);

  // Another writer holds SQLite's write lock.
  sqlite3* other = nullptr;
  REQUIRE(sqlite3_open(db.c_str(), &other) == SQLITE_OK);
  REQUIRE(sqlite3_exec(other, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) == SQLITE_OK);

  std::vector<float> out(kDim);
  auto lookup_all = [&](int from, int to) {
    for (int i = from; i < to; ++i) {
      clm::SnapshotHit hit;
      REQUIRE(store->lookup("t", keys[static_cast<std::size_t>(i)], {}, hit, out).ok());
      REQUIRE(hit.level == SnapshotLevel::exact);
    }
  };
  lookup_all(0, 4096);  // the 4,096th pending row asks the background thread to write
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // it is waiting for `other` now
  const auto start = std::chrono::steady_clock::now();
  lookup_all(4096, kRows);  // the same shard: not held up by that wait
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(store->metrics().busy_misses == 0);
  CHECK(seconds < 2.0);  // a lookup held by the shard's lock would wait 0.5 s, then miss
  REQUIRE(sqlite3_exec(other, "ROLLBACK", nullptr, nullptr, nullptr) == SQLITE_OK);
  sqlite3_close(other);

  // The background write goes through once the lock is free: the 4,096 counts
  // are in the database without a flush; the rest follow with it.
  std::int64_t written = 0;
  for (int i = 0; i < 400 && written < 4096; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    written = sum_usage(db);
  }
  CHECK(written == 4096);
  REQUIRE(store->flush().ok());
  CHECK(sum_usage(db) == kRows);
}

TEST_CASE("level 1 serves what a naive model says after every write, remembered row or not", "[store][usage]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm_test::TempDir dir("choice");
  clm_test::ManualClock clock;
  clm::SnapshotStoreConfig c;
  c.path = dir.str();
  c.num_shards = 2;
  c.snapshot_dim = kDim;
  c.min_usage_threshold = 1;
  c.version_cosine = 0.99f;
  c.max_versions_per_key = 4;
  c.lookup_timeout_us = 2'000'000;
  c.rebuild_in_background = false;
  c.clock_ms = clock.fn();
  std::unique_ptr<clm::SnapshotStore> store;
  REQUIRE(clm::SnapshotStore::open(c, store).ok());
  // The model: per key, versions (number -> vector, confirmations); served =
  // pin, else the newest with a confirmation, else the newest.
  struct Version {
    std::vector<float> v;
    int confirmations = 0;
  };
  std::vector<clm::SuffixKey> keys;
  for (int i = 0; i < 6; ++i) keys.push_back(host_key(fmt::format("key-{}", i), "g"));
  std::vector<std::map<int, Version>> model(keys.size());
  std::vector<int> next_version(keys.size(), 1), pinned(keys.size(), 0);
  std::vector<float> out(kDim);
  auto served = [&](std::size_t k) {
    if (pinned[k]) return pinned[k];
    for (auto it = model[k].rbegin(); it != model[k].rend(); ++it) {
      if (it->second.confirmations >= 1) return it->first;
    }
    return model[k].empty() ? 0 : model[k].rbegin()->first;
  };
  for (int step = 0; step < 600; ++step) {
    const std::size_t k = rng() % keys.size();
    const int op = static_cast<int>(rng() % 10);
    INFO("step " << step << " op " << op << " key " << k);
    if (op < 5 || model[k].empty()) {  // record: a new version or a confirmation of the newest
      clm::RecordOutcome o;
      if (!model[k].empty() && rng() % 2 == 0) {
        REQUIRE(store->record("t", keys[k], model[k].rbegin()->second.v, o).ok());
        REQUIRE(o.result == clm::RecordResult::confirmed);
        ++model[k].rbegin()->second.confirmations;
      } else {
        std::vector<float> v = random_unit(rng, kDim);
        REQUIRE(store->record("t", keys[k], v, o).ok());
        const int version = next_version[k]++;
        REQUIRE(o.version == version);
        model[k][version] = {v, 0};
        while (model[k].size() > 4) {  // the cap drops the oldest unpinned
          auto oldest = model[k].begin();
          if (oldest->first == pinned[k]) ++oldest;
          model[k].erase(oldest);
        }
      }
    } else if (op == 5) {  // pin a version
      const auto it = std::next(model[k].begin(), static_cast<std::ptrdiff_t>(rng() % model[k].size()));
      REQUIRE(store->pin_version("t", keys[k], it->first).ok());
      pinned[k] = it->first;
    } else if (op == 6 && pinned[k]) {
      REQUIRE(store->unpin_version("t", keys[k]).ok());
      pinned[k] = 0;
    } else if (op == 7) {  // roll back to the oldest version
      const int to = model[k].begin()->first;
      std::int64_t deleted = 0;
      REQUIRE(store->roll_back("t", keys[k], to, deleted).ok());
      while (model[k].rbegin()->first > to) model[k].erase(std::prev(model[k].end()));
      if (pinned[k] > to) pinned[k] = 0;
      next_version[k] = to + 1;
    } else if (op == 8) {  // delete the key
      std::int64_t deleted = 0;
      REQUIRE(store->delete_key("t", keys[k], deleted).ok());
      model[k].clear();
      pinned[k] = 0;
      next_version[k] = 1;
    }
    // Every key, twice (the second time from the remembered row).
    for (std::size_t j = 0; j < keys.size(); ++j) {
      for (int twice = 0; twice < 2; ++twice) {
        clm::SnapshotHit hit;
        REQUIRE(store->lookup("t", keys[j], {}, hit, out).ok());
        if (model[j].empty()) {
          REQUIRE(hit.level == SnapshotLevel::miss);
          continue;
        }
        REQUIRE(hit.level == SnapshotLevel::exact);
        REQUIRE(hit.version == served(j));
        REQUIRE(hit.stable == (model[j].at(served(j)).confirmations >= 1));
        REQUIRE(clm_test::max_abs_diff(out, model[j].at(served(j)).v) < 2e-3);
      }
    }
  }
}
