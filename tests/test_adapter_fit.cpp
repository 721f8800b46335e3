// Tests of the adapter's ridge fit (include/clm/model/adapter_fit.hpp): recovery of a
// known map, agreement with a float64 normal-equation reference written here
// (the bias as an extra unpenalised column, plain Gaussian elimination),
// singular systems and bad inputs. Fresh random data (seed printed on failure).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "clm/detail/half.hpp"
#include "clm/model/adapter_fit.hpp"

namespace {

std::uint32_t fresh_seed() { return std::random_device{}(); }

struct Pairs {
  int dim = 0, hidden = 0;
  std::vector<float> snapshots;  // [n][dim]
  std::vector<float> deltas;     // [n][hidden]
  std::int64_t rows() const { return static_cast<std::int64_t>(snapshots.size()) / dim; }
  clm::ConstActivationView s() const { return clm::ConstActivationView::f32(snapshots, rows(), dim); }
  clm::ConstActivationView d() const { return clm::ConstActivationView::f32(deltas, rows(), hidden); }
};

struct TrueMap {
  std::vector<double> w;  // [hidden][dim]
  std::vector<double> b;  // [hidden]
};

TrueMap random_map(int dim, int hidden, std::mt19937& rng) {
  std::normal_distribution<double> n(0.0, 1.0);
  TrueMap m;
  m.w.resize(static_cast<std::size_t>(dim * hidden));
  m.b.resize(static_cast<std::size_t>(hidden));
  for (double& v : m.w) v = n(rng);
  for (double& v : m.b) v = n(rng);
  return m;
}

// delta = scale (W s + b) + noise; snapshots off-centre, so the bias matters.
Pairs sample(const TrueMap& m, int dim, int hidden, std::size_t rows, float scale, double noise, std::mt19937& rng) {
  std::normal_distribution<double> n(0.0, 1.0);
  Pairs p;
  p.dim = dim;
  p.hidden = hidden;
  for (std::size_t r = 0; r < rows; ++r) {
    std::vector<double> s(static_cast<std::size_t>(dim));
    for (std::size_t k = 0; k < s.size(); ++k) {
      s[k] = 2.0 + 1.5 * n(rng);
      p.snapshots.push_back(static_cast<float>(s[k]));
    }
    for (int o = 0; o < hidden; ++o) {
      double y = m.b[static_cast<std::size_t>(o)];
      for (int k = 0; k < dim; ++k) y += m.w[static_cast<std::size_t>(o * dim + k)] * p.snapshots[r * dim + k];
      p.deltas.push_back(static_cast<float>(scale * y + noise * n(rng)));
    }
  }
  return p;
}

// min |y/scale - W s - b|^2 + lambda |W|^2 via the augmented normal equations
// [S 1]^T [S 1] + diag(lambda.., 0), by Gaussian elimination with pivoting.
TrueMap reference_fit(const Pairs& p, double lambda, double scale) {
  const std::size_t d = static_cast<std::size_t>(p.dim), h = static_cast<std::size_t>(p.hidden), a = d + 1;
  const auto n = static_cast<std::size_t>(p.rows());
  std::vector<std::vector<double>> m(a, std::vector<double>(a + h, 0.0));  // [A | rhs]
  for (std::size_t r = 0; r < n; ++r) {
    auto s = [&](std::size_t k) { return k < d ? static_cast<double>(p.snapshots[r * d + k]) : 1.0; };
    for (std::size_t i = 0; i < a; ++i) {
      for (std::size_t j = 0; j < a; ++j) m[i][j] += s(i) * s(j);
      for (std::size_t o = 0; o < h; ++o) m[i][a + o] += s(i) * static_cast<double>(p.deltas[r * h + o]) / scale;
    }
  }
  for (std::size_t i = 0; i < d; ++i) m[i][i] += lambda;
  for (std::size_t col = 0; col < a; ++col) {
    std::size_t pivot = col;
    for (std::size_t r = col + 1; r < a; ++r) {
      if (std::abs(m[r][col]) > std::abs(m[pivot][col])) pivot = r;
    }
    std::swap(m[col], m[pivot]);
    for (std::size_t r = 0; r < a; ++r) {
      if (r == col) continue;
      const double f = m[r][col] / m[col][col];
      for (std::size_t c = col; c < a + h; ++c) m[r][c] -= f * m[col][c];
    }
  }
  TrueMap out;
  out.w.resize(h * d);
  out.b.resize(h);
  for (std::size_t o = 0; o < h; ++o) {
    for (std::size_t k = 0; k < d; ++k) out.w[o * d + k] = m[k][a + o] / m[k][k];
    out.b[o] = m[d][a + o] / m[d][d];
  }
  return out;
}

clm::SnapshotAdapterWeights fit(const Pairs& p, double lambda, float scale, clm::AdapterFitReport* report = nullptr) {
  clm::SnapshotAdapterWeights w;
  const clm::Status s = clm::fit_snapshot_adapter(p.s(), p.d(), lambda, scale, w, report);
  INFO(s.message());
  REQUIRE(s.ok());
  REQUIRE(w.snapshot_dim == p.dim);
  REQUIRE(w.hidden == p.hidden);
  REQUIRE(w.weight.size() == static_cast<std::size_t>(p.dim * p.hidden));
  REQUIRE(w.bias.size() == static_cast<std::size_t>(p.hidden));
  return w;
}

// |a - b|_F / |b|_F over weight and bias separately; returns the larger.
double rel_error(const clm::SnapshotAdapterWeights& got, const TrueMap& want) {
  auto rel = [](const std::vector<float>& a, const std::vector<double>& b) {
    double num = 0.0, den = 0.0;
    for (std::size_t i = 0; i < b.size(); ++i) {
      num += (a[i] - b[i]) * (a[i] - b[i]);
      den += b[i] * b[i];
    }
    return std::sqrt(num / den);
  };
  return std::max(rel(got.weight, want.w), rel(got.bias, want.b));
}

void check_close(const clm::SnapshotAdapterWeights& got, const TrueMap& want, double tol) {
  for (std::size_t i = 0; i < want.w.size(); ++i) {
    INFO("weight " << i << ": " << got.weight[i] << " vs " << want.w[i]);
    REQUIRE(std::abs(got.weight[i] - want.w[i]) <= tol * (1.0 + std::abs(want.w[i])));
  }
  for (std::size_t o = 0; o < want.b.size(); ++o) {
    INFO("bias " << o << ": " << got.bias[o] << " vs " << want.b[o]);
    REQUIRE(std::abs(got.bias[o] - want.b[o]) <= tol * (1.0 + std::abs(want.b[o])));
  }
}

}  // namespace

TEST_CASE("adapter fit recovers a known map, more closely with more pairs") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const int dim = 16, hidden = 24;
  const float scale = clm::kDefaultResidualScale;
  const TrueMap truth = random_map(dim, hidden, rng);
  double previous = std::numeric_limits<double>::infinity();
  for (std::size_t rows : {std::size_t{200}, std::size_t{3200}}) {
    const Pairs p = sample(truth, dim, hidden, rows, scale, 0.02, rng);
    clm::AdapterFitReport report;
    const clm::SnapshotAdapterWeights w = fit(p, 1e-6, scale, &report);
    const double err = rel_error(w, truth);
    INFO(rows << " pairs: relative error " << err << ", R^2 " << report.r2);
    // Over 300 seeds at 200 pairs: median 0.026, largest 0.048 (CI once met
    // 0.052 under 0.05). A fit that learnt nothing is near 1.
    CHECK(err < 0.08);
    // ~1/sqrt(n): 16x the pairs, ~1/4 the error (median ratio 0.24, largest
    // 0.45 over 200 seeds); a fit that stops improving stays near 1.
    CHECK(err < 0.6 * previous);
    previous = err;
    CHECK(report.rows == static_cast<std::int64_t>(rows));
    CHECK(report.r2 > 0.99);
    CHECK(report.r2 <= 1.0);

    // R^2 as the report defines it, from the returned weights.
    double rss = 0.0, tss = 0.0;
    std::vector<double> mean(static_cast<std::size_t>(hidden), 0.0);
    for (std::size_t r = 0; r < rows; ++r) {
      for (int o = 0; o < hidden; ++o) mean[static_cast<std::size_t>(o)] += p.deltas[r * hidden + o] / double(rows);
    }
    for (std::size_t r = 0; r < rows; ++r) {
      for (int o = 0; o < hidden; ++o) {
        double y = w.bias[static_cast<std::size_t>(o)];
        for (int k = 0; k < dim; ++k)
          y += double{w.weight[static_cast<std::size_t>(o * dim + k)]} * p.snapshots[r * dim + k];
        const double delta = p.deltas[r * hidden + o];
        rss += (delta - scale * y) * (delta - scale * y);
        tss += (delta - mean[static_cast<std::size_t>(o)]) * (delta - mean[static_cast<std::size_t>(o)]);
      }
    }
    CHECK(report.tss == Approx(tss).epsilon(1e-9));
    CHECK(report.rss == Approx(rss).epsilon(1e-3));  // the weights were rounded to f32
    CHECK(report.r2 == Approx(1.0 - rss / tss).epsilon(1e-6));
  }
}

TEST_CASE("adapter fit equals a float64 normal-equation reference") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const int dim = 12, hidden = 20;
  const TrueMap truth = random_map(dim, hidden, rng);
  const float scale = 0.5f;
  const Pairs p = sample(truth, dim, hidden, 150, scale, 0.3, rng);

  SECTION("lambda > 0 (and it shrinks the weights)") {
    const double lambda = 400.0;
    const clm::SnapshotAdapterWeights w = fit(p, lambda, scale);
    check_close(w, reference_fit(p, lambda, scale), 2e-5);
    double shrunk = 0.0, plain = 0.0;
    const TrueMap ols = reference_fit(p, 0.0, scale);
    for (std::size_t i = 0; i < ols.w.size(); ++i) {
      shrunk += double{w.weight[i]} * w.weight[i];
      plain += ols.w[i] * ols.w[i];
    }
    CHECK(shrunk < 0.9 * plain);
  }
  SECTION("lambda = 0 with full-rank data is ordinary least squares") {
    check_close(fit(p, 0.0, scale), reference_fit(p, 0.0, scale), 2e-5);
  }
  SECTION("lambda = 0 on noise-free data recovers the map exactly") {
    const Pairs exact = sample(truth, dim, hidden, 40, scale, 0.0, rng);
    clm::AdapterFitReport report;
    const clm::SnapshotAdapterWeights w = fit(exact, 0.0, scale, &report);
    check_close(w, truth, 1e-4);
    CHECK(report.r2 > 1.0 - 1e-9);
  }
  SECTION("f16 snapshots fit as the f32 view of their rounded values") {
    std::vector<std::uint16_t> half(p.snapshots.size());
    Pairs rounded = p;
    for (std::size_t i = 0; i < half.size(); ++i) {
      half[i] = clm::detail::f32_to_f16(p.snapshots[i]);
      rounded.snapshots[i] = clm::detail::f16_to_f32(half[i]);
    }
    clm::SnapshotAdapterWeights w;
    const clm::ConstActivationView view{half.data(), clm::ActDType::f16, p.rows(), dim};
    REQUIRE(clm::fit_snapshot_adapter(view, p.d(), 1.0, scale, w).ok());
    const clm::SnapshotAdapterWeights want = fit(rounded, 1.0, scale);
    CHECK(w.weight == want.weight);
    CHECK(w.bias == want.bias);
  }
}

TEST_CASE("adapter fit: one pair with lambda > 0 gives W = 0 and the bias through it") {
  const Pairs p{3, 2, {1.0f, -2.0f, 0.5f}, {0.6f, -0.3f}};
  const clm::SnapshotAdapterWeights w = fit(p, 0.1, 0.3f);
  CHECK(w.weight == std::vector<float>(6, 0.0f));
  CHECK(w.bias[0] == Approx(2.0));
  CHECK(w.bias[1] == Approx(-1.0));
}

TEST_CASE("adapter fit: singular systems and bad inputs give invalid_argument, outputs untouched") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const int dim = 8, hidden = 6;
  const TrueMap truth = random_map(dim, hidden, rng);
  const Pairs p = sample(truth, dim, hidden, 60, 0.3f, 0.1, rng);

  auto refused = [](clm::ConstActivationView s, clm::ConstActivationView d, double lambda, float scale) {
    clm::SnapshotAdapterWeights out;
    out.hidden = -3;
    clm::AdapterFitReport report;
    report.rows = -3;
    const clm::Status st = clm::fit_snapshot_adapter(s, d, lambda, scale, out, &report);
    INFO(st.message());
    return st.code() == clm::StatusCode::invalid_argument && !st.message().empty() && out.hidden == -3 &&
           out.weight.empty() && report.rows == -3;
  };

  SECTION("singular with lambda = 0, fine with lambda > 0") {
    const Pairs few = sample(truth, dim, hidden, static_cast<std::size_t>(dim), 0.3f, 0.1, rng);  // < dim + 1
    CHECK(refused(few.s(), few.d(), 0.0, 0.3f));
    Pairs dependent = p;  // column 3 = 2 * column 1
    for (std::int64_t r = 0; r < p.rows(); ++r) {
      dependent.snapshots[static_cast<std::size_t>(r * dim + 3)] =
          2.0f * p.snapshots[static_cast<std::size_t>(r * dim + 1)];
    }
    CHECK(refused(dependent.s(), dependent.d(), 0.0, 0.3f));
    fit(few, 1e-2, 0.3f);
    fit(dependent, 1e-2, 0.3f);
  }
  SECTION("bad inputs") {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    CHECK(refused(clm::ConstActivationView::f32({}, 0, dim), clm::ConstActivationView::f32({}, 0, hidden), 1.0, 0.3f));
    Pairs bad = p;
    bad.snapshots[17] = nan;
    CHECK(refused(bad.s(), bad.d(), 1.0, 0.3f));
    bad = p;
    bad.deltas[5] = -inf;
    CHECK(refused(bad.s(), bad.d(), 1.0, 0.3f));
    CHECK(refused(p.s(), p.d(), -1e-3, 0.3f));
    CHECK(refused(p.s(), p.d(), std::numeric_limits<double>::quiet_NaN(), 0.3f));
    CHECK(refused(p.s(), p.d(), std::numeric_limits<double>::infinity(), 0.3f));
    CHECK(refused(p.s(), p.d(), 1.0, 0.0f));
    CHECK(refused(p.s(), p.d(), 1.0, -0.3f));
    CHECK(refused(p.s(), p.d(), 1.0, nan));
    CHECK(refused(p.s(), clm::ConstActivationView::f32(p.deltas, p.rows() - 1, hidden), 1.0, 0.3f));
    CHECK(refused(clm::ConstActivationView::f32(p.snapshots, p.rows(), 0), p.d(), 1.0, 0.3f));
    CHECK(refused(clm::ConstActivationView{nullptr, clm::ActDType::f32, p.rows(), dim}, p.d(), 1.0, 0.3f));
  }
}

TEST_CASE("adapter fit: a solution finite in f64 but not in f32 is refused, not returned") {
  // delta / residual_scale = 1e40: finite in f64, +inf once stored as f32 weights.
  const std::vector<float> s = {0.0f, 1.0f, 2.0f};
  const std::vector<float> d = {1e10f, 2e10f, 3e10f};
  const clm::ConstActivationView sv{s.data(), clm::ActDType::f32, 3, 1};
  const clm::ConstActivationView dv{d.data(), clm::ActDType::f32, 3, 1};
  clm::SnapshotAdapterWeights out;
  out.hidden = -7;
  const clm::Status st = clm::fit_snapshot_adapter(sv, dv, 0.0, 1e-30f, out);
  INFO(st.message());
  CHECK(st.code() == clm::StatusCode::invalid_argument);
  CHECK(out.hidden == -7);
  // The same data at a sane scale fits, and an adapter accepts it.
  REQUIRE(clm::fit_snapshot_adapter(sv, dv, 0.0, 0.3f, out).ok());
  CHECK(clm::validate_snapshot_adapter(out).ok());
}
