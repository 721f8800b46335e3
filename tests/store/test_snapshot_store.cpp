// The snapshot store (clm/store/snapshot_store.hpp) against independent
// references: float64 cosines, a brute-force nearest-neighbour search, a
// naive model of versions and admission, on fresh random vectors.
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include <catch2/catch.hpp>

#include "alloc_fault.hpp"
#include "child_process.hpp"
#include "clm/detail/half.hpp"
#include "clm/store/consistent_hash.hpp"
#include "clm/store/snapshot_blob.hpp"
#include "clm/store/snapshot_store.hpp"
#include "store/store_test_support.hpp"
#include "test_support.hpp"

using clm::RecordResult;
using clm::SnapshotLevel;
using clm_test::host_key;
using clm_test::lookup;
using clm_test::open_store;
using clm_test::random_unit;

namespace {

constexpr int kDim = 32;
constexpr double kF16 = 2e-3;  // a unit vector's entries through f16

clm::SnapshotStoreConfig memory_config(int shards = 4) {
  clm::SnapshotStoreConfig c;
  c.path = ":memory:";
  c.num_shards = shards;
  c.snapshot_dim = kDim;
  c.min_usage_threshold = 1;
  // Tests other than breaker (a)'s must not answer miss because a loaded CI
  // machine held a shard (a background rebuild) longer than 2 ms.
  c.lookup_timeout_us = 2'000'000;
  return c;
}

clm::RecordOutcome record(clm::SnapshotStore& store, std::string_view tenant, const clm::SuffixKey& key,
                          const std::vector<float>& v) {
  clm::RecordOutcome out;
  const clm::Status s = store.record(tenant, key, v, out);
  INFO(s.message());
  REQUIRE(s.ok());
  return out;
}

// Flips the page-type byte of the root page of a database's table of rows:
// reads of rows fail (SQLITE_CORRUPT) while its indexes, which answer the
// row count and the tenant list, still read.
void tear_rows_table(const std::string& db_path) {
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open(db_path.c_str(), &db) == SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  REQUIRE(sqlite3_prepare_v2(db,
                             "SELECT (SELECT rootpage FROM sqlite_schema WHERE name = 'semantic_snapshots'),"
                             " (SELECT page_size FROM pragma_page_size)",
                             -1, &stmt, nullptr) == SQLITE_OK);
  REQUIRE(sqlite3_step(stmt) == SQLITE_ROW);
  const std::int64_t root = sqlite3_column_int64(stmt, 0), page_size = sqlite3_column_int64(stmt, 1);
  sqlite3_finalize(stmt);
  sqlite3_close(db);  // the last connection: the WAL is checkpointed into the file
  REQUIRE(root > 1);
  std::fstream f(db_path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg((root - 1) * page_size);
  const int type = f.get();
  f.seekp((root - 1) * page_size);
  f.put(static_cast<char>(type ^ 0xFF));  // 2, 5, 10 and 13 are the valid types; none flips to another
  REQUIRE(f.good());
}

}  // namespace

namespace {

// The BLOB checksums as clm/store/snapshot_blob.hpp words them, written
// plainly: FNV-1a 64 byte by byte; and the word-wise one from a list of
// little-endian words assembled byte by byte.
std::uint64_t reference_bytewise(const std::vector<std::uint8_t>& blob) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::uint8_t b : blob) {
    h ^= b;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::uint64_t reference_wordwise(const std::vector<std::uint8_t>& blob) {
  constexpr std::uint64_t basis = 0xcbf29ce484222325ull, prime = 0x100000001b3ull;
  std::vector<std::uint64_t> words((blob.size() + 7) / 8, 0);
  for (std::size_t j = 0; j < blob.size(); ++j) words[j / 8] |= static_cast<std::uint64_t>(blob[j]) << (8 * (j % 8));
  std::uint64_t lanes[4] = {basis, basis ^ 1, basis ^ 2, basis ^ 3};
  for (std::size_t i = 0; i < words.size(); ++i) lanes[i % 4] = (lanes[i % 4] ^ words[i]) * prime;
  std::uint64_t h = basis;
  for (std::uint64_t lane : lanes) h = (h ^ lane) * prime;
  h = (h ^ blob.size()) * prime;
  h += 0x9e3779b97f4a7c15ull;  // splitmix64's finaliser
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

}  // namespace

TEST_CASE("snapshot BLOB: both checksum formats match their references, and every flipped bit is caught",
          "[store][blob]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (int dim : {1, 3, 4, 7, 8, 77, 256}) {  // every length of the last word
    INFO("dim " << dim);
    const std::vector<float> v = random_unit(rng, dim);
    for (std::uint16_t format : {clm::kSnapshotBlobBytewise, clm::kSnapshotBlobWordwise}) {
      INFO("format " << format);
      std::vector<std::uint8_t> blob;
      clm::encode_snapshot_blob(v, blob, format);
      REQUIRE((blob[4] | (blob[5] << 8)) == format);
      const std::uint64_t sum = clm::snapshot_checksum(blob);
      CHECK(sum == (format == clm::kSnapshotBlobBytewise ? reference_bytewise(blob) : reference_wordwise(blob)));
      std::vector<float> back(static_cast<std::size_t>(dim)), untouched(static_cast<std::size_t>(dim), 7.0f);
      REQUIRE(clm::decode_snapshot_blob(blob, dim, sum, back).ok());
      for (std::size_t i = 0; i < back.size(); ++i)  // f16 decoding against the portable one
        CHECK(back[i] == clm::detail::f16_to_f32(clm::detail::f32_to_f16(v[i])));
      // The other format's checksum of the same bytes is refused.
      const std::uint64_t other =
          format == clm::kSnapshotBlobBytewise ? reference_wordwise(blob) : reference_bytewise(blob);
      CHECK_FALSE(clm::decode_snapshot_blob(blob, dim, other, untouched).ok());
      std::size_t missed = 0;
      for (std::size_t bit = 0; bit < 8 * blob.size(); ++bit) {  // every single flipped bit
        std::vector<std::uint8_t> bad = blob;
        bad[bit / 8] ^= static_cast<std::uint8_t>(1u << (bit % 8));
        missed += clm::decode_snapshot_blob(bad, dim, sum, untouched).ok();
      }
      CHECK(missed == 0);
      CHECK(std::all_of(untouched.begin(), untouched.end(), [](float x) { return x == 7.0f; }));
    }
  }
}

TEST_CASE("snapshot BLOB: round trip through f16, every corruption refused", "[store][blob]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const std::vector<float> v = random_unit(rng, 77);
  std::vector<std::uint8_t> blob;
  clm::encode_snapshot_blob(v, blob);
  REQUIRE(blob.size() == clm::kSnapshotBlobHeader + 2 * v.size());
  const std::uint64_t sum = clm::snapshot_checksum(blob);
  std::vector<float> back(v.size());
  REQUIRE(clm::decode_snapshot_blob(blob, 77, sum, back).ok());
  CHECK(clm_test::max_abs_diff(v, back) < kF16);

  std::vector<float> untouched(v.size(), 7.0f);
  for (std::size_t at = 0; at < blob.size(); at += 1 + blob.size() / 40) {  // a flipped bit anywhere
    std::vector<std::uint8_t> bad = blob;
    bad[at] ^= static_cast<std::uint8_t>(1u << (at % 8));
    CHECK_FALSE(clm::decode_snapshot_blob(bad, 77, sum, untouched).ok());
  }
  CHECK_FALSE(clm::decode_snapshot_blob(std::span(blob).first(blob.size() - 2), 77, sum, untouched).ok());
  CHECK_FALSE(clm::decode_snapshot_blob(blob, 76, sum, std::span(untouched).first(76)).ok());
  std::vector<float> with_inf = v;
  with_inf[3] = 1e6f;  // beyond f16: stored as inf, refused when read
  clm::encode_snapshot_blob(with_inf, blob);
  CHECK_FALSE(clm::decode_snapshot_blob(blob, 77, clm::snapshot_checksum(blob), untouched).ok());
  CHECK(std::all_of(untouched.begin(), untouched.end(), [](float x) { return x == 7.0f; }));

  std::uniform_int_distribution<int> byte(0, 255), len(0, 300);
  for (int i = 0; i < 2000; ++i) {  // random bytes: refused, never a crash
    std::vector<std::uint8_t> junk(static_cast<std::size_t>(len(rng)));
    for (auto& b : junk) b = static_cast<std::uint8_t>(byte(rng));
    (void)clm::decode_snapshot_blob(junk, 77, clm::snapshot_checksum(junk), untouched);
  }
}

TEST_CASE("consistent hashing: balanced, and a new shard takes about 1/(N+1) of the keys", "[store][shards]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  constexpr int kKeys = 200000;
  for (int n : {4, 16}) {
    const clm::ConsistentHashRing before(n), after(n + 1);
    std::vector<int> load(static_cast<std::size_t>(n), 0);
    int moved = 0;
    for (int i = 0; i < kKeys; ++i) {
      const std::uint64_t key = rng();
      const int a = before.shard_of(key), b = after.shard_of(key);
      REQUIRE(a >= 0);
      REQUIRE(a < n);
      ++load[static_cast<std::size_t>(a)];
      if (a != b) {
        ++moved;
        CHECK(b == n);  // keys only ever move to the new shard
      }
    }
    const double mean = static_cast<double>(kKeys) / n;
    for (int l : load) CHECK(std::abs(l - mean) < 0.25 * mean);
    const double fraction = static_cast<double>(moved) / kKeys, ideal = 1.0 / (n + 1);
    INFO("shards " << n << ": moved " << fraction << ", ideal " << ideal);
    CHECK(fraction > 0.6 * ideal);
    CHECK(fraction < 1.4 * ideal);
  }
}

TEST_CASE("admission: a key is counted until min_usage_threshold sightings, then stored", "[store]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm::SnapshotStoreConfig c = memory_config();
  c.min_usage_threshold = 5;
  auto store = open_store(c);
  const clm::SuffixKey key = host_key("ORDER-789-QUERY-STATUS");
  const std::vector<float> v = random_unit(rng, kDim);
  std::vector<float> out;
  for (int i = 1; i < 5; ++i) {
    const clm::RecordOutcome o = record(*store, "t", key, v);
    CHECK(o.result == RecordResult::counted);
    CHECK(o.seen == i);
    CHECK(lookup(*store, "t", key, {}, out).level == SnapshotLevel::miss);
  }
  CHECK(record(*store, "t", key, v).result == RecordResult::admitted);
  const clm::SnapshotHit hit = lookup(*store, "t", key, {}, out);
  CHECK(hit.level == SnapshotLevel::exact);
  CHECK(hit.version == 1);
  CHECK(clm_test::max_abs_diff(out, v) < kF16);
  // Sightings are per tenant: another tenant starts from zero.
  CHECK(record(*store, "u", key, v).result == RecordResult::counted);
  const auto m = store->metrics();
  CHECK(m.counted == 5);
  CHECK(m.admissions == 1);
  CHECK(m.snapshots == 1);
}

TEST_CASE("versions: a dissimilar snapshot starts a version, the newest stable one is served", "[store][versions]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm::SnapshotStoreConfig c = memory_config();
  c.stable_confirmations = 2;
  auto store = open_store(c);
  const clm::SuffixKey key = host_key("K");
  const std::vector<float> a = random_unit(rng, kDim), b = random_unit(rng, kDim);
  REQUIRE(clm_test::cosine64(a, b) < 0.9);
  std::vector<float> out;
  CHECK(record(*store, "t", key, a).result == RecordResult::admitted);
  clm::SnapshotHit hit = lookup(*store, "t", key, {}, out);
  CHECK(hit.version == 1);
  CHECK_FALSE(hit.stable);  // nothing confirmed it yet: served, flagged
  // Close to a (cosine >= 0.95 by construction): confirms version 1.
  const std::vector<float> near_a = clm_test::noisy(a, 0.02, rng);
  REQUIRE(clm_test::cosine64(near_a, a) >= 0.96);
  for (int i = 0; i < 2; ++i) {
    const clm::RecordOutcome o = record(*store, "t", key, near_a);
    CHECK(o.result == RecordResult::confirmed);
    CHECK(o.version == 1);
  }
  CHECK(lookup(*store, "t", key, {}, out).stable);
  // b differs: version 2, not yet stable, so version 1 is still served.
  const clm::RecordOutcome v2 = record(*store, "t", key, b);
  CHECK(v2.result == RecordResult::new_version);
  CHECK(v2.version == 2);
  hit = lookup(*store, "t", key, {}, out);
  CHECK(hit.version == 1);
  CHECK(clm_test::max_abs_diff(out, a) < kF16);
  record(*store, "t", key, b);
  record(*store, "t", key, b);
  hit = lookup(*store, "t", key, b, out);
  CHECK(hit.version == 2);
  CHECK(hit.stable);
  CHECK(hit.similarity == Approx(1.0).margin(1e-3));
  CHECK(clm_test::max_abs_diff(out, b) < kF16);
  CHECK(store->metrics().versions == 1);
}

TEST_CASE("drift: a window whose variance passes the threshold starts a version", "[store][versions]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm::SnapshotStoreConfig c = memory_config();
  c.drift_window = 10;
  c.version_cosine = 0.5f;     // so that only the drift rule makes versions here
  c.drift_mean_cosine = 0.5f;  // and only its variance half (the mean's is tested below)
  auto store = open_store(c);
  const clm::SuffixKey key = host_key("DRIFT");
  const std::vector<float> base = random_unit(rng, kDim);
  // The reference: every record as the store keeps it (unit, rounded through
  // f16), and the float64 total variance of the last drift_window of them.
  std::vector<std::vector<float>> history;
  auto record_tracked = [&](const std::vector<float>& v) {
    std::vector<float> kept = v;
    for (float& x : kept) x = clm::detail::f16_to_f32(clm::detail::f32_to_f16(x));
    history.push_back(kept);
    return record(*store, "t", key, v);
  };
  auto window_variance = [&] {
    const std::size_t n = 10, first = history.size() - n;
    std::vector<double> mean(kDim, 0.0);
    for (std::size_t r = first; r < history.size(); ++r) {
      for (int d = 0; d < kDim; ++d) mean[static_cast<std::size_t>(d)] += history[r][static_cast<std::size_t>(d)] / n;
    }
    double variance = 0;
    for (std::size_t r = first; r < history.size(); ++r) {
      for (int d = 0; d < kDim; ++d) {
        const double e = history[r][static_cast<std::size_t>(d)] - mean[static_cast<std::size_t>(d)];
        variance += e * e / n;
      }
    }
    return variance;
  };
  // Tight records: variance ~ sigma^2 * dim, far below the threshold.
  record_tracked(base);
  for (int i = 0; i < 30; ++i) {
    CHECK(record_tracked(clm_test::noisy(base, 0.01, rng)).result == RecordResult::confirmed);
    if (history.size() >= 10) CHECK(window_variance() < 0.08);
  }
  // Spread records (cosine to base still >= 0.5): the window's variance rises;
  // the store must start a version exactly when the reference passes 0.08
  // (within what f16 sums can move it).
  bool drifted = false;
  for (int i = 0; i < 10 && !drifted; ++i) {
    const std::vector<float> v = clm_test::noisy(base, 0.11, rng);
    REQUIRE(clm_test::cosine64(v, base) > 0.5);
    const clm::RecordOutcome o = record_tracked(v);
    const double reference = window_variance();
    INFO("record " << i << ": window variance " << reference);
    drifted = o.result == RecordResult::drifted;
    if (drifted) {
      CHECK(reference > 0.08 - 1e-3);
      CHECK(o.version == 2);
    } else {
      CHECK(reference <= 0.08 + 1e-3);
    }
  }
  CHECK(drifted);
  CHECK(store->metrics().drift_versions == 1);
}

TEST_CASE("drift at the default settings: records that all lean one way start a version, noise does not",
          "[store][versions]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const clm::SnapshotStoreConfig c = memory_config();  // drift_window 100, drift_mean_cosine 0.98
  REQUIRE(c.drift_window == 100);
  auto store = open_store(c);
  const std::vector<float> base = random_unit(rng, kDim);
  // A direction orthogonal to base (Gram-Schmidt in float64), and base leaned
  // 15 degrees toward it: every record still confirms base (cosine about
  // 0.966 > version_cosine 0.95), but their mean is 15 degrees off.
  std::vector<float> away = random_unit(rng, kDim);
  double along = 0;
  for (int d = 0; d < kDim; ++d) along += static_cast<double>(away[d]) * base[d];
  for (int d = 0; d < kDim; ++d) away[d] = static_cast<float>(away[d] - along * base[d]);
  const double theta = 15.0 * 3.14159265358979 / 180.0;
  std::vector<float> leaned(kDim);
  double norm = 0;
  for (int d = 0; d < kDim; ++d) norm += static_cast<double>(away[d]) * away[d];
  for (int d = 0; d < kDim; ++d) {
    leaned[d] = static_cast<float>(std::cos(theta) * base[d] + std::sin(theta) * away[d] / std::sqrt(norm));
  }
  // The reference: the float64 cosine of the window's mean (the last 100
  // records as the store keeps them) and base.
  std::deque<std::vector<float>> window;
  auto mean_cosine = [&] {
    std::vector<double> mean(kDim, 0.0);
    for (const auto& r : window) {
      for (int d = 0; d < kDim; ++d) mean[static_cast<std::size_t>(d)] += r[static_cast<std::size_t>(d)];
    }
    double dot = 0, n2 = 0;
    for (int d = 0; d < kDim; ++d) {
      dot += mean[static_cast<std::size_t>(d)] * base[static_cast<std::size_t>(d)];
      n2 += mean[static_cast<std::size_t>(d)] * mean[static_cast<std::size_t>(d)];
    }
    return dot / std::sqrt(n2);
  };
  auto track = [&](const clm::SuffixKey& key, const std::vector<float>& v) {
    std::vector<float> kept = v;
    double n = 0;
    for (float x : kept) n += static_cast<double>(x) * x;
    for (float& x : kept) x = clm::detail::f16_to_f32(clm::detail::f32_to_f16(static_cast<float>(x / std::sqrt(n))));
    window.push_back(kept);
    if (window.size() > 100) window.pop_front();
    return record(*store, "t", key, v);
  };

  // Noise around base: no version, however long it goes on.
  const clm::SuffixKey steady = host_key("STEADY");
  track(steady, base);
  for (int i = 0; i < 250; ++i) {
    const clm::RecordOutcome o = track(steady, clm_test::noisy(base, 0.02, rng));
    INFO("steady record " << i << ", mean cosine " << mean_cosine());
    REQUIRE(o.result == RecordResult::confirmed);
  }
  // Leaning records: a version exactly when the reference mean passes 0.98.
  window.clear();
  const clm::SuffixKey leaning = host_key("LEANING");
  track(leaning, base);
  bool drifted = false;
  for (int i = 0; i < 150 && !drifted; ++i) {
    const std::vector<float> v = clm_test::noisy(leaned, 0.005, rng);
    REQUIRE(clm_test::cosine64(v, base) > 0.95);
    const clm::RecordOutcome o = track(leaning, v);
    const double reference = mean_cosine();
    INFO("leaning record " << i << ": window of " << window.size() << ", mean cosine " << reference);
    drifted = o.result == RecordResult::drifted;
    if (drifted) {
      CHECK(window.size() == 100);  // only a full window speaks
      CHECK(reference < 0.98 + 1e-3);
      CHECK(o.version == 2);
    } else {
      CHECK(o.result == RecordResult::confirmed);
      CHECK((window.size() < 100 || reference >= 0.98 - 1e-3));
    }
  }
  CHECK(drifted);
  CHECK(store->metrics().drift_versions == 1);
}

TEST_CASE("level 2: only a key's served version is a candidate, never a version it moved on from", "[store][ann]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm::SnapshotStoreConfig c = memory_config(1);
  c.stable_confirmations = 0;  // the newest version is served at once
  c.similarity_floor = 0.5f;
  const auto store = open_store(c);
  // Two versions of A, far apart: v1, then v2 orthogonal to it (a new version).
  const std::vector<float> v1 = random_unit(rng, kDim);
  std::vector<float> v2 = random_unit(rng, kDim);
  double along = 0;
  for (int i = 0; i < kDim; ++i) along += double(v1[i]) * v2[i];
  double norm = 0;
  for (int i = 0; i < kDim; ++i) {
    v2[i] = static_cast<float>(v2[i] - along * v1[i]);
    norm += double(v2[i]) * v2[i];
  }
  for (float& x : v2) x = static_cast<float>(x / std::sqrt(norm));
  const clm::SuffixKey a = host_key("A", "g"), b = host_key("B", "g");
  CHECK(record(*store, "t", a, v1).result == RecordResult::admitted);
  const clm::RecordOutcome second = record(*store, "t", a, v2);
  REQUIRE(second.result == RecordResult::new_version);
  std::vector<float> out;
  // B (no rows) asks near v1: A's version 1 lies there, but A serves version 2.
  const clm::SnapshotHit near_old = lookup(*store, "t", b, v1, out);
  CHECK(near_old.level == SnapshotLevel::miss);
  // Near v2: A's served version, at level 2.
  const clm::SnapshotHit near_new = lookup(*store, "t", b, v2, out);
  REQUIRE(near_new.level == SnapshotLevel::ann);
  CHECK(near_new.key == "A");
  CHECK(near_new.version == second.version);
  double err = 0;
  for (int i = 0; i < kDim; ++i) err = std::max(err, std::abs(double(out[i]) - v2[i]));
  CHECK(err < kF16);
}

TEST_CASE("level 2: nearest neighbours equal brute force, within the group, above the floor", "[store][ann]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm::SnapshotStoreConfig c = memory_config(2);
  c.similarity_floor = 0.5f;
  auto store = open_store(c);
  // 40 clusters of 10 rows; half the keys in group "a", half in "b".
  std::vector<std::vector<float>> centres;
  for (int k = 0; k < 40; ++k) centres.push_back(random_unit(rng, kDim));
  struct Row {
    std::string key, group;
    std::vector<float> v;
  };
  std::vector<Row> rows;
  for (int i = 0; i < 400; ++i) {
    Row r{fmt::format("row-{}", i), i % 2 ? "a" : "b",
          clm_test::noisy(centres[static_cast<std::size_t>(i % 40)], 0.08, rng)};
    record(*store, "t", host_key(r.key, r.group), r.v);
    rows.push_back(std::move(r));
  }
  std::vector<float> out;
  int agree = 0, trials = 0;
  for (int q = 0; q < 60; ++q) {
    const std::vector<float> query = clm_test::noisy(centres[static_cast<std::size_t>(q % 40)], 0.08, rng);
    const std::string group = q % 3 == 0 ? "a" : "b";
    // Reference: float64 cosines to the f16-rounded rows of this group.
    std::vector<std::pair<double, std::string>> ref;
    for (const Row& r : rows) {
      if (r.group != group) continue;
      std::vector<float> stored = r.v;
      for (float& x : stored) x = clm::detail::f16_to_f32(clm::detail::f32_to_f16(x));
      ref.emplace_back(clm_test::cosine64(query, stored), r.key);
    }
    std::sort(ref.rbegin(), ref.rend());
    const clm::SnapshotHit hit = lookup(*store, "t", host_key(fmt::format("query-{}", q), group), query, out);
    // The store's cosines are float32 and agree with the float64 reference to
    // 2e-3 (below): a best neighbour that close to the floor may fall either
    // side of it (seed 1071930543: 0.500015).
    if (std::abs(ref.front().first - 0.5) < 2e-3) continue;
    if (ref.front().first < 0.5) {
      CHECK(hit.level == SnapshotLevel::miss);
      continue;
    }
    REQUIRE(hit.level == SnapshotLevel::ann);
    ++trials;
    agree += hit.key == ref.front().second ? 1 : 0;
    CHECK(hit.similarity == Approx(ref.front().first).margin(2e-3));
    REQUIRE(hit.candidates.size() <= 3);
    for (std::size_t i = 0; i < hit.candidates.size(); ++i) {
      CHECK(hit.candidates[i].similarity >= 0.5f);
      if (i) CHECK(hit.candidates[i].similarity <= hit.candidates[i - 1].similarity);
      const auto row =
          std::find_if(rows.begin(), rows.end(), [&](const Row& r) { return r.key == hit.candidates[i].key; });
      REQUIRE(row != rows.end());
      CHECK(row->group == group);  // never a candidate of another group
    }
  }
  INFO("level 2 agreed with brute force on " << agree << " of " << trials);
  CHECK(agree >= trials * 95 / 100);
  // Enough queries above the floor to mean something: 30 to 60 of them over
  // 200 seeds (it asked for more than 30 and failed 7 seeds in 200).
  CHECK(trials >= 20);
}

TEST_CASE("tenants never see each other's rows, indexes or fallbacks", "[store][isolation]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  auto store = open_store(memory_config());
  const std::vector<float> v = random_unit(rng, kDim);
  const clm::SuffixKey key = host_key("SECRET", "g");
  record(*store, "alice", key, v);
  clm::SuffixKey greeting = host_key("GREETING", "greeting");
  greeting.low_information = true;
  REQUIRE(store->set_fallback("alice", "*", v).ok());
  std::vector<float> out;
  CHECK(lookup(*store, "alice", key, v, out).level == SnapshotLevel::exact);
  CHECK(lookup(*store, "alice", host_key("OTHER", "g"), v, out).level == SnapshotLevel::ann);
  CHECK(lookup(*store, "alice", greeting, v, out).level == SnapshotLevel::fallback);
  // A blacklisted fallback is refused like any key.
  for (int i = 0; i < 20; ++i) REQUIRE(store->report_outcome("alice", host_key("*", "greeting"), false).ok());
  CHECK(lookup(*store, "alice", greeting, v, out).level == SnapshotLevel::miss);
  for (std::string_view bob : {std::string_view("bob"), std::string_view("alic"), std::string_view("alice\0", 6)}) {
    CHECK(lookup(*store, bob, key, v, out).level == SnapshotLevel::miss);
    CHECK(lookup(*store, bob, host_key("OTHER", "g"), v, out).level == SnapshotLevel::miss);
    CHECK(lookup(*store, bob, greeting, v, out).level == SnapshotLevel::miss);
  }
}

TEST_CASE("breaker (b): a key whose accuracy falls is blacklisted, persisted, and expires", "[store][breaker]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm_test::TempDir dir;
  clm_test::ManualClock clock;
  clm::SnapshotStoreConfig c = memory_config();
  c.path = dir.str();
  c.clock_ms = clock.fn();
  c.blacklist_min_reports = 20;
  const clm::SuffixKey key = host_key("FLAKY", "g"), good = host_key("GOOD", "g");
  const std::vector<float> v = random_unit(rng, kDim);
  std::vector<float> out;
  {
    auto store = open_store(c);
    record(*store, "t", key, v);
    record(*store, "t", good, clm_test::noisy(v, 0.01, rng));
    // 19 right and 1 wrong: 95%, not below: stays.
    for (int i = 0; i < 20; ++i) REQUIRE(store->report_outcome("t", key, i != 7).ok());
    CHECK_FALSE(store->is_blacklisted("t", key));
    // Reports older than 5 minutes leave the window.
    clock.advance_ms(6 * 60 * 1000);
    for (int i = 0; i < 19; ++i) REQUIRE(store->report_outcome("t", key, true).ok());
    REQUIRE(store->report_outcome("t", key, false).ok());
    REQUIRE(store->report_outcome("t", key, false).ok());  // 19/21 < 95%
    CHECK(store->is_blacklisted("t", key));
    CHECK_FALSE(store->is_blacklisted("u", key));
    CHECK(lookup(*store, "t", key, v, out).level != SnapshotLevel::exact);
    CHECK(store->metrics().blacklisted_keys == 1);
  }
  {
    auto store = open_store(c);  // persisted
    CHECK(store->is_blacklisted("t", key));
    const clm::SnapshotHit hit = lookup(*store, "t", key, v, out);
    CHECK(hit.level == SnapshotLevel::miss);  // checked before any level
    // As a level-2 candidate it is refused too; GOOD is served instead.
    const clm::SnapshotHit other = lookup(*store, "t", host_key("THIRD", "g"), v, out);
    CHECK(other.level == SnapshotLevel::ann);
    CHECK(other.key == "GOOD");
    clock.advance_ms(24 * 60 * 60 * 1000 + 1);
    CHECK_FALSE(store->is_blacklisted("t", key));
    CHECK(lookup(*store, "t", key, v, out).level == SnapshotLevel::exact);
  }
}

TEST_CASE("eviction: old, little-used rows go with their index entries, then vacuum runs", "[store][evict]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm_test::TempDir dir;
  clm_test::ManualClock clock;
  clm::SnapshotStoreConfig c = memory_config(2);
  c.path = dir.str();
  c.clock_ms = clock.fn();
  auto store = open_store(c);
  std::vector<std::vector<float>> vs;
  for (int i = 0; i < 200; ++i) {
    vs.push_back(random_unit(rng, kDim));
    record(*store, "t", host_key(fmt::format("k{}", i)), vs.back());
  }
  std::vector<float> out;
  clock.advance_ms(10LL * 24 * 3600 * 1000);
  for (int i = 0; i < 50; ++i) {  // keys 0..49 used 5 times (kept); 50..99 used 4 times (not enough)
    for (int u = 0; u < (i < 25 ? 5 : 4); ++u) lookup(*store, "t", host_key(fmt::format("k{}", i)), {}, out);
  }
  clm::EvictionReport report;
  REQUIRE(store->evict(report).ok());
  CHECK(report.deleted == 0);                 // nothing is 30 days old yet
  clock.advance_ms(45LL * 24 * 3600 * 1000);  // rows made 55 days ago, used 45 days ago
  REQUIRE(store->evict(report).ok());
  CHECK(report.deleted == 175);
  CHECK(store->metrics().snapshots == 25);
  for (int i = 0; i < 200; ++i) {
    const clm::SnapshotHit hit = lookup(*store, "t", host_key(fmt::format("k{}", i)), {}, out);
    CHECK((hit.level == SnapshotLevel::exact) == (i < 25));
    // Level 2 with a row's own vector finds it only if it was kept.
    const clm::SnapshotHit near = lookup(*store, "t", host_key("probe"), vs[static_cast<std::size_t>(i)], out);
    if (i >= 25 && near.level == SnapshotLevel::ann) CHECK(near.key != fmt::format("k{}", i));
  }
  REQUIRE(store->check_integrity().ok());
}

namespace {

// The durability tests' store: 300 rows of tenant "t" (keys k0..k299 in 16
// groups) recorded and the store closed; returns their vectors.
std::vector<std::vector<float>> fill_durability_store(const clm::SnapshotStoreConfig& c, std::mt19937& rng) {
  std::vector<std::vector<float>> vs;
  auto store = open_store(c);
  for (int i = 0; i < 300; ++i) {
    vs.push_back(random_unit(rng, kDim));
    record(*store, "t", host_key(fmt::format("k{}", i), fmt::format("g{}", i % 16)), vs.back());
  }
  return vs;
}

}  // namespace

TEST_CASE("durability: indexes reload, a missing or corrupt index is rebuilt while level 1 serves",
          "[store][durability]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm_test::TempDir dir;
  clm::SnapshotStoreConfig c = memory_config(2);
  c.path = dir.str();
  const std::vector<std::vector<float>> vs = fill_durability_store(c, rng);
  auto check_all = [&](clm::SnapshotStore& store, bool ann) {
    std::vector<float> out;
    for (int i = 0; i < 300; i += 7) {
      const std::string group = fmt::format("g{}", i % 16);
      const clm::SnapshotHit hit = lookup(store, "t", host_key(fmt::format("k{}", i), group), {}, out);
      CHECK(hit.level == SnapshotLevel::exact);
      CHECK(clm_test::max_abs_diff(out, vs[static_cast<std::size_t>(i)]) < kF16);
      if (!ann) continue;
      const clm::SnapshotHit near = lookup(store, "t", host_key("probe", group), vs[static_cast<std::size_t>(i)], out);
      CHECK(near.level == SnapshotLevel::ann);
      CHECK(near.key == fmt::format("k{}", i));
    }
  };
  std::vector<std::filesystem::path> index_files;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    if (e.path().extension() == ".hnsw") index_files.push_back(e.path());
  }
  REQUIRE(index_files.size() == 2);  // one per shard for the one tenant
  {
    auto store = open_store(c);
    CHECK(store->metrics().index_rebuilds == 0);
    check_all(*store, true);
  }
  std::filesystem::remove(index_files[0]);
  {
    std::fstream f(index_files[1], std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(200);
    const int byte = f.get();  // flipped, not overwritten: a fixed value may be the one already there
    f.seekp(200);
    f.put(static_cast<char>(byte ^ 0xFF));
  }
  {
    auto store = open_store(c);
    check_all(*store, false);  // level 1 serves during the rebuild
    store->wait_for_rebuilds();
    CHECK(store->metrics().index_rebuilds == 2);
    check_all(*store, true);
  }
  {
    auto store = open_store(c);  // the rebuilt files load
    CHECK(store->metrics().index_rebuilds == 0);
    check_all(*store, true);
  }
}

TEST_CASE("an open that fails after queueing an index rebuild returns its error, with no thread left running",
          "[store][durability]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm_test::TempDir dir;
  clm::SnapshotStoreConfig c = memory_config(2);
  c.path = dir.str();
  REQUIRE(c.rebuild_in_background);
  fill_durability_store(c, rng);
  // Shard 0's index file is lost: open() queues its rebuild on the thread.
  // Shard 1's table of rows is torn, which open() finds only later, when it
  // reads the labels of the rows shard 1's (intact) index file holds.
  int removed = 0, kept = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    if (e.path().extension() != ".hnsw") continue;
    if (e.path().filename().string().starts_with("shard-00.")) {
      std::filesystem::remove(e.path());
      ++removed;
    } else {
      ++kept;
    }
  }
  REQUIRE(removed == 1);
  REQUIRE(kept == 1);
  tear_rows_table(dir.str() + "/shard-01.db");
  // In a child: before the fix the failed open destroyed a joinable thread
  // (std::terminate), which would end this test program too.
  clm_test::ChildProcess child([&](int report_fd) {
    std::unique_ptr<clm::SnapshotStore> store;
    const clm::Status s = clm::SnapshotStore::open(c, store);
    const auto code = static_cast<std::int32_t>(s.code());
    if (::write(report_fd, &code, sizeof code) != sizeof code) return 2;
    return store ? 1 : 0;
  });
  CHECK(child.exit_code() == 0);
  std::int32_t code = 0;
  REQUIRE(child.read(code));
  CHECK(code == static_cast<std::int32_t>(clm::StatusCode::io_error));
}

TEST_CASE("a row whose BLOB fails its checksum is skipped and counted, never served", "[store][durability]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm_test::TempDir dir;
  clm::SnapshotStoreConfig c = memory_config(1);
  c.path = dir.str();
  const std::vector<float> v1 = random_unit(rng, kDim), v2 = random_unit(rng, kDim);
  const clm::SuffixKey key = host_key("K");
  {
    auto store = open_store(c);
    record(*store, "t", key, v1);
    record(*store, "t", key, v2);  // version 2
  }
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open((dir.str() + "/shard-00.db").c_str(), &db) == SQLITE_OK);
  // Change a byte of version 2's vector behind the store's back (to another value: writing a
  // fixed 0xAB left the BLOB as it was when that byte already was 0xAB, one seed in 256).
  REQUIRE(sqlite3_exec(db,
                       "UPDATE semantic_snapshots SET snapshot = substr(snapshot, 1, 20) || "
                       "CASE WHEN substr(snapshot, 21, 1) = x'AB' THEN x'AC' ELSE x'AB' END || "
                       "substr(snapshot, 22) WHERE version = 2",
                       nullptr, nullptr, nullptr) == SQLITE_OK);
  sqlite3_close(db);
  auto store = open_store(c);
  std::vector<float> out;
  const clm::SnapshotHit hit = lookup(*store, "t", key, {}, out);
  CHECK(hit.level == SnapshotLevel::exact);
  CHECK(hit.version == 1);
  CHECK(clm_test::max_abs_diff(out, v1) < kF16);
  CHECK(store->metrics().corrupt_skipped >= 1);
  // Level 2 reaches the corrupt row through the index (loaded from its file,
  // labels read without the BLOBs): it is skipped there too, never served.
  const std::uint64_t corrupt_before = store->metrics().corrupt_skipped;
  const clm::SnapshotHit near = lookup(*store, "t", host_key("OTHER"), v2, out);
  CHECK_FALSE((near.level == SnapshotLevel::ann && near.version == 2));
  CHECK(store->metrics().corrupt_skipped == corrupt_before + 1);
}

TEST_CASE("breaker (a): a busy shard answers miss in bounded time, and a locked write fails cleanly",
          "[store][breaker]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm_test::TempDir dir;
  clm::SnapshotStoreConfig c = memory_config(1);
  c.path = dir.str();
  c.lookup_timeout_us = 3000;
  c.write_busy_timeout_ms = 400;
  auto store = open_store(c);
  const clm::SuffixKey key = host_key("K");
  const std::vector<float> v = random_unit(rng, kDim);
  record(*store, "t", key, v);
  REQUIRE(store->flush().ok());
  std::vector<float> out;
  REQUIRE(lookup(*store, "t", key, {}, out).level == SnapshotLevel::exact);

  // Another process's connection holds the write lock.
  sqlite3* other = nullptr;
  REQUIRE(sqlite3_open((dir.str() + "/shard-00.db").c_str(), &other) == SQLITE_OK);
  REQUIRE(sqlite3_exec(other, "BEGIN IMMEDIATE; UPDATE store_meta SET value = value WHERE name = 'format';", nullptr,
                       nullptr, nullptr) == SQLITE_OK);
  // Under WAL, readers are not blocked by a writer: level 1 still serves.
  CHECK(lookup(*store, "t", key, {}, out).level == SnapshotLevel::exact);
  // A write waits write_busy_timeout_ms for the lock, holding the shard; a
  // lookup meanwhile gives up after lookup_timeout_us and answers miss.
  clm::Status written;
  std::thread writer([&] {
    clm::RecordOutcome o;
    written = store->record("t", host_key("NEW"), v, o);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto start = std::chrono::steady_clock::now();
  const clm::SnapshotHit hit = lookup(*store, "t", key, {}, out);
  const double waited_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  writer.join();
  CHECK(hit.level == SnapshotLevel::miss);
  CHECK(waited_ms < 150);  // 3 ms asked, the write holds the shard for 400: generous for a loaded CI machine
  CHECK(store->metrics().busy_misses >= 1);
  CHECK(written.code() == clm::StatusCode::io_error);
  INFO(written.message());
  CHECK(written.message().find("locked") != std::string::npos);
  REQUIRE(sqlite3_exec(other, "COMMIT", nullptr, nullptr, nullptr) == SQLITE_OK);
  sqlite3_close(other);
  // Nothing was half-written; both work again.
  CHECK(lookup(*store, "t", host_key("NEW"), {}, out).level == SnapshotLevel::miss);
  record(*store, "t", host_key("NEW"), v);
  CHECK(lookup(*store, "t", host_key("NEW"), {}, out).level == SnapshotLevel::exact);
  CHECK(store->metrics().snapshots == 2);
  REQUIRE(store->check_integrity().ok());
}

TEST_CASE("bad input: clear statuses, nothing committed changes", "[store][errors]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm_test::TempDir dir;
  clm::SnapshotStoreConfig c = memory_config(2);
  c.path = dir.str();
  auto store = open_store(c);
  const std::vector<float> v = random_unit(rng, kDim);
  record(*store, "t", host_key("K"), v);
  clm::RecordOutcome o;
  std::vector<float> bad = v;
  bad[5] = std::nanf("");
  CHECK(store->record("t", host_key("K"), bad, o).code() == clm::StatusCode::invalid_argument);
  bad[5] = std::numeric_limits<float>::infinity();
  CHECK(store->record("t", host_key("K"), bad, o).code() == clm::StatusCode::invalid_argument);
  CHECK(store->record("t", host_key("K"), std::vector<float>(kDim, 0.0f), o).code() ==
        clm::StatusCode::invalid_argument);
  CHECK(store->record("t", host_key("K"), std::vector<float>(kDim + 1, 0.1f), o).code() ==
        clm::StatusCode::invalid_argument);
  clm::SuffixKey forged = host_key("K");
  forged.fingerprint ^= 1;
  CHECK(store->record("t", forged, v, o).code() == clm::StatusCode::invalid_argument);
  CHECK(store->record("t", clm::SuffixKey{}, v, o).code() == clm::StatusCode::invalid_argument);
  // A batch with one bad record writes none of them.
  const clm::SuffixKey a = host_key("A"), b = host_key("B");
  const clm::SnapshotRecord batch[] = {{"t", &a, v}, {"t", &b, bad}};
  clm::RecordOutcome outs[2];
  CHECK(store->record_batch(batch, outs).code() == clm::StatusCode::invalid_argument);
  std::vector<float> out(kDim);
  clm::SnapshotHit hit;
  REQUIRE(store->lookup("t", a, {}, hit, out).ok());
  CHECK(hit.level == SnapshotLevel::miss);
  CHECK(store->lookup("t", a, bad, hit, out).code() == clm::StatusCode::invalid_argument);
  CHECK(store->lookup("t", a, {}, hit, std::span(out).first(3)).code() == clm::StatusCode::invalid_argument);
  CHECK(store->set_fallback("t", "", v).code() == clm::StatusCode::invalid_argument);
  CHECK(store->metrics().snapshots == 1);
  store.reset();

  // Configs out of range, and a store reopened with another shape.
  for (auto mutate : std::vector<std::function<void(clm::SnapshotStoreConfig&)>>{
           [](auto& x) { x.num_shards = 0; }, [](auto& x) { x.snapshot_dim = 0; },
           [](auto& x) { x.min_usage_threshold = 0; }, [](auto& x) { x.version_cosine = 1.5f; },
           [](auto& x) { x.ann_top_k = 0; }, [](auto& x) { x.ann_ef_search = 1; }, [](auto& x) { x.drift_window = 1; },
           [](auto& x) { x.path.clear(); }}) {
    clm::SnapshotStoreConfig bad_config = c;
    mutate(bad_config);
    std::unique_ptr<clm::SnapshotStore> s;
    CHECK(clm::SnapshotStore::open(bad_config, s).code() == clm::StatusCode::invalid_argument);
    CHECK_FALSE(s);
  }
  for (auto mutate : std::vector<std::function<void(clm::SnapshotStoreConfig&)>>{
           [](auto& x) { x.num_shards = 3; }, [](auto& x) { x.snapshot_dim = 16; }}) {
    clm::SnapshotStoreConfig other = c;
    mutate(other);
    std::unique_ptr<clm::SnapshotStore> s;
    CHECK(clm::SnapshotStore::open(other, s).code() == clm::StatusCode::failed_precondition);
  }
  // A database file that is not one, and a truncated one.
  {
    clm_test::TempDir junk;
    std::ofstream(junk.path() / "shard-00.db") << std::string(4096, 'x');
    clm::SnapshotStoreConfig j = c;
    j.path = junk.str();
    std::unique_ptr<clm::SnapshotStore> s;
    const clm::Status st = clm::SnapshotStore::open(j, s);
    CHECK(st.code() == clm::StatusCode::io_error);
    CHECK(st.message().find("shard-00") != std::string::npos);
  }
  auto reopened = open_store(c);
  {
    std::unique_ptr<clm::SnapshotStore> twice;  // one SnapshotStore per directory at a time
    CHECK(clm::SnapshotStore::open(c, twice).code() == clm::StatusCode::failed_precondition);
  }
  REQUIRE(reopened->lookup("t", host_key("K"), {}, hit, out).ok());
  CHECK(hit.level == SnapshotLevel::exact);
}

namespace {
// What the store committed, by key: sightings before admission and each
// version's vector; with stable_confirmations 0 the newest version is served.
struct CommittedModel {
  std::int64_t min_usage = 1;
  struct Key {
    std::int64_t seen = 0;
    std::vector<std::vector<float>> versions;
  };
  std::map<std::string, Key> keys;

  // Records v for `name` as the store does, and says what the store must answer.
  RecordResult record(const std::string& name, const std::vector<float>& v) {
    Key& k = keys[name];
    if (k.versions.empty()) {
      if (++k.seen < min_usage) return RecordResult::counted;
      k.versions.push_back(v);
      return RecordResult::admitted;
    }
    if (clm_test::cosine64(v, k.versions.back()) < 0.95) {
      k.versions.push_back(v);
      return RecordResult::new_version;
    }
    return RecordResult::confirmed;
  }
};

clm::SuffixKey model_key(const std::string& name) { return host_key(name, "group-" + name); }
}  // namespace

TEST_CASE("an allocation failure inside record or record_batch rolls back, and the shard stays usable",
          "[store][errors][faults]") {
  REQUIRE(clm_test::kAllocationFaults);  // not under ThreadSanitizer, where nothing would fail
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm::SnapshotStoreConfig c = memory_config(4);
  c.min_usage_threshold = 2;
  c.stable_confirmations = 0;
  auto store = open_store(c);
  CommittedModel model;
  model.min_usage = c.min_usage_threshold;

  auto check_committed = [&] {
    std::vector<float> out;
    for (const auto& [name, k] : model.keys) {
      INFO("key " << name);
      const clm::SnapshotHit hit = lookup(*store, "t", model_key(name), {}, out);
      if (k.versions.empty()) {
        CHECK(hit.level == SnapshotLevel::miss);
        continue;
      }
      CHECK(hit.level == SnapshotLevel::exact);
      CHECK(hit.version == static_cast<std::int32_t>(k.versions.size()));
      CHECK(clm_test::max_abs_diff(out, k.versions.back()) < kF16);
    }
  };
  int normal_records = 0;
  using Batch = std::vector<std::pair<std::string, std::vector<float>>>;
  // Runs the batch (record() for one record) with the n-th allocation of the
  // call failing, until a run allocates fewer than n + 1 times.
  auto fail_each_allocation = [&](const Batch& batch) {
    std::vector<clm::SuffixKey> keys;
    for (const auto& [name, v] : batch) keys.push_back(model_key(name));
    std::vector<clm::SnapshotRecord> records;
    for (std::size_t i = 0; i < batch.size(); ++i) records.push_back({"t", &keys[i], batch[i].second});
    std::vector<clm::RecordOutcome> outcomes(batch.size());
    for (long n = 0;; ++n) {
      INFO("allocation " << n << " fails, batch of " << batch.size());
      for (auto& o : outcomes) o = clm::RecordOutcome{RecordResult::not_written, 0, 0};
      clm::Status s;
      bool threw = false, fired = false;
      {
        clm_test::FailAllocation fail(n);
        try {
          s = batch.size() == 1 ? store->record("t", keys[0], batch[0].second, outcomes[0])
                                : store->record_batch(records, outcomes);
        } catch (const std::bad_alloc&) {
          threw = true;
        }
        fired = fail.fired();
      }
      CHECK_FALSE(threw);
      INFO(s.message());
      if (!s.ok()) CHECK(s.code() == clm::StatusCode::out_of_memory);
      if (!fired) REQUIRE(s.ok());
      // A failed batch keeps the shards it committed before the failing one;
      // their records say so, and the model follows the outcomes.
      for (std::size_t i = 0; i < batch.size(); ++i) {
        if (outcomes[i].result == RecordResult::not_written) continue;
        CHECK(outcomes[i].result == model.record(batch[i].first, batch[i].second));
      }
      if (s.ok() && !threw) {
        for (const auto& o : outcomes) CHECK(o.result != RecordResult::not_written);
      }
      check_committed();
      // Normal records afterwards commit in every shard (no transaction was
      // left open).
      for (std::int32_t shard = 0; shard < c.num_shards; ++shard) {
        std::string after;
        do {
          after = fmt::format("after-{}", normal_records++);
        } while (store->shard_of("t", model_key(after)) != shard);
        const std::vector<float> v = random_unit(rng, kDim);
        for (RecordResult expected : {RecordResult::counted, RecordResult::admitted}) {
          clm::RecordOutcome o;
          const clm::Status normal = store->record("t", model_key(after), v, o);
          INFO("shard " << shard << ": " << normal.message());
          REQUIRE(normal.ok());
          CHECK(o.result == expected);
          CHECK(model.record(after, v) == expected);
        }
      }
      check_committed();
      if (!fired) return;
    }
  };

  const std::vector<float> a1 = random_unit(rng, kDim), a2 = random_unit(rng, kDim);
  REQUIRE(std::abs(clm_test::cosine64(a1, a2)) < 0.9);
  fail_each_allocation({{"A", a1}});  // counted
  fail_each_allocation({{"A", a1}});  // admitted
  fail_each_allocation({{"A", a1}});  // confirmed
  fail_each_allocation({{"A", a2}});  // a new version
  // Keys of several shards, each new, confirming or starting a version.
  Batch batch{{"A", a2}, {"A-prime", a1}};
  for (int i = 0; i < 6; ++i) batch.emplace_back(fmt::format("B{}", i), random_unit(rng, kDim));
  std::set<std::int32_t> shards;
  for (const auto& [name, v] : batch) shards.insert(store->shard_of("t", model_key(name)));
  REQUIRE(shards.size() >= 2);
  fail_each_allocation(batch);  // counts B*
  batch[0].second = a1;         // A: back to a1, a new version
  fail_each_allocation(batch);  // admits B*, A-prime
  fail_each_allocation(batch);  // confirms all
  REQUIRE(store->check_integrity().ok());

  // A lookup that runs out of memory part way serves nothing: its status says
  // so and its hit is a miss, whatever it had filled in before.
  for (const std::string name : {"A", "B0"}) {
    std::vector<float> out(kDim);
    for (long n = 0;; ++n) {
      INFO("lookup of " << name << ", allocation " << n << " fails");
      clm::SnapshotHit hit;
      clm::Status s;
      bool fired = false;
      {
        clm_test::FailAllocation fail(n);
        s = store->lookup("t", model_key(name), a1, hit, out);
        fired = fail.fired();
      }
      if (!s.ok()) {
        CHECK(s.code() == clm::StatusCode::out_of_memory);
        CHECK(hit.level == SnapshotLevel::miss);
      }
      if (!fired) {
        REQUIRE(s.ok());
        CHECK(hit.level == SnapshotLevel::exact);
        break;
      }
    }
  }
}

TEST_CASE("concurrent records and lookups from many threads keep every row", "[store][concurrency][threads]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  clm::SnapshotStoreConfig c = memory_config(4);
  c.lookup_timeout_us = 5'000'000;  // a lookup here must not give up on a shard another thread writes
  auto store = open_store(c);
  constexpr int kThreads = 4, kPerThread = 150;
  std::vector<std::vector<std::vector<float>>> vs(kThreads);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(seed + static_cast<std::uint32_t>(t));
      std::vector<float> out(kDim);
      for (int i = 0; i < kPerThread; ++i) {
        vs[static_cast<std::size_t>(t)].push_back(random_unit(rng, kDim));
        const clm::SuffixKey key = host_key(fmt::format("t{}-{}", t, i), fmt::format("g{}", i % 5));
        clm::RecordOutcome o;
        if (!store->record("tenant", key, vs[static_cast<std::size_t>(t)].back(), o).ok()) ++failures;
        clm::SnapshotHit hit;
        if (!store->lookup("tenant", key, vs[static_cast<std::size_t>(t)].back(), hit, out).ok() ||
            hit.level != SnapshotLevel::exact) {
          ++failures;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(failures == 0);
  CHECK(store->metrics().snapshots == kThreads * kPerThread);
  std::vector<float> out;
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPerThread; i += 13) {
      const clm::SnapshotHit hit =
          lookup(*store, "tenant", host_key(fmt::format("t{}-{}", t, i), fmt::format("g{}", i % 5)), {}, out);
      CHECK(hit.level == SnapshotLevel::exact);
      CHECK(clm_test::max_abs_diff(out, vs[static_cast<std::size_t>(t)][static_cast<std::size_t>(i)]) < kF16);
    }
  }
}

// ---- low-information keys ------------------------------------------------------

TEST_CASE("a low-information key is never stored and never served at levels 1 and 2", "[store][abstain]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  auto store = open_store(memory_config());
  const std::vector<float> v = random_unit(rng, kDim);
  // A row stored under a host key that a low-information key shares, key and group.
  const clm::SuffixKey served = host_key("GREETING", "greeting");
  REQUIRE(record(*store, "t", served, v).result == RecordResult::admitted);
  clm::SuffixKey greeting = served;
  greeting.low_information = true;
  greeting.abstain_reason = "a greeting";
  std::vector<float> out;
  CHECK(lookup(*store, "t", served, v, out).level == SnapshotLevel::exact);
  CHECK(lookup(*store, "t", greeting, {}, out).level == SnapshotLevel::miss);  // not level 1
  CHECK(lookup(*store, "t", greeting, v, out).level == SnapshotLevel::miss);   // nor level 2
  clm::SuffixKey neighbour = host_key("GREETING-2", "greeting");
  neighbour.low_information = true;
  CHECK(lookup(*store, "t", neighbour, v, out).level == SnapshotLevel::miss);
  REQUIRE(store->set_fallback("t", "GREETING", v).ok());
  const clm::SnapshotHit hit = lookup(*store, "t", greeting, v, out);
  CHECK(hit.level == SnapshotLevel::fallback);  // level 3 only
  CHECK(hit.key == "GREETING");

  // record() stores and counts nothing, and says so; a batch keeps its other records.
  const clm::SnapshotStoreMetrics before = store->metrics();
  const clm::RecordOutcome o = record(*store, "t", neighbour, v);
  CHECK(o.result == RecordResult::abstained);
  CHECK(o.version == 0);
  CHECK(std::string(clm::record_result_name(o.result)) == "abstained");
  const clm::SuffixKey other = host_key("OTHER", "g");
  const clm::SnapshotRecord batch[] = {{"t", &neighbour, v}, {"t", &other, v}, {"u", &greeting, v}};
  clm::RecordOutcome outs[3];
  REQUIRE(store->record_batch(batch, outs).ok());
  CHECK(outs[0].result == RecordResult::abstained);
  CHECK(outs[1].result == RecordResult::admitted);
  CHECK(outs[2].result == RecordResult::abstained);
  const clm::SnapshotStoreMetrics after = store->metrics();
  CHECK(after.abstained == before.abstained + 3);
  CHECK(after.records == before.records + 4);
  CHECK(after.snapshots == before.snapshots + 1);                               // OTHER only
  CHECK(lookup(*store, "t", neighbour, {}, out).level == SnapshotLevel::miss);  // no fallback of its name
  CHECK(lookup(*store, "u", greeting, {}, out).level == SnapshotLevel::miss);
  // Bad input is still refused, low information or not.
  std::vector<float> bad = v;
  bad[0] = std::nanf("");
  clm::RecordOutcome refused;
  CHECK(store->record("t", neighbour, bad, refused).code() == clm::StatusCode::invalid_argument);
}

// ---- key rules: versioned keys, rekey ----------------------------------------------

namespace {

// Two rule sets for the keyer: under B "parcel" is an ORDER (keys that were
// two become one) and "package" is unknown (its texts make no servable key).
struct Lexicons {
  clm_test::TempDir dir{"lexicons"};
  std::string a = dir.file("a"), b = dir.file("b");
  Lexicons() {
    std::filesystem::create_directories(a);
    std::filesystem::create_directories(b);
    write(a + "/test.tsv",
          "check\taction\tQUERY\ncancel\taction\tCANCEL\norder\tobject\tORDER\nparcel\tobject\tPARCEL\n"
          "package\tobject\tPACKAGE\nmy\tstopword\tMY\nhi\tgreeting\tGREETING\n");
    write(b + "/test.tsv",
          "check\taction\tQUERY\ncancel\taction\tCANCEL\norder\tobject\tORDER\nparcel\tobject\tORDER\n"
          "my\tstopword\tMY\nhi\tgreeting\tGREETING\n");
  }
  static void write(const std::string& path, const std::string& text) {
    std::ofstream f(path, std::ios::binary);
    f << text;
    REQUIRE(f.good());
  }
};

// The test's lexicons replace the built-in ones, so that its keys do not
// change with the built-in key rules (empty: the built-in ones).
std::unique_ptr<clm::SuffixKeyer> make_keyer(const std::string& lexicon_dir) {
  clm::SuffixKeyerConfig kc;
  kc.lexicon_dir = lexicon_dir;
  kc.replace_builtin_lexicons = !lexicon_dir.empty();
  std::unique_ptr<clm::SuffixKeyer> keyer;
  const clm::Status s = clm::SuffixKeyer::create(kc, keyer);
  INFO(s.message());
  REQUIRE(s.ok());
  return keyer;
}

// Every file of a directory and its bytes (what "nothing was written" compares).
std::map<std::string, std::string> files_of(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::ifstream f(e.path(), std::ios::binary);
    out[e.path().filename().string()] = std::string(std::istreambuf_iterator<char>(f), {});
  }
  return out;
}

void exec_sql(const std::string& db_path, const std::string& sql) {
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) == SQLITE_OK);
  char* error = nullptr;
  const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error);
  const std::string why = error ? error : "";
  sqlite3_free(error);
  sqlite3_close(db);
  INFO(sql << ": " << why);
  REQUIRE(rc == SQLITE_OK);
}

// The rows of a one-column query (integers or text, as text).
std::vector<std::string> query_sql(const std::string& db_path, const std::string& sql) {
  sqlite3* db = nullptr;
  // Read-write (no file is created): the last connection to close removes the -wal and -shm files,
  // as the store's own does, so that a directory's files compare equal before and after.
  REQUIRE(sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) == SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  REQUIRE(sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) == SQLITE_OK);
  std::vector<std::string> out;
  while (sqlite3_step(stmt) == SQLITE_ROW) {
    const unsigned char* t = sqlite3_column_text(stmt, 0);
    out.emplace_back(t ? reinterpret_cast<const char*>(t) : "NULL");
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return out;
}

std::string shard_db(const std::string& dir, int shard) { return fmt::format("{}/shard-{:02}.db", dir, shard); }

// One record the rekey tests made: a text or a host key, and its vector.
struct Recorded {
  std::string tenant;
  std::string text;  // empty: a host key
  std::string host, group;
  std::vector<float> v;
};

clm::SnapshotStoreConfig rekey_config(const std::string& dir, const std::string& lexicons,
                                      const clm_test::ManualClock& clock) {
  clm::SnapshotStoreConfig c = memory_config(4);
  c.path = dir;
  c.keyer.lexicon_dir = lexicons;
  c.keyer.replace_builtin_lexicons = true;  // as make_keyer
  c.stable_confirmations = 0;               // every version stable: a lookup serves the newest
  c.rebuild_in_background = false;
  c.clock_ms = clock.fn();
  return c;
}

// Records, under c's rules, `entities` order numbers' texts in two tenants
// (each a second apart, so that created_at orders them) and some host keys.
std::vector<Recorded> fill_rekey_store(const clm::SnapshotStoreConfig& c, clm_test::ManualClock& clock,
                                       std::mt19937& rng, int entities) {
  std::vector<Recorded> records;
  for (int n = 0; n < entities; ++n) {
    const std::string tenant = n % 2 ? "t1" : "t2";
    const int number = 100 + n;
    for (const char* form : {"check order {}", "check parcel {}", "check package {}", "cancel my order {}"}) {
      records.push_back({tenant, fmt::format(fmt::runtime(form), number), "", "", random_unit(rng, kDim)});
    }
    if (n % 3 == 0) records.push_back({tenant, fmt::format("check order {}", number), "", "", random_unit(rng, kDim)});
    if (n % 4 == 0)
      records.push_back({tenant, "", fmt::format("host-{}", n), fmt::format("hg{}", n % 3), random_unit(rng, kDim)});
  }
  auto store = open_store(c);
  for (const Recorded& r : records) {
    clm::SuffixKey key;
    if (r.text.empty()) {
      key = host_key(r.host, r.group);
    } else {
      REQUIRE(store->keyer().make_key(r.text, key).ok());
      REQUIRE_FALSE(key.low_information);
    }
    clock.advance_ms(1000);
    const clm::RecordOutcome o = record(*store, r.tenant, key, r.v);
    REQUIRE((o.result == RecordResult::admitted || o.result == RecordResult::new_version));
  }
  return records;
}

// What a store under c's rules must serve for `records`: each (tenant, key)
// its newest record's vector, with as many versions as records, by key
// (level 1); texts that make no servable key now nothing; and no other row.
void check_served(const clm::SnapshotStoreConfig& c, const std::vector<Recorded>& records,
                  std::int64_t* dropped_out = nullptr) {
  auto store = open_store(c);
  std::map<std::pair<std::string, std::string>, std::vector<std::size_t>> by_key;
  std::map<std::pair<std::string, std::string>, clm::SuffixKey> keys;
  std::int64_t dropped = 0;
  for (std::size_t i = 0; i < records.size(); ++i) {
    const Recorded& r = records[i];
    clm::SuffixKey key;
    if (r.text.empty()) {
      key = host_key(r.host, r.group);
    } else if (!store->keyer().make_key(r.text, key).ok() || key.low_information) {
      ++dropped;
      continue;
    }
    by_key[{r.tenant, key.key}].push_back(i);
    keys[{r.tenant, key.key}] = key;
  }
  std::vector<float> out;
  std::int64_t rows = 0;
  for (const auto& [tk, indexes] : by_key) {
    INFO("tenant " << tk.first << " key " << tk.second);
    rows += static_cast<std::int64_t>(indexes.size());
    if (store->is_blacklisted(tk.first, keys[tk])) continue;  // kept, not served
    const clm::SnapshotHit hit = lookup(*store, tk.first, keys[tk], {}, out);
    REQUIRE(hit.level == SnapshotLevel::exact);
    CHECK(hit.version == static_cast<std::int32_t>(indexes.size()));
    CHECK(clm_test::max_abs_diff(out, records[indexes.back()].v) < kF16);
  }
  CHECK(store->metrics().snapshots == rows);
  if (dropped_out) *dropped_out = dropped;
}

}  // namespace

TEST_CASE("key rules: a store opens only under the rules it was made with, and a refused open writes nothing",
          "[store][rekey]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  Lexicons lex;
  clm_test::TempDir dir;
  clm_test::ManualClock clock;
  const clm::SnapshotStoreConfig a = rekey_config(dir.str(), lex.a, clock);
  clm::SnapshotStoreConfig b = a;
  b.keyer.lexicon_dir = lex.b;
  const auto records = fill_rekey_store(a, clock, rng, 6);
  const std::uint64_t rules_a = make_keyer(lex.a)->rules_fingerprint();
  const std::uint64_t rules_b = make_keyer(lex.b)->rules_fingerprint();
  REQUIRE(rules_a != rules_b);
  CHECK(rules_a != make_keyer("")->rules_fingerprint());  // the built-in lexicons are other rules too
  for (int s = 0; s < 4; ++s) {
    CHECK(query_sql(shard_db(dir.str(), s), "SELECT value FROM store_meta WHERE name = 'key_rules'") ==
          std::vector<std::string>{std::to_string(static_cast<std::int64_t>(rules_a))});
    CHECK(query_sql(shard_db(dir.str(), s), "SELECT value FROM store_meta WHERE name = 'format'") ==
          std::vector<std::string>{"4"});
  }
  // Texts are kept; host keys have none.
  std::vector<std::string> texts, host_texts;
  for (int s = 0; s < 4; ++s) {
    for (auto& t : query_sql(shard_db(dir.str(), s),
                             "SELECT source_text FROM semantic_snapshots WHERE suffix_key NOT LIKE 'host-%'")) {
      texts.push_back(t);
    }
    for (auto& t : query_sql(shard_db(dir.str(), s),
                             "SELECT source_text FROM semantic_snapshots WHERE suffix_key LIKE 'host-%'")) {
      host_texts.push_back(t);
    }
  }
  std::vector<std::string> expected_texts;
  for (const Recorded& r : records) {
    if (!r.text.empty()) expected_texts.push_back(r.text);
  }
  std::sort(texts.begin(), texts.end());
  std::sort(expected_texts.begin(), expected_texts.end());
  CHECK(texts == expected_texts);
  CHECK(host_texts == std::vector<std::string>(host_texts.size(), "NULL"));
  CHECK_FALSE(host_texts.empty());

  const auto before = files_of(dir.str());
  std::unique_ptr<clm::SnapshotStore> store;
  const clm::Status refused = clm::SnapshotStore::open(b, store);
  INFO(refused.message());
  CHECK(refused.code() == clm::StatusCode::failed_precondition);
  CHECK(refused.message().find(fmt::format("{:016x}", rules_a)) != std::string::npos);
  CHECK(refused.message().find(fmt::format("{:016x}", rules_b)) != std::string::npos);
  CHECK(refused.message().find(fmt::format("clm_store rekey {}", dir.str())) != std::string::npos);
  CHECK(refused.message().find("rekey --adopt") != std::string::npos);
  CHECK(store == nullptr);
  CHECK(files_of(dir.str()) == before);  // not a byte written
  // The same with a shard file missing: it is not created.
  std::filesystem::rename(shard_db(dir.str(), 3), dir.file("aside"));
  CHECK(clm::SnapshotStore::open(b, store).code() == clm::StatusCode::failed_precondition);
  CHECK_FALSE(std::filesystem::exists(shard_db(dir.str(), 3)));
  std::filesystem::rename(dir.file("aside"), shard_db(dir.str(), 3));
  // Under its own rules it opens and serves as before.
  check_served(a, records);
}

TEST_CASE("rekey: keys made again from their texts, rows moved, host keys kept, served as recorded", "[store][rekey]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  Lexicons lex;
  clm_test::TempDir dir;
  clm_test::ManualClock clock;
  const clm::SnapshotStoreConfig a = rekey_config(dir.str(), lex.a, clock);
  clm::SnapshotStoreConfig b = a;
  b.keyer.lexicon_dir = lex.b;
  const auto records = fill_rekey_store(a, clock, rng, 24);
  const auto keyer_a = make_keyer(lex.a), keyer_b = make_keyer(lex.b);
  // State about old keys: a blacklisted text key, a blacklisted host key, a sighting.
  clm::SuffixKey parcel;
  REQUIRE(keyer_a->make_key("check parcel 100", parcel).ok());
  const clm::SuffixKey host0 = host_key("host-0", "hg0");
  {
    auto store = open_store(a);
    for (int i = 0; i < 20; ++i) {
      REQUIRE(store->report_outcome("t2", parcel, false).ok());
      REQUIRE(store->report_outcome("t2", host0, false).ok());
    }
    CHECK(store->is_blacklisted("t2", parcel));
  }
  {
    clm::SnapshotStoreConfig counting = a;
    counting.min_usage_threshold = 5;
    auto store = open_store(counting);
    clm::SuffixKey fresh;
    REQUIRE(store->keyer().make_key("cancel my order 999", fresh).ok());
    CHECK(record(*store, "t1", fresh, random_unit(rng, kDim)).result == RecordResult::counted);
  }
  // What B makes of the texts: which keys change, move, merge or go.
  const clm::ConsistentHashRing ring(4);
  auto route = [&](const std::string& tenant, std::uint64_t group) {
    return ring.shard_of(group ^ clm::mix64(clm::key_fingerprint(tenant)));
  };
  std::int64_t text_rows = 0, host_rows = 0, changed = 0, moved = 0, dropped = 0;
  for (const Recorded& r : records) {
    if (r.text.empty()) {
      ++host_rows;
      continue;
    }
    ++text_rows;
    clm::SuffixKey ka, kb;
    REQUIRE(keyer_a->make_key(r.text, ka).ok());
    if (!keyer_b->make_key(r.text, kb).ok() || kb.low_information) {
      ++dropped;
      continue;
    }
    changed += ka.key != kb.key ? 1 : 0;
    moved += route(r.tenant, ka.group) != route(r.tenant, kb.group) ? 1 : 0;
  }
  REQUIRE(dropped > 0);  // "check package N": package is no word of B
  REQUIRE(changed > 0);  // "check parcel N" is an ORDER's
  REQUIRE(moved > 0);

  const auto rows_before = static_cast<std::int64_t>(records.size());
  clm::RekeyReport report;
  const clm::Status s = clm::SnapshotStore::rekey(b, false, report);
  INFO(s.message());
  REQUIRE(s.ok());
  CHECK(report.old_rules == keyer_a->rules_fingerprint());
  CHECK(report.new_rules == keyer_b->rules_fingerprint());
  CHECK(report.old_format == 4);  // made by this library
  CHECK_FALSE(report.adopted);
  CHECK_FALSE(report.resumed);
  CHECK(report.rows_before == rows_before);
  CHECK(report.rows_after == rows_before - dropped);
  CHECK(report.kept == host_rows);
  CHECK(report.rekeyed == text_rows - dropped);
  CHECK(report.changed == changed);
  CHECK(report.moved == moved);
  CHECK(report.dropped == dropped);
  REQUIRE_FALSE(report.drops.empty());
  std::int64_t listed = 0;
  for (const auto& d : report.drops) {
    listed += d.rows;
    CHECK_FALSE(d.reason.empty());
    CHECK(d.example.find("package") != std::string::npos);
  }
  CHECK(listed == dropped);
  CHECK(report.versions_renumbered > 0);  // "check order N" and "check parcel N" became one key
  CHECK(report.sightings_dropped == 1);
  CHECK(report.blacklist_dropped == 1);  // the parcel key's; the host key's stays
  CHECK(report.indexes_rebuilt > 0);

  // Under B: every key served by its newest record, versions numbered in created order.
  std::int64_t served_dropped = 0;
  check_served(b, records, &served_dropped);
  CHECK(served_dropped == dropped);
  {
    auto store = open_store(b);
    CHECK(store->is_blacklisted("t2", host0));
    clm::SuffixKey merged;
    REQUIRE(store->keyer().make_key("check parcel 100", merged).ok());
    CHECK_FALSE(store->is_blacklisted("t2", merged));
    // Level 2 through the rebuilt indexes: a host key's vector under another key of its group.
    const Recorded& h =
        *std::find_if(records.begin(), records.end(), [](const Recorded& r) { return r.host == "host-4"; });
    std::vector<float> out;
    const clm::SnapshotHit near = lookup(*store, h.tenant, host_key("probe", h.group), h.v, out);
    CHECK(near.level == SnapshotLevel::ann);
    CHECK(near.key == "host-4");
    // A record after the rekey keeps its text too.
    clm::SuffixKey k;
    REQUIRE(store->keyer().make_key("check parcel 500", k).ok());
    record(*store, "t1", k, random_unit(rng, kDim));
  }
  CHECK(query_sql(shard_db(dir.str(), 0), "SELECT value FROM store_meta WHERE name = 'key_rules'") ==
        std::vector<std::string>{std::to_string(static_cast<std::int64_t>(keyer_b->rules_fingerprint()))});
  std::vector<std::string> kept_text;
  for (int s2 = 0; s2 < 4; ++s2) {
    for (auto& t : query_sql(shard_db(dir.str(), s2),
                             "SELECT source_text FROM semantic_snapshots WHERE source_text LIKE '%500'")) {
      kept_text.push_back(t);
    }
    CHECK(query_sql(shard_db(dir.str(), s2), "SELECT name FROM sqlite_master WHERE name LIKE 'rekey%'").empty());
    CHECK(query_sql(shard_db(dir.str(), s2), "SELECT name FROM store_meta WHERE name LIKE 'rekey%'").empty());
  }
  CHECK(kept_text == std::vector<std::string>{"check parcel 500"});

  // Again under the same rules: nothing changes. Back under A: parcel's keys come back.
  clm::RekeyReport again;
  REQUIRE(clm::SnapshotStore::rekey(b, false, again).ok());
  CHECK(again.changed == 0);
  CHECK(again.moved == 0);
  CHECK(again.dropped == 0);
  CHECK(again.versions_renumbered == 0);
  clm::RekeyReport back;
  REQUIRE(clm::SnapshotStore::rekey(a, false, back).ok());
  CHECK(back.changed > 0);
  CHECK(back.dropped == 0);
}

TEST_CASE("rekey: an interrupted rekey is detected, refused at open, and finished by running it again",
          "[store][rekey]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  Lexicons lex;
  clm_test::ManualClock clock;

  SECTION("a mark left in one shard") {
    clm_test::TempDir dir;
    const clm::SnapshotStoreConfig a = rekey_config(dir.str(), lex.a, clock);
    clm::SnapshotStoreConfig b = a;
    b.keyer.lexicon_dir = lex.b;
    const auto records = fill_rekey_store(a, clock, rng, 8);
    exec_sql(shard_db(dir.str(), 2), "INSERT INTO store_meta (name, value) VALUES ('rekey_to', 12345)");
    const auto before = files_of(dir.str());
    for (const clm::SnapshotStoreConfig* c : std::initializer_list<const clm::SnapshotStoreConfig*>{&a, &b}) {
      std::unique_ptr<clm::SnapshotStore> store;
      const clm::Status s = clm::SnapshotStore::open(*c, store);
      INFO(s.message());
      CHECK(s.code() == clm::StatusCode::failed_precondition);
      CHECK(s.message().find("interrupted") != std::string::npos);
      CHECK(s.message().find(fmt::format("clm_store rekey {}", dir.str())) != std::string::npos);
    }
    CHECK(files_of(dir.str()) == before);
    clm::RekeyReport report;
    const clm::Status adopt = clm::SnapshotStore::rekey(b, true, report);
    CHECK(adopt.code() == clm::StatusCode::failed_precondition);  // keys half new: adopting would keep them so
    CHECK(files_of(dir.str()) == before);
    REQUIRE(clm::SnapshotStore::rekey(b, false, report).ok());
    CHECK(report.resumed);
    check_served(b, records);
  }

  SECTION("SIGKILL at random moments of a rekey") {
    // How long a whole rekey takes, on a store like those killed below (the
    // shorter of two: the first runs on cold caches).
    constexpr int kEntities = 250, kKills = 8;
    double full_s = 1e9;
    for (int run = 0; run < 2; ++run) {
      clm_test::TempDir dir;
      const clm::SnapshotStoreConfig a = rekey_config(dir.str(), lex.a, clock);
      clm::SnapshotStoreConfig b = a;
      b.keyer.lexicon_dir = lex.b;
      const auto records = fill_rekey_store(a, clock, rng, kEntities);
      const auto t0 = std::chrono::steady_clock::now();
      clm::RekeyReport report;
      REQUIRE(clm::SnapshotStore::rekey(b, false, report).ok());
      full_s = std::min(full_s, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      if (run == 0) check_served(b, records);
    }
    int finished = 0, untouched = 0, interrupted = 0;
    for (int kill = 0; kill < kKills; ++kill) {
      clm_test::TempDir dir;
      const clm::SnapshotStoreConfig a = rekey_config(dir.str(), lex.a, clock);
      clm::SnapshotStoreConfig b = a;
      b.keyer.lexicon_dir = lex.b;
      const auto records = fill_rekey_store(a, clock, rng, kEntities);
      std::uniform_real_distribution<double> when(0.0, full_s * 0.7);  // the end is the index rebuild
      const double delay_s = when(rng);
      INFO("kill " << kill << " after " << delay_s << " s of a " << full_s << " s rekey");
      {
        clm_test::ChildProcess child([&](int fd) {
          const std::int32_t ready = 1;
          if (write(fd, &ready, sizeof ready) != sizeof ready) return 5;
          clm::RekeyReport report;
          return clm::SnapshotStore::rekey(b, false, report).ok() ? 0 : 3;
        });
        std::int32_t ready = 0;
        REQUIRE(child.read(ready));
        std::this_thread::sleep_for(std::chrono::duration<double>(delay_s));
      }  // SIGKILL (a child that finished already is only reaped)
      // Whatever the moment: under B the store is whole or refused; under A
      // it opens only if nothing had changed yet.
      std::unique_ptr<clm::SnapshotStore> store;
      const clm::Status under_b = clm::SnapshotStore::open(b, store);
      store.reset();
      if (under_b.ok()) {
        ++finished;
        check_served(b, records);
      } else {
        INFO(under_b.message());
        CHECK(under_b.code() == clm::StatusCode::failed_precondition);
        const clm::Status under_a = clm::SnapshotStore::open(a, store);
        store.reset();
        if (under_a.ok()) {
          ++untouched;
          check_served(a, records);
        } else {
          ++interrupted;
          CHECK(under_a.code() == clm::StatusCode::failed_precondition);
        }
      }
      clm::RekeyReport report;
      const clm::Status rerun = clm::SnapshotStore::rekey(b, false, report);
      INFO(rerun.message());
      REQUIRE(rerun.ok());
      check_served(b, records);
      for (int s = 0; s < 4; ++s) {
        CHECK(query_sql(shard_db(dir.str(), s), "PRAGMA integrity_check") == std::vector<std::string>{"ok"});
      }
    }
    INFO("finished " << finished << ", untouched " << untouched << ", interrupted " << interrupted);
    CHECK(finished + untouched + interrupted == kKills);
  }
}

TEST_CASE("a format-1 store is refused naming rekey --adopt, and adopt keeps its keys", "[store][rekey]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  Lexicons lex;
  clm_test::TempDir dir;
  clm_test::ManualClock clock;
  clm::SnapshotStoreConfig c = rekey_config(dir.str(), lex.a, clock);
  c.num_shards = 2;
  // The store as clmcache made it before keys kept their text: format 1, no
  // source_text column, no key_rules.
  constexpr const char* kOldSchema =
      "PRAGMA journal_mode = WAL;"
      "CREATE TABLE semantic_snapshots (id INTEGER PRIMARY KEY AUTOINCREMENT, suffix_hash INTEGER NOT NULL,"
      " version INTEGER NOT NULL DEFAULT 1, snapshot BLOB NOT NULL, created_at INTEGER NOT NULL,"
      " last_used INTEGER NOT NULL, usage_count INTEGER NOT NULL DEFAULT 0, tenant BLOB NOT NULL,"
      " suffix_key TEXT NOT NULL, group_hash INTEGER NOT NULL, dim INTEGER NOT NULL, dtype TEXT NOT NULL,"
      " checksum INTEGER NOT NULL, confirmations INTEGER NOT NULL DEFAULT 0);"
      "CREATE INDEX idx_hash_version ON semantic_snapshots(suffix_hash, version);"
      "CREATE INDEX idx_tenant_id ON semantic_snapshots(tenant, id);"
      "CREATE TABLE suffix_sightings (tenant BLOB NOT NULL, suffix_hash INTEGER NOT NULL, suffix_key TEXT NOT NULL,"
      " seen INTEGER NOT NULL, last_seen INTEGER NOT NULL, PRIMARY KEY (tenant, suffix_hash, suffix_key))"
      " WITHOUT ROWID;"
      "CREATE TABLE blacklist (tenant BLOB NOT NULL, suffix_hash INTEGER NOT NULL, suffix_key TEXT NOT NULL,"
      " until_ms INTEGER NOT NULL, PRIMARY KEY (tenant, suffix_hash)) WITHOUT ROWID;"
      "CREATE TABLE fallback_snapshots (tenant BLOB NOT NULL, name TEXT NOT NULL, snapshot BLOB NOT NULL,"
      " dim INTEGER NOT NULL, checksum INTEGER NOT NULL, PRIMARY KEY (tenant, name)) WITHOUT ROWID;"
      "CREATE TABLE store_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;";
  const clm::ConsistentHashRing ring(2);
  struct Old {
    clm::SuffixKey key;
    std::vector<float> v;
  };
  std::vector<Old> rows;
  for (int i = 0; i < 12; ++i) rows.push_back({host_key(fmt::format("old-{}", i), fmt::format("og{}", i % 3)), {}});
  clm::SuffixKey text_key;  // a key once made from text, whose text the store never kept
  REQUIRE(make_keyer(lex.a)->make_key("check order 123", text_key).ok());
  rows.push_back({text_key, {}});
  for (int s = 0; s < 2; ++s) {
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open(shard_db(dir.str(), s).c_str(), &db) == SQLITE_OK);
    REQUIRE(sqlite3_exec(db, kOldSchema, nullptr, nullptr, nullptr) == SQLITE_OK);
    const std::string meta = fmt::format(
        "INSERT INTO store_meta VALUES ('format', 1), ('shard', {}), ('num_shards', 2), ('snapshot_dim', {})", s, kDim);
    REQUIRE(sqlite3_exec(db, meta.c_str(), nullptr, nullptr, nullptr) == SQLITE_OK);
    sqlite3_stmt* insert = nullptr;
    REQUIRE(sqlite3_prepare_v2(db,
                               "INSERT INTO semantic_snapshots (suffix_hash, version, snapshot, created_at, last_used,"
                               " tenant, suffix_key, group_hash, dim, dtype, checksum)"
                               " VALUES (?1, 1, ?2, 1700000000, 1700000000, CAST('t' AS BLOB), ?3, ?4, ?5, 'f16', ?6)",
                               -1, &insert, nullptr) == SQLITE_OK);
    for (Old& r : rows) {
      if (ring.shard_of(r.key.group ^ clm::mix64(clm::key_fingerprint("t"))) != s) continue;
      r.v = random_unit(rng, kDim);
      std::vector<std::uint8_t> blob;
      clm::encode_snapshot_blob(r.v, blob);
      sqlite3_bind_int64(insert, 1, static_cast<std::int64_t>(r.key.fingerprint));
      sqlite3_bind_blob(insert, 2, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
      sqlite3_bind_text(insert, 3, r.key.key.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_int64(insert, 4, static_cast<std::int64_t>(r.key.group));
      sqlite3_bind_int64(insert, 5, kDim);
      sqlite3_bind_int64(insert, 6, static_cast<std::int64_t>(clm::snapshot_checksum(blob)));
      REQUIRE(sqlite3_step(insert) == SQLITE_DONE);
      sqlite3_reset(insert);
    }
    sqlite3_finalize(insert);
    sqlite3_close(db);
  }
  for (const Old& r : rows) REQUIRE_FALSE(r.v.empty());

  const auto before = files_of(dir.str());
  std::unique_ptr<clm::SnapshotStore> store;
  const clm::Status refused = clm::SnapshotStore::open(c, store);
  INFO(refused.message());
  CHECK(refused.code() == clm::StatusCode::failed_precondition);
  CHECK(refused.message().find(fmt::format("clm_store rekey --adopt {}", dir.str())) != std::string::npos);
  CHECK(refused.message().find("format 1") != std::string::npos);
  clm::RekeyReport report;
  const clm::Status no_text = clm::SnapshotStore::rekey(c, false, report);
  CHECK(no_text.code() == clm::StatusCode::failed_precondition);  // no text to make keys from
  CHECK(no_text.message().find("--adopt") != std::string::npos);
  auto after = files_of(dir.str());
  after.erase("LOCK");  // the rekey's lock file: no part of the store
  CHECK(after == before);

  const clm::Status adopted = clm::SnapshotStore::rekey(c, true, report);
  INFO(adopted.message());
  REQUIRE(adopted.ok());
  CHECK(report.adopted);
  CHECK(report.old_format == 1);
  CHECK(report.old_rules == 0);
  CHECK(report.new_rules == make_keyer(lex.a)->rules_fingerprint());
  CHECK(report.kept == static_cast<std::int64_t>(rows.size()));
  CHECK(report.rows_after == static_cast<std::int64_t>(rows.size()));
  CHECK(report.rekeyed == 0);
  for (int s = 0; s < 2; ++s) {
    CHECK(query_sql(shard_db(dir.str(), s), "SELECT value FROM store_meta WHERE name = 'format'") ==
          std::vector<std::string>{"4"});
    CHECK(query_sql(shard_db(dir.str(), s),
                    "SELECT count(*) FROM pragma_table_info('semantic_snapshots')"
                    " WHERE name = 'source_text'") == std::vector<std::string>{"1"});
  }
  {
    store = open_store(c);
    std::vector<float> out;
    for (const Old& r : rows) {
      INFO(r.key.key);
      CHECK(store->shard_of("t", r.key) == ring.shard_of(r.key.group ^ clm::mix64(clm::key_fingerprint("t"))));
      const clm::SnapshotHit hit = lookup(*store, "t", r.key, {}, out);
      CHECK(hit.level == SnapshotLevel::exact);
      CHECK(clm_test::max_abs_diff(out, r.v) < kF16);
    }
    store.reset();
  }
  // Adopting again, or under other rules (the user's explicit choice), records those rules.
  clm::SnapshotStoreConfig b = c;
  b.keyer.lexicon_dir = lex.b;
  REQUIRE(clm::SnapshotStore::rekey(b, true, report).ok());
  CHECK(report.old_format == 4);  // adopted: the current format
  CHECK(report.old_rules == make_keyer(lex.a)->rules_fingerprint());
  store = open_store(b);
  std::vector<float> out;
  CHECK(lookup(*store, "t", rows[0].key, {}, out).level == SnapshotLevel::exact);
}

TEST_CASE("rekey and open: bad directories and stores are refused with clear statuses", "[store][rekey][errors]") {
  Lexicons lex;
  clm_test::TempDir dir;
  clm_test::ManualClock clock;
  clm::SnapshotStoreConfig c = rekey_config(dir.file("store"), lex.a, clock);
  clm::RekeyReport report;
  // A missing directory, and one with no store: not_found, nothing created.
  clm::Status s = clm::SnapshotStore::rekey(c, false, report);
  INFO(s.message());
  CHECK(s.code() == clm::StatusCode::not_found);
  CHECK_FALSE(std::filesystem::exists(c.path));
  std::filesystem::create_directories(c.path);
  Lexicons::write(c.path + "/notes.txt", "not a store");
  for (const bool adopt : {false, true}) {
    s = clm::SnapshotStore::rekey(c, adopt, report);
    CHECK(s.code() == clm::StatusCode::not_found);
    CHECK(s.message().find("no snapshot store") != std::string::npos);
  }
  CHECK(files_of(c.path).size() == 1);
  // A shard-00.db that is some other program's database: refused by open and rekey, left alone.
  exec_sql(shard_db(c.path, 0), "CREATE TABLE mine (x INTEGER); INSERT INTO mine VALUES (7);");
  const auto before = files_of(c.path);
  std::unique_ptr<clm::SnapshotStore> store;
  s = clm::SnapshotStore::open(c, store);
  CHECK(s.code() == clm::StatusCode::failed_precondition);
  CHECK(s.message().find("not a snapshot store") != std::string::npos);
  s = clm::SnapshotStore::rekey(c, false, report);
  CHECK(s.code() == clm::StatusCode::failed_precondition);
  auto after = files_of(c.path);
  after.erase("LOCK");
  CHECK(after == before);
  // A file that is no database at all.
  std::filesystem::remove(shard_db(c.path, 0));
  Lexicons::write(shard_db(c.path, 0), std::string(4096, 'x'));
  CHECK(clm::SnapshotStore::rekey(c, false, report).code() == clm::StatusCode::io_error);
  CHECK(clm::SnapshotStore::open(c, store).code() == clm::StatusCode::io_error);
  // ":memory:", a path that is a file.
  clm::SnapshotStoreConfig memory = c;
  memory.path = ":memory:";
  CHECK(clm::SnapshotStore::rekey(memory, false, report).code() == clm::StatusCode::invalid_argument);
  clm::SnapshotStoreConfig file = c;
  file.path = c.path + "/notes.txt";
  CHECK(clm::SnapshotStore::rekey(file, false, report).code() == clm::StatusCode::not_found);

  // A real store: another shape, or open elsewhere, is refused.
  clm::SnapshotStoreConfig real = rekey_config(dir.file("real"), lex.a, clock);
  std::mt19937 rng(7);
  fill_rekey_store(real, clock, rng, 2);
  clm::SnapshotStoreConfig shape = real;
  shape.num_shards = 8;
  CHECK(clm::SnapshotStore::rekey(shape, false, report).code() == clm::StatusCode::failed_precondition);
  shape = real;
  shape.snapshot_dim = kDim * 2;
  CHECK(clm::SnapshotStore::rekey(shape, true, report).code() == clm::StatusCode::failed_precondition);
  {
    auto open = open_store(real);
    s = clm::SnapshotStore::rekey(real, false, report);
    CHECK(s.code() == clm::StatusCode::failed_precondition);
    CHECK(s.message().find("already open") != std::string::npos);
  }
  clm::SnapshotStoreConfig bad_lexicons = real;
  bad_lexicons.keyer.lexicon_dir = dir.file("no-such-lexicons");
  CHECK_FALSE(clm::SnapshotStore::rekey(bad_lexicons, false, report).ok());
  REQUIRE(clm::SnapshotStore::rekey(real, false, report).ok());  // under its own rules: nothing to do
  CHECK(report.changed == 0);
  CHECK(report.dropped == 0);
}

TEST_CASE("usage: last_used is the time of the row's latest lookup, not of the write of the counts", "[store][evict]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm_test::TempDir dir("usage");
  clm_test::ManualClock clock;
  clm::SnapshotStoreConfig c = memory_config(1);
  c.path = dir.str();
  c.clock_ms = clock.fn();
  auto store = open_store(c);
  const clm::SuffixKey once = host_key("used-once"), often = host_key("used-often"), late = host_key("used-late");
  std::vector<float> out;
  for (const auto* k : {&once, &often, &late}) record(*store, "t", *k, random_unit(rng, kDim));
  REQUIRE(store->flush().ok());
  CHECK(lookup(*store, "t", once, {}, out).level == SnapshotLevel::exact);  // day 0
  for (int i = 0; i < 5; ++i) CHECK(lookup(*store, "t", often, {}, out).level == SnapshotLevel::exact);
  clock.advance_ms(20LL * 86'400'000);
  CHECK(lookup(*store, "t", late, {}, out).level == SnapshotLevel::exact);  // day 20
  clock.advance_ms(9LL * 86'400'000);                                       // day 29: the counts are written now
  REQUIRE(store->flush().ok());
  const auto last_used = [&](const clm::SuffixKey& key) {  // as written: nothing is pending after flush()
    std::vector<clm::SnapshotVersionInfo> versions;
    REQUIRE(store->list_versions("t", key, versions).ok());
    REQUIRE(versions.size() == 1);
    return versions[0].last_used_s;
  };
  const std::int64_t day0 = 1'790'000'000;  // ManualClock's start, in seconds
  CHECK(last_used(once) == day0);
  CHECK(last_used(late) == day0 + 20 * 86'400);
  clock.advance_ms(2LL * 86'400'000);  // day 31: used-once was last used 31 days ago, used-late 11
  clm::EvictionReport report;
  REQUIRE(store->evict(report).ok());
  CHECK(report.deleted == 1);
  CHECK(lookup(*store, "t", once, {}, out).level == SnapshotLevel::miss);
  CHECK(lookup(*store, "t", often, {}, out).level == SnapshotLevel::exact);  // used 5 times: kept
  CHECK(lookup(*store, "t", late, {}, out).level == SnapshotLevel::exact);
}

TEST_CASE("level 1 after a reopen: the choices warmed at open serve what a key's versions say", "[store][level1]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm_test::TempDir dir("warm");
  clm::SnapshotStoreConfig c = memory_config(3);
  c.path = dir.str();
  c.version_cosine = 0.99f;  // random unit vectors are new versions; the same vector confirms
  c.stable_confirmations = 1 + static_cast<std::int32_t>(rng() % 2);
  // The model: each key's versions (vector, confirmations) and its pin.
  struct Version {
    std::vector<float> v;
    std::int32_t confirmations = 0;
  };
  struct Key {
    std::string tenant;
    clm::SuffixKey key;
    std::vector<Version> versions;  // version i + 1
    std::int32_t pinned = 0;
    std::int32_t served(std::int32_t stable) const {
      if (pinned) return pinned;
      for (std::size_t i = versions.size(); i-- > 0;)
        if (versions[i].confirmations >= stable) return static_cast<std::int32_t>(i + 1);
      return static_cast<std::int32_t>(versions.size());
    }
  };
  std::vector<Key> keys;
  for (int i = 0; i < 60; ++i) keys.push_back({i % 3 ? "t-a" : "t-b", host_key("warm-" + std::to_string(i)), {}, 0});
  auto add_version = [&](clm::SnapshotStore& store, Key& k) {
    Version version{random_unit(rng, kDim), 0};
    const clm::RecordResult first = record(store, k.tenant, k.key, version.v).result;
    REQUIRE((first == clm::RecordResult::admitted || first == clm::RecordResult::new_version));
    for (int n = static_cast<int>(rng() % 3); n > 0; --n) {  // 0-2 confirmations
      REQUIRE(record(store, k.tenant, k.key, version.v).result == clm::RecordResult::confirmed);
      ++version.confirmations;
    }
    k.versions.push_back(std::move(version));
  };
  auto check_all = [&](clm::SnapshotStore& store, const char* when) {
    std::vector<float> out;
    for (const Key& k : keys) {
      INFO(when << ": " << k.key.key << ", " << k.versions.size() << " versions, pinned " << k.pinned);
      const clm::SnapshotHit hit = lookup(store, k.tenant, k.key, {}, out);
      const std::int32_t want = k.served(c.stable_confirmations);
      REQUIRE(hit.level == SnapshotLevel::exact);
      CHECK(hit.version == want);
      CHECK(clm_test::max_abs_diff(out, k.versions[static_cast<std::size_t>(want - 1)].v) < kF16);
    }
  };
  {
    auto store = open_store(c);
    for (Key& k : keys)
      for (int n = 1 + static_cast<int>(rng() % 4); n > 0; --n) add_version(*store, k);
    for (std::size_t i = 0; i < keys.size(); i += 7) {
      keys[i].pinned = 1 + static_cast<std::int32_t>(rng() % keys[i].versions.size());
      REQUIRE(store->pin_version(keys[i].tenant, keys[i].key, keys[i].pinned).ok());
    }
    check_all(*store, "before the reopen");
  }
  auto store = open_store(c);
  check_all(*store, "first lookups after the reopen");                            // the warmed choices
  for (std::size_t i = 0; i < keys.size(); i += 2) add_version(*store, keys[i]);  // writes forget choices
  check_all(*store, "after new versions");
  check_all(*store, "again");  // the choices the lookups remembered
}

TEST_CASE("breaker (a): the lookup deadline covers the level-2 search", "[store][breaker][ann]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm::SnapshotStoreConfig c = memory_config(1);
  auto generous = open_store(c);
  c.lookup_timeout_us = 0;  // every deadline has passed by the time a search returns
  auto strict = open_store(c);
  const std::vector<float> v = random_unit(rng, kDim);
  for (auto* store : {generous.get(), strict.get()}) {
    for (int i = 0; i < 50; ++i) record(*store, "t", host_key(fmt::format("k{}", i), "g"), random_unit(rng, kDim));
    record(*store, "t", host_key("near", "g"), v);
  }
  std::vector<float> out;
  const clm::SuffixKey probe = host_key("probe", "g");
  CHECK(lookup(*generous, "t", probe, v, out).level == SnapshotLevel::ann);
  const std::uint64_t busy_before = strict->metrics().busy_misses;
  CHECK(lookup(*strict, "t", probe, v, out).level == SnapshotLevel::miss);
  CHECK(strict->metrics().busy_misses == busy_before + 1);
}
