// The adapter's ridge fit (include/clm/model/adapter_fit.hpp): centred normal
// equations accumulated a chunk of rows at a time in f64, solved by LDLT.
#include "clm/model/adapter_fit.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include <Eigen/Cholesky>
#include <Eigen/Core>

namespace clm {
namespace {

using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using VecD = Eigen::VectorXd;

constexpr std::int64_t kChunk = 512;

// Rows [begin, begin + out.rows()) of the view, minus `mean`, times `scale`.
void load_centred(const ConstActivationView& view, std::int64_t begin, const VecD& mean, double scale, MatD& out) {
  for (Eigen::Index r = 0; r < out.rows(); ++r) {
    for (std::int32_t c = 0; c < view.cols; ++c) {
      out(r, c) = static_cast<double>(view.at(begin + r, c)) * scale - mean[c];
    }
  }
}

// Column means of view * scale; false on a NaN/Inf element.
bool column_means(const ConstActivationView& view, double scale, VecD& mean) {
  mean.setZero(view.cols);
  for (std::int64_t r = 0; r < view.rows; ++r) {
    for (std::int32_t c = 0; c < view.cols; ++c) {
      const float v = view.at(r, c);
      if (!std::isfinite(v)) return false;
      mean[c] += static_cast<double>(v) * scale;
    }
  }
  mean /= static_cast<double>(view.rows);
  return true;
}

}  // namespace

Status fit_snapshot_adapter(ConstActivationView snapshots, ConstActivationView deltas, double ridge_lambda,
                            float residual_scale, SnapshotAdapterWeights& out, AdapterFitReport* report) {
  CLM_RETURN_IF_ERROR(check_activation_view(snapshots, -1, "fit_snapshot_adapter: snapshots"));
  CLM_RETURN_IF_ERROR(check_activation_view(deltas, -1, "fit_snapshot_adapter: deltas"));
  if (snapshots.rows < 1) return invalid_argument("fit_snapshot_adapter: needs at least one pair");
  if (deltas.rows != snapshots.rows) {
    return invalid_argument("fit_snapshot_adapter: " + std::to_string(snapshots.rows) + " snapshots but " +
                            std::to_string(deltas.rows) + " deltas");
  }
  if (snapshots.cols < 1 || deltas.cols < 1) return invalid_argument("fit_snapshot_adapter: a view has 0 columns");
  if (!std::isfinite(ridge_lambda) || ridge_lambda < 0.0) {
    return invalid_argument("fit_snapshot_adapter: ridge_lambda must be finite and >= 0");
  }
  if (!std::isfinite(residual_scale) || residual_scale <= 0.0f) {
    return invalid_argument("fit_snapshot_adapter: residual_scale must be finite and > 0");
  }
  const double inv_scale = 1.0 / static_cast<double>(residual_scale);
  const Eigen::Index d = snapshots.cols, h = deltas.cols;
  const std::int64_t n = snapshots.rows;
  // Centring costs one degree of freedom: n - 1 < d leaves Sc^T Sc singular. Said
  // by count, since the pivot test below cannot tell such a system from a
  // merely ill-conditioned one reliably.
  if (ridge_lambda == 0.0 && n < d + 1) {
    return invalid_argument("fit_snapshot_adapter: ridge_lambda = 0 needs at least snapshot_dim + 1 = " +
                            std::to_string(d + 1) + " pairs, got " + std::to_string(n) + "; use ridge_lambda > 0");
  }

  // Pass 1: means (centring first keeps the cross products well conditioned).
  VecD x_mean, y_mean;
  if (!column_means(snapshots, 1.0, x_mean)) return invalid_argument("fit_snapshot_adapter: snapshots hold a NaN/Inf");
  if (!column_means(deltas, inv_scale, y_mean)) return invalid_argument("fit_snapshot_adapter: deltas hold a NaN/Inf");

  // Passes 2 and 3 walk the pairs in chunks of centred rows (xc, yc).
  MatD xc, yc;
  const auto for_each_centred_chunk = [&](auto&& use) {
    for (std::int64_t begin = 0; begin < n; begin += kChunk) {
      const Eigen::Index rows = std::min(kChunk, n - begin);
      xc.resize(rows, d);
      yc.resize(rows, h);
      load_centred(snapshots, begin, x_mean, 1.0, xc);
      load_centred(deltas, begin, y_mean, inv_scale, yc);
      use();
    }
  };

  // Pass 2: G = Sc^T Sc, R = Sc^T Yc.
  MatD gram = MatD::Zero(d, d), cross = MatD::Zero(d, h);
  double tss_scaled = 0.0;
  for_each_centred_chunk([&] {
    gram.noalias() += xc.transpose() * xc;
    cross.noalias() += xc.transpose() * yc;
    tss_scaled += yc.squaredNorm();
  });
  gram.diagonal().array() += ridge_lambda;

  const Eigen::LDLT<MatD> ldlt(gram);
  const VecD pivots = ldlt.vectorD();
  const double max_pivot = pivots.cwiseAbs().maxCoeff();
  // Dependent snapshot columns leave a pivot at rounding level (~1e-16 of the largest).
  if (ldlt.info() != Eigen::Success || !(pivots.minCoeff() > max_pivot * static_cast<double>(d) * 1e-13)) {
    return invalid_argument(
        "fit_snapshot_adapter: the normal equations are singular (linearly dependent snapshot columns); use "
        "ridge_lambda > 0");
  }
  const MatD coef = ldlt.solve(cross);  // [d][h] = W^T
  const VecD bias = y_mean - coef.transpose() * x_mean;
  if (!coef.allFinite() || !bias.allFinite()) return invalid_argument("fit_snapshot_adapter: non-finite solution");

  // Pass 3: residuals, centred (W s + b - y = W (s - mean s) - (y - mean y)).
  double rss_scaled = 0.0;
  for_each_centred_chunk([&] { rss_scaled += (xc * coef - yc).squaredNorm(); });

  SnapshotAdapterWeights w;
  w.snapshot_dim = static_cast<std::int32_t>(d);
  w.hidden = static_cast<std::int32_t>(h);
  w.weight.resize(static_cast<std::size_t>(h * d));
  for (Eigen::Index o = 0; o < h; ++o) {
    for (Eigen::Index k = 0; k < d; ++k) w.weight[static_cast<std::size_t>(o * d + k)] = static_cast<float>(coef(k, o));
  }
  w.bias.resize(static_cast<std::size_t>(h));
  for (Eigen::Index o = 0; o < h; ++o) w.bias[static_cast<std::size_t>(o)] = static_cast<float>(bias[o]);
  // Finite in f64 can still overflow f32: return only weights an adapter accepts.
  if (Status valid = validate_snapshot_adapter(w); !valid.ok()) {
    return invalid_argument("fit_snapshot_adapter: the solution does not fit f32 weights: " + valid.message());
  }

  if (report != nullptr) {
    const double s2 = static_cast<double>(residual_scale) * static_cast<double>(residual_scale);
    AdapterFitReport r;
    r.rows = n;
    r.rss = rss_scaled * s2;
    r.tss = tss_scaled * s2;
    r.r2 = r.tss > 0.0 ? 1.0 - r.rss / r.tss : std::numeric_limits<double>::quiet_NaN();
    *report = r;
  }
  out = std::move(w);
  return Status::success();
}

}  // namespace clm
