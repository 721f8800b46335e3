// Crash consistency of the snapshot store: a child process ingests (batches,
// index saves, evictions) and is killed with SIGKILL at a random moment, again
// and again; after each kill the store must open, pass PRAGMA
// integrity_check, and serve every snapshot the child saw committed, by key
// (level 1) and by similarity (level 2, through the index files and the
// rows added after their last save). CLM_CRASH_KILLS sets the number of kills
// (make test: 60; make soak: more).
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include <catch2/catch.hpp>

#include "child_process.hpp"
#include "clm/store/snapshot_store.hpp"
#include "store/store_test_support.hpp"
#include "test_support.hpp"

namespace {

constexpr int kDim = 32;
constexpr int kBatch = 8;

clm::SnapshotStoreConfig crash_config(const std::string& dir) {
  clm::SnapshotStoreConfig c;
  c.path = dir;
  c.num_shards = 4;
  c.snapshot_dim = kDim;
  c.min_usage_threshold = 1;
  c.rebuild_in_background = false;  // the child must not race a rebuild it was killed in
  c.lookup_timeout_us = 2'000'000;  // no busy misses (level 2 included) on a loaded machine
  return c;
}

std::string key_name(int generation, int index) { return fmt::format("gen{}-row{}", generation, index); }
std::string group_name(int index) { return fmt::format("g{}", index % 11); }

// The vector of a key: a function of its name, so the parent can recompute it.
std::vector<float> vector_of(const std::string& key) {
  std::mt19937 rng(static_cast<std::uint32_t>(clm::key_fingerprint(key)));
  return clm_test::random_unit(rng, kDim);
}

// The child: ingest until killed, writing the index of each committed batch's
// last row to `fd` once record_batch has returned.
[[noreturn]] void ingest_until_killed(const std::string& dir, int generation, int fd) {
  std::unique_ptr<clm::SnapshotStore> store;
  if (!clm::SnapshotStore::open(crash_config(dir), store).ok()) _exit(3);
  const std::int32_t ready = -2;
  if (write(fd, &ready, sizeof ready) != sizeof ready) _exit(5);
  for (int batch = 0;; ++batch) {
    std::vector<clm::SuffixKey> keys(kBatch);
    std::vector<std::vector<float>> vectors(kBatch);
    std::vector<clm::SnapshotRecord> records(kBatch);
    for (int j = 0; j < kBatch; ++j) {
      const int index = batch * kBatch + j;
      keys[static_cast<std::size_t>(j)] = clm_test::host_key(key_name(generation, index), group_name(index));
      vectors[static_cast<std::size_t>(j)] = vector_of(key_name(generation, index));
      records[static_cast<std::size_t>(j)] = {"tenant", &keys[static_cast<std::size_t>(j)],
                                              vectors[static_cast<std::size_t>(j)]};
    }
    std::vector<clm::RecordOutcome> outcomes(kBatch);
    if (!store->record_batch(records, outcomes).ok()) _exit(4);
    const std::int32_t last = batch * kBatch + kBatch - 1;
    if (write(fd, &last, sizeof last) != sizeof last) _exit(5);
    if (batch % 5 == 4 && !store->flush().ok()) _exit(6);  // index saves, to be killed in the middle of
    if (batch % 17 == 16) {
      clm::EvictionReport report;
      if (!store->evict(report).ok()) _exit(7);  // deletes nothing here (nothing is 30 days old), but runs
    }
  }
}

}  // namespace

TEST_CASE("SIGKILL while ingesting loses no committed snapshot and leaves every database intact", "[store][crash]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const char* env = std::getenv("CLM_CRASH_KILLS");
  const int kills = env ? std::max(1, std::atoi(env)) : 60;
  clm_test::TempDir dir;
  std::vector<int> committed;  // per generation: rows [0, committed] are in
  std::uniform_int_distribution<int> delay_us(2'000, 60'000);
  int verified_rows = 0;
  for (int generation = 0; generation < kills; ++generation) {
    INFO("generation " << generation);
    clm_test::ChildProcess child([&](int report_fd) { ingest_until_killed(dir.str(), generation, report_fd); });
    // Most kills land while the child ingests (after it says it has opened
    // the store); every fifth may land while it opens.
    std::int32_t value = 0, last = -1;
    if (generation % 5 != 4) REQUIRE(child.read(value));
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
    child.kill();
    while (child.read(value)) last = std::max(last, value);
    committed.push_back(last);

    // Every few kills, and after the last: open, check, and look everything up.
    if (generation % 6 != 5 && generation + 1 != kills) continue;
    std::unique_ptr<clm::SnapshotStore> store;
    const clm::Status opened = clm::SnapshotStore::open(crash_config(dir.str()), store);
    INFO(opened.message());
    REQUIRE(opened.ok());
    const clm::Status integrity = store->check_integrity();
    INFO(integrity.message());
    REQUIRE(integrity.ok());
    std::vector<float> out(kDim);
    for (int g = 0; g <= generation; ++g) {
      for (int i = 0; i <= committed[static_cast<std::size_t>(g)]; ++i) {
        const std::string name = key_name(g, i);
        const std::vector<float> expected = vector_of(name);
        clm::SnapshotHit hit;
        REQUIRE(store->lookup("tenant", clm_test::host_key(name, group_name(i)), {}, hit, out).ok());
        INFO(name);
        REQUIRE(hit.level == clm::SnapshotLevel::exact);
        REQUIRE(clm_test::max_abs_diff(out, expected) < 2e-3);
        ++verified_rows;
        if (i % 9 != 0) continue;
        // By similarity, under another key of the same group.
        REQUIRE(store->lookup("tenant", clm_test::host_key("probe", group_name(i)), expected, hit, out).ok());
        REQUIRE(hit.level == clm::SnapshotLevel::ann);
        REQUIRE(hit.key == name);
      }
    }
  }
  int total = 0;
  for (int c : committed) total += c + 1;
  INFO("kills " << kills << ", rows committed " << total << ", lookups verified " << verified_rows);
  CHECK(total > kills);  // the children did commit work before they were killed
}

TEST_CASE("a full disk: writes fail with a clear status and nothing committed is lost", "[store][crash][faults]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  clm_test::TempDir dir;
  constexpr int kCommitted = 200;
  {
    std::unique_ptr<clm::SnapshotStore> store;
    REQUIRE(clm::SnapshotStore::open(crash_config(dir.str()), store).ok());
    for (int i = 0; i < kCommitted; ++i) {
      clm::RecordOutcome o;
      REQUIRE(store->record("tenant", clm_test::host_key(key_name(0, i), group_name(i)), vector_of(key_name(0, i)), o)
                  .ok());
    }
  }
  // The child writes until the file-size limit (RLIMIT_FSIZE: a disk that
  // is full for every file it grows) stops it; it exits 0 only if every
  // failure was a clean io_error and the store still served what it had.
  clm_test::ChildProcess child([&](int report_fd) {
    signal(SIGXFSZ, SIG_IGN);  // a write past the limit then fails with EFBIG instead of killing us
    std::unique_ptr<clm::SnapshotStore> store;
    if (!clm::SnapshotStore::open(crash_config(dir.str()), store).ok()) return 3;
    std::uintmax_t largest = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir.path())) largest = std::max(largest, e.file_size());
    const rlimit limit{static_cast<rlim_t>(largest + 64 * 1024), static_cast<rlim_t>(largest + 64 * 1024)};
    if (setrlimit(RLIMIT_FSIZE, &limit) != 0) return 4;
    int failures = 0;
    for (int i = 0; i < 20000 && failures < 20; ++i) {
      clm::RecordOutcome o;
      const clm::Status s =
          store->record("tenant", clm_test::host_key(key_name(1, i), group_name(i)), vector_of(key_name(1, i)), o);
      if (!s.ok() && s.code() != clm::StatusCode::io_error) return 6;
      failures += s.ok() ? 0 : 1;
      const std::int32_t report = s.ok() ? i : -1 - i;  // committed, or failed (and so must be absent)
      if (write(report_fd, &report, sizeof report) != sizeof report) return 5;
      if (i % 50 == 49) {
        const clm::Status f = store->flush();  // index saves hit the limit too
        if (!f.ok() && f.code() != clm::StatusCode::io_error) return 7;
      }
    }
    return failures == 0 ? 8 : 0;  // 8: the limit was never reached, so the test tested nothing
  });
  const int code = child.exit_code();
  std::vector<std::int32_t> ok_rows, failed_rows;
  std::int32_t value = 0;
  while (child.read(value)) (value >= 0 ? ok_rows : failed_rows).push_back(value);
  INFO("child exit code " << code << " (see the codes the child returns)");
  REQUIRE(code == 0);
  std::unique_ptr<clm::SnapshotStore> store;
  const clm::Status opened = clm::SnapshotStore::open(crash_config(dir.str()), store);
  INFO(opened.message());
  REQUIRE(opened.ok());
  REQUIRE(store->check_integrity().ok());
  std::vector<float> out(kDim);
  auto served = [&](int g, int i) {
    clm::SnapshotHit hit;
    REQUIRE(store->lookup("tenant", clm_test::host_key(key_name(g, i), group_name(i)), {}, hit, out).ok());
    return hit.level == clm::SnapshotLevel::exact && clm_test::max_abs_diff(out, vector_of(key_name(g, i))) < 2e-3;
  };
  for (int i = 0; i < kCommitted; ++i) REQUIRE(served(0, i));
  for (std::int32_t i : ok_rows) {
    INFO("committed under the limit: " << key_name(1, i));
    REQUIRE(served(1, i));
  }
  for (std::int32_t f : failed_rows) {
    INFO("failed under the limit: " << key_name(1, -1 - f));
    REQUIRE_FALSE(served(1, -1 - f));
  }
  CHECK(store->metrics().snapshots == kCommitted + static_cast<std::int64_t>(ok_rows.size()));
  INFO("rows committed under the limit: " << ok_rows.size() << ", refused: " << failed_rows.size());
  CHECK(failed_rows.size() == 20);
}
