// lib/store/snapshot_pca.cpp: a key's rows on their two top principal
// components (clm/store/snapshot_pca.hpp), in float64 with Eigen.
#include "clm/store/snapshot_pca.hpp"

#include <algorithm>
#include <cmath>
#include <new>

#include <fmt/format.h>
#include <Eigen/Core>
#include <Eigen/Eigenvalues>

namespace clm {

namespace {

using Matrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Vector = Eigen::VectorXd;

// Signed so that the largest-magnitude entry (the first, on ties) is positive:
// the same rows always give the same picture.
void fix_sign(Vector& axis) {
  Eigen::Index largest = 0;
  for (Eigen::Index i = 1; i < axis.size(); ++i) {
    if (std::abs(axis[i]) > std::abs(axis[largest])) largest = i;
  }
  if (axis[largest] < 0) axis = -axis;
}

// Takes out of v its parts along the axes found so far; false when little is left.
bool orthonormalise(Vector& v, const std::vector<Vector>& found) {
  for (int pass = 0; pass < 2; ++pass) {  // twice: one pass loses orthogonality to rounding
    for (const Vector& a : found) v -= a.dot(v) * a;
  }
  const double norm = v.norm();
  if (!(norm > 1e-6)) return false;
  v /= norm;
  return true;
}

}  // namespace

std::pair<double, double> SnapshotPlane::project(std::span<const float> v) const {
  double x = 0, y = 0;
  const std::size_t n = std::min(v.size(), mean.size());
  for (std::size_t i = 0; i < n; ++i) {
    const double centred = static_cast<double>(v[i]) - mean[i];
    x += centred * axes[0][i];
    y += centred * axes[1][i];
  }
  return {x, y};
}

Status fit_snapshot_plane(std::span<const float> rows, std::int32_t dim, SnapshotPlane& out) try {
  if (dim < 2) return failed_precondition(fmt::format("snapshot plane: dim {}: a plane needs 2 dimensions", dim));
  const auto d = static_cast<std::size_t>(dim);
  if (rows.size() % d != 0) {
    return invalid_argument(fmt::format("snapshot plane: {} values are not rows of {}", rows.size(), dim));
  }
  const std::size_t n = rows.size() / d;
  if (n < 2) {
    return failed_precondition(
        fmt::format("snapshot plane: {} row{}: a key with one row has no shape to plot", n, n == 1 ? "" : "s"));
  }
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (!std::isfinite(rows[i])) {
      return invalid_argument(fmt::format("snapshot plane: row {} value {} is not finite", i / d, i % d));
    }
  }
  const auto rn = static_cast<Eigen::Index>(n), rd = static_cast<Eigen::Index>(d);
  Matrix centred(rn, rd);
  for (Eigen::Index r = 0; r < rn; ++r) {
    for (Eigen::Index c = 0; c < rd; ++c)
      centred(r, c) = rows[static_cast<std::size_t>(r) * d + static_cast<std::size_t>(c)];
  }
  const Vector mean = centred.colwise().mean().transpose();
  centred.rowwise() -= mean.transpose();
  const double sum_of_squares = centred.squaredNorm();
  const double denominator = static_cast<double>(n - 1);

  // The top two eigenvectors of the smaller matrix: the Gram matrix's map back
  // through the rows to the same axes the covariance's would be.
  std::vector<Vector> axes;
  const double negligible = 1e-12 * sum_of_squares;  // an eigenvalue this small is rounding, not a direction
  if (n <= d) {
    const Matrix gram = centred * centred.transpose();
    const Eigen::SelfAdjointEigenSolver<Matrix> solver(gram);
    if (solver.info() != Eigen::Success) return {StatusCode::internal, "snapshot plane: the eigensolver failed"};
    for (Eigen::Index k = rn - 1; k >= 0 && axes.size() < 2; --k) {
      if (!(solver.eigenvalues()[k] > negligible)) break;  // ascending order: the rest are smaller
      Vector axis = centred.transpose() * solver.eigenvectors().col(k);
      if (orthonormalise(axis, axes)) axes.push_back(std::move(axis));
    }
  } else {
    const Matrix covariance = centred.transpose() * centred;
    const Eigen::SelfAdjointEigenSolver<Matrix> solver(covariance);
    if (solver.info() != Eigen::Success) return {StatusCode::internal, "snapshot plane: the eigensolver failed"};
    for (Eigen::Index k = rd - 1; k >= 0 && axes.size() < 2; --k) {
      if (!(solver.eigenvalues()[k] > negligible)) break;
      Vector axis = solver.eigenvectors().col(k);
      if (orthonormalise(axis, axes)) axes.push_back(std::move(axis));
    }
  }
  // Rows along fewer than two directions: the plane is completed from the
  // standard basis, so that other vectors still spread on it.
  for (Eigen::Index j = 0; j < rd && axes.size() < 2; ++j) {
    Vector axis = Vector::Unit(rd, j);
    if (orthonormalise(axis, axes)) axes.push_back(std::move(axis));
  }

  SnapshotPlane plane;
  plane.dim = dim;
  plane.rows = static_cast<std::int64_t>(n);
  plane.mean.assign(mean.data(), mean.data() + rd);
  plane.total_variance = sum_of_squares / denominator;
  for (std::size_t a = 0; a < 2; ++a) {
    fix_sign(axes[a]);
    plane.axes[a].assign(axes[a].data(), axes[a].data() + rd);
    plane.variance[a] = (centred * axes[a]).squaredNorm() / denominator;  // measured, also on a completed axis
    plane.share[a] = plane.total_variance > 0 ? plane.variance[a] / plane.total_variance : 0.0;
  }
  out = std::move(plane);
  return {};
} catch (const std::bad_alloc&) {
  return out_of_memory("snapshot plane: out of host memory");
}

}  // namespace clm
