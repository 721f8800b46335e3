// Reading a snapshot store beside its writer (SnapshotStoreConfig::read_only)
// and the writer's scheduled maintenance (maintenance_interval_ms): what a
// reader serves against what the writer recorded (a naive model of the
// vectors), that it writes nothing (every file's bytes before and after),
// that it refuses every write, and that the writer's blacklist reaches it.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <thread>

#include <catch2/catch.hpp>

#include "clm/store/snapshot_store.hpp"
#include "store/store_test_support.hpp"
#include "test_support.hpp"

using clm::SnapshotLevel;
using clm::StatusCode;
using clm_test::host_key;
using clm_test::lookup;
using clm_test::open_store;
using clm_test::random_unit;

namespace {

constexpr int kDim = 16;
constexpr double kF16 = 2e-3;

clm::SnapshotStoreConfig writer_config(const std::string& path, const clm_test::ManualClock& clock) {
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

// Every file of the directory but the databases' WAL and shared memory (the
// writer's, which SQLite itself maintains), by name, with its bytes.
std::map<std::string, std::string> index_files(const std::filesystem::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.find(".hnsw") == std::string::npos && name != "LOCK") continue;
    std::ifstream in(e.path(), std::ios::binary);
    out[name] = {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  return out;
}

// Waits (at most 20 s) until pred holds: a background thread acts on its own time.
template <class Pred>
bool eventually(Pred pred) {
  for (int i = 0; i < 2000; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

}  // namespace

TEST_CASE("read-only: a reader beside the writer serves what was committed and writes nothing", "[store][read_only]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm_test::TempDir dir("reader");
  clm_test::ManualClock clock;
  const clm::SnapshotStoreConfig wc = writer_config(dir.str(), clock);
  clm::SnapshotStoreConfig rc = wc;
  rc.read_only = true;
  rc.read_only_refresh_ms = 10;

  auto writer = open_store(wc);
  std::map<std::pair<std::string, std::string>, std::vector<float>> model;  // (tenant, key) -> vector
  std::vector<clm::SuffixKey> keys;
  for (int i = 0; i < 30; ++i) keys.push_back(host_key(fmt::format("key-{}", i), fmt::format("g{}", i % 4)));
  for (const std::string tenant : {"t1", "t2"}) {
    for (const clm::SuffixKey& k : keys) {
      std::vector<float> v = random_unit(rng, kDim);
      clm::RecordOutcome o;
      REQUIRE(writer->record(tenant, k, v, o).ok());
      model[{tenant, k.key}] = std::move(v);
    }
  }
  REQUIRE(writer->flush().ok());

  // A second writer is still refused; a reader is not.
  std::unique_ptr<clm::SnapshotStore> second;
  CHECK(clm::SnapshotStore::open(wc, second).code() == StatusCode::failed_precondition);
  const auto files_before = index_files(dir.path());
  auto reader = open_store(rc);
  std::vector<float> out;
  for (const std::string tenant : {"t1", "t2"}) {
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const std::vector<float>& v = model[{tenant, keys[i].key}];
      INFO(tenant << " " << keys[i].key);
      const clm::SnapshotHit exact = lookup(*reader, tenant, keys[i], {}, out);
      REQUIRE(exact.level == SnapshotLevel::exact);
      CHECK(clm_test::max_abs_diff(out, v) < kF16);
      // Level 2 from the reader's own index: a key of the group with no row.
      const clm::SnapshotHit near = lookup(*reader, tenant, host_key("probe", fmt::format("g{}", i % 4)), v, out);
      REQUIRE(near.level == SnapshotLevel::ann);
      CHECK(near.key == keys[i].key);
    }
  }

  // Every write is refused and changes nothing.
  const clm::SuffixKey k0 = keys[0];
  const std::vector<float> v0 = model[{"t1", k0.key}];
  clm::RecordOutcome o;
  clm::EvictionReport er;
  clm::TenantDeletionReport tr;
  std::int64_t rows = 0;
  const clm::SnapshotHit served = lookup(*reader, "t1", k0, {}, out);
  const std::vector<std::pair<const char*, clm::Status>> refused = {
      {"record", reader->record("t1", k0, v0, o)},
      {"report_outcome", reader->report_outcome("t1", k0, served, false)},
      {"set_fallback", reader->set_fallback("t1", "*", v0)},
      {"evict", reader->evict(er)},
      {"flush", reader->flush()},
      {"rebuild_indexes", reader->rebuild_indexes()},
      {"delete_key", reader->delete_key("t1", k0, rows)},
      {"delete_tenant", reader->delete_tenant("t1", tr)},
      {"blacklist_key", reader->blacklist_key("t1", k0, "by hand", clock.now->load() + 1000)},
      {"unblacklist_key", reader->unblacklist_key("t1", k0)},
      {"pin_version", reader->pin_version("t1", k0, 1)},
      {"unpin_version", reader->unpin_version("t1", k0)},
  };
  for (const auto& [what, s] : refused) {
    INFO(what << ": " << s.message());
    CHECK(s.code() == StatusCode::failed_precondition);
    CHECK(s.message().find("read-only") != std::string::npos);
  }
  std::int64_t rolled = 0;
  CHECK(reader->roll_back("t1", k0, 1, rolled).code() == StatusCode::failed_precondition);
  CHECK(lookup(*writer, "t1", k0, {}, out).level == SnapshotLevel::exact);
  std::vector<clm::SnapshotVersionInfo> versions;
  REQUIRE(writer->list_versions("t1", k0, versions).ok());
  CHECK(versions.size() == 1);
  CHECK(versions[0].usage_count == 1);  // the writer's lookup just now; the reader's counted nothing

  // The writer goes on: level 1 of the reader reads the new row, its level
  // 2 (an index made at its open) does not know it.
  const clm::SuffixKey late = host_key("late", "g-late");
  const std::vector<float> late_v = random_unit(rng, kDim);
  REQUIRE(writer->record("t1", late, late_v, o).ok());
  CHECK(lookup(*reader, "t1", late, {}, out).level == SnapshotLevel::exact);
  CHECK(lookup(*reader, "t1", host_key("probe", "g-late"), late_v, out).level == SnapshotLevel::miss);
  CHECK(lookup(*writer, "t1", host_key("probe", "g-late"), late_v, out).level == SnapshotLevel::ann);

  // A key the writer blacklists stops being served by the reader after its refresh.
  REQUIRE(writer->blacklist_key("t1", k0, "wrong answers", clock.now->load() + 60'000).ok());
  CHECK(eventually([&] { return lookup(*reader, "t1", k0, {}, out).level == SnapshotLevel::miss; }));
  CHECK(lookup(*reader, "t2", k0, {}, out).level == SnapshotLevel::exact);  // another tenant's is not
  REQUIRE(writer->pin_version("t2", k0, 1).ok());
  CHECK(eventually([&] { return lookup(*reader, "t2", k0, {}, out).pinned; }));

  reader.reset();
  CHECK(index_files(dir.path()) == files_before);  // the reader wrote no index file, and no LOCK
  writer.reset();

  // With no writer at all (its WAL checkpointed and removed at close).
  reader = open_store(rc);
  CHECK(lookup(*reader, "t1", late, {}, out).level == SnapshotLevel::exact);
  CHECK(lookup(*reader, "t1", k0, {}, out).level == SnapshotLevel::miss);  // blacklisted
  writer = open_store(wc);                                                 // and a writer opens beside it
  REQUIRE(writer->record("t1", host_key("after", "g0"), late_v, o).ok());
}

TEST_CASE("read-only: no store, a bad config, a corrupt index: clear statuses, nothing written", "[store][read_only]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm_test::ManualClock clock;
  clm_test::TempDir dir("reader-bad");
  clm::SnapshotStoreConfig rc = writer_config((dir.path() / "none").string(), clock);
  rc.read_only = true;
  std::unique_ptr<clm::SnapshotStore> store;
  CHECK(clm::SnapshotStore::open(rc, store).code() == StatusCode::not_found);
  CHECK_FALSE(std::filesystem::exists(dir.path() / "none"));
  rc.path = dir.str();  // a directory with no store in it
  CHECK(clm::SnapshotStore::open(rc, store).code() == StatusCode::not_found);
  CHECK(std::filesystem::is_empty(dir.path()));
  rc.path = ":memory:";
  CHECK(clm::SnapshotStore::open(rc, store).code() == StatusCode::invalid_argument);
  rc.path = dir.str();
  rc.read_only_refresh_ms = 0;
  CHECK(clm::SnapshotStore::open(rc, store).code() == StatusCode::invalid_argument);
  rc.read_only_refresh_ms = 1000;

  // A corrupt index file: the reader rebuilds it in memory and leaves the file as it is.
  clm::SnapshotStoreConfig wc = writer_config(dir.str(), clock);
  std::vector<float> v = random_unit(rng, kDim);
  {
    auto writer = open_store(wc);
    clm::RecordOutcome o;
    REQUIRE(writer->record("t", host_key("a", "g"), v, o).ok());
  }
  std::filesystem::path index;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    if (e.path().extension() == ".hnsw") index = e.path();
  }
  REQUIRE(!index.empty());
  std::filesystem::resize_file(index, std::filesystem::file_size(index) / 2);
  const auto files_before = index_files(dir.path());
  {
    rc.rebuild_in_background = false;
    auto reader = open_store(rc);
    std::vector<float> out;
    CHECK(lookup(*reader, "t", host_key("b", "g"), v, out).level == SnapshotLevel::ann);
    CHECK(reader->metrics().index_rebuilds == 1);
  }
  CHECK(index_files(dir.path()) == files_before);
}

TEST_CASE("maintenance: evict and flush run on the background thread when asked, never otherwise",
          "[store][maintenance]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm_test::ManualClock clock;
  clm::SnapshotStoreConfig c = writer_config(":memory:", clock);
  c.maintenance_interval_ms = -1;
  std::unique_ptr<clm::SnapshotStore> store;
  CHECK(clm::SnapshotStore::open(c, store).code() == StatusCode::invalid_argument);

  for (const std::int64_t interval : {std::int64_t{0}, std::int64_t{20}}) {
    INFO("interval " << interval);
    clm_test::TempDir dir("maintenance");
    c.path = dir.str();
    c.maintenance_interval_ms = interval;
    store = open_store(c);
    clm::RecordOutcome o;
    const clm::SuffixKey old_key = host_key(fmt::format("old-{}", interval), "g");
    REQUIRE(store->record("t", old_key, random_unit(rng, kDim), o).ok());
    clock.advance_ms(31LL * 24 * 3600 * 1000);  // past evict_after_days, never used
    const clm::SuffixKey fresh = host_key(fmt::format("fresh-{}", interval), "g");
    REQUIRE(store->record("t", fresh, random_unit(rng, kDim), o).ok());
    std::vector<float> out;
    if (interval == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      CHECK(store->metrics().maintenance_runs == 0);
      CHECK(store->metrics().evictions == 0);
      clm::EvictionReport r;
      REQUIRE(store->evict(r).ok());  // by hand
      CHECK(r.deleted == 1);
      CHECK(lookup(*store, "t", old_key, {}, out).level == SnapshotLevel::miss);
    } else {
      REQUIRE(eventually([&] { return store->metrics().evictions == 1; }));
      CHECK(store->metrics().maintenance_runs >= 1);
      CHECK(store->metrics().maintenance_failures == 0);
      CHECK(store->last_maintenance().ok());
      CHECK(lookup(*store, "t", old_key, {}, out).level == SnapshotLevel::miss);
    }
    CHECK(lookup(*store, "t", fresh, {}, out).level == SnapshotLevel::exact);
    store.reset();
  }
}
