// What `clm_store plot` stands on, on fresh random data each run:
// fit_snapshot_plane (clm/store/snapshot_pca.hpp) against an independent
// float64 reference (power iteration with deflation on the covariance,
// computed naively), points on a known plane, and the degenerate cases; and
// SnapshotStore::key_vectors on a real store in a temporary directory: a key
// that holds two meanings (records from two clusters, which become
// alternating versions), its nearest other keys against a naive model, the
// key's own rows and other tenants left out, the statuses, and a read-only
// store that answers and writes nothing.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "clm/detail/half.hpp"
#include "clm/store/snapshot_pca.hpp"
#include "clm/store/snapshot_store.hpp"
#include "store/store_test_support.hpp"
#include "test_random.hpp"

using clm::StatusCode;
using clm_test::host_key;
using clm_test::random_unit;

namespace {

using Vec = std::vector<double>;

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// The covariance's top two eigenpairs by power iteration and deflation
// (eigenvalues of the scatter matrix divided by n - 1): the reference.
struct Reference {
  Vec mean;
  std::array<Vec, 2> axes;
  std::array<double, 2> variance{};
};

Reference power_reference(const std::vector<float>& rows, std::size_t dim, std::mt19937& rng) {
  const std::size_t n = rows.size() / dim;
  Reference ref;
  ref.mean.assign(dim, 0.0);
  for (std::size_t r = 0; r < n; ++r)
    for (std::size_t c = 0; c < dim; ++c) ref.mean[c] += rows[r * dim + c];
  for (double& m : ref.mean) m /= static_cast<double>(n);
  std::vector<Vec> cov(dim, Vec(dim, 0.0));
  for (std::size_t r = 0; r < n; ++r) {
    for (std::size_t i = 0; i < dim; ++i) {
      const double xi = rows[r * dim + i] - ref.mean[i];
      for (std::size_t j = 0; j < dim; ++j) cov[i][j] += xi * (rows[r * dim + j] - ref.mean[j]);
    }
  }
  for (auto& row : cov)
    for (double& v : row) v /= static_cast<double>(n - 1);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (int k = 0; k < 2; ++k) {
    Vec v(dim);
    for (double& x : v) x = normal(rng);
    double lambda = 0;
    for (int it = 0; it < 20000; ++it) {
      Vec w(dim, 0.0);
      for (std::size_t i = 0; i < dim; ++i) w[i] = dot(cov[i], v);
      if (k == 1) {  // deflated: nothing along the first axis
        const double along = dot(w, ref.axes[0]);
        for (std::size_t i = 0; i < dim; ++i) w[i] -= along * ref.axes[0][i];
      }
      const double norm = std::sqrt(dot(w, w));
      for (double& x : w) x /= norm;
      const double change = 1.0 - std::abs(dot(w, v));
      v = w;
      lambda = norm;
      if (change < 1e-16 && it > 50) break;
    }
    ref.axes[static_cast<std::size_t>(k)] = v;
    ref.variance[static_cast<std::size_t>(k)] = lambda;
  }
  return ref;
}

// `count` random orthonormal vectors of `dim` (Gram-Schmidt, float64).
std::vector<Vec> orthonormal(std::size_t count, std::size_t dim, std::mt19937& rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<Vec> out;
  while (out.size() < count) {
    Vec v(dim);
    for (double& x : v) x = normal(rng);
    for (int pass = 0; pass < 2; ++pass)
      for (const Vec& u : out) {
        const double d = dot(u, v);
        for (std::size_t i = 0; i < dim; ++i) v[i] -= d * u[i];
      }
    const double norm = std::sqrt(dot(v, v));
    if (norm < 1e-3) continue;
    for (double& x : v) x /= norm;
    out.push_back(v);
  }
  return out;
}

void check_orthonormal(const clm::SnapshotPlane& plane) {
  CHECK(dot(plane.axes[0], plane.axes[0]) == Approx(1.0).margin(1e-12));
  CHECK(dot(plane.axes[1], plane.axes[1]) == Approx(1.0).margin(1e-12));
  CHECK(std::abs(dot(plane.axes[0], plane.axes[1])) < 1e-12);
}

}  // namespace

TEST_CASE("snapshot plane: the axes and variances of power iteration, on both sides of n = dim", "[store][plot]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  // n <= dim (the Gram matrix) and n > dim (the covariance).
  for (const auto& [n, dim] :
       {std::pair<std::size_t, std::size_t>{12, 40}, {70, 9}, {2 + rng() % 30, 3 + rng() % 30}}) {
    INFO("n " << n << ", dim " << dim);
    // Spread 3, 1.5, then 0.3 and less: a clear gap below each wanted axis.
    const std::vector<Vec> basis = orthonormal(std::min<std::size_t>(dim, 5), dim, rng);
    const double spread[] = {3.0, 1.5, 0.3, 0.2, 0.1};
    std::normal_distribution<double> normal(0.0, 1.0);
    Vec centre(dim);
    for (double& x : centre) x = normal(rng);
    std::vector<float> rows;
    for (std::size_t r = 0; r < n; ++r) {
      Vec p = centre;
      for (std::size_t b = 0; b < basis.size(); ++b) {
        const double c = spread[b] * normal(rng);
        for (std::size_t i = 0; i < dim; ++i) p[i] += c * basis[b][i];
      }
      for (double x : p) rows.push_back(static_cast<float>(x));
    }
    clm::SnapshotPlane plane;
    const clm::Status s = clm::fit_snapshot_plane(rows, static_cast<std::int32_t>(dim), plane);
    INFO(s.message());
    REQUIRE(s.ok());
    const Reference ref = power_reference(rows, dim, rng);
    REQUIRE(plane.rows == static_cast<std::int64_t>(n));
    for (std::size_t i = 0; i < dim; ++i) CHECK(plane.mean[i] == Approx(ref.mean[i]).margin(1e-9));
    check_orthonormal(plane);
    double total = 0;
    for (std::size_t i = 0; i < dim; ++i) {
      double v = 0;
      for (std::size_t r = 0; r < n; ++r) v += std::pow(rows[r * dim + i] - ref.mean[i], 2);
      total += v / static_cast<double>(n - 1);
    }
    CHECK(plane.total_variance == Approx(total).epsilon(1e-10));
    const std::size_t wanted = std::min<std::size_t>(2, n - 1);  // n = 2 spans one direction
    for (std::size_t a = 0; a < wanted; ++a) {
      INFO("axis " << a);
      CHECK(std::abs(dot(plane.axes[a], ref.axes[a])) == Approx(1.0).margin(1e-7));  // up to sign
      CHECK(plane.variance[a] == Approx(ref.variance[a]).epsilon(1e-8));
      CHECK(plane.share[a] == Approx(ref.variance[a] / total).epsilon(1e-8));
      // Its sign: the largest-magnitude entry is positive.
      const auto largest = std::max_element(plane.axes[a].begin(), plane.axes[a].end(),
                                            [](double x, double y) { return std::abs(x) < std::abs(y); });
      CHECK(*largest > 0);
    }
    CHECK(plane.variance[0] >= plane.variance[1]);
    // Projections: the rows' coordinates about the mean, and any other vector
    // on the same axes; the rows' x values have the axis's variance.
    double sum_x = 0, sum_xx = 0;
    for (std::size_t r = 0; r < n; ++r) {
      const auto [x, y] = plane.project(std::span<const float>(rows).subspan(r * dim, dim));
      Vec centred(dim);
      for (std::size_t i = 0; i < dim; ++i) centred[i] = rows[r * dim + i] - ref.mean[i];
      CHECK(x == Approx(dot(centred, plane.axes[0])).margin(1e-9));
      CHECK(y == Approx(dot(centred, plane.axes[1])).margin(1e-9));
      sum_x += x;
      sum_xx += x * x;
    }
    CHECK(sum_x == Approx(0.0).margin(1e-7 * static_cast<double>(n)));
    CHECK(sum_xx / static_cast<double>(n - 1) == Approx(plane.variance[0]).epsilon(1e-9));
    std::vector<float> other(dim);
    for (float& x : other) x = static_cast<float>(normal(rng));
    const auto [ox, oy] = plane.project(other);
    Vec centred(dim);
    for (std::size_t i = 0; i < dim; ++i) centred[i] = other[i] - ref.mean[i];
    CHECK(ox == Approx(dot(centred, plane.axes[0])).margin(1e-9));
    CHECK(oy == Approx(dot(centred, plane.axes[1])).margin(1e-9));
  }
}

TEST_CASE("snapshot plane: points on a known plane give that plane and its variances", "[store][plot]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const std::size_t dim = 16 + rng() % 48, n = 20 + rng() % 100;
  const std::vector<Vec> uv = orthonormal(2, dim, rng);
  std::normal_distribution<double> normal(0.0, 1.0);
  // Coefficients made exactly uncorrelated and of known sample variances
  // (centred, then b orthogonalised against a): then u and v are the axes.
  Vec a(n), b(n);
  for (double& x : a) x = normal(rng);
  for (double& x : b) x = normal(rng);
  auto centre = [&](Vec& v) {
    double m = 0;
    for (double x : v) m += x;
    for (double& x : v) x -= m / static_cast<double>(n);
  };
  centre(a);
  centre(b);
  const double ab = dot(a, b) / dot(a, a);
  for (std::size_t i = 0; i < n; ++i) b[i] -= ab * a[i];
  const double var_a = 4.0, var_b = 0.25;  // the plane's two variances
  const double scale_a = std::sqrt(var_a * static_cast<double>(n - 1) / dot(a, a));
  const double scale_b = std::sqrt(var_b * static_cast<double>(n - 1) / dot(b, b));
  std::vector<float> rows;
  Vec offset(dim);
  for (double& x : offset) x = normal(rng);
  for (std::size_t r = 0; r < n; ++r) {
    for (std::size_t i = 0; i < dim; ++i) {
      rows.push_back(static_cast<float>(offset[i] + scale_a * a[r] * uv[0][i] + scale_b * b[r] * uv[1][i]));
    }
  }
  clm::SnapshotPlane plane;
  REQUIRE(clm::fit_snapshot_plane(rows, static_cast<std::int32_t>(dim), plane).ok());
  // float32 rows: the plane is known to the rounding of its points.
  CHECK(std::abs(dot(plane.axes[0], uv[0])) == Approx(1.0).margin(1e-5));
  CHECK(std::abs(dot(plane.axes[1], uv[1])) == Approx(1.0).margin(1e-5));
  CHECK(plane.variance[0] == Approx(var_a).epsilon(1e-4));
  CHECK(plane.variance[1] == Approx(var_b).epsilon(1e-4));
  CHECK(plane.share[0] + plane.share[1] == Approx(1.0).epsilon(1e-5));  // nothing off the plane
}

TEST_CASE("snapshot plane: identical rows, two rows, and what has no shape", "[store][plot]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const int dim = 8;
  const std::vector<float> v = random_unit(rng, dim), w = random_unit(rng, dim);

  SECTION("every row the same vector: a plane all the same, with variance 0") {
    std::vector<float> rows;
    for (int r = 0; r < 5; ++r) rows.insert(rows.end(), v.begin(), v.end());
    clm::SnapshotPlane plane;
    REQUIRE(clm::fit_snapshot_plane(rows, dim, plane).ok());
    check_orthonormal(plane);
    CHECK(plane.total_variance == 0.0);
    CHECK(plane.variance == std::array<double, 2>{0.0, 0.0});
    CHECK(plane.share == std::array<double, 2>{0.0, 0.0});
    const auto [x, y] = plane.project(v);
    CHECK(std::abs(x) < 1e-12);
    CHECK(std::abs(y) < 1e-12);
    const auto [ox, oy] = plane.project(w);  // another key's vector still lands somewhere
    CHECK(std::hypot(ox, oy) > 0);
  }
  SECTION("two rows: the first axis through both, the second with variance 0") {
    std::vector<float> rows(v);
    rows.insert(rows.end(), w.begin(), w.end());
    clm::SnapshotPlane plane;
    REQUIRE(clm::fit_snapshot_plane(rows, dim, plane).ok());
    check_orthonormal(plane);
    Vec diff(dim);
    double sq = 0;
    for (int i = 0; i < dim; ++i) {
      diff[static_cast<std::size_t>(i)] =
          static_cast<double>(v[static_cast<std::size_t>(i)]) - w[static_cast<std::size_t>(i)];
      sq += diff[static_cast<std::size_t>(i)] * diff[static_cast<std::size_t>(i)];
    }
    CHECK(std::abs(dot(plane.axes[0], diff)) / std::sqrt(sq) == Approx(1.0).margin(1e-9));
    CHECK(plane.variance[0] == Approx(sq / 2).epsilon(1e-9));  // (|d|/2)^2 * 2 / (2 - 1)
    CHECK(plane.variance[1] < 1e-20);
    CHECK(plane.share[0] == Approx(1.0).epsilon(1e-9));
  }
  SECTION("refused: one row, no row, dim 1, a ragged size, a value not finite") {
    clm::SnapshotPlane plane;
    plane.rows = 77;  // untouched on error
    clm::Status s = clm::fit_snapshot_plane(v, dim, plane);
    CHECK(s.code() == StatusCode::failed_precondition);
    CHECK_THAT(s.message(), Catch::Contains("a key with one row has no shape to plot"));
    CHECK(clm::fit_snapshot_plane({}, dim, plane).code() == StatusCode::failed_precondition);
    const std::vector<float> line = {1.0f, 2.0f, 3.0f};
    CHECK(clm::fit_snapshot_plane(line, 1, plane).code() == StatusCode::failed_precondition);
    std::vector<float> rows(v);
    rows.insert(rows.end(), w.begin(), w.end());
    CHECK(clm::fit_snapshot_plane(std::span<const float>(rows).first(rows.size() - 1), dim, plane).code() ==
          StatusCode::invalid_argument);
    rows[3] = std::nanf("");
    CHECK(clm::fit_snapshot_plane(rows, dim, plane).code() == StatusCode::invalid_argument);
    CHECK(plane.rows == 77);
  }
}

namespace {

constexpr int kDim = 16;

clm::SnapshotStoreConfig plot_config(const std::string& path, const clm_test::ManualClock& clock) {
  clm::SnapshotStoreConfig c;
  c.path = path;
  c.num_shards = 4;
  c.snapshot_dim = kDim;
  c.min_usage_threshold = 1;
  c.version_cosine = 0.9f;  // a record of the other cluster starts a version; one of the same confirms it
  c.stable_confirmations = 1;
  c.max_versions_per_key = 64;  // every switch of meaning kept: the model drops none
  c.rebuild_in_background = false;
  c.lookup_timeout_us = 2'000'000;
  c.clock_ms = clock.fn();
  return c;
}

struct ModelRow {
  std::int32_t version = 0;
  int cluster = -1;  // -1: not one of the two meanings
  std::vector<float> vector;
};

// A record as the store keeps it: unit length, rounded through f16.
std::vector<float> unit_f16(const std::vector<float>& v) {
  double norm = 0;
  for (float x : v) norm += static_cast<double>(x) * x;
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    out[i] = clm::detail::f16_to_f32(clm::detail::f32_to_f16(static_cast<float>(v[i] / std::sqrt(norm))));
  }
  return out;
}

std::map<std::string, std::vector<char>> store_files(const std::filesystem::path& dir) {
  std::map<std::string, std::vector<char>> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.ends_with("-wal") || name.ends_with("-shm")) continue;  // a reader's WAL index may move
    std::ifstream in(e.path(), std::ios::binary);
    out[name] = std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return out;
}

}  // namespace

TEST_CASE("key_vectors: a key of two meanings, its nearest other keys, the statuses, read-only", "[store][plot]") {
  const std::uint32_t seed = clm_test::fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  clm_test::TempDir dir("plot");
  clm_test::ManualClock clock;
  const clm::SnapshotStoreConfig config = plot_config(dir.str(), clock);
  // Two meanings far apart (refund, return).
  std::vector<float> centre[2];
  do {
    centre[0] = random_unit(rng, kDim);
    centre[1] = random_unit(rng, kDim);
  } while (std::abs(clm_test::cosine64(centre[0], centre[1])) > 0.3);
  const clm::SuffixKey refund = host_key("REFUND", "after-sale");
  std::map<std::string, std::vector<ModelRow>> model;  // tenant-a's rows by key, as recorded
  std::vector<ModelRow> other_tenant;
  {
    auto store = clm_test::open_store(config);
    auto record = [&](const std::string& tenant, const clm::SuffixKey& key, const std::vector<float>& v, int cluster) {
      clm::RecordOutcome o;
      REQUIRE(store->record(tenant, key, v, o).ok());
      if (o.result == clm::RecordResult::confirmed) return;
      REQUIRE((o.result == clm::RecordResult::admitted || o.result == clm::RecordResult::new_version));
      (tenant == "a" ? model[key.key] : other_tenant).push_back({o.version, cluster, unit_f16(v)});
    };
    // The key's records switch meaning now and then: each switch is a new version.
    int cluster = 0;
    for (int i = 0; i < 40; ++i) {
      if (i > 0 && rng() % 4 == 0) cluster = 1 - cluster;
      record("a", refund, clm_test::noisy(centre[static_cast<std::size_t>(cluster)], 0.03, rng), cluster);
    }
    if (model["REFUND"].size() < 3) {  // rng kept one meaning long: make sure of two
      record("a", refund, clm_test::noisy(centre[1 - cluster], 0.03, rng), 1 - cluster);
      record("a", refund, clm_test::noisy(centre[static_cast<std::size_t>(cluster)], 0.03, rng), cluster);
    }
    // Neighbours in other groups (other shards, most of them): keys near
    // either meaning, and keys anywhere.
    for (int k = 0; k < 12; ++k) {
      const clm::SuffixKey key = host_key(fmt::format("K{}", k), fmt::format("g{}", k));
      const int versions = 1 + static_cast<int>(rng() % 3);
      for (int v = 0; v < versions; ++v) {
        const std::vector<float> vec =
            k < 4 ? clm_test::noisy(centre[static_cast<std::size_t>(k % 2)], 0.1 + 0.1 * k, rng)
                  : random_unit(rng, kDim);
        record("a", key, vec, -1);
      }
    }
    // A key of one row, and another tenant's copy of the key's first meaning.
    record("a", host_key("ONE-ROW", "g1"), random_unit(rng, kDim), -1);
    record("b", host_key("THEIRS", "after-sale"), centre[0], -1);
    REQUIRE(store->flush().ok());
  }
  const std::vector<ModelRow>& mine = model["REFUND"];
  REQUIRE(mine.size() >= 3);

  // The naive model of the nearest keys: best cosine of any of their rows to any of the key's.
  std::vector<std::pair<double, std::string>> nearest;
  for (const auto& [name, rows] : model) {
    if (name == "REFUND") continue;
    double best = -2;
    for (const auto& r : rows)
      for (const auto& m : mine) best = std::max(best, clm_test::cosine64(r.vector, m.vector));
    nearest.emplace_back(best, name);
  }
  std::sort(nearest.rbegin(), nearest.rend());
  const std::map<std::string, double> best_of = [&] {
    std::map<std::string, double> m;
    for (const auto& [best, name] : nearest) m[name] = best;
    return m;
  }();

  auto check_key_vectors = [&](clm::SnapshotStore& store) {
    clm::KeyVectors kv;
    const clm::Status s = store.key_vectors("a", refund, 5, kv);
    INFO(s.message());
    REQUIRE(s.ok());
    CHECK(kv.key == "REFUND");
    CHECK(kv.fingerprint == refund.fingerprint);
    CHECK(kv.shard == store.shard_of("a", refund));
    CHECK(kv.unreadable == 0);
    CHECK(kv.neighbours_complete);
    // Every row, with its version and its vector to f16 precision.
    REQUIRE(kv.rows.size() == mine.size());
    for (std::size_t i = 0; i < mine.size(); ++i) {
      INFO("row " << i);
      CHECK(kv.rows[i].version == mine[i].version);
      CHECK(clm_test::max_abs_diff(kv.rows[i].vector, mine[i].vector) < 1e-3);
      CHECK(kv.rows[i].created_at_s == *clock.now / 1000);
      CHECK(kv.rows[i].id > 0);
    }
    // The nearest other keys, best first, never the key itself: each with
    // the model's best cosine, and none left out nearer than the last one
    // (the index ranks by the inner product of f16 vectors, whose lengths
    // are 1 to about 1e-4, so a key within that of the last may swap in).
    REQUIRE(kv.neighbours.size() == 5);
    std::set<std::string> chosen;
    for (std::size_t i = 0; i < kv.neighbours.size(); ++i) {
      const auto& n = kv.neighbours[i];
      INFO("neighbour " << i << " " << n.key);
      CHECK(n.key != "REFUND");
      REQUIRE(best_of.count(n.key) == 1);
      CHECK(n.similarity == Approx(best_of.at(n.key)).margin(1e-6));
      if (i > 0) CHECK(n.similarity <= kv.neighbours[i - 1].similarity);
      chosen.insert(n.key);
      CHECK(n.fingerprint == clm::key_fingerprint(n.key));
      const std::vector<ModelRow>& rows = model[n.key];
      REQUIRE(n.rows.size() == rows.size());
      for (std::size_t r = 0; r < rows.size(); ++r) {
        CHECK(n.rows[r].version == rows[r].version);
        CHECK(clm_test::max_abs_diff(n.rows[r].vector, rows[r].vector) < 1e-3);
      }
    }
    for (const auto& [best, name] : nearest) {
      if (chosen.count(name) == 0) CHECK(best <= kv.neighbours.back().similarity + 1e-3);
    }
    // Two meanings: two clusters on the first axis, most of the variance along it.
    std::vector<float> flat;
    for (const auto& r : kv.rows) flat.insert(flat.end(), r.vector.begin(), r.vector.end());
    clm::SnapshotPlane plane;
    REQUIRE(clm::fit_snapshot_plane(flat, kDim, plane).ok());
    CHECK(plane.share[0] > 0.8);
    std::set<bool> side_of[2];
    for (std::size_t i = 0; i < mine.size(); ++i)
      side_of[static_cast<std::size_t>(mine[i].cluster)].insert(plane.project(kv.rows[i].vector).first > 0);
    CHECK(side_of[0].size() == 1);
    CHECK(side_of[1].size() == 1);
    CHECK(side_of[0] != side_of[1]);
  };

  {
    auto store = clm_test::open_store(config);
    check_key_vectors(*store);

    clm::KeyVectors kv;
    clm::Status s = store->key_vectors("a", host_key("NOBODY", "after-sale"), 5, kv);
    CHECK(s.code() == StatusCode::not_found);
    CHECK_THAT(s.message(), Catch::Contains("NOBODY"));
    CHECK(store->key_vectors("c", refund, 5, kv).code() == StatusCode::not_found);  // another tenant's view
    CHECK(store->key_vectors("a", refund, 65, kv).code() == StatusCode::invalid_argument);
    CHECK(store->key_vectors("a", refund, -1, kv).code() == StatusCode::invalid_argument);
    REQUIRE(store->key_vectors("a", refund, 0, kv).ok());
    CHECK(kv.neighbours.empty());
    CHECK(kv.rows.size() == mine.size());

    // Tenant b sees its own key only: tenant a's rows are never its neighbours.
    REQUIRE(store->key_vectors("b", host_key("THEIRS", "after-sale"), 5, kv).ok());
    CHECK(kv.rows.size() == 1);
    CHECK(kv.neighbours.empty());

    // One row: listed, and the plane refuses it.
    REQUIRE(store->key_vectors("a", host_key("ONE-ROW", "g1"), 3, kv).ok());
    REQUIRE(kv.rows.size() == 1);
    clm::SnapshotPlane plane;
    s = clm::fit_snapshot_plane(kv.rows[0].vector, kDim, plane);
    CHECK(s.code() == StatusCode::failed_precondition);
    CHECK_THAT(s.message(), Catch::Contains("one row"));

    // A blacklisted key is still listed, for the administrator.
    REQUIRE(store->blacklist_key("a", refund, "two meanings", *clock.now + 3'600'000).ok());
    REQUIRE(store->key_vectors("a", refund, 5, kv).ok());
    CHECK(kv.blacklisted);
    CHECK(kv.rows.size() == mine.size());
    REQUIRE(store->unblacklist_key("a", refund).ok());
  }

  // Read-only, beside nothing: the same answers, and not a byte written.
  const auto before = store_files(dir.path());
  {
    clm::SnapshotStoreConfig reader = config;
    reader.read_only = true;
    auto store = clm_test::open_store(reader);
    check_key_vectors(*store);
  }
  CHECK(store_files(dir.path()) == before);
}
