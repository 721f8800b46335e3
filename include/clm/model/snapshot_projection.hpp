// clm/model/snapshot_projection.hpp: the snapshot projection of CLM (docs/clm.md). A
// semantic snapshot is a last-layer hidden vector compressed by PCA to
// snapshot_dim values and normalised to unit length; it is stored (f32 or f16)
// and later injected through the SnapshotAdapter (clm/model/snapshot_adapter.hpp).
//
//   clm::SnapshotProjectionWeights w;
//   CLM_RETURN_IF_ERROR(clm::fit_pca(samples /*[n][hidden]*/, clm::kDefaultSnapshotDim, w));
//   CLM_RETURN_IF_ERROR(clm::write_snapshot_projection("snapshot.safetensors", w));
//   std::unique_ptr<clm::SnapshotProjection> proj;
//   CLM_RETURN_IF_ERROR(clm::SnapshotProjection::create(std::move(w), proj));
//   std::vector<std::uint16_t> snap(proj->snapshot_dim());
//   CLM_RETURN_IF_ERROR(proj->project_f16(last_hidden /*[1][hidden]*/, snap));
//
// project: out_row = normalize(components * (x - mean)), one Eigen GEMM per
// batch, |out_row| = 1. A row whose projection is exactly zero (x == mean, or x
// orthogonal to every component) has no direction: invalid_argument, never a
// NaN and never a made-up vector.
//
// fit_pca: mean and the top snapshot_dim principal components, in double.
// snapshot_dim is meant to be one of kSnapshotDims (128, 192, 256, 384), but
// any 1 <= snapshot_dim <= min(hidden, n - 1) is accepted (small shapes in
// tests, small models). The eigenproblem is solved on the smaller side:
//   - n <= hidden: the n x n Gram matrix of the centered samples (components
//     mapped back through the samples and re-orthonormalised);
//   - otherwise the hidden x hidden covariance, built by blocked rank updates.
// That m x m matrix (m = min(n, hidden)) goes to a full SelfAdjointEigenSolver
// when m <= options.direct_limit (1024: under a second), else to a block
// Krylov solver with full reorthogonalisation and Rayleigh-Ritz, run until
// every wanted Ritz pair has |S v_i - theta_i v_i| <= tolerance * theta_i
// (+ 1e-12 theta_0, above rounding). In the worst case, a spectrum flat around
// snapshot_dim, it ends exact at Krylov dimension m. Building the matrix costs
// n * hidden * m / 2 multiply-adds in double. Measured on one core, hidden 4096,
// dim 256, a power-law spectrum: 1500 samples ~2 s, 6000 samples ~14 s (8 s of
// it the covariance); a full 4096 x 4096 eigensolve alone takes about a minute.
// Deterministic: a fixed seed starts the Krylov solver, and each component is
// signed so that its largest-magnitude entry (the first, on ties) is positive.
// explained_variance[i] = eigenvalue i / (n - 1), in decreasing order.
//
// Errors (Status, never exceptions), invalid_argument unless said otherwise:
// NaN/Inf anywhere in the input, sizes that do not match, fewer than 2 samples,
// snapshot_dim out of range, samples spanning fewer than snapshot_dim
// directions (a component with zero variance), weights that are not finite,
// not of matching sizes or whose components are not orthonormal (to 1e-2, so
// f16/bf16 files pass). Outputs are left untouched on any error.
// All const members are safe to call concurrently.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "clm/io/safetensors.hpp"
#include "clm/kernels/activations.hpp"
#include "clm/status.hpp"

namespace clm {

inline constexpr std::int32_t kDefaultSnapshotDim = 256;
inline constexpr std::array<std::int32_t, 4> kSnapshotDims = {128, 192, 256, 384};

// Row-major f32 weights of the projection.
struct SnapshotProjectionWeights {
  std::int32_t hidden = 0;
  std::int32_t snapshot_dim = 0;
  std::vector<float> mean;                // [hidden]
  std::vector<float> components;          // [snapshot_dim][hidden], orthonormal rows
  std::vector<float> explained_variance;  // [snapshot_dim], may be empty when loaded
};

enum class PcaSolver : std::uint8_t {
  automatic,  // direct when min(n, hidden) <= direct_limit, else krylov
  direct,     // full SelfAdjointEigenSolver of the m x m matrix
  krylov,     // block Krylov + Rayleigh-Ritz (for large hidden)
};

struct PcaOptions {
  PcaSolver solver = PcaSolver::automatic;
  std::int32_t direct_limit = 1024;
  std::int32_t block_size = 0;  // krylov block width; 0 = clamp(snapshot_dim / 16, 8, 32)
  double tolerance = 1e-9;      // krylov residual bound, relative to each eigenvalue
};

// Fits `out` (replaced only on success) to `samples` [n][hidden] (f32/f16/bf16).
Status fit_pca(ConstActivationView samples, std::int32_t snapshot_dim, SnapshotProjectionWeights& out,
               const PcaOptions& options = {});

class SnapshotProjection {
 public:
  // Validates `weights` (see above) and takes ownership of them.
  static Status create(SnapshotProjectionWeights weights, std::unique_ptr<SnapshotProjection>& out);

  // rows: [n][hidden] (f32/f16/bf16); out: [n][snapshot_dim], unit-length rows.
  // n == 0 is valid and writes nothing.
  Status project(ConstActivationView rows, std::span<float> out) const;
  // The same, stored as f16 (round to nearest even).
  Status project_f16(ConstActivationView rows, std::span<std::uint16_t> out) const;

  std::int32_t hidden() const { return weights_.hidden; }
  std::int32_t snapshot_dim() const { return weights_.snapshot_dim; }
  const SnapshotProjectionWeights& weights() const { return weights_; }

 private:
  explicit SnapshotProjection(SnapshotProjectionWeights weights) : weights_(std::move(weights)) {}

  SnapshotProjectionWeights weights_;
};

// The checks create applies, without building anything.
Status validate_snapshot_projection(const SnapshotProjectionWeights& weights);

// A snapshot (or a batch of them) between f32 and f16 storage. Sizes must be
// equal; a NaN/Inf, or an f32 value beyond the f16 range, is invalid_argument
// and leaves `out` untouched.
Status snapshot_to_f16(std::span<const float> snapshot, std::span<std::uint16_t> out);
Status snapshot_from_f16(std::span<const std::uint16_t> snapshot, std::span<float> out);

// safetensors: "snapshot.mean" [hidden], "snapshot.components" [snapshot_dim,
// hidden], optional "snapshot.explained_variance" [snapshot_dim]; F32, F16 or
// BF16 (read as f32). Other tensors in the file are ignored. A missing tensor,
// another dtype, a wrong shape or a NaN/Inf is invalid_argument naming the
// tensor; `out` is replaced only on success. write_* stores f32 and checks the
// weights as create does first.
Status read_snapshot_projection(const SafetensorsFile& file, SnapshotProjectionWeights& out);
Status read_snapshot_projection(const std::string& path, SnapshotProjectionWeights& out);
Status write_snapshot_projection(const std::string& path, const SnapshotProjectionWeights& weights);

}  // namespace clm
