// The snapshot projection (include/clm/model/snapshot_projection.hpp): PCA on the
// smaller side of the data (Gram or covariance matrix; direct or block Krylov
// eigensolver, in double), projection as one f32 GEMM per batch, f16 storage
// and safetensors I/O.
#include "clm/model/snapshot_projection.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include <Eigen/Core>
#include <Eigen/Eigenvalues>
#include <Eigen/QR>

#include "io/float_tensor.hpp"
#include "kernels/dense_gemm.hpp"

namespace clm {
namespace {

using Eigen::Index;
using MatD = Eigen::MatrixXd;
using RowMatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using RowMatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstRowMapF = Eigen::Map<const RowMatF>;

constexpr std::int64_t kChunk = 256;                  // rows / columns per blocked rank update
constexpr std::uint64_t kKrylovSeed = 0x5eed5eedULL;  // fixed: fits are reproducible
constexpr double kZeroVariance = 1e-10;               // eigenvalue / top eigenvalue below this is "none"
constexpr float kOrthonormalTolerance = 1e-2f;        // loose enough for f16/bf16 files
constexpr const char* kMean = "snapshot.mean";
constexpr const char* kComponents = "snapshot.components";
constexpr const char* kExplained = "snapshot.explained_variance";

std::size_t sz(std::int64_t v) { return static_cast<std::size_t>(v); }

// Elements (r, c0 .. c0 + n) of `v` as f32.
void load_segment(const ConstActivationView& v, std::int64_t r, std::int64_t c0, std::int64_t n, float* dst) {
  const std::size_t base = sz(r) * sz(v.cols) + sz(c0);
  switch (v.dtype) {
    case ActDType::f32:
      std::memcpy(dst, static_cast<const float*>(v.data) + base, sz(n) * sizeof(float));
      return;
    case ActDType::f16: {
      const std::uint16_t* p = static_cast<const std::uint16_t*>(v.data) + base;
      for (std::int64_t i = 0; i < n; ++i) dst[i] = detail::f16_to_f32(p[i]);
      return;
    }
    case ActDType::bf16: {
      const std::uint16_t* p = static_cast<const std::uint16_t*>(v.data) + base;
      for (std::int64_t i = 0; i < n; ++i) dst[i] = detail::bf16_to_f32(p[i]);
      return;
    }
  }
}

// samples[r0 .. r0+nr][c0 .. c0+nc] - mean, in double.
void load_centered(const ConstActivationView& v, const std::vector<double>& mean, std::int64_t r0, std::int64_t nr,
                   std::int64_t c0, std::int64_t nc, RowMatD& dst) {
  dst.resize(nr, nc);
  std::vector<float> row(sz(nc));
  for (std::int64_t r = 0; r < nr; ++r) {
    load_segment(v, r0 + r, c0, nc, row.data());
    for (std::int64_t c = 0; c < nc; ++c) dst(r, c) = static_cast<double>(row[sz(c)]) - mean[sz(c0 + c)];
  }
}

// Top `dim` eigenpairs of symmetric S, eigenvalues decreasing.
Status direct_top(const MatD& s, Index dim, Eigen::VectorXd& values, MatD& vectors) {
  Eigen::SelfAdjointEigenSolver<MatD> es(s);
  if (es.info() != Eigen::Success) return {StatusCode::internal, "fit_pca: the eigensolver did not converge"};
  const Index m = s.rows();
  values.resize(dim);
  vectors.resize(m, dim);
  for (Index i = 0; i < dim; ++i) {  // ascending -> decreasing
    values(i) = es.eigenvalues()(m - 1 - i);
    vectors.col(i) = es.eigenvectors().col(m - 1 - i);
  }
  return Status::success();
}

void fill_random(Eigen::Ref<Eigen::VectorXd> x, std::mt19937_64& rng) {
  std::normal_distribution<double> normal;
  for (Index i = 0; i < x.size(); ++i) x(i) = normal(rng);
}

// Makes the columns of X orthonormal and orthogonal to the (orthonormal) Q.
// Two passes of block Gram-Schmidt ("twice is enough"); a column that vanishes
// (the Krylov space became invariant, e.g. low-rank data) is replaced by a
// random one. Needs Q.cols() + X.cols() <= rows.
void orthonormalize(const Eigen::Ref<const MatD>& q, MatD& x, std::mt19937_64& rng) {
  const Eigen::VectorXd before = x.colwise().norm().transpose();
  for (int pass = 0; pass < 2 && q.cols() > 0; ++pass) x.noalias() -= q * (q.transpose() * x);
  for (Index j = 0; j < x.cols(); ++j) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      auto col = x.col(j);
      for (int pass = 0; pass < 2; ++pass) {
        if (attempt > 0 && q.cols() > 0) col -= q * (q.transpose() * col);
        if (j > 0) col -= x.leftCols(j) * (x.leftCols(j).transpose() * col);
      }
      const double norm = col.norm();
      const double ref = attempt == 0 ? before(j) : 1.0;
      if (norm > 1e-10 * ref) {
        col /= norm;
        break;
      }
      fill_random(col, rng);
      col.normalize();
    }
  }
}

// Top `dim` eigenpairs of symmetric S by block Krylov with full
// reorthogonalisation: the basis Q grows by S times the newest block, T = Q^T S Q
// is kept up to date, and Rayleigh-Ritz on T is checked now and then until
// every wanted residual |S v_i - theta_i v_i| <= tol * theta_i + 1e-12 theta_0
// (exact at K == m).
Status krylov_top(const MatD& s, Index dim, Index block, double tol, Eigen::VectorXd& values, MatD& vectors) {
  const Index m = s.rows();
  std::mt19937_64 rng(kKrylovSeed);
  Index cap = std::min(m, 4 * dim + 2 * block);
  MatD q(m, cap), sq(m, cap), t(0, 0);
  MatD x(m, std::min(block, m));
  for (Index j = 0; j < x.cols(); ++j) fill_random(x.col(j), rng);
  Index k = 0;
  Index next_check = std::min(m, std::max(2 * dim, dim + 2 * block));
  for (;;) {
    orthonormalize(q.leftCols(k), x, rng);
    const Index bw = x.cols();
    if (k + bw > cap) {
      cap = std::min(m, std::max(k + bw, 2 * cap));
      q.conservativeResize(Eigen::NoChange, cap);
      sq.conservativeResize(Eigen::NoChange, cap);
    }
    q.middleCols(k, bw) = x;
    sq.middleCols(k, bw).noalias() = s * x;
    const MatD tn = q.leftCols(k + bw).transpose() * sq.middleCols(k, bw);  // new columns of T
    t.conservativeResize(k + bw, k + bw);
    t.rightCols(bw) = tn;
    t.bottomLeftCorner(bw, k) = tn.topRows(k).transpose();
    t.bottomRightCorner(bw, bw) = 0.5 * (tn.bottomRows(bw) + tn.bottomRows(bw).transpose());
    k += bw;
    if (k >= next_check || k == m) {
      Eigen::SelfAdjointEigenSolver<MatD> es(t);
      if (es.info() != Eigen::Success) return {StatusCode::internal, "fit_pca: the Ritz eigensolver did not converge"};
      const MatD w = es.eigenvectors().rightCols(dim).rowwise().reverse();
      const Eigen::VectorXd theta = es.eigenvalues().tail(dim).reverse();
      MatD v = q.leftCols(k) * w;
      const MatD r = sq.leftCols(k) * w - v * theta.asDiagonal();
      // Each pair to its own eigenvalue (small components converge too), with a
      // floor above the rounding of S itself.
      const Eigen::VectorXd bound = tol * theta.cwiseAbs().array() + 1e-12 * std::abs(theta(0));
      const bool converged = (r.colwise().norm().transpose().array() <= bound.array()).all();
      if (k == m || converged) {
        values = theta;
        vectors = std::move(v);
        return Status::success();
      }
      next_check = std::min(m, std::max(k + block, k + k / 4));
    }
    x = sq.middleCols(k - bw, std::min(bw, m - k));
  }
}

// Signs each column so that its largest-magnitude entry (the first on ties) is positive.
void fix_signs(MatD& v) {
  for (Index i = 0; i < v.cols(); ++i) {
    Index at = 0;
    v.col(i).cwiseAbs().maxCoeff(&at);
    if (v(at, i) < 0.0) v.col(i) = -v.col(i);
  }
}

bool all_finite(std::span<const float> values) {
  return std::all_of(values.begin(), values.end(), [](float v) { return std::isfinite(v); });
}

Status bad(const std::string& what, const std::string& message) { return invalid_argument(what + ": " + message); }

}  // namespace

// ---- fitting -------------------------------------------------------------------

Status fit_pca(ConstActivationView samples, std::int32_t snapshot_dim, SnapshotProjectionWeights& out,
               const PcaOptions& options) {
  const std::string what = "fit_pca";
  CLM_RETURN_IF_ERROR(check_activation_view(samples, -1, "fit_pca: samples"));
  const std::int64_t n = samples.rows;
  const std::int32_t hidden = samples.cols;
  if (hidden < 1) return bad(what, "samples have no columns (hidden must be >= 1)");
  if (n < 2) return bad(what, "needs at least 2 samples, got " + std::to_string(n));
  const std::int64_t max_dim = std::min<std::int64_t>(hidden, n - 1);
  if (snapshot_dim < 1 || snapshot_dim > max_dim) {
    return bad(what, "snapshot_dim " + std::to_string(snapshot_dim) + " is out of range: needs 1 <= snapshot_dim <= " +
                         "min(hidden, samples - 1) = " + std::to_string(max_dim) +
                         " (models use 128, 192, 256 or 384)");
  }
  if (options.solver != PcaSolver::automatic && options.solver != PcaSolver::direct &&
      options.solver != PcaSolver::krylov) {
    return bad(what, "unknown PcaSolver");
  }
  if (options.direct_limit < 0 || options.block_size < 0 || !(options.tolerance > 0.0) ||
      !std::isfinite(options.tolerance)) {
    return bad(what, "PcaOptions need direct_limit >= 0, block_size >= 0 and a finite tolerance > 0");
  }

  // Mean (double) and the NaN/Inf check, one pass.
  const auto h = static_cast<std::size_t>(hidden);
  std::vector<double> mean(h, 0.0);
  std::vector<float> row(h);
  for (std::int64_t r = 0; r < n; ++r) {
    load_segment(samples, r, 0, hidden, row.data());
    for (std::size_t c = 0; c < h; ++c) {
      if (!std::isfinite(row[c])) {
        return bad(what, "samples hold a NaN or Inf (row " + std::to_string(r) + ", column " + std::to_string(c) + ")");
      }
      mean[c] += static_cast<double>(row[c]);
    }
  }
  for (double& v : mean) v /= static_cast<double>(n);

  // S = Xc Xc^T (n x n) when there are fewer samples than channels, else Xc^T Xc.
  const bool gram = n < hidden;
  const Index m = gram ? static_cast<Index>(n) : static_cast<Index>(hidden);
  MatD s = MatD::Zero(m, m);
  RowMatD chunk;
  if (gram) {
    for (std::int64_t c0 = 0; c0 < hidden; c0 += kChunk) {
      load_centered(samples, mean, 0, n, c0, std::min<std::int64_t>(kChunk, hidden - c0), chunk);
      s.selfadjointView<Eigen::Lower>().rankUpdate(chunk);
    }
  } else {
    for (std::int64_t r0 = 0; r0 < n; r0 += kChunk) {
      load_centered(samples, mean, r0, std::min<std::int64_t>(kChunk, n - r0), 0, hidden, chunk);
      s.selfadjointView<Eigen::Lower>().rankUpdate(chunk.transpose());
    }
  }
  s.triangularView<Eigen::StrictlyUpper>() = s.transpose();
  if (!(s.trace() > 0.0)) return bad(what, "all samples are equal: there is no variance to fit");

  const Index dim = snapshot_dim;
  const bool direct = options.solver == PcaSolver::direct ||
                      (options.solver == PcaSolver::automatic && m <= static_cast<Index>(options.direct_limit));
  Eigen::VectorXd theta;
  MatD u;
  if (direct) {
    CLM_RETURN_IF_ERROR(direct_top(s, dim, theta, u));
  } else {
    // Narrow blocks reach a higher polynomial degree for the same basis size,
    // which is what interior components of slowly decaying spectra need.
    const Index block = options.block_size > 0 ? options.block_size : std::clamp<Index>(dim / 16, 8, 32);
    CLM_RETURN_IF_ERROR(krylov_top(s, dim, block, options.tolerance, theta, u));
  }
  for (Index i = 0; i < dim; ++i) {
    if (!(theta(i) > kZeroVariance * theta(0))) {
      return bad(what, "the samples span only " + std::to_string(i) + " directions, fewer than snapshot_dim " +
                           std::to_string(dim) + " (component " + std::to_string(i) + " has no variance)");
    }
  }

  MatD v;  // [hidden x dim], orthonormal columns
  if (gram) {
    // v_i = Xc^T u_i / sqrt(theta_i), then QR against the rounding of that map.
    v.resize(hidden, dim);
    for (std::int64_t c0 = 0; c0 < hidden; c0 += kChunk) {
      const std::int64_t nc = std::min<std::int64_t>(kChunk, hidden - c0);
      load_centered(samples, mean, 0, n, c0, nc, chunk);
      v.middleRows(static_cast<Index>(c0), static_cast<Index>(nc)).noalias() = chunk.transpose() * u;
    }
    v = v * theta.cwiseSqrt().cwiseInverse().asDiagonal();
    const Eigen::HouseholderQR<MatD> qr(v);
    MatD q = qr.householderQ() * MatD::Identity(hidden, dim);
    for (Index i = 0; i < dim; ++i) {
      if (qr.matrixQR()(i, i) < 0.0) q.col(i) = -q.col(i);
    }
    v = std::move(q);
  } else {
    v = std::move(u);
  }
  fix_signs(v);

  SnapshotProjectionWeights w;
  w.hidden = hidden;
  w.snapshot_dim = snapshot_dim;
  w.mean.resize(h);
  for (std::size_t c = 0; c < h; ++c) w.mean[c] = static_cast<float>(mean[c]);
  w.components.resize(sz(dim) * h);
  for (Index i = 0; i < dim; ++i) {
    for (std::size_t c = 0; c < h; ++c) w.components[sz(i) * h + c] = static_cast<float>(v(static_cast<Index>(c), i));
  }
  w.explained_variance.resize(sz(dim));
  for (Index i = 0; i < dim; ++i)
    w.explained_variance[sz(i)] = static_cast<float>(theta(i) / static_cast<double>(n - 1));
  out = std::move(w);
  return Status::success();
}

// ---- the projection ----------------------------------------------------------

Status validate_snapshot_projection(const SnapshotProjectionWeights& w) {
  const std::string what = "SnapshotProjection";
  if (w.hidden < 1) return bad(what, "hidden must be >= 1, got " + std::to_string(w.hidden));
  if (w.snapshot_dim < 1 || w.snapshot_dim > w.hidden) {
    return bad(what, "snapshot_dim must be in [1, hidden = " + std::to_string(w.hidden) + "], got " +
                         std::to_string(w.snapshot_dim));
  }
  const std::size_t h = sz(w.hidden), d = sz(w.snapshot_dim);
  if (w.mean.size() != h) {
    return bad(what, "mean must hold hidden = " + std::to_string(h) + " floats, got " + std::to_string(w.mean.size()));
  }
  if (w.components.size() != d * h) {
    return bad(what, "components must hold snapshot_dim * hidden = " + std::to_string(d * h) + " floats, got " +
                         std::to_string(w.components.size()));
  }
  if (!w.explained_variance.empty() && w.explained_variance.size() != d) {
    return bad(what, "explained_variance must be empty or hold snapshot_dim = " + std::to_string(d) + " floats, got " +
                         std::to_string(w.explained_variance.size()));
  }
  if (!all_finite(w.mean) || !all_finite(w.components) || !all_finite(w.explained_variance)) {
    return bad(what, "the weights hold a NaN or Inf");
  }
  if (std::any_of(w.explained_variance.begin(), w.explained_variance.end(), [](float v) { return v < 0.0f; })) {
    return bad(what, "explained_variance holds a negative value");
  }
  const ConstRowMapF c(w.components.data(), static_cast<Index>(d), static_cast<Index>(h));
  const RowMatF gram = c * c.transpose();
  const float off = (gram - RowMatF::Identity(static_cast<Index>(d), static_cast<Index>(d))).cwiseAbs().maxCoeff();
  if (!(off <= kOrthonormalTolerance)) {
    return bad(what, "the component rows are not orthonormal (|C C^T - I| reaches " + std::to_string(off) + ")");
  }
  return Status::success();
}

Status SnapshotProjection::create(SnapshotProjectionWeights weights, std::unique_ptr<SnapshotProjection>& out) {
  CLM_RETURN_IF_ERROR(validate_snapshot_projection(weights));
  out.reset(new SnapshotProjection(std::move(weights)));
  return Status::success();
}

Status SnapshotProjection::project(ConstActivationView rows, std::span<float> out) const {
  const std::string what = "SnapshotProjection::project";
  CLM_RETURN_IF_ERROR(check_activation_view(rows, weights_.hidden, "SnapshotProjection::project: rows"));
  const std::size_t n = sz(rows.rows), h = sz(weights_.hidden), d = sz(weights_.snapshot_dim);
  if (out.size() != n * d) {
    return bad(what, "out has " + std::to_string(out.size()) +
                         " floats, expected rows * snapshot_dim = " + std::to_string(n * d));
  }
  if (n == 0) return Status::success();

  RowMatF x(static_cast<Index>(n), static_cast<Index>(h));
  for (std::size_t r = 0; r < n; ++r) {
    float* dst = x.data() + r * h;
    load_segment(rows, static_cast<std::int64_t>(r), 0, static_cast<std::int64_t>(h), dst);
    for (std::size_t c = 0; c < h; ++c) {
      if (!std::isfinite(dst[c])) {
        return bad(what, "rows hold a NaN or Inf (row " + std::to_string(r) + ", column " + std::to_string(c) + ")");
      }
      dst[c] -= weights_.mean[c];
    }
  }
  RowMatF y(static_cast<Index>(n), static_cast<Index>(d));  // [n x dim] = X C^T
  detail::gemm_nt(x.data(), static_cast<std::int64_t>(n), static_cast<std::int64_t>(h), weights_.components.data(),
                  static_cast<std::int64_t>(d), y.data());

  std::vector<double> inv_norm(n);
  for (std::size_t r = 0; r < n; ++r) {
    double ss = 0.0;
    for (std::size_t j = 0; j < d; ++j) {
      const auto v = static_cast<double>(y.data()[r * d + j]);
      ss += v * v;
    }
    if (!std::isfinite(ss)) return bad(what, "row " + std::to_string(r) + " overflows f32 when projected");
    if (ss == 0.0) {
      return bad(what, "row " + std::to_string(r) +
                           " projects to the zero vector (it equals the mean, or is orthogonal to every component): "
                           "it has no direction to store");
    }
    inv_norm[r] = 1.0 / std::sqrt(ss);
  }
  for (std::size_t r = 0; r < n; ++r) {
    for (std::size_t j = 0; j < d; ++j) {
      out[r * d + j] = static_cast<float>(static_cast<double>(y.data()[r * d + j]) * inv_norm[r]);
    }
  }
  return Status::success();
}

Status SnapshotProjection::project_f16(ConstActivationView rows, std::span<std::uint16_t> out) const {
  if (rows.rows < 0 || out.size() != sz(rows.rows) * sz(weights_.snapshot_dim)) {
    return bad("SnapshotProjection::project_f16",
               "out has " + std::to_string(out.size()) + " values, expected rows * snapshot_dim");
  }
  std::vector<float> tmp(out.size());
  CLM_RETURN_IF_ERROR(project(rows, tmp));
  return snapshot_to_f16(tmp, out);
}

// ---- f16 storage ---------------------------------------------------------------

Status snapshot_to_f16(std::span<const float> snapshot, std::span<std::uint16_t> out) {
  if (snapshot.size() != out.size()) {
    return bad("snapshot_to_f16",
               "sizes differ: " + std::to_string(snapshot.size()) + " in, " + std::to_string(out.size()) + " out");
  }
  std::vector<std::uint16_t> tmp(snapshot.size());
  for (std::size_t i = 0; i < snapshot.size(); ++i) {
    tmp[i] = detail::f32_to_f16(snapshot[i]);
    if (!std::isfinite(detail::f16_to_f32(tmp[i]))) {
      return bad("snapshot_to_f16", "value " + std::to_string(i) + " is NaN, Inf or beyond the f16 range");
    }
  }
  std::copy(tmp.begin(), tmp.end(), out.begin());
  return Status::success();
}

Status snapshot_from_f16(std::span<const std::uint16_t> snapshot, std::span<float> out) {
  if (snapshot.size() != out.size()) {
    return bad("snapshot_from_f16",
               "sizes differ: " + std::to_string(snapshot.size()) + " in, " + std::to_string(out.size()) + " out");
  }
  for (std::size_t i = 0; i < snapshot.size(); ++i) {
    if (!std::isfinite(detail::f16_to_f32(snapshot[i]))) {
      return bad("snapshot_from_f16", "value " + std::to_string(i) + " is NaN or Inf");
    }
  }
  for (std::size_t i = 0; i < snapshot.size(); ++i) out[i] = detail::f16_to_f32(snapshot[i]);
  return Status::success();
}

// ---- safetensors ---------------------------------------------------------------

Status read_snapshot_projection(const SafetensorsFile& file, SnapshotProjectionWeights& out) {
  const std::string what = "read_snapshot_projection";
  std::vector<std::int64_t> mean_shape, comp_shape, ev_shape;
  SnapshotProjectionWeights w;
  CLM_RETURN_IF_ERROR(detail::load_float_tensor(file, what, kMean, 1, mean_shape, w.mean));
  CLM_RETURN_IF_ERROR(detail::load_float_tensor(file, what, kComponents, 2, comp_shape, w.components));
  if (comp_shape[1] != mean_shape[0] || comp_shape[0] > comp_shape[1]) {
    return bad(what, std::string("tensor \"") + kComponents + "\" has shape " + detail::shape_text(comp_shape) +
                         ", expected [snapshot_dim, " + std::to_string(mean_shape[0]) +
                         "] with snapshot_dim <= hidden (hidden from \"" + kMean + "\")");
  }
  if (mean_shape[0] > std::numeric_limits<std::int32_t>::max()) return bad(what, "hidden does not fit in int32");
  if (file.find(kExplained) != nullptr) {
    CLM_RETURN_IF_ERROR(detail::load_float_tensor(file, what, kExplained, 1, ev_shape, w.explained_variance));
    if (ev_shape[0] != comp_shape[0]) {
      return bad(what, std::string("tensor \"") + kExplained + "\" has shape " + detail::shape_text(ev_shape) +
                           ", expected [" + std::to_string(comp_shape[0]) + "] (snapshot_dim)");
    }
  }
  w.hidden = static_cast<std::int32_t>(mean_shape[0]);
  w.snapshot_dim = static_cast<std::int32_t>(comp_shape[0]);
  if (Status s = validate_snapshot_projection(w); !s.ok()) return bad(what, s.message());
  out = std::move(w);
  return Status::success();
}

Status read_snapshot_projection(const std::string& path, SnapshotProjectionWeights& out) {
  SafetensorsFile file;
  CLM_RETURN_IF_ERROR(SafetensorsFile::open(path, file));
  return read_snapshot_projection(file, out);
}

Status write_snapshot_projection(const std::string& path, const SnapshotProjectionWeights& weights) {
  if (Status s = validate_snapshot_projection(weights); !s.ok()) {
    return bad("write_snapshot_projection", s.message());
  }
  const std::int64_t h = weights.hidden, d = weights.snapshot_dim;
  std::vector<TensorToWrite> tensors = {
      {kMean, TensorDType::f32, {h}, std::as_bytes(std::span(weights.mean))},
      {kComponents, TensorDType::f32, {d, h}, std::as_bytes(std::span(weights.components))},
  };
  if (!weights.explained_variance.empty()) {
    tensors.push_back({kExplained, TensorDType::f32, {d}, std::as_bytes(std::span(weights.explained_variance))});
  }
  return write_safetensors(path, tensors);
}

}  // namespace clm
