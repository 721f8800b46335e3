// capi/clm_snapshot.cpp: the C ABI of CLM snapshots (clm.h): the PCA
// projection and the adapter, from files or host memory, making snapshots and
// injecting them. Conversion only; the logic is in clm::SnapshotProjection,
// clm::SnapshotAdapter and clm::Engine::inject_snapshots.
#include <cstdint>
#include <memory>
#include <vector>

#include "capi_internal.hpp"
#include "clm/model/snapshot_adapter.hpp"
#include "clm/model/snapshot_projection.hpp"

using namespace clm_capi;

namespace {

constexpr int32_t kMaxDim = 1 << 20;
constexpr std::size_t kMaxLayers = 1 << 16;

clm_adapter_options default_adapter_options() {
  const clm::SnapshotAdapterConfig defaults;
  clm_adapter_options o{};
  o.struct_size = sizeof o;
  o.num_layers = 0;
  o.layers = nullptr;
  o.n_layers = 0;
  o.residual_scale = defaults.residual_scale;
  return o;
}

clm_status adapter_config(const clm_adapter_options* options, const char* fn, clm::SnapshotAdapterConfig& out) {
  if (!options) return null_argument(fn, "options (num_layers has no default)");
  if (clm_status s = check_struct_size<clm_adapter_options>(options->struct_size, {kAdapterOptionsV1}, fn)) return s;
  const clm_adapter_options o = widen(options, options->struct_size, default_adapter_options());
  if (!o.layers && o.n_layers > 0) return null_argument(fn, "options->layers (with n_layers > 0)");
  if (o.n_layers > kMaxLayers) {
    return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("{}: n_layers {} is too large", fn, o.n_layers));
  }
  out.num_layers = o.num_layers;
  out.layers.assign(o.layers, o.layers + o.n_layers);
  out.residual_scale = o.residual_scale;
  return CLM_OK;
}

clm_status install_adapter(clm_engine* engine, clm::SnapshotAdapterWeights weights, clm::SnapshotAdapterConfig config) {
  std::unique_ptr<clm::SnapshotAdapter> adapter;
  if (clm_status s = report(clm::SnapshotAdapter::create(std::move(weights), std::move(config), adapter))) return s;
  engine->state->engine->set_snapshot_adapter(std::shared_ptr<const clm::SnapshotAdapter>(std::move(adapter)));
  return CLM_OK;
}

clm_status install_projection(clm_engine* engine, clm::SnapshotProjectionWeights weights) {
  std::unique_ptr<clm::SnapshotProjection> projection;
  if (clm_status s = report(clm::SnapshotProjection::create(std::move(weights), projection))) return s;
  engine->state->engine->set_snapshot_projection(std::shared_ptr<const clm::SnapshotProjection>(std::move(projection)));
  return CLM_OK;
}

clm_status check_dtype(int32_t dtype, const char* fn) {
  if (dtype < CLM_DTYPE_F32 || dtype > CLM_DTYPE_BF16) {
    return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("{}: unknown dtype {}", fn, dtype));
  }
  return CLM_OK;
}

clm_status check_dims(int32_t hidden, int32_t snapshot_dim, const char* fn) {
  if (hidden < 1 || hidden > kMaxDim || snapshot_dim < 1 || snapshot_dim > kMaxDim) {
    return fail(CLM_ERR_INVALID_ARGUMENT,
                fmt::format("{}: hidden {} or snapshot_dim {} is out of [1, {}]", fn, hidden, snapshot_dim, kMaxDim));
  }
  return CLM_OK;
}

}  // namespace

extern "C" {

clm_status clm_engine_load_snapshot_projection(clm_engine* engine, const char* path) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_engine_load_snapshot_projection";
    if (!engine) return null_argument(fn, "engine");
    if (!path) return null_argument(fn, "path");
    clm::SnapshotProjectionWeights weights;
    if (clm_status s = report(clm::read_snapshot_projection(std::string(path), weights))) return s;
    return install_projection(engine, std::move(weights));
  });
}

clm_status clm_engine_set_snapshot_projection(clm_engine* engine, int32_t hidden, int32_t snapshot_dim,
                                              const float* mean, const float* components) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_engine_set_snapshot_projection";
    if (!engine) return null_argument(fn, "engine");
    if (clm_status s = check_dims(hidden, snapshot_dim, fn)) return s;
    if (!mean) return null_argument(fn, "mean");
    if (!components) return null_argument(fn, "components");
    clm::SnapshotProjectionWeights weights;
    weights.hidden = hidden;
    weights.snapshot_dim = snapshot_dim;
    weights.mean.assign(mean, mean + hidden);
    weights.components.assign(components,
                              components + static_cast<std::size_t>(hidden) * static_cast<std::size_t>(snapshot_dim));
    return install_projection(engine, std::move(weights));
  });
}

clm_status clm_engine_make_snapshots(float* snapshots, size_t snapshots_len, clm_engine* engine, const void* rows,
                                     int32_t dtype, size_t n_rows, int32_t hidden) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_engine_make_snapshots";
    if (!engine) return null_argument(fn, "engine");
    if (!snapshots && snapshots_len > 0) return null_argument(fn, "snapshots");
    if (!rows && n_rows > 0) return null_argument(fn, "rows");
    if (clm_status s = check_dtype(dtype, fn)) return s;
    if (hidden < 1 || hidden > kMaxDim || n_rows > static_cast<size_t>(INT32_MAX)) {
      return fail(CLM_ERR_INVALID_ARGUMENT,
                  fmt::format("{}: hidden {} or n_rows {} is out of range", fn, hidden, n_rows));
    }
    const clm::ConstActivationView view{rows, static_cast<clm::ActDType>(dtype), static_cast<std::int64_t>(n_rows),
                                        hidden};
    return report(engine->state->engine->make_snapshots(view, {snapshots, snapshots_len}));
  });
}

clm_status clm_adapter_options_init(clm_adapter_options* options, size_t struct_size) {
  if (!options) return null_argument("clm_adapter_options_init", "options");
  if (clm_status s =
          check_struct_size<clm_adapter_options>(struct_size, {kAdapterOptionsV1}, "clm_adapter_options_init")) {
    return s;
  }
  clm_adapter_options defaults = default_adapter_options();
  defaults.struct_size = static_cast<uint32_t>(struct_size);
  std::memcpy(options, &defaults, struct_size);
  return CLM_OK;
}

clm_status clm_engine_load_snapshot_adapter(clm_engine* engine, const char* path, const clm_adapter_options* options) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_engine_load_snapshot_adapter";
    if (!engine) return null_argument(fn, "engine");
    if (!path) return null_argument(fn, "path");
    clm::SnapshotAdapterConfig config;
    if (clm_status s = adapter_config(options, fn, config)) return s;
    clm::SnapshotAdapterWeights weights;
    if (clm_status s = report(clm::read_snapshot_adapter(std::string(path), weights))) return s;
    return install_adapter(engine, std::move(weights), std::move(config));
  });
}

clm_status clm_engine_set_snapshot_adapter(clm_engine* engine, int32_t snapshot_dim, int32_t hidden,
                                           const float* weight, const float* bias, const clm_adapter_options* options) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_engine_set_snapshot_adapter";
    if (!engine) return null_argument(fn, "engine");
    if (clm_status s = check_dims(hidden, snapshot_dim, fn)) return s;
    if (!weight) return null_argument(fn, "weight");
    if (!bias) return null_argument(fn, "bias");
    clm::SnapshotAdapterConfig config;
    if (clm_status s = adapter_config(options, fn, config)) return s;
    clm::SnapshotAdapterWeights weights;
    weights.snapshot_dim = snapshot_dim;
    weights.hidden = hidden;
    weights.weight.assign(weight, weight + static_cast<std::size_t>(hidden) * static_cast<std::size_t>(snapshot_dim));
    weights.bias.assign(bias, bias + hidden);
    return install_adapter(engine, std::move(weights), std::move(config));
  });
}

clm_status clm_engine_inject_snapshots(clm_engine* engine, void* hidden_states, int32_t dtype, size_t n_rows,
                                       int32_t hidden, clm_seq* const* seqs, size_t n_seqs, const int32_t* indptr,
                                       const float* snapshots, int32_t snapshot_dim, const uint8_t* apply,
                                       int32_t layer) {
  return guarded([&]() -> clm_status {
    const char* fn = "clm_engine_inject_snapshots";
    if (!engine) return null_argument(fn, "engine");
    if (!hidden_states && n_rows > 0) return null_argument(fn, "hidden_states");
    if (!indptr) return null_argument(fn, "indptr");
    if (!snapshots && n_seqs > 0) return null_argument(fn, "snapshots");
    if (!apply && n_seqs > 0) return null_argument(fn, "apply");
    if (clm_status s = check_dtype(dtype, fn)) return s;
    if (clm_status s = check_dims(hidden, snapshot_dim, fn)) return s;
    if (n_rows >= static_cast<size_t>(INT32_MAX) || n_seqs >= static_cast<size_t>(INT32_MAX)) {
      return fail(CLM_ERR_INVALID_ARGUMENT, fmt::format("{}: n_rows or n_seqs is too large", fn));
    }
    std::vector<clm::SequenceId> ids;
    if (clm_status s = sequence_ids(engine, seqs, n_seqs, fn, ids)) return s;
    const clm::ActivationView view{hidden_states, static_cast<clm::ActDType>(dtype), static_cast<std::int64_t>(n_rows),
                                   hidden};
    const std::size_t n_snapshot_floats = n_seqs * static_cast<std::size_t>(snapshot_dim);
    return report(engine->state->engine->inject_snapshots(ids, view, {indptr, n_seqs + 1},
                                                          {snapshots, n_snapshot_floats}, {apply, n_seqs}, layer));
  });
}

}  // extern "C"
