// clm/store/snapshot_pca.hpp: a key's snapshot vectors seen in two
// dimensions (`clm_store plot`, docs/snapshot-store.md): principal component
// analysis in float64 of the rows of one key, so that a person sees whether
// the key holds one meaning (one cluster) or two (退款 and 退货 under one key).
//
//   clm::KeyVectors kv;                                   // snapshot_store.hpp
//   CLM_RETURN_IF_ERROR(store->key_vectors("tenant-7", key, 5, kv));
//   std::vector<float> rows;                              // [n][dim], the key's rows
//   for (const auto& r : kv.rows) rows.insert(rows.end(), r.vector.begin(), r.vector.end());
//   clm::SnapshotPlane plane;
//   CLM_RETURN_IF_ERROR(clm::fit_snapshot_plane(rows, dim, plane));
//   const auto [x, y] = plane.project(kv.neighbours[0].rows[0].vector);  // same axes
//
// The plane is centred on the mean of the rows it was fitted to; its two axes
// are their two top principal components (unit, orthogonal; each signed so
// that its largest-magnitude entry, the first on ties, is positive), and
// variance[i] is the rows' sample variance along axis i (divided by n - 1),
// share[i] that variance over the rows' total variance (0 when it is 0).
// Other vectors (a key's nearest neighbours) are projected on the same axes.
//
// Rows that span fewer than two directions still give a plane: the axes with
// no variance (both, when every row is the same vector) are completed to an
// orthonormal pair from the standard basis, and their variance is 0. The
// eigenproblem is solved on the smaller side: the n x n Gram matrix of the
// centred rows when n <= dim, else the dim x dim covariance.
//
// Errors (Status, never exceptions): failed_precondition for fewer than 2
// rows ("a key with one row has no shape to plot") or dim < 2 (no plane);
// invalid_argument for a size that is not a multiple of dim, or a value that
// is not finite. `out` is untouched on error.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "clm/status.hpp"

namespace clm {

struct SnapshotPlane {
  std::int32_t dim = 0;
  std::int64_t rows = 0;                        // rows it was fitted to
  std::vector<double> mean;                     // [dim]
  std::array<std::vector<double>, 2> axes;      // [dim] each: unit, orthogonal
  std::array<double, 2> variance = {0.0, 0.0};  // along each axis (sample variance)
  std::array<double, 2> share = {0.0, 0.0};     // variance / total_variance (0 when that is 0)
  double total_variance = 0.0;                  // over every direction: sum of the per-value sample variances

  // (x, y) of a vector of `dim` values on the plane's axes, about its mean.
  std::pair<double, double> project(std::span<const float> v) const;
};

// Fits the plane to `rows` ([n][dim], row-major).
Status fit_snapshot_plane(std::span<const float> rows, std::int32_t dim, SnapshotPlane& out);

}  // namespace clm
