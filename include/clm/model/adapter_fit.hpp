// clm/model/adapter_fit.hpp: fitting the snapshot adapter (clm/model/snapshot_adapter.hpp)
// from the host's own (snapshot, residual delta) pairs, in closed form
// (lib/model/adapter_fit.cpp, docs/clm.md).
//
//   // snapshots [n][snapshot_dim], deltas [n][hidden]: the change the adapter
//   // should add to the residual stream for that snapshot.
//   clm::SnapshotAdapterWeights weights;
//   clm::AdapterFitReport report;
//   CLM_RETURN_IF_ERROR(clm::fit_snapshot_adapter(snapshots, deltas, 1e-3, clm::kDefaultResidualScale,
//                                                 weights, &report));
//
// The adapter adds residual_scale * (W s + b) to the hidden state, so the fit
// targets y = delta / residual_scale: ridge regression with an unpenalised
// bias,
//   min_{W,b} sum_i |y_i - W s_i - b|^2 + ridge_lambda |W|_F^2,
// solved exactly: centre S and Y, solve (Sc^T Sc + lambda I) B = Sc^T Yc with
// an LDLT in f64 (W = B^T), then b = mean(y) - W mean(s). ridge_lambda is thus
// in the units of the scaled targets; pass the residual_scale the adapter will
// run with (SnapshotAdapterConfig::residual_scale, kDefaultResidualScale =
// 0.3). Three passes over the data, a chunk of rows at a time: O(n d (d + h))
// time, O(d (d + h)) memory in f64 whatever n.
//
// Errors (invalid_argument; `out` and `*report` untouched): a malformed view,
// n < 1, 0 columns, rows that differ between the two views, a NaN/Inf value,
// ridge_lambda not finite >= 0, residual_scale not finite > 0, or a singular
// system: ridge_lambda == 0 with fewer than snapshot_dim + 1 pairs, or
// numerically dependent snapshot columns (an LDLT pivot below
// 1e-13 * snapshot_dim * the largest); use ridge_lambda > 0 for those.
#pragma once

#include <cstdint>

#include "clm/kernels/activations.hpp"
#include "clm/model/snapshot_adapter.hpp"
#include "clm/status.hpp"

namespace clm {

inline constexpr float kDefaultResidualScale = 0.3f;

struct AdapterFitReport {
  // On the training pairs, in delta units, pooled over all hidden channels:
  // r2 = 1 - rss / tss with rss = sum |delta - residual_scale (W s + b)|^2 and
  // tss = sum |delta - mean(delta)|^2. NaN when tss == 0 (constant deltas).
  double r2 = 0.0;
  double rss = 0.0;
  double tss = 0.0;
  std::int64_t rows = 0;
};

Status fit_snapshot_adapter(ConstActivationView snapshots, ConstActivationView deltas, double ridge_lambda,
                            float residual_scale, SnapshotAdapterWeights& out, AdapterFitReport* report = nullptr);

}  // namespace clm
