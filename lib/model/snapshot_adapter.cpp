// The snapshot adapter (include/clm/model/snapshot_adapter.hpp): residual_scale *
// (W s + b) added to the hidden states of the injecting layers; the deltas of
// a batch as one Eigen GEMM; safetensors I/O.
#include "clm/model/snapshot_adapter.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>

#include <Eigen/Core>

#include "clm/model/snapshot_projection.hpp"  // snapshot_from_f16
#include "io/float_tensor.hpp"
#include "kernels/dense_gemm.hpp"

namespace clm {
namespace {

using Eigen::Index;
using RowMatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstRowMapF = Eigen::Map<const RowMatF>;
using ConstVecMapF = Eigen::Map<const Eigen::VectorXf>;

constexpr const char* kWeight = "adapter.weight";
constexpr const char* kBias = "adapter.bias";

std::size_t sz(std::int64_t v) { return static_cast<std::size_t>(v); }

Status bad(const std::string& what, const std::string& message) { return invalid_argument(what + ": " + message); }

bool all_finite(std::span<const float> values) {
  return std::all_of(values.begin(), values.end(), [](float v) { return std::isfinite(v); });
}

// rows [r0, r1) of `hs` += delta (f32 add, then rounded to the view's dtype).
void add_rows(const ActivationView& hs, std::int64_t r0, std::int64_t r1, const float* delta) {
  const std::size_t h = sz(hs.cols);
  for (std::int64_t r = r0; r < r1; ++r) {
    const std::size_t base = sz(r) * h;
    switch (hs.dtype) {
      case ActDType::f32: {
        float* p = static_cast<float*>(hs.data) + base;
        for (std::size_t c = 0; c < h; ++c) p[c] += delta[c];
        break;
      }
      case ActDType::f16: {
        std::uint16_t* p = static_cast<std::uint16_t*>(hs.data) + base;
        for (std::size_t c = 0; c < h; ++c) p[c] = detail::f32_to_f16(detail::f16_to_f32(p[c]) + delta[c]);
        break;
      }
      case ActDType::bf16: {
        std::uint16_t* p = static_cast<std::uint16_t*>(hs.data) + base;
        for (std::size_t c = 0; c < h; ++c) p[c] = detail::f32_to_bf16(detail::bf16_to_f32(p[c]) + delta[c]);
        break;
      }
    }
  }
}

}  // namespace

Status validate_snapshot_adapter(const SnapshotAdapterWeights& w) {
  const std::string what = "SnapshotAdapter";
  if (w.hidden < 1 || w.snapshot_dim < 1) {
    return bad(what, "hidden and snapshot_dim must be >= 1, got hidden " + std::to_string(w.hidden) +
                         ", snapshot_dim " + std::to_string(w.snapshot_dim));
  }
  const std::size_t h = sz(w.hidden), d = sz(w.snapshot_dim);
  if (w.weight.size() != h * d) {
    return bad(what, "weight must hold hidden * snapshot_dim = " + std::to_string(h * d) + " floats, got " +
                         std::to_string(w.weight.size()));
  }
  if (w.bias.size() != h) {
    return bad(what, "bias must hold hidden = " + std::to_string(h) + " floats, got " + std::to_string(w.bias.size()));
  }
  if (!all_finite(w.weight) || !all_finite(w.bias)) return bad(what, "the weights hold a NaN or Inf");
  return Status::success();
}

Status SnapshotAdapter::create(SnapshotAdapterWeights weights, SnapshotAdapterConfig config,
                               std::unique_ptr<SnapshotAdapter>& out) {
  const std::string what = "SnapshotAdapter";
  CLM_RETURN_IF_ERROR(validate_snapshot_adapter(weights));
  if (config.num_layers < 1) return bad(what, "num_layers must be >= 1, got " + std::to_string(config.num_layers));
  if (!std::isfinite(config.residual_scale)) return bad(what, "residual_scale is NaN or Inf");
  for (std::int32_t layer : config.layers) {
    if (layer < 0 || layer >= config.num_layers) {
      return bad(what, "layer " + std::to_string(layer) +
                           " is outside [0, num_layers = " + std::to_string(config.num_layers) + ")");
    }
  }
  std::sort(config.layers.begin(), config.layers.end());
  if (auto dup = std::adjacent_find(config.layers.begin(), config.layers.end()); dup != config.layers.end()) {
    return bad(what, "layer " + std::to_string(*dup) + " is listed twice");
  }
  if (config.layers.empty()) {
    for (std::int32_t l = std::max(0, config.num_layers - 3); l < config.num_layers; ++l) config.layers.push_back(l);
  }
  out.reset(new SnapshotAdapter(std::move(weights), std::move(config)));
  return Status::success();
}

bool SnapshotAdapter::injects_at(std::int32_t layer) const {
  return std::binary_search(config_.layers.begin(), config_.layers.end(), layer);
}

Status SnapshotAdapter::check_common(const ConstActivationView& hs, std::int32_t layer, const char* what) const {
  CLM_RETURN_IF_ERROR(check_activation_view(hs, weights_.hidden, (std::string(what) + ": hidden_states").c_str()));
  if (layer < 0 || layer >= config_.num_layers) {
    return bad(what, "layer " + std::to_string(layer) +
                         " is outside [0, num_layers = " + std::to_string(config_.num_layers) + ")");
  }
  return Status::success();
}

Status SnapshotAdapter::delta(std::span<const float> snapshot, std::span<float> out) const {
  const std::string what = "SnapshotAdapter::delta";
  const std::size_t h = sz(weights_.hidden), d = sz(weights_.snapshot_dim);
  if (snapshot.size() != d) {
    return bad(what, "snapshot has " + std::to_string(snapshot.size()) + " values, expected snapshot_dim " +
                         std::to_string(d));
  }
  if (out.size() != h) {
    return bad(what, "out has " + std::to_string(out.size()) + " values, expected hidden " + std::to_string(h));
  }
  if (!all_finite(snapshot)) return bad(what, "the snapshot holds a NaN or Inf");
  const ConstRowMapF w(weights_.weight.data(), static_cast<Index>(h), static_cast<Index>(d));
  const ConstVecMapF b(weights_.bias.data(), static_cast<Index>(h));
  const ConstVecMapF s(snapshot.data(), static_cast<Index>(d));
  const Eigen::VectorXf v = config_.residual_scale * (w * s + b);
  if (!v.allFinite()) return bad(what, "the delta overflows f32");
  std::copy(v.data(), v.data() + v.size(), out.begin());
  return Status::success();
}

Status SnapshotAdapter::inject(ActivationView hidden_states, std::span<const float> snapshot,
                               std::int32_t layer) const {
  const std::string what = "SnapshotAdapter::inject";
  CLM_RETURN_IF_ERROR(check_common(hidden_states, layer, what.c_str()));
  // Checked at every layer, injecting or not: a bad snapshot is always an error.
  if (snapshot.size() != sz(weights_.snapshot_dim)) {
    return bad(what, "snapshot has " + std::to_string(snapshot.size()) + " values, expected snapshot_dim " +
                         std::to_string(weights_.snapshot_dim));
  }
  if (!all_finite(snapshot)) return bad(what, "the snapshot holds a NaN or Inf");
  if (!injects_at(layer)) return Status::success();
  std::vector<float> d(sz(weights_.hidden));
  CLM_RETURN_IF_ERROR(delta(snapshot, d));
  add_rows(hidden_states, 0, hidden_states.rows, d.data());
  return Status::success();
}

Status SnapshotAdapter::inject(ActivationView hidden_states, std::span<const std::uint16_t> snapshot_f16,
                               std::int32_t layer) const {
  std::vector<float> s(snapshot_f16.size());
  CLM_RETURN_IF_ERROR(snapshot_from_f16(snapshot_f16, s));
  return inject(hidden_states, std::span<const float>(s), layer);
}

Status SnapshotAdapter::inject_batch(ActivationView hidden_states, std::span<const std::int32_t> indptr,
                                     std::span<const float> snapshots, std::span<const std::uint8_t> apply,
                                     std::int32_t layer) const {
  const std::string what = "SnapshotAdapter::inject_batch";
  CLM_RETURN_IF_ERROR(check_common(hidden_states, layer, what.c_str()));
  if (indptr.empty()) return bad(what, "indptr is empty (needs batch + 1 entries)");
  const std::size_t batch = indptr.size() - 1;
  const std::size_t h = sz(weights_.hidden), d = sz(weights_.snapshot_dim);
  if (indptr[0] != 0) return bad(what, "indptr[0] must be 0, got " + std::to_string(indptr[0]));
  for (std::size_t b = 0; b < batch; ++b) {
    if (indptr[b + 1] < indptr[b]) return bad(what, "indptr decreases at " + std::to_string(b + 1));
  }
  if (indptr[batch] != hidden_states.rows) {
    return bad(what, "indptr ends at " + std::to_string(indptr[batch]) + ", hidden_states has " +
                         std::to_string(hidden_states.rows) + " rows");
  }
  if (snapshots.size() != batch * d) {
    return bad(what, "snapshots has " + std::to_string(snapshots.size()) +
                         " values, expected batch * snapshot_dim = " + std::to_string(batch * d));
  }
  if (apply.size() != batch) {
    return bad(what, "apply has " + std::to_string(apply.size()) + " entries, expected batch " + std::to_string(batch));
  }
  std::vector<std::size_t> applied;
  for (std::size_t b = 0; b < batch; ++b) {
    if (apply[b] == 0) continue;
    if (!all_finite(snapshots.subspan(b * d, d))) {
      return bad(what, "the snapshot of sequence " + std::to_string(b) + " holds a NaN or Inf");
    }
    applied.push_back(b);
  }
  if (!injects_at(layer) || applied.empty()) return Status::success();

  // D [applied x hidden] = scale * (S W^T + 1 b^T), one GEMM.
  const auto a = static_cast<Index>(applied.size());
  RowMatF s(a, static_cast<Index>(d));
  for (Index i = 0; i < a; ++i) {
    std::copy_n(snapshots.data() + applied[sz(i)] * d, d, s.data() + sz(i) * d);
  }
  const ConstVecMapF bias(weights_.bias.data(), static_cast<Index>(h));
  RowMatF deltas(a, static_cast<Index>(h));
  detail::gemm_nt(s.data(), a, static_cast<std::int64_t>(d), weights_.weight.data(), static_cast<std::int64_t>(h),
                  deltas.data());
  deltas.rowwise() += bias.transpose();
  deltas *= config_.residual_scale;
  for (Index i = 0; i < a; ++i) {
    if (!deltas.row(i).allFinite()) {
      return bad(what, "the delta of sequence " + std::to_string(applied[sz(i)]) + " overflows f32");
    }
  }
  for (Index i = 0; i < a; ++i) {
    const std::size_t b = applied[sz(i)];
    add_rows(hidden_states, indptr[b], indptr[b + 1], deltas.data() + sz(i) * h);
  }
  return Status::success();
}

// ---- safetensors ---------------------------------------------------------------

Status read_snapshot_adapter(const SafetensorsFile& file, SnapshotAdapterWeights& out) {
  const std::string what = "read_snapshot_adapter";
  std::vector<std::int64_t> w_shape, b_shape;
  SnapshotAdapterWeights w;
  CLM_RETURN_IF_ERROR(detail::load_float_tensor(file, what, kWeight, 2, w_shape, w.weight));
  CLM_RETURN_IF_ERROR(detail::load_float_tensor(file, what, kBias, 1, b_shape, w.bias));
  if (b_shape[0] != w_shape[0]) {
    return bad(what, std::string("tensor \"") + kBias + "\" has shape " + detail::shape_text(b_shape) + ", expected [" +
                         std::to_string(w_shape[0]) + "] (hidden, from \"" + kWeight + "\")");
  }
  if (w_shape[0] > std::numeric_limits<std::int32_t>::max() || w_shape[1] > std::numeric_limits<std::int32_t>::max()) {
    return bad(what, "extents do not fit in int32");
  }
  w.hidden = static_cast<std::int32_t>(w_shape[0]);
  w.snapshot_dim = static_cast<std::int32_t>(w_shape[1]);
  if (Status s = validate_snapshot_adapter(w); !s.ok()) return bad(what, s.message());
  out = std::move(w);
  return Status::success();
}

Status read_snapshot_adapter(const std::string& path, SnapshotAdapterWeights& out) {
  SafetensorsFile file;
  CLM_RETURN_IF_ERROR(SafetensorsFile::open(path, file));
  return read_snapshot_adapter(file, out);
}

Status write_snapshot_adapter(const std::string& path, const SnapshotAdapterWeights& weights) {
  if (Status s = validate_snapshot_adapter(weights); !s.ok()) return bad("write_snapshot_adapter", s.message());
  const std::int64_t h = weights.hidden, d = weights.snapshot_dim;
  const TensorToWrite tensors[] = {
      {kWeight, TensorDType::f32, {h, d}, std::as_bytes(std::span(weights.weight))},
      {kBias, TensorDType::f32, {h}, std::as_bytes(std::span(weights.bias))},
  };
  return write_safetensors(path, tensors);
}

}  // namespace clm
