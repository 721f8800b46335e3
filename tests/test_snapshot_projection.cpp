// Tests of the snapshot projection (include/clm/model/snapshot_projection.hpp): PCA
// against a full Eigen decomposition of a float64 covariance on data from a
// known low-rank subspace, projection against a float64 reference written here
// with plain loops, f16 storage, safetensors files (round trip and hand-built
// bytes) and every bad input. Fresh random data; the seed is printed on failure.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>  // getpid

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wconversion"
#pragma GCC diagnostic ignored "-Wshadow"
#pragma GCC diagnostic ignored "-Wpedantic"
#include <Eigen/Dense>
#pragma GCC diagnostic pop

#include "clm/detail/half.hpp"
#include "clm/model/snapshot_projection.hpp"
#include "test_support.hpp"

namespace {

using clm_test::fresh_seed;
using clm_test::to_half;
using clm_test::RawTensor;
using clm_test::raw_bytes;

using clm::StatusCode;
using MatD = Eigen::MatrixXd;

std::size_t sz(std::int64_t v) { return static_cast<std::size_t>(v); }

void require_invalid(const clm::Status& s) {
  INFO("status " << s.code_name() << ": " << s.message());
  REQUIRE(s.code() == StatusCode::invalid_argument);
  REQUIRE(!s.message().empty());
}

// Random h x r matrix with orthonormal columns.
MatD random_basis(int h, int r, std::mt19937& rng) {
  std::normal_distribution<double> n(0.0, 1.0);
  MatD a(h, r);
  for (int i = 0; i < h; ++i)
    for (int j = 0; j < r; ++j) a(i, j) = n(rng);
  const Eigen::HouseholderQR<MatD> qr(a);
  return qr.householderQ() * MatD::Identity(h, r);
}

// n samples [n][h]: mean + sum_i sigma_i z_i b_i + noise, sigma_i = 10 * 0.8^i.
struct Samples {
  int n = 0, h = 0;
  MatD basis;  // [h x r]
  std::vector<float> x;
};

Samples low_rank_samples(int n, int h, int r, double noise, std::mt19937& rng) {
  std::normal_distribution<double> nd(0.0, 1.0);
  Samples s{n, h, random_basis(h, r, rng), {}};
  std::vector<double> mean(sz(h));
  for (double& v : mean) v = 3.0 * nd(rng);
  s.x.resize(sz(n) * sz(h));
  for (int t = 0; t < n; ++t) {
    std::vector<double> row = mean;
    for (int i = 0; i < r; ++i) {
      const double z = 10.0 * std::pow(0.8, i) * nd(rng);
      for (int c = 0; c < h; ++c) row[sz(c)] += z * s.basis(c, i);
    }
    for (int c = 0; c < h; ++c) s.x[sz(t) * sz(h) + sz(c)] = static_cast<float>(row[sz(c)] + noise * nd(rng));
  }
  return s;
}

// Power law over k random directions, sigma_i = 5 / (i + 1), plus isotropic
// noise at the level of the last one (no exact low rank), offset by 1.
Samples power_law_samples(int n, int h, int k, std::mt19937& rng) {
  std::normal_distribution<double> nd(0.0, 1.0);
  Samples s{n, h, random_basis(h, k, rng), {}};
  MatD z(k, n);
  for (int t = 0; t < n; ++t)
    for (int i = 0; i < k; ++i) z(i, t) = 5.0 / (i + 1) * nd(rng);
  const MatD x = s.basis * z;  // [h x n]
  const double noise = 5.0 / (k + 1);
  s.x.resize(sz(n) * sz(h));
  for (int t = 0; t < n; ++t)
    for (int c = 0; c < h; ++c) s.x[sz(t) * sz(h) + sz(c)] = static_cast<float>(1.0 + x(c, t) + noise * nd(rng));
  return s;
}

clm::ConstActivationView view_of(const Samples& s) { return clm::ConstActivationView::f32(s.x, s.n, s.h); }

// The reference: mean and covariance in double (plain loops), then a full
// Eigen decomposition; eigenpairs in decreasing order.
struct Reference {
  std::vector<double> mean;
  Eigen::VectorXd variance;  // eigenvalue / (n - 1)
  MatD vectors;              // [h x h]
};

Reference reference_pca(const std::vector<float>& x, int n, int h) {
  Reference ref;
  ref.mean.assign(sz(h), 0.0);
  for (int t = 0; t < n; ++t)
    for (int c = 0; c < h; ++c) ref.mean[sz(c)] += static_cast<double>(x[sz(t) * sz(h) + sz(c)]);
  for (double& v : ref.mean) v /= n;
  MatD xc(n, h);
  for (int t = 0; t < n; ++t)
    for (int c = 0; c < h; ++c) xc(t, c) = static_cast<double>(x[sz(t) * sz(h) + sz(c)]) - ref.mean[sz(c)];
  const MatD cov = xc.transpose() * xc / (n - 1);
  const Eigen::SelfAdjointEigenSolver<MatD> es(cov);
  REQUIRE(es.info() == Eigen::Success);
  ref.variance = es.eigenvalues().reverse();
  ref.vectors = es.eigenvectors().rowwise().reverse();
  return ref;
}

MatD components_of(const clm::SnapshotProjectionWeights& w) {  // [dim x h]
  MatD c(w.snapshot_dim, w.hidden);
  for (int i = 0; i < w.snapshot_dim; ++i)
    for (int j = 0; j < w.hidden; ++j) c(i, j) = static_cast<double>(w.components[sz(i) * sz(w.hidden) + sz(j)]);
  return c;
}

// Checks shapes, orthonormality, the sign convention, the mean, the explained
// variance and the spanned subspace against the reference; with
// `per_component`, each component too (up to sign, then with the sign rule).
void check_fit(const clm::SnapshotProjectionWeights& w, const Reference& ref, int dim, bool per_component,
               double tol = 1e-5) {
  const int h = static_cast<int>(ref.mean.size());
  REQUIRE(w.hidden == h);
  REQUIRE(w.snapshot_dim == dim);
  REQUIRE(w.mean.size() == sz(h));
  REQUIRE(w.components.size() == sz(dim) * sz(h));
  REQUIRE(w.explained_variance.size() == sz(dim));
  double mean_scale = 1.0;
  for (double v : ref.mean) mean_scale = std::max(mean_scale, std::abs(v));
  for (int c = 0; c < h; ++c)
    CHECK(std::abs(static_cast<double>(w.mean[sz(c)]) - ref.mean[sz(c)]) <= 1e-6 * mean_scale);
  for (int i = 0; i < dim; ++i) {
    INFO("component " << i << ": variance " << w.explained_variance[sz(i)] << ", reference " << ref.variance(i));
    CHECK(std::abs(static_cast<double>(w.explained_variance[sz(i)]) - ref.variance(i)) <= tol * ref.variance(i));
  }
  const MatD c = components_of(w);
  CHECK((c * c.transpose() - MatD::Identity(dim, dim)).cwiseAbs().maxCoeff() <= 1e-5);
  for (int i = 0; i < dim; ++i) {
    Eigen::Index at = 0;
    c.row(i).cwiseAbs().maxCoeff(&at);
    CHECK(c(i, at) > 0.0);  // largest-magnitude entry positive
  }
  // Projector difference |P - P_ref|_F, P = C^T C.
  const MatD r = ref.vectors.leftCols(dim);
  const double proj_diff = (c.transpose() * c - r * r.transpose()).norm();
  INFO("projector difference " << proj_diff);
  CHECK(proj_diff <= tol * 10);
  if (per_component) {
    for (int i = 0; i < dim; ++i) {
      Eigen::VectorXd v = r.col(i);
      Eigen::Index at = 0;
      v.cwiseAbs().maxCoeff(&at);
      if (v(at) < 0) v = -v;
      INFO("component " << i);
      CHECK((c.row(i).transpose() - v).norm() <= tol * 10);
    }
  }
}

// The cosines of the principal angles between the rows of C and the columns
// of B, smallest first is what matters: min singular value of C B.
double min_cosine(const MatD& c, const MatD& b) {
  const Eigen::JacobiSVD<MatD> svd(c * b);
  return svd.singularValues().minCoeff();
}

std::unique_ptr<clm::SnapshotProjection> make_projection(clm::SnapshotProjectionWeights w) {
  std::unique_ptr<clm::SnapshotProjection> p;
  const clm::Status s = clm::SnapshotProjection::create(std::move(w), p);
  INFO(s.message());
  REQUIRE(s.ok());
  REQUIRE(p);
  return p;
}

// Random orthonormal components and a mean (for projection tests at any size).
clm::SnapshotProjectionWeights random_weights(int h, int dim, std::mt19937& rng) {
  const MatD b = random_basis(h, dim, rng);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  clm::SnapshotProjectionWeights w;
  w.hidden = h;
  w.snapshot_dim = dim;
  w.mean.resize(sz(h));
  for (float& v : w.mean) v = 0.5f * nd(rng);
  w.components.resize(sz(dim) * sz(h));
  for (int i = 0; i < dim; ++i)
    for (int c = 0; c < h; ++c) w.components[sz(i) * sz(h) + sz(c)] = static_cast<float>(b(c, i));
  return w;
}

// normalize(C (x - mean)) per row, in double with plain loops.
std::vector<double> reference_project(const clm::SnapshotProjectionWeights& w, const std::vector<double>& rows) {
  const std::size_t h = sz(w.hidden), d = sz(w.snapshot_dim), n = rows.size() / h;
  std::vector<double> out(n * d);
  for (std::size_t r = 0; r < n; ++r) {
    double ss = 0.0;
    for (std::size_t i = 0; i < d; ++i) {
      double acc = 0.0;
      for (std::size_t c = 0; c < h; ++c)
        acc += static_cast<double>(w.components[i * h + c]) * (rows[r * h + c] - static_cast<double>(w.mean[c]));
      out[r * d + i] = acc;
      ss += acc * acc;
    }
    for (std::size_t i = 0; i < d; ++i) out[r * d + i] /= std::sqrt(ss);
  }
  return out;
}

// The mean plus a mix of the components (|z| = sqrt(dim), so rows are not
// dominated by the mean: f16/bf16 rounding stays at the 1e-2 level) and noise.
std::vector<float> random_rows(const clm::SnapshotProjectionWeights& w, int n, std::mt19937& rng) {
  const std::size_t h = sz(w.hidden), d = sz(w.snapshot_dim);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(sz(n) * h);
  for (std::size_t r = 0; r < sz(n); ++r) {
    std::vector<float> z(d);
    double zz = 0.0;
    for (float& v : z) {
      v = nd(rng);
      zz += static_cast<double>(v) * v;
    }
    for (float& v : z) v = static_cast<float>(v * std::sqrt(static_cast<double>(d) / zz));
    for (std::size_t c = 0; c < h; ++c) {
      float v = w.mean[c] + 0.05f * nd(rng);
      for (std::size_t i = 0; i < d; ++i) v += z[i] * w.components[i * h + c];
      x[r * h + c] = v;
    }
  }
  return x;
}

std::vector<double> from_half(const std::vector<std::uint16_t>& x, clm::ActDType dtype) {
  std::vector<double> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i)
    out[i] = dtype == clm::ActDType::f16 ? clm::detail::f16_to_f32(x[i]) : clm::detail::bf16_to_f32(x[i]);
  return out;
}

// ---- hand-built safetensors bytes ------------------------------------------------

clm::Status read_bytes(const std::vector<RawTensor>& tensors, clm::SnapshotProjectionWeights& out) {
  clm::SafetensorsFile file;
  const clm::Status s = clm::SafetensorsFile::parse(clm_test::safetensors_bytes(tensors), file);
  INFO(s.message());
  REQUIRE(s.ok());
  return clm::read_snapshot_projection(file, out);
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("clm_test_snapshot_projection_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

bool same(const clm::SnapshotProjectionWeights& a, const clm::SnapshotProjectionWeights& b) {
  return a.hidden == b.hidden && a.snapshot_dim == b.snapshot_dim && a.mean == b.mean && a.components == b.components &&
         a.explained_variance == b.explained_variance;
}

}  // namespace

// ---- fit_pca ---------------------------------------------------------------------

TEST_CASE("fit_pca matches a full Eigen decomposition on both sides, with both solvers") {
  const uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  struct Shape {
    int n, h, r, dim;
  };
  // n < h: the Gram side; n > h: the covariance side. dim < r, dim == r.
  const std::vector<Shape> shapes = {
      {60, 200, 6, 6}, {60, 200, 6, 3}, {500, 64, 6, 6}, {500, 64, 8, 5}, {40, 40, 5, 5}};
  for (const Shape& sh : shapes) {
    const Samples s = low_rank_samples(sh.n, sh.h, sh.r, 0.01, rng);
    const Reference ref = reference_pca(s.x, sh.n, sh.h);
    for (clm::PcaSolver solver : {clm::PcaSolver::direct, clm::PcaSolver::krylov, clm::PcaSolver::automatic}) {
      for (int block : {0, 2}) {
        INFO("n " << sh.n << ", hidden " << sh.h << ", rank " << sh.r << ", dim " << sh.dim << ", solver "
                  << static_cast<int>(solver) << ", block " << block);
        clm::PcaOptions options;
        options.solver = solver;
        options.block_size = block;
        clm::SnapshotProjectionWeights w;
        const clm::Status st = clm::fit_pca(view_of(s), sh.dim, w, options);
        INFO(st.message());
        REQUIRE(st.ok());
        check_fit(w, ref, sh.dim, /*per_component=*/true);
        // And the subspace is the one the data came from (up to the noise).
        CHECK(min_cosine(components_of(w), s.basis) >= 0.999);
      }
    }
  }
}

TEST_CASE("fit_pca: the Krylov solver agrees with the direct one on a power-law spectrum") {
  const uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (auto [n, h] : {std::pair{400, 120}, std::pair{90, 300}}) {
    const Samples s = power_law_samples(n, h, std::min(n, h) - 10, rng);
    const Reference ref = reference_pca(s.x, n, h);
    for (int dim : {1, 8, 20}) {
      for (int block : {0, 3, 16}) {
        INFO("n " << n << ", hidden " << h << ", dim " << dim << ", block " << block);
        clm::PcaOptions options;
        options.solver = clm::PcaSolver::krylov;
        options.block_size = block;
        clm::SnapshotProjectionWeights w;
        const clm::Status st = clm::fit_pca(view_of(s), dim, w, options);
        INFO(st.message());
        REQUIRE(st.ok());
        check_fit(w, ref, dim, /*per_component=*/false, 1e-4);
      }
    }
  }
}

TEST_CASE("fit_pca: the automatic Krylov path at a size above direct_limit", "[slow]") {
  const uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  SECTION("covariance side, hidden 1100 > direct_limit: against the full decomposition") {
    const Samples s = low_rank_samples(1200, 1100, 24, 0.05, rng);
    const Reference ref = reference_pca(s.x, 1200, 1100);
    clm::SnapshotProjectionWeights w;
    const clm::Status st = clm::fit_pca(view_of(s), 16, w);
    INFO(st.message());
    REQUIRE(st.ok());
    check_fit(w, ref, 16, true);
  }
}

// Two minutes under ASan (a 4096-wide fit, twice), where make test leaves it
// out: the Krylov path's memory use is checked there by the case above.
TEST_CASE("fit_pca: hidden 4096, Krylov against direct", "[slow]") {
  const uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  SECTION("hidden 4096, 1200 samples (Gram side 1200 > direct_limit), dim 256: Krylov against direct") {
    const Samples s = power_law_samples(1200, 4096, 600, rng);
    clm::SnapshotProjectionWeights krylov, direct;
    const auto t0 = std::chrono::steady_clock::now();
    REQUIRE(clm::fit_pca(view_of(s), clm::kDefaultSnapshotDim, krylov).ok());
    const auto t1 = std::chrono::steady_clock::now();
    clm::PcaOptions options;
    options.solver = clm::PcaSolver::direct;
    REQUIRE(clm::fit_pca(view_of(s), clm::kDefaultSnapshotDim, direct, options).ok());
    const auto t2 = std::chrono::steady_clock::now();
    const double tk = std::chrono::duration<double>(t1 - t0).count();
    const double td = std::chrono::duration<double>(t2 - t1).count();
    INFO("krylov " << tk << " s, direct " << td << " s");
    const MatD a = components_of(krylov), b = components_of(direct);
    CHECK((a * a.transpose() - MatD::Identity(256, 256)).cwiseAbs().maxCoeff() <= 1e-5);
    // |A (I - B^T B)|_F: what of a's subspace lies outside b's (the sines of
    // the principal angles), without forming the 4096 x 4096 projectors.
    const double outside = (a - (a * b.transpose()) * b).norm();
    INFO("subspace difference " << outside);
    CHECK(outside <= 1e-4);
    for (int i = 0; i < 256; ++i) {
      CHECK(std::abs(krylov.explained_variance[sz(i)] - direct.explained_variance[sz(i)]) <=
            1e-5f * direct.explained_variance[sz(i)]);
    }
    CHECK(tk < 60.0);  // practical: seconds, not minutes
  }
}

TEST_CASE("fit_pca reads f16 and bf16 samples as their f32 values") {
  const uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const Samples s = low_rank_samples(80, 48, 5, 0.01, rng);
  for (clm::ActDType dtype : {clm::ActDType::f16, clm::ActDType::bf16}) {
    const std::vector<std::uint16_t> half = to_half(s.x, dtype);
    const std::vector<double> decoded = from_half(half, dtype);
    const std::vector<float> as_f32(decoded.begin(), decoded.end());
    clm::SnapshotProjectionWeights a, b;
    REQUIRE(clm::fit_pca({half.data(), dtype, s.n, s.h}, 5, a).ok());
    REQUIRE(clm::fit_pca(clm::ConstActivationView::f32(as_f32, s.n, s.h), 5, b).ok());
    CHECK(same(a, b));
  }
}

TEST_CASE("fit_pca: bad input gives invalid_argument and leaves the output untouched") {
  const uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  Samples s = low_rank_samples(30, 16, 4, 0.01, rng);
  clm::SnapshotProjectionWeights sentinel;
  sentinel.hidden = 7;
  sentinel.mean = {1.0f, 2.0f};
  auto refused = [&](clm::ConstActivationView v, int dim, const clm::PcaOptions& options = {}) {
    clm::SnapshotProjectionWeights out = sentinel;
    const clm::Status st = clm::fit_pca(v, dim, out, options);
    INFO(st.message());
    return st.code() == StatusCode::invalid_argument && !st.message().empty() && same(out, sentinel);
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();

  // snapshot_dim: 0, negative, > hidden, > n - 1
  CHECK(refused(view_of(s), 0));
  CHECK(refused(view_of(s), -3));
  CHECK(refused(view_of(s), 17));
  CHECK(refused(clm::ConstActivationView::f32(std::span<const float>(s.x).first(8 * 16), 8, 16), 8));
  CHECK(
      clm::fit_pca(clm::ConstActivationView::f32(std::span<const float>(s.x).first(8 * 16), 8, 16), 7, sentinel).ok());
  sentinel = {};
  sentinel.hidden = 7;
  // too few samples, no columns, null data, bad dtype
  CHECK(refused(clm::ConstActivationView::f32(std::span<const float>(s.x).first(16), 1, 16), 1));
  CHECK(refused(clm::ConstActivationView::f32({}, 0, 16), 1));
  CHECK(refused(clm::ConstActivationView::f32({}, 5, 0), 1));
  CHECK(refused({nullptr, clm::ActDType::f32, 30, 16}, 2));
  CHECK(refused({s.x.data(), static_cast<clm::ActDType>(9), 30, 16}, 2));
  // NaN / Inf, f32 and f16
  for (float bad : {nan, inf, -inf}) {
    Samples c = s;
    c.x[std::uniform_int_distribution<std::size_t>(0, c.x.size() - 1)(rng)] = bad;
    CHECK(refused(view_of(c), 2));
  }
  std::vector<std::uint16_t> half = to_half(s.x, clm::ActDType::f16);
  half[37] = 0x7c00;  // +inf
  CHECK(refused({half.data(), clm::ActDType::f16, 30, 16}, 2));
  // all samples equal; data of rank 3 asked for 5 directions
  std::vector<float> equal(30 * 16, 1.5f);
  CHECK(refused(clm::ConstActivationView::f32(equal, 30, 16), 1));
  const Samples rank3 = low_rank_samples(30, 16, 3, 0.0, rng);
  CHECK(refused(view_of(rank3), 5));
  clm::PcaOptions krylov;
  krylov.solver = clm::PcaSolver::krylov;
  krylov.block_size = 2;
  CHECK(refused(view_of(rank3), 5, krylov));  // the Krylov basis runs out of directions, then says so
  CHECK(clm::fit_pca(view_of(rank3), 3, sentinel).ok());
  sentinel = {};
  // bad options
  clm::PcaOptions bad_options;
  bad_options.tolerance = 0.0;
  CHECK(refused(view_of(s), 2, bad_options));
  bad_options = {};
  bad_options.block_size = -1;
  CHECK(refused(view_of(s), 2, bad_options));
  bad_options = {};
  bad_options.solver = static_cast<clm::PcaSolver>(7);
  CHECK(refused(view_of(s), 2, bad_options));
}

// ---- projection ------------------------------------------------------------------

TEST_CASE("project matches a float64 reference, rows are unit length") {
  const uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  struct Shape {
    int h, dim, n;
  };
  for (const Shape& sh : std::vector<Shape>{{8, 3, 5}, {64, 16, 33}, {512, 128, 9}, {4096, 256, 4}, {4096, 384, 1}}) {
    INFO("hidden " << sh.h << ", dim " << sh.dim << ", rows " << sh.n);
    const clm::SnapshotProjectionWeights w = random_weights(sh.h, sh.dim, rng);
    auto proj = make_projection(w);
    CHECK(proj->hidden() == sh.h);
    CHECK(proj->snapshot_dim() == sh.dim);
    const std::vector<float> x = random_rows(w, sh.n, rng);
    const std::size_t d = sz(sh.dim);

    // f32 rows: against the reference on the same values.
    std::vector<float> out(sz(sh.n) * d, -9.0f);
    REQUIRE(proj->project(clm::ConstActivationView::f32(x, sh.n, sh.h), out).ok());
    const std::vector<double> ref = reference_project(w, std::vector<double>(x.begin(), x.end()));
    for (std::size_t i = 0; i < out.size(); ++i) CHECK(std::abs(static_cast<double>(out[i]) - ref[i]) <= 1e-5);
    for (std::size_t r = 0; r < sz(sh.n); ++r) {
      double ss = 0.0;
      for (std::size_t j = 0; j < d; ++j) ss += static_cast<double>(out[r * d + j]) * out[r * d + j];
      CHECK(std::abs(std::sqrt(ss) - 1.0) <= 1e-6);
    }

    // f16 / bf16 rows: 1e-5 against the decoded values, 1e-2 against the f32 originals.
    for (clm::ActDType dtype : {clm::ActDType::f16, clm::ActDType::bf16}) {
      INFO("dtype " << clm::kv_dtype_name(dtype));
      const std::vector<std::uint16_t> half = to_half(x, dtype);
      std::vector<float> hout(out.size());
      REQUIRE(proj->project({half.data(), dtype, sh.n, sh.h}, hout).ok());
      const std::vector<double> href = reference_project(w, from_half(half, dtype));
      for (std::size_t i = 0; i < out.size(); ++i) {
        CHECK(std::abs(static_cast<double>(hout[i]) - href[i]) <= 1e-5);
        CHECK(std::abs(static_cast<double>(hout[i]) - ref[i]) <= 1e-2);
      }
    }

    // project_f16 stores the f32 result rounded to f16.
    std::vector<std::uint16_t> h16(out.size());
    REQUIRE(proj->project_f16(clm::ConstActivationView::f32(x, sh.n, sh.h), h16).ok());
    CHECK(h16 == to_half(out, clm::ActDType::f16));
  }
}

TEST_CASE("snapshots round-trip through f16") {
  const uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const clm::SnapshotProjectionWeights w = random_weights(256, 128, rng);
  auto proj = make_projection(w);
  const std::vector<float> x = random_rows(w, 3, rng);
  std::vector<float> snap(3 * 128);
  REQUIRE(proj->project(clm::ConstActivationView::f32(x, 3, 256), snap).ok());
  std::vector<std::uint16_t> half(snap.size());
  REQUIRE(clm::snapshot_to_f16(snap, half).ok());
  std::vector<float> back(snap.size());
  REQUIRE(clm::snapshot_from_f16(half, back).ok());
  for (std::size_t i = 0; i < snap.size(); ++i) {
    CHECK(std::abs(back[i] - snap[i]) <= std::ldexp(1.0f, -11) * std::max(std::abs(snap[i]), std::ldexp(1.0f, -14)));
  }
  // Converting back to f16 is exact.
  std::vector<std::uint16_t> again(snap.size());
  REQUIRE(clm::snapshot_to_f16(back, again).ok());
  CHECK(again == half);

  // Bad sizes and values leave the output untouched.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::uint16_t> hout(4, 0x1234);
  const std::vector<std::uint16_t> hsentinel = hout;
  require_invalid(clm::snapshot_to_f16(std::vector<float>{0.5f, nan, 0.1f, 0.2f}, hout));
  require_invalid(clm::snapshot_to_f16(std::vector<float>{0.5f, 7e4f, 0.1f, 0.2f}, hout));  // beyond f16
  require_invalid(clm::snapshot_to_f16(std::vector<float>{0.5f, 0.1f, 0.2f}, hout));
  CHECK(hout == hsentinel);
  std::vector<float> fout(4, -3.0f);
  const std::vector<float> fsentinel = fout;
  require_invalid(clm::snapshot_from_f16(std::vector<std::uint16_t>{0x3c00, 0x7e00, 0, 0}, fout));  // NaN
  require_invalid(clm::snapshot_from_f16(std::vector<std::uint16_t>{0x3c00, 0xfc00, 0, 0}, fout));  // -inf
  require_invalid(clm::snapshot_from_f16(std::vector<std::uint16_t>{0x3c00}, fout));
  CHECK(fout == fsentinel);
}

TEST_CASE("project: bad input gives invalid_argument and leaves the output untouched") {
  const uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  // Axis-aligned components, so "orthogonal to every component" is exact.
  clm::SnapshotProjectionWeights w;
  w.hidden = 6;
  w.snapshot_dim = 2;
  w.mean = {1.0f, -2.0f, 0.5f, 0.0f, 3.0f, 4.0f};
  w.components = {1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0};
  auto proj = make_projection(w);
  std::vector<float> x = {2.0f, 0.0f, 1.5f, 1.0f, 1.0f, 1.0f,  // fine
                          5.0f, 1.0f, 0.0f, 1.0f, 1.0f, 1.0f};
  std::vector<float> out(4, -9.0f);
  REQUIRE(proj->project(clm::ConstActivationView::f32(x, 2, 6), out).ok());
  CHECK(std::abs(out[0] - 1.0f / std::sqrt(2.0f)) <= 1e-6f);
  CHECK(std::abs(out[1] - 1.0f / std::sqrt(2.0f)) <= 1e-6f);
  CHECK(std::abs(out[2] - 4.0f / std::sqrt(16.25f)) <= 1e-6f);
  CHECK(std::abs(out[3] + 0.5f / std::sqrt(16.25f)) <= 1e-6f);

  const std::vector<float> sentinel(4, -9.0f);
  auto refused = [&](const std::vector<float>& rows, std::int64_t n, std::int32_t cols, std::size_t out_size) {
    std::vector<float> o(out_size, -9.0f);
    const clm::Status s = proj->project(clm::ConstActivationView::f32(rows, n, cols), o);
    INFO(s.message());
    return s.code() == StatusCode::invalid_argument && !s.message().empty() && o == std::vector<float>(out_size, -9.0f);
  };
  // x == mean, and x - mean orthogonal to both components: no direction.
  std::vector<float> zero = x;
  std::copy(w.mean.begin(), w.mean.end(), zero.begin() + 6);
  CHECK(refused(zero, 2, 6, 4));
  std::vector<float> orth = x;
  orth[6 + 0] = w.mean[0];
  orth[6 + 2] = w.mean[2];
  CHECK(refused(orth, 2, 6, 4));
  // NaN / Inf anywhere, including a channel no component reads
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    for (std::size_t at : {std::size_t{0}, std::size_t{5}, std::size_t{9}}) {
      std::vector<float> c = x;
      c[at] = bad;
      INFO("bad at " << at);
      CHECK(refused(c, 2, 6, 4));
    }
  }
  std::vector<std::uint16_t> half = to_half(x, clm::ActDType::bf16);
  half[3] = 0x7fc0;  // bf16 NaN
  std::vector<float> o = sentinel;
  require_invalid(proj->project({half.data(), clm::ActDType::bf16, 2, 6}, o));
  CHECK(o == sentinel);
  // overflow of the centered values
  std::vector<float> huge = x;
  huge[0] = 3.0e38f;
  huge[2] = -3.0e38f;
  w.mean[0] = -3.0e38f;
  auto proj_big = make_projection(w);
  o = sentinel;
  require_invalid(proj_big->project(clm::ConstActivationView::f32(huge, 2, 6), o));
  CHECK(o == sentinel);
  // shapes: wrong out size, wrong cols, null data, negative rows
  CHECK(refused(x, 2, 6, 3));
  CHECK(refused(x, 2, 6, 5));
  CHECK(refused(x, 3, 4, 6));
  o = sentinel;
  require_invalid(proj->project({nullptr, clm::ActDType::f32, 2, 6}, o));
  require_invalid(proj->project({x.data(), clm::ActDType::f32, -1, 6}, o));
  CHECK(o == sentinel);
  std::vector<std::uint16_t> h16(4, 7);
  require_invalid(proj->project_f16(clm::ConstActivationView::f32(x, 2, 6), std::span<std::uint16_t>(h16).first(3)));
  require_invalid(proj->project_f16(clm::ConstActivationView::f32(zero, 2, 6), h16));
  CHECK(h16 == std::vector<std::uint16_t>(4, 7));
  // zero rows is valid and writes nothing
  CHECK(proj->project(clm::ConstActivationView::f32({}, 0, 6), {}).ok());
}

TEST_CASE("SnapshotProjection::create refuses bad weights") {
  const uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const clm::SnapshotProjectionWeights good = random_weights(32, 4, rng);
  auto refused = [](clm::SnapshotProjectionWeights w) {
    std::unique_ptr<clm::SnapshotProjection> out;
    const clm::Status s = clm::SnapshotProjection::create(std::move(w), out);
    INFO(s.message());
    return s.code() == StatusCode::invalid_argument && !s.message().empty() && !out;
  };
  auto with = [&](auto edit) {
    clm::SnapshotProjectionWeights w = good;
    edit(w);
    return w;
  };
  using W = clm::SnapshotProjectionWeights;
  CHECK(refused(with([](W& w) { w.hidden = 0; })));
  CHECK(refused(with([](W& w) { w.hidden = 31; })));
  CHECK(refused(with([](W& w) { w.snapshot_dim = 0; })));
  CHECK(refused(with([](W& w) { w.snapshot_dim = 5; })));
  CHECK(refused(with([](W& w) { w.mean.pop_back(); })));
  CHECK(refused(with([](W& w) { w.components.pop_back(); })));
  CHECK(refused(with([](W& w) { w.explained_variance = {1.0f, 2.0f}; })));
  CHECK(refused(with([](W& w) { w.explained_variance = {4.0f, 3.0f, -1.0f, 1.0f}; })));
  CHECK(refused(with([](W& w) { w.mean[3] = std::numeric_limits<float>::quiet_NaN(); })));
  CHECK(refused(with([](W& w) { w.components[40] = std::numeric_limits<float>::infinity(); })));
  CHECK(refused(with([](W& w) {
    w.explained_variance = {1.0f, std::numeric_limits<float>::quiet_NaN(), 1.0f, 1.0f};
  })));
  CHECK(refused(with([](W& w) {
    for (float& v : w.components) v *= 1.1f;  // not unit length
  })));
  CHECK(refused(with([](W& w) {
    std::copy(w.components.begin(), w.components.begin() + 32, w.components.begin() + 32);  // two equal rows
  })));
  std::unique_ptr<clm::SnapshotProjection> ok;
  CHECK(clm::SnapshotProjection::create(with([](W& w) { w.explained_variance = {4.0f, 3.0f, 2.0f, 1.0f}; }), ok).ok());
}

// ---- safetensors -----------------------------------------------------------------

TEST_CASE("snapshot projection safetensors: round trip through a file") {
  const uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const Samples s = low_rank_samples(50, 24, 4, 0.01, rng);
  clm::SnapshotProjectionWeights w;
  REQUIRE(clm::fit_pca(view_of(s), 4, w).ok());
  const std::string path = temp_path("roundtrip.safetensors");
  for (bool with_variance : {true, false}) {
    clm::SnapshotProjectionWeights src = w;
    if (!with_variance) src.explained_variance.clear();
    const clm::Status ws = clm::write_snapshot_projection(path, src);
    INFO(ws.message());
    REQUIRE(ws.ok());
    clm::SnapshotProjectionWeights back;
    const clm::Status rs = clm::read_snapshot_projection(path, back);
    INFO(rs.message());
    REQUIRE(rs.ok());
    CHECK(same(back, src));
  }
  std::filesystem::remove(path);
  // writing checks the weights; a missing file is io_error
  clm::SnapshotProjectionWeights broken = w;
  broken.mean.pop_back();
  require_invalid(clm::write_snapshot_projection(path, broken));
  CHECK(!std::filesystem::exists(path));
  clm::SnapshotProjectionWeights out;
  CHECK(clm::read_snapshot_projection(temp_path("missing.safetensors"), out).code() == StatusCode::io_error);
}

TEST_CASE("snapshot projection safetensors: a hand-built file with bf16, f16 and f32 tensors") {
  // hidden 4, dim 2. Mean BF16, components F16 (rows (0.6, 0.8, 0, 0) and
  // (0, 0, 1, 0) rounded), variance F32, and an unrelated tensor to ignore.
  const std::vector<float> mean = {0.5f, -2.0f, 1.0f, 0.0f};
  const std::vector<float> comps = {0.6f, 0.8f, 0.0f, 0.0f, 0.0f, 0.0f, 1.0f, 0.0f};
  const std::vector<float> var = {3.0f, 1.25f};
  const std::vector<std::byte> mean_bf16 = raw_bytes(to_half(mean, clm::ActDType::bf16));
  const std::vector<std::byte> comps_f16 = raw_bytes(to_half(comps, clm::ActDType::f16));
  const std::vector<RawTensor> good = {
      {"other.weight", "I32", {2}, raw_bytes(std::vector<std::int32_t>{1, 2})},
      {"snapshot.mean", "BF16", {4}, mean_bf16},
      {"snapshot.components", "F16", {2, 4}, comps_f16},
      {"snapshot.explained_variance", "F32", {2}, raw_bytes(var)},
  };
  clm::SnapshotProjectionWeights w;
  const clm::Status s = read_bytes(good, w);
  INFO(s.message());
  REQUIRE(s.ok());
  CHECK(w.hidden == 4);
  CHECK(w.snapshot_dim == 2);
  CHECK(w.mean == mean);  // exact in bf16
  for (std::size_t i = 0; i < comps.size(); ++i) {
    CHECK(w.components[i] == clm::detail::f16_to_f32(clm::detail::f32_to_f16(comps[i])));
  }
  CHECK(w.explained_variance == var);
  // ... and it projects.
  auto proj = make_projection(w);
  std::vector<float> out(2);
  const std::vector<float> x = {1.1f, -1.2f, 2.0f, 5.0f};
  REQUIRE(proj->project(clm::ConstActivationView::f32(x, 1, 4), out).ok());
  const std::vector<double> ref = reference_project(w, std::vector<double>(x.begin(), x.end()));
  CHECK(std::abs(out[0] - ref[0]) <= 1e-6);
  CHECK(std::abs(out[1] - ref[1]) <= 1e-6);

  // Without the optional variance.
  clm::SnapshotProjectionWeights nv;
  REQUIRE(read_bytes({good[1], good[2]}, nv).ok());
  CHECK(nv.explained_variance.empty());
  CHECK(nv.components == w.components);
}

TEST_CASE("snapshot projection safetensors: bad files give invalid_argument, the output untouched") {
  const std::vector<float> mean = {0.5f, -2.0f, 1.0f, 0.0f};
  const std::vector<float> comps = {1, 0, 0, 0, 0, 0, 1, 0};
  const RawTensor m = {"snapshot.mean", "F32", {4}, raw_bytes(mean)};
  const RawTensor c = {"snapshot.components", "F32", {2, 4}, raw_bytes(comps)};
  const RawTensor v = {"snapshot.explained_variance", "F32", {2}, raw_bytes(std::vector<float>{2.0f, 1.0f})};
  clm::SnapshotProjectionWeights sentinel;
  sentinel.hidden = 99;
  auto refused = [&](const std::vector<RawTensor>& tensors, const std::string& mentions) {
    clm::SnapshotProjectionWeights out = sentinel;
    const clm::Status s = read_bytes(tensors, out);
    INFO(s.code_name() << ": " << s.message());
    return s.code() == StatusCode::invalid_argument && s.message().find(mentions) != std::string::npos &&
           same(out, sentinel);
  };
  clm::SnapshotProjectionWeights fine;
  REQUIRE(read_bytes({m, c, v}, fine).ok());

  // missing tensors
  CHECK(refused({c, v}, "snapshot.mean"));
  CHECK(refused({m, v}, "snapshot.components"));
  // dtypes other than F32 / F16 / BF16
  CHECK(refused({{"snapshot.mean", "F64", {4}, raw_bytes(std::vector<double>(4, 0.5))}, c}, "F64"));
  CHECK(refused({m, {"snapshot.components", "I32", {2, 4}, raw_bytes(std::vector<std::int32_t>(8, 0))}}, "I32"));
  CHECK(refused({m, c, {"snapshot.explained_variance", "U8", {2}, {std::byte{1}, std::byte{2}}}}, "U8"));
  // shapes: wrong rank, hidden mismatch, transposed, dim > hidden, variance size, empty extent
  CHECK(refused({{"snapshot.mean", "F32", {1, 4}, raw_bytes(mean)}, c}, "snapshot.mean"));
  CHECK(refused({m, {"snapshot.components", "F32", {8}, raw_bytes(comps)}}, "snapshot.components"));
  CHECK(refused({{"snapshot.mean", "F32", {2}, raw_bytes(std::vector<float>{1, 2})}, c}, "snapshot.components"));
  CHECK(refused({m, {"snapshot.components", "F32", {4, 2}, raw_bytes(comps)}}, "snapshot.components"));
  CHECK(refused({{"snapshot.mean", "F32", {2}, raw_bytes(std::vector<float>{1, 2})},
                 {"snapshot.components", "F32", {4, 2}, raw_bytes(comps)}},
                "snapshot.components"));
  CHECK(refused({m, c, {"snapshot.explained_variance", "F32", {3}, raw_bytes(std::vector<float>{1, 1, 1})}},
                "snapshot.explained_variance"));
  CHECK(refused({{"snapshot.mean", "F32", {0}, {}}, {"snapshot.components", "F32", {0, 0}, {}}}, "snapshot.mean"));
  // NaN in the data (f16 and f32), components not orthonormal, negative variance
  std::vector<std::uint16_t> nan_f16 = to_half(comps, clm::ActDType::f16);
  nan_f16[5] = 0x7e00;
  CHECK(refused({m, {"snapshot.components", "F16", {2, 4}, raw_bytes(nan_f16)}}, "snapshot.components"));
  std::vector<float> nan_mean = mean;
  nan_mean[1] = std::numeric_limits<float>::infinity();
  CHECK(refused({{"snapshot.mean", "F32", {4}, raw_bytes(nan_mean)}, c}, "snapshot.mean"));
  CHECK(refused({m, {"snapshot.components", "F32", {2, 4}, raw_bytes(std::vector<float>{1, 0, 0, 0, 1, 0, 0, 0})}},
                "orthonormal"));
  CHECK(refused({m, c, {"snapshot.explained_variance", "F32", {2}, raw_bytes(std::vector<float>{1, -1})}}, "negative"));
}
