// tests/store/store_test_support.hpp: what the snapshot store's tests share:
// random unit vectors, a clock the test moves by hand, a host key, opening a
// store and looking a key up with every status checked (and clm_test::TempDir,
// from tests/temp_dir.hpp).
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include "clm/store/snapshot_store.hpp"
#include "temp_dir.hpp"

namespace clm_test {

inline std::vector<float> random_unit(std::mt19937& rng, int dim) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(dim));
  double norm = 0;
  for (float& x : v) {
    x = n(rng);
    norm += static_cast<double>(x) * x;
  }
  for (float& x : v) x = static_cast<float>(x / std::sqrt(norm));
  return v;
}

// base + sigma * noise, renormalised (float64).
inline std::vector<float> noisy(const std::vector<float>& base, double sigma, std::mt19937& rng) {
  std::normal_distribution<double> n(0.0, sigma);
  std::vector<double> v(base.size());
  double norm = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    v[i] = base[i] + n(rng);
    norm += v[i] * v[i];
  }
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = static_cast<float>(v[i] / std::sqrt(norm));
  return out;
}

inline double cosine64(const std::vector<float>& a, const std::vector<float>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ab += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(static_cast<double>(a[i]) - b[i]));
  return d;
}

// A clock the test sets; starts at a fixed, realistic date.
struct ManualClock {
  std::shared_ptr<std::atomic<std::int64_t>> now = std::make_shared<std::atomic<std::int64_t>>(1'790'000'000'000);
  std::function<std::int64_t()> fn() const {
    auto n = now;
    return [n] { return n->load(); };
  }
  void advance_ms(std::int64_t ms) { *now += ms; }
};

inline clm::SuffixKey host_key(const std::string& key, const std::string& group = "g") {
  clm::SuffixKey k;
  const clm::Status s = clm::SuffixKeyer::from_host_key(key, group, k);
  if (!s.ok()) throw std::runtime_error(s.message());
  return k;
}

// The store of config `c`; the test stops (with open's message) if it does not open.
inline std::unique_ptr<clm::SnapshotStore> open_store(const clm::SnapshotStoreConfig& c) {
  std::unique_ptr<clm::SnapshotStore> store;
  const clm::Status s = clm::SnapshotStore::open(c, store);
  INFO(s.message());
  REQUIRE(s.ok());
  return store;
}

// One lookup, which must succeed (a miss is a success); `out` gets
// snapshot_dim values (zeros on a miss).
inline clm::SnapshotHit lookup(clm::SnapshotStore& store, std::string_view tenant, const clm::SuffixKey& key,
                               const std::vector<float>& query, std::vector<float>& out) {
  clm::SnapshotHit hit;
  out.assign(static_cast<std::size_t>(store.config().snapshot_dim), 0.0f);
  const clm::Status s = store.lookup(tenant, key, query, hit, out);
  INFO(s.message());
  REQUIRE(s.ok());
  return hit;
}

}  // namespace clm_test
