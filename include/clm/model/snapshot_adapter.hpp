// clm/model/snapshot_adapter.hpp: the CLM snapshot adapter (docs/clm.md). A linear
// map snapshot_dim -> hidden (+ bias) whose output, times residual_scale, is
// added to every position's hidden state at the layers the config allows.
//
//   std::unique_ptr<clm::SnapshotAdapter> adapter;
//   CLM_RETURN_IF_ERROR(clm::SnapshotAdapter::create(std::move(weights), config, adapter));
//   // at each layer, after the layer's residual add:
//   clm::ActivationView hs{hidden_bf16.data(), clm::ActDType::bf16, tokens, hidden};
//   CLM_RETURN_IF_ERROR(adapter->inject(hs, snapshot, layer));  // no-op where the layer does not inject
//
// delta = residual_scale * (W s + b), W [hidden][snapshot_dim]. inject adds it
// to every row of the view (f32, or f16/bf16 rounded to nearest even after an
// f32 add); inject_batch does so per sequence of a ragged batch, the deltas of
// the applied sequences computed as one Eigen GEMM.
//
// Errors (Status, never exceptions), all invalid_argument:
//   - create: hidden or snapshot_dim < 1, weight/bias sizes that do not match,
//     a NaN/Inf weight or residual_scale, num_layers < 1, a listed layer
//     outside [0, num_layers) or listed twice;
//   - delta / inject / inject_batch: a view that is not [tokens][hidden], a
//     snapshot of the wrong size or holding a NaN/Inf, a layer outside
//     [0, num_layers), indptr not [batch + 1] offsets from 0 to tokens
//     (non-decreasing), snapshots or apply of the wrong size, or a delta that
//     overflows f32. Everything is checked before anything is written, also at
//     layers that do not inject: on error the outputs are left untouched.
// In inject_batch, the snapshot of a sequence whose apply flag is 0 is not
// read (it may be anything). The hidden states themselves are not checked.
// All const members are safe to call concurrently on distinct hidden states.
#pragma once

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

// Row-major f32 weights of the adapter.
struct SnapshotAdapterWeights {
  std::int32_t snapshot_dim = 0;
  std::int32_t hidden = 0;
  std::vector<float> weight;  // [hidden][snapshot_dim]
  std::vector<float> bias;    // [hidden]
};

struct SnapshotAdapterConfig {
  std::int32_t num_layers = 0;       // the model's layer count
  std::vector<std::int32_t> layers;  // layers that inject; empty = the last 3 (clamped to num_layers)
  float residual_scale = 0.3f;
};

class SnapshotAdapter {
 public:
  // Validates (see above) and takes ownership of the weights.
  static Status create(SnapshotAdapterWeights weights, SnapshotAdapterConfig config,
                       std::unique_ptr<SnapshotAdapter>& out);

  // Whether `layer` injects (false outside [0, num_layers)).
  bool injects_at(std::int32_t layer) const;

  // out [hidden] = residual_scale * (W snapshot + b).
  Status delta(std::span<const float> snapshot, std::span<float> out) const;

  // hidden_states [tokens][hidden] += delta at an injecting layer; ok and no
  // change at another layer of the model.
  Status inject(ActivationView hidden_states, std::span<const float> snapshot, std::int32_t layer) const;
  // The same with the snapshot stored as f16.
  Status inject(ActivationView hidden_states, std::span<const std::uint16_t> snapshot_f16, std::int32_t layer) const;

  // Ragged batch: sequence b owns rows indptr[b] .. indptr[b+1]-1 and gets
  // snapshots[b] when apply[b] != 0. indptr [batch + 1], snapshots
  // [batch][snapshot_dim], apply [batch].
  Status inject_batch(ActivationView hidden_states, std::span<const std::int32_t> indptr,
                      std::span<const float> snapshots, std::span<const std::uint8_t> apply, std::int32_t layer) const;

  std::int32_t hidden() const { return weights_.hidden; }
  std::int32_t snapshot_dim() const { return weights_.snapshot_dim; }
  std::int32_t num_layers() const { return config_.num_layers; }
  // The injecting layers, sorted (the defaults filled in).
  const std::vector<std::int32_t>& layers() const { return config_.layers; }
  float residual_scale() const { return config_.residual_scale; }
  const SnapshotAdapterWeights& weights() const { return weights_; }

 private:
  SnapshotAdapter(SnapshotAdapterWeights weights, SnapshotAdapterConfig config)
      : weights_(std::move(weights)), config_(std::move(config)) {}

  Status check_common(const ConstActivationView& hidden_states, std::int32_t layer, const char* what) const;

  SnapshotAdapterWeights weights_;
  SnapshotAdapterConfig config_;
};

// The weight checks of create, without a config.
Status validate_snapshot_adapter(const SnapshotAdapterWeights& weights);

// safetensors: "adapter.weight" [hidden, snapshot_dim] and "adapter.bias"
// [hidden]; F32, F16 or BF16 (read as f32). Other tensors are ignored. A
// missing tensor, another dtype, a wrong shape or a NaN/Inf is
// invalid_argument naming the tensor; `out` is replaced only on success.
// write_* stores f32 and checks the weights first.
Status read_snapshot_adapter(const SafetensorsFile& file, SnapshotAdapterWeights& out);
Status read_snapshot_adapter(const std::string& path, SnapshotAdapterWeights& out);
Status write_snapshot_adapter(const std::string& path, const SnapshotAdapterWeights& weights);

}  // namespace clm
